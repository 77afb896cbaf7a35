package identity

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// The totp auth method (keystone/auth/plugins/totp.py): RFC 6238 with
// HMAC-SHA-1, six digits and 30-second steps over the user's credentials of
// type totp, whose blob is the base32 secret. A passcode of the step before
// or after now is accepted too, for clocks that drift.
//
// Unlike Keystone, a passcode is spent: the step it matched is stored on
// the user's row, and a passcode of that step or an earlier one is refused
// afterwards, on every controller sharing the database (RFC 6238 §5.2). And
// wrong passcodes are bounded per user: maxPasscodeFailures in a row refuse
// every passcode of the user for passcodeLockout. Since a passcode is only
// checked after a right password (mfa.go firstFactors), only someone who
// holds the password can spend those tries.

const (
	totpPeriod          = 30
	totpDrift           = 1 // steps either way
	maxPasscodeFailures = 10
	passcodeLockout     = 15 * time.Minute
	// Secrets: Keystone's docs ask for at least 128 bits; 512 is plenty.
	minTOTPKey = 16
	maxTOTPKey = 64
)

var totpEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// decodeTOTPSecret reads a TOTP credential's blob: upper-case base32,
// padded or not, of 16 to 64 bytes.
func decodeTOTPSecret(blob string) ([]byte, error) {
	key, err := totpEncoding.DecodeString(strings.TrimRight(blob, "="))
	if err != nil || len(key) < minTOTPKey || len(key) > maxTOTPKey {
		return nil, errors.New("identity: not a TOTP secret")
	}
	return key, nil
}

// totpCode is RFC 6238's code of key at step.
func totpCode(key []byte, step int64) string {
	mac := hmac.New(sha1.New, key)
	var msg [8]byte
	binary.BigEndian.PutUint64(msg[:], uint64(step))
	mac.Write(msg[:])
	sum := mac.Sum(nil)
	off := sum[len(sum)-1] & 0x0f
	n := binary.BigEndian.Uint32(sum[off:off+4]) & 0x7fffffff
	return fmt.Sprintf("%06d", n%1_000_000)
}

// matchStep is the first step after last, within the drift of now, at which
// one of keys gives passcode; ok is false when there is none.
func matchStep(keys [][]byte, passcode string, now time.Time, last int64) (step int64, ok bool) {
	if len(passcode) != 6 {
		return 0, false
	}
	cur := now.Unix() / totpPeriod
	for st := cur - totpDrift; st <= cur+totpDrift; st++ {
		if st <= last {
			continue
		}
		for _, k := range keys {
			if hmac.Equal([]byte(totpCode(k, st)), []byte(passcode)) {
				return st, true
			}
		}
	}
	return 0, false
}

// totpKeys are the secrets of the user's TOTP credentials; blobs that are
// not secrets are skipped, as Keystone skips those it cannot decode.
func (s *Service) totpKeys(ctx context.Context, q store.Querier, userID string) ([][]byte, error) {
	creds, err := listCredentials(ctx, q, "user_id = ? AND type = ?", userID, credTOTP)
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	for _, c := range creds {
		if k, err := decodeTOTPSecret(c.Blob); err == nil {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// checkPasscode checks passcode for the user against keys (the user's
// credentials when nil), for a client at addr, spending the step it
// matches. A wrong or spent passcode counts against the user and the
// address; one that comes while the user's passcodes are refused is 401
// whatever it is.
func (s *Service) checkPasscode(ctx context.Context, addr, userID, passcode string, keys [][]byte) error {
	if wait := s.addressWait(addr); wait > 0 {
		return retryLater(http.StatusTooManyRequests, wait,
			"Too many failed authentication attempts from this address; retry after "+
				strconv.Itoa(int(math.Ceil(wait.Seconds())))+" seconds.")
	}
	now := s.now()
	var last int64
	var failures int
	var failedAt string
	err := s.db.QueryRow(ctx, "SELECT totp_last_step, totp_failed_count, totp_failed_at FROM users WHERE id = ?", userID).
		Scan(&last, &failures, &failedAt)
	if store.IsNoRows(err) {
		return api.Unauthorized()
	}
	if err != nil {
		return err
	}
	if until := store.ParseTime(failedAt).Add(passcodeLockout); failures >= maxPasscodeFailures && now.Before(until) {
		s.addressFailed(addr)
		return retryLater(http.StatusUnauthorized, until.Sub(now),
			"Too many wrong passcodes for user: "+userID+"; retry after "+strconv.Itoa(int(math.Ceil(until.Sub(now).Seconds())))+" seconds.")
	}
	if keys == nil {
		if keys, err = s.totpKeys(ctx, s.db, userID); err != nil {
			return err
		}
	}
	if step, ok := matchStep(keys, strings.TrimSpace(passcode), now, last); ok {
		spent, err := s.spendStep(ctx, userID, step)
		if err != nil || spent {
			return err
		}
		// Another request spent this step (or a later one) meanwhile.
	}
	s.addressFailed(addr)
	if err := s.passcodeFailed(ctx, userID, now); err != nil {
		return err
	}
	return api.Unauthorized()
}

// spendStep records step as the user's last accepted one, unless it or a
// later one already is; it reports whether it did. The condition in the
// UPDATE makes two controllers accepting one passcode at once impossible.
func (s *Service) spendStep(ctx context.Context, userID string, step int64) (bool, error) {
	var n int64
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		res, err := tx.Exec(ctx, `UPDATE users SET totp_last_step = ?, totp_failed_count = 0, totp_failed_at = ''
			WHERE id = ? AND totp_last_step < ?`, step, userID, step)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n == 1, err
}

// passcodeFailed counts a wrong passcode; a lock that has run out starts
// the count again.
func (s *Service) passcodeFailed(ctx context.Context, userID string, now time.Time) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE users SET totp_failed_count = CASE
			WHEN totp_failed_at < ? THEN 1 ELSE totp_failed_count + 1 END, totp_failed_at = ? WHERE id = ?`,
			store.FormatTime(now.Add(-passcodeLockout)), store.FormatTime(now), userID)
		return err
	})
}

// totpFactor checks the totp method for u: a wrong passcode also counts
// against the receipt it came with.
func (s *Service) totpFactor(ctx context.Context, addr string, u *User, passcode string, rc *receipt) error {
	err := s.checkPasscode(ctx, addr, u.ID, passcode, nil)
	if err != nil && rc != nil && api.AsError(err).Status == http.StatusUnauthorized {
		if ferr := s.receiptFailed(ctx, rc); ferr != nil {
			return ferr
		}
	}
	return err
}

// Two-factor sign-in for a user's own account, as the panel offers it: a
// TOTP credential and the rules PanelTOTPRules, made or removed together.

// TOTPEnabled reports whether the user has a TOTP credential.
func (s *Service) TOTPEnabled(ctx context.Context, userID string) (bool, error) {
	var n int
	err := s.db.QueryRow(ctx, "SELECT COUNT(*) FROM credentials WHERE user_id = ? AND type = ?", userID, credTOTP).Scan(&n)
	return n > 0, err
}

// EnableTOTP gives the user a TOTP credential with secret (base32) and,
// unless the user has MFA rules already, the rules PanelTOTPRules, once
// passcode, made from secret, shows that the user's authenticator holds it.
// The passcode is spent like any other. A wrong one is 401 but not counted
// against the user: nothing is guessed by it.
func (s *Service) EnableTOTP(ctx context.Context, userID, secret, passcode string) error {
	key, err := decodeTOTPSecret(secret)
	if err != nil {
		return api.BadRequest("Not a TOTP secret.")
	}
	if on, err := s.TOTPEnabled(ctx, userID); err != nil || on {
		if on {
			return api.Conflict("Two-factor sign-in is on already.")
		}
		return err
	}
	var last int64
	if err := s.db.QueryRow(ctx, "SELECT totp_last_step FROM users WHERE id = ?", userID).Scan(&last); err != nil {
		return err
	}
	step, ok := matchStep([][]byte{key}, strings.TrimSpace(passcode), s.now(), last)
	if !ok {
		return api.Unauthorized()
	}
	if spent, err := s.spendStep(ctx, userID, step); err != nil || !spent {
		if err == nil {
			err = api.Unauthorized()
		}
		return err
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		u, err := findUser(ctx, tx, userID)
		if err != nil {
			return err
		}
		if err := s.insertCredential(ctx, tx, &Credential{ID: NewID(), UserID: userID, Type: credTOTP, Blob: secret}); err != nil {
			return err
		}
		if len(u.Options.MFARules) > 0 {
			return nil // an admin's rules stand
		}
		on := true
		u.Options.MFARules, u.Options.MFAEnabled = PanelTOTPRules, &on
		tx.AfterCommit(s.cache.invalidate)
		return updateUser(ctx, tx, u)
	})
}

// DisableTOTP removes the user's TOTP credentials and the rules
// EnableTOTP set, given a passcode of one of them (checked and counted as a
// sign-in's). Rules an admin set that need a passcode stay, and so the
// credentials do too: 409.
func (s *Service) DisableTOTP(ctx context.Context, addr, userID, passcode string) error {
	u, err := GetUser(ctx, s.db, userID)
	if err != nil {
		return err
	}
	ours := slices.EqualFunc(u.Options.MFARules, PanelTOTPRules, slices.Equal[[]string])
	if !ours && u.Options.requiresTOTP() {
		return api.Conflict("Your administrator requires two-factor sign-in for this account.")
	}
	if err := s.checkPasscode(ctx, addr, userID, passcode, nil); err != nil {
		return err
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		u, err := findUser(ctx, tx, userID)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM credentials WHERE user_id = ? AND type = ?", userID, credTOTP); err != nil {
			return err
		}
		if !slices.EqualFunc(u.Options.MFARules, PanelTOTPRules, slices.Equal[[]string]) {
			return nil
		}
		u.Options = UserOptions{}
		tx.AfterCommit(s.cache.invalidate)
		return updateUser(ctx, tx, u)
	})
}
