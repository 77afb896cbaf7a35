package identity

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Lockout state lives in the users table, not in memory, so that every
// controller sharing one PostgreSQL counts the same failures: an attacker
// spreading guesses over controllers gets no more of them.

// passwordLogin authenticates the user that find names with pw, for a client
// at addr ("" for in-process callers). In Keystone's order
// (identity/backends/sql.py authenticate), a locked account is refused before
// its password is hashed, so guesses at it cost no memory; every failure
// counts against the address and, with lockout on, the user.
func (s *Service) passwordLogin(ctx context.Context, addr string, find func() (*User, error), pw string) (*User, error) {
	if wait := s.addressWait(addr); wait > 0 {
		secs := strconv.Itoa(int(math.Ceil(wait.Seconds())))
		return nil, retryLater(http.StatusTooManyRequests, wait,
			"Too many failed authentication attempts from this address; retry after "+secs+" seconds.")
	}
	user, err := find()
	if err != nil && !errors.Is(err, store.ErrNotFound) && !isAPIError(err) {
		return nil, err
	}
	if err != nil || user == nil || !user.Enabled {
		s.addressFailed(addr)
		return nil, api.Unauthorized()
	}
	if _, err := s.checkLock(ctx, user.ID); err != nil {
		s.addressFailed(addr)
		return nil, err
	}
	done, err := s.userTurn(ctx, user.ID)
	if err != nil {
		return nil, err
	}
	defer done()
	ok := false
	failures := 0
	err = s.withHashSlot(ctx, func() error {
		// Again: the lock may have come while this request waited.
		var err error
		if failures, err = s.checkLock(ctx, user.ID); err != nil {
			return err
		}
		ok = CheckPassword(user.PasswordHash, pw)
		return nil
	})
	switch {
	case err != nil:
		if api.AsError(err).Status == http.StatusUnauthorized {
			s.addressFailed(addr) // locked while it waited
		}
		return nil, err
	case !ok:
		s.addressFailed(addr)
		if err := s.recordFailure(ctx, user.ID); err != nil {
			return nil, err
		}
		return nil, api.Unauthorized()
	case failures > 0:
		if err := s.resetFailures(ctx, user.ID); err != nil {
			return nil, err
		}
	}
	return user, nil
}

// checkLock returns the user's failed logins in a row, or Keystone's 401
// when they lock the account now.
func (s *Service) checkLock(ctx context.Context, userID string) (int, error) {
	attempts := s.limits.LockoutFailureAttempts
	if attempts <= 0 {
		return 0, nil
	}
	var n int
	var at string
	err := s.db.QueryRow(ctx, "SELECT failed_auth_count, failed_auth_at FROM users WHERE id = ?", userID).Scan(&n, &at)
	if err != nil {
		return 0, err
	}
	d := s.limits.LockoutDuration
	if n >= attempts && (d <= 0 || s.now().Before(store.ParseTime(at).Add(d))) {
		return n, api.Errorf(http.StatusUnauthorized, "The account is locked for user: %s.", userID)
	}
	return n, nil
}

// recordFailure counts a failed password check; a lock that has run out
// starts the count again, as Keystone's _is_account_locked resets it.
func (s *Service) recordFailure(ctx context.Context, userID string) error {
	attempts := s.limits.LockoutFailureAttempts
	if attempts <= 0 {
		return nil
	}
	now := s.now()
	expired := "" // no lock expires without a duration: nothing is before ''
	if d := s.limits.LockoutDuration; d > 0 {
		expired = store.FormatTime(now.Add(-d))
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE users SET failed_auth_count = CASE
			WHEN failed_auth_count >= ? AND failed_auth_at < ? THEN 1 ELSE failed_auth_count + 1 END,
			failed_auth_at = ? WHERE id = ?`, attempts, expired, store.FormatTime(now), userID)
		return err
	})
}

// resetFailures forgets a user's failed logins, after a good one or when an
// admin enables the user (Keystone's User.enabled setter).
func (s *Service) resetFailures(ctx context.Context, userID string) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		return resetFailuresTx(ctx, tx, userID)
	})
}

func resetFailuresTx(ctx context.Context, tx *store.Tx, userID string) error {
	_, err := tx.Exec(ctx, "UPDATE users SET failed_auth_count = 0, failed_auth_at = '' WHERE id = ? AND failed_auth_count > 0", userID)
	return err
}
