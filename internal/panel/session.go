package panel

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"time"

	"nimbus/internal/store"
)

// Session is a signed-in user: who they are, the project they act in, and
// the Keystone token every API call of theirs carries.
type Session struct {
	UserID, UserName       string
	ProjectID, ProjectName string
	Roles                  []string
	Admin                  bool
	// Token is the user's own Keystone token; the panel calls the APIs
	// with it, so it can do nothing the API would not let the user do.
	Token   string
	CSRF    string
	Expires time.Time

	idHash string
}

const (
	sessionCookie = "nimbus_session"
	// anonCookie carries the CSRF secret of a visitor who is not signed
	// in (login, sign-up and reset forms): double-submit, checked against
	// the form's field.
	anonCookie = "nimbus_csrf"
	csrfField  = "csrf"
)

// newSecret is 32 random bytes, URL-safe.
func newSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashID(secret string) string {
	h := sha256.Sum256([]byte("nimbus-panel-session\x00" + secret))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// sealKey derives the key that seals a session's Keystone token from the
// cookie's secret, which the store never sees.
func sealKey(secret string) []byte {
	h := sha256.Sum256([]byte("nimbus-panel-token\x00" + secret))
	return h[:]
}

// aead is AES-GCM under a cookie's sealing key.
func aead(secret string) (cipher.AEAD, error) {
	block, err := aes.NewCipher(sealKey(secret))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func seal(secret, plain string) (string, error) {
	gcm, err := aead(secret)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(gcm.Seal(nonce, nonce, []byte(plain), nil)), nil
}

func unseal(secret, sealed string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		return "", err
	}
	gcm, err := aead(secret)
	if err != nil {
		return "", err
	}
	if len(raw) < gcm.NonceSize() {
		return "", errors.New("panel: sealed token too short")
	}
	out, err := gcm.Open(nil, raw[:gcm.NonceSize()], raw[gcm.NonceSize():], nil)
	return string(out), err
}

// MaxSessionsPerUser bounds one user's sessions: signing in once more
// ends the oldest, so signing in again and again (at identity's token
// rate, ten a second) cannot fill the table until the sessions expire.
const MaxSessionsPerUser = 20

// sessions keeps sessions in the store.
type sessions struct {
	db  *store.DB
	now func() time.Time
}

// create stores s, ending the user's oldest sessions beyond
// MaxSessionsPerUser, and returns the cookie's secret.
func (st *sessions) create(ctx context.Context, s *Session) (string, error) {
	secret := newSecret()
	sealed, err := seal(secret, s.Token)
	if err != nil {
		return "", err
	}
	s.CSRF = newSecret()
	s.idHash = hashID(secret)
	now := st.now()
	return secret, st.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO panel_sessions (id_hash, user_id, user_name, project_id, project_name, roles,
		token_sealed, csrf, created_at, expires_at, created_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			s.idHash, s.UserID, s.UserName, s.ProjectID, s.ProjectName, strings.Join(s.Roles, ","),
			sealed, s.CSRF, now.Unix(), s.Expires.Unix(), now.UnixNano())
		if err != nil {
			return err
		}
		// The new one stays whatever the clock says; of the others the
		// newest stay.
		_, err = tx.Exec(ctx, `DELETE FROM panel_sessions WHERE user_id = ? AND id_hash <> ? AND id_hash NOT IN
		(SELECT id_hash FROM panel_sessions WHERE user_id = ? AND id_hash <> ? ORDER BY created_ns DESC, id_hash DESC LIMIT ?)`,
			s.UserID, s.idHash, s.UserID, s.idHash, MaxSessionsPerUser-1)
		return err
	})
}

// errNoSession is a missing, unknown or expired session.
var errNoSession = errors.New("panel: no session")

// load finds the live session of a cookie's secret.
func (st *sessions) load(ctx context.Context, secret string) (*Session, error) {
	if len(secret) != 43 {
		return nil, errNoSession
	}
	s := &Session{idHash: hashID(secret)}
	var roles, sealed string
	var expires int64
	err := st.db.QueryRow(ctx, `SELECT user_id, user_name, project_id, project_name, roles, token_sealed, csrf, expires_at
		FROM panel_sessions WHERE id_hash = ?`, s.idHash).
		Scan(&s.UserID, &s.UserName, &s.ProjectID, &s.ProjectName, &roles, &sealed, &s.CSRF, &expires)
	if store.IsNoRows(err) {
		return nil, errNoSession
	}
	if err != nil {
		return nil, err
	}
	s.Expires = time.Unix(expires, 0)
	if !st.now().Before(s.Expires) {
		st.delete(ctx, s.idHash)
		return nil, errNoSession
	}
	if s.Token, err = unseal(secret, sealed); err != nil {
		return nil, errNoSession
	}
	if roles != "" {
		s.Roles = strings.Split(roles, ",")
	}
	for _, r := range s.Roles {
		if r == "admin" {
			s.Admin = true
		}
	}
	return s, nil
}

func (st *sessions) delete(ctx context.Context, idHash string) error {
	_, err := st.db.Exec(ctx, "DELETE FROM panel_sessions WHERE id_hash = ?", idHash)
	return err
}

// deleteUser ends every session of a user (password reset, sign-out
// everywhere).
func (st *sessions) deleteUser(ctx context.Context, userID string) error {
	_, err := st.db.Exec(ctx, "DELETE FROM panel_sessions WHERE user_id = ?", userID)
	return err
}

// purge removes expired sessions.
func (st *sessions) purge(ctx context.Context) error {
	_, err := st.db.Exec(ctx, "DELETE FROM panel_sessions WHERE expires_at <= ?", st.now().Unix())
	return err
}

// setCookie sets a cookie as every panel cookie is: Secure, HttpOnly,
// SameSite=Lax (a link from elsewhere may open a page, never post a form),
// for the whole panel.
func setCookie(w http.ResponseWriter, name, value string, expires time.Time) {
	c := &http.Cookie{Name: name, Value: value, Path: "/", Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode}
	if !expires.IsZero() {
		c.Expires = expires
		c.MaxAge = int(time.Until(expires).Seconds())
		if c.MaxAge <= 0 {
			c.MaxAge = -1
		}
	}
	http.SetCookie(w, c)
}

func clearCookie(w http.ResponseWriter, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", Secure: true, HttpOnly: true,
		SameSite: http.SameSiteLaxMode, MaxAge: -1})
}

// sameSecret compares two secrets in constant time.
func sameSecret(a, b string) bool {
	return a != "" && len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
