package identity

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Auth receipts (keystone/receipt): a sign-in that proved some of the
// factors its user's rules require waits for the rest behind a receipt,
// which the client sends back in Openstack-Auth-Receipt with the missing
// method. Like tokens they are random secrets stored hashed, so every
// controller sharing the database knows them and a receipt can be spent
// once: a token issued with it deletes it, and too many wrong passcodes
// with it end it.
//
// Every receipt needs a right first factor (a password) to exist, and their
// number is bounded per user (the user's oldest give way) and per client
// address (the address waits), so no one can fill a shared table and lock
// other users out, as a flood of pending sign-ins once could.

// ReceiptHeader carries a receipt both ways (keystone/common/authorization.py
// AUTH_RECEIPT_HEADER).
const ReceiptHeader = "Openstack-Auth-Receipt"

const (
	// receiptTTL is Keystone's [receipt] expiration default.
	receiptTTL = 5 * time.Minute
	// maxReceiptsPerUser are one user's live receipts: a new one ends the
	// oldest, so a user can only crowd out their own sign-ins.
	maxReceiptsPerUser = 3
	// maxReceiptFailures wrong passcodes end a receipt.
	maxReceiptFailures = 5
)

// ReceiptRequired is the answer to a sign-in whose user's rules need more
// factors than it gave: Keystone's 401 with an auth receipt.
type ReceiptRequired struct {
	Receipt             string     // the receipt's id, a secret
	User                *User      // who signed in
	Domain              *Domain    // the user's domain
	Methods             []string   // the methods the receipt holds
	Required            [][]string // required_auth_methods
	IssuedAt, ExpiresAt time.Time
}

func (e *ReceiptRequired) Error() string {
	return "401: additional authentication methods are required (" + strings.Join(e.Methods, ",") + " given)"
}

// ErrReceiptNotFound is the 401 for a receipt that is unknown, expired,
// spent or another user's (Keystone's ReceiptNotFound). It is shared:
// never change it.
var ErrReceiptNotFound = api.Errorf(http.StatusUnauthorized, "Could not find auth receipt.")

// receipt is a stored receipt.
type receipt struct {
	hash, userID string
	methods      []string
}

// loadReceipt reads the live receipt id names.
func (s *Service) loadReceipt(ctx context.Context, id string) (*receipt, error) {
	if id == "" || len(id) > 512 {
		return nil, ErrReceiptNotFound
	}
	rc := &receipt{hash: hashToken(id)}
	var methods string
	err := s.db.QueryRow(ctx, "SELECT user_id, methods FROM auth_receipts WHERE id_hash = ? AND expires_at > ? AND failures < ?",
		rc.hash, store.FormatTime(s.now()), maxReceiptFailures).Scan(&rc.userID, &methods)
	if store.IsNoRows(err) {
		return nil, ErrReceiptNotFound
	}
	if err != nil {
		return nil, err
	}
	rc.methods = strings.Split(methods, ",")
	return rc, nil
}

// issueReceipt stores a receipt for u holding methods, in place of old if
// given, for a client at addr, and returns the answer that carries it.
func (s *Service) issueReceipt(ctx context.Context, addr string, u *User, methods []string, old *receipt) error {
	d, err := getDomain(ctx, s.db, "id = ?", u.DomainID)
	if err != nil {
		return err
	}
	id, now := newSecret(), s.now()
	e := &ReceiptRequired{Receipt: id, User: u, Domain: d, Methods: methods,
		Required: requiredMethods(u.Options.activeRules(), methods), IssuedAt: now, ExpiresAt: now.Add(receiptTTL)}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if old != nil {
			if _, err := tx.Exec(ctx, "DELETE FROM auth_receipts WHERE id_hash = ?", old.hash); err != nil {
				return err
			}
		}
		if err := s.roomForReceipt(ctx, tx, addr, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO auth_receipts (id_hash, user_id, methods, address, issued_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?)`, hashToken(id), u.ID, strings.Join(methods, ","), addr,
			store.FormatTime(now), store.FormatTime(e.ExpiresAt)); err != nil {
			return err
		}
		// The user's oldest beyond the cap give way.
		_, err := tx.Exec(ctx, `DELETE FROM auth_receipts WHERE user_id = ? AND id_hash NOT IN
			(SELECT id_hash FROM auth_receipts WHERE user_id = ? ORDER BY issued_at DESC, id_hash DESC LIMIT ?)`,
			u.ID, u.ID, maxReceiptsPerUser)
		return err
	})
	if err != nil {
		return err
	}
	return e
}

// roomForReceipt forgets expired receipts and refuses a new one for addr
// when it holds ReceiptsPerAddress live ones already (429 until the oldest
// expires). An in-process caller without an address is not limited.
func (s *Service) roomForReceipt(ctx context.Context, tx *store.Tx, addr string, now time.Time) error {
	if _, err := tx.Exec(ctx, "DELETE FROM auth_receipts WHERE expires_at <= ?", store.FormatTime(now)); err != nil {
		return err
	}
	limit := s.limits.ReceiptsPerAddress
	if limit <= 0 || addr == "" {
		return nil
	}
	var n int
	var oldest string
	err := tx.QueryRow(ctx, "SELECT COUNT(*), COALESCE(MIN(expires_at), '') FROM auth_receipts WHERE address = ?", addr).
		Scan(&n, &oldest)
	if err != nil || n < limit {
		return err
	}
	return retryLater(http.StatusTooManyRequests, store.ParseTime(oldest).Sub(now),
		"Too many sign-ins waiting for a second factor from this address; finish or abandon one first.")
}

// receiptFailed counts a wrong passcode against rc; the last allowed one
// ends it.
func (s *Service) receiptFailed(ctx context.Context, rc *receipt) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE auth_receipts SET failures = failures + 1 WHERE id_hash = ?", rc.hash); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM auth_receipts WHERE id_hash = ? AND failures >= ?", rc.hash, maxReceiptFailures)
		return err
	})
}

// spendReceipt deletes rc once a token was issued with it.
func (s *Service) spendReceipt(ctx context.Context, rc *receipt) error {
	if rc == nil {
		return nil
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM auth_receipts WHERE id_hash = ?", rc.hash)
		return err
	})
}

// applyRules checks the methods that succeeded for u, with those of rc,
// against u's rules. It returns every method the token will name, or a
// *ReceiptRequired holding them when a factor is missing.
func (s *Service) applyRules(ctx context.Context, addr string, u *User, methods []string, rc *receipt) ([]string, error) {
	if rc != nil {
		if rc.userID != u.ID {
			return nil, ErrReceiptNotFound
		}
		methods = union(rc.methods, methods)
	}
	if !hasFirstFactor(methods) {
		return nil, api.Unauthorized()
	}
	if satisfied(u.Options.activeRules(), methods) {
		return methods, nil
	}
	return nil, s.issueReceipt(ctx, addr, u, methods, rc)
}

// asReceipt is err as a *ReceiptRequired, if it is one.
func asReceipt(err error) (*ReceiptRequired, bool) {
	var e *ReceiptRequired
	ok := errors.As(err, &e)
	return e, ok
}
