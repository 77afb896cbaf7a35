package compute

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// keypairTime is how Nova shows a key pair's created_at: microseconds and no
// zone (doc/api_samples/os-keypairs/keypairs-get-resp.json).
const keypairTime = "2006-01-02T15:04:05.000000"

const keypairColumns = "id, user_id, name, type, public_key, fingerprint, created_at"

func scanKeypair(row interface{ Scan(...any) error }) (*Keypair, error) {
	var k Keypair
	var created string
	if err := row.Scan(&k.ID, &k.UserID, &k.Name, &k.Type, &k.PublicKey, &k.Fingerprint, &created); err != nil {
		if store.IsNoRows(err) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	k.CreatedAt = store.ParseTime(created)
	return &k, nil
}

// getKeypair loads a user's key pair by name; store.ErrNotFound when there
// is none.
func (s *Service) getKeypair(ctx context.Context, q store.Querier, userID, name string) (*Keypair, error) {
	if !validText(name) {
		return nil, store.ErrNotFound // PostgreSQL would refuse to compare it
	}
	return scanKeypair(q.QueryRow(ctx, "SELECT "+keypairColumns+" FROM compute_keypairs WHERE user_id = ? AND name = ?", userID, name))
}

// keypairUser is the user a key pair call is about: the caller, or from
// 2.10 an admin's ?user_id (keypairs.py _get_user_id).
func keypairUser(r *http.Request, action, requested string) (string, error) {
	c := api.CallerFrom(r.Context())
	if requested == "" || requested == c.UserID {
		return c.UserID, nil
	}
	if !c.IsAdmin() {
		return "", api.PolicyForbidden("os_compute_api:os-keypairs:" + action)
	}
	return requested, nil
}

func queryUserID(r *http.Request) string {
	if VersionFrom(r.Context()).AtLeast(10) {
		return r.URL.Query().Get("user_id")
	}
	return ""
}

func keypairNotFound(name, user string) error {
	return api.NotFound("Keypair %s not found for user %s", name, user)
}

// maxPublicKey bounds an imported public key: an RSA key of 16384 bits in
// OpenSSH form is about 2.8 KiB, a PEM x509 certificate a few KiB. Nova's
// schema sets no length.
const maxPublicKey = 16 << 10

// keypairInvalid is Nova's InvalidKeypair, a 400.
func keypairInvalid(reason string) error {
	return api.BadRequest("Keypair data is invalid: %s", reason)
}

func (s *Service) listKeypairs(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	if err := strictQuery(r, "user_id", "limit", "marker"); err != nil {
		return nil, err
	}
	user, err := keypairUser(r, "index", queryUserID(r))
	if err != nil {
		return nil, err
	}
	limit, marker := resMaxLimit, ""
	if v.AtLeast(35) {
		if limit, marker, err = resPage(r); err != nil {
			return nil, err
		}
	}
	var markerID int64
	if marker != "" {
		k, err := s.getKeypair(ctx, s.db, user, marker)
		if errors.Is(err, store.ErrNotFound) {
			return nil, api.BadRequest("Marker %s could not be found.", marker)
		}
		if err != nil {
			return nil, err
		}
		markerID = k.ID
	}
	rows, err := s.db.Query(ctx, "SELECT "+keypairColumns+" FROM compute_keypairs WHERE user_id = ? AND id > ? ORDER BY id LIMIT ?",
		user, markerID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []any{}
	var last string
	for rows.Next() {
		k, err := scanKeypair(rows)
		if err != nil {
			return nil, err
		}
		item := map[string]any{"name": k.Name, "public_key": k.PublicKey, "fingerprint": k.Fingerprint}
		if v.AtLeast(2) {
			item["type"] = k.Type
		}
		out = append(out, map[string]any{"keypair": item})
		last = k.Name
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	body := map[string]any{"keypairs": out}
	if v.AtLeast(35) && r.URL.Query().Has("limit") && limit > 0 && len(out) == limit {
		body["keypairs_links"] = resNextLink(r, last)
	}
	return api.JSON(http.StatusOK, body), nil
}

func (s *Service) showKeypair(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if err := strictQuery(r, "user_id"); err != nil {
		return nil, err
	}
	user, err := keypairUser(r, "show", queryUserID(r))
	if err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	k, err := s.getKeypair(ctx, s.db, user, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, keypairNotFound(name, user)
	}
	if err != nil {
		return nil, err
	}
	item := map[string]any{
		"name": k.Name, "public_key": k.PublicKey, "fingerprint": k.Fingerprint, "user_id": k.UserID,
		"id": k.ID, "deleted": false, "created_at": k.CreatedAt.UTC().Format(keypairTime),
		"updated_at": nil, "deleted_at": nil,
	}
	if VersionFrom(ctx).AtLeast(2) {
		item["type"] = k.Type
	}
	return api.JSON(http.StatusOK, map[string]any{"keypair": item}), nil
}

// deleteKeypair answers 202 at 2.1 and 204 from 2.2.
func (s *Service) deleteKeypair(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if err := strictQuery(r, "user_id"); err != nil {
		return nil, err
	}
	user, err := keypairUser(r, "delete", queryUserID(r))
	if err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		res, err := tx.Exec(ctx, "DELETE FROM compute_keypairs WHERE user_id = ? AND name = ?", user, name)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return keypairNotFound(name, user)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if VersionFrom(ctx).AtLeast(2) {
		return api.Empty(http.StatusNoContent), nil
	}
	return api.Empty(http.StatusAccepted), nil
}

// validKeypairName is compute/api.py _validate_new_key_pair; 2.92 also
// allows '@' and '.'.
func validKeypairName(name string, v Version) error {
	safe := "_- 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	if v.AtLeast(92) {
		safe += "@."
	}
	if strings.IndexFunc(name, func(c rune) bool { return !strings.ContainsRune(safe, c) }) >= 0 {
		return keypairInvalid("Keypair name contains unsafe characters")
	}
	if len(name) < 1 || len(name) > 255 {
		return keypairInvalid("Keypair name must be string and between 1 and 255 characters long")
	}
	return nil
}

// createKeypair imports or (before 2.92) generates a key pair: 200 at 2.1,
// 201 from 2.2 (keypairs.py create).
func (s *Service) createKeypair(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	body, err := decodeWrapped(r, "keypair")
	if err != nil {
		return nil, err
	}
	allowed := []string{"name", "public_key"}
	if v.AtLeast(2) {
		allowed = append(allowed, "type")
	}
	if v.AtLeast(10) {
		allowed = append(allowed, "user_id")
	}
	if err := api.UnknownFields(body, allowed...); err != nil {
		return nil, err
	}
	rawName, ok := body["name"]
	if !ok {
		return nil, api.SchemaError("keypair", body, "'name' is a required property")
	}
	name, ok := rawString(rawName)
	if !ok {
		return nil, api.SchemaError("name", rawName, "%s is not of type 'string'", api.PyRepr(rawName))
	}
	if err := validKeypairName(name, v); err != nil {
		return nil, err
	}
	typ := "ssh"
	if raw, ok := body["type"]; ok {
		t, ok := rawString(raw)
		if !ok || (t != "ssh" && t != "x509") {
			return nil, api.SchemaError("type", raw, "%s is not one of ['ssh', 'x509']", api.PyRepr(raw))
		}
		typ = t
	}
	requestedUser := ""
	if raw, ok := body["user_id"]; ok {
		u, ok := rawString(raw)
		if !ok || u == "" || len(u) > 255 {
			return nil, api.SchemaError("user_id", raw, "%s is not of type 'string'", api.PyRepr(raw))
		}
		requestedUser = u
	}
	user, err := keypairUser(r, "create", requestedUser)
	if err != nil {
		return nil, err
	}
	k := &Keypair{Name: name, UserID: user, Type: typ, CreatedAt: s.now()}
	var private string
	if raw, ok := body["public_key"]; ok {
		pub, ok := rawString(raw)
		if !ok || len(pub) < 1 {
			return nil, api.SchemaError("public_key", raw, "%s is not of type 'string'", api.PyRepr(raw))
		}
		if len(pub) > maxPublicKey {
			return nil, keypairInvalid("public_key is too long")
		}
		k.PublicKey = pub
		if k.Fingerprint, err = keyFingerprint(typ, pub); err != nil {
			return nil, err
		}
	} else {
		if v.AtLeast(92) {
			return nil, api.SchemaError("keypair", body, "'public_key' is a required property")
		}
		if k.PublicKey, private, k.Fingerprint, err = generateKeypair(typ, user); err != nil {
			return nil, err
		}
	}
	if err := s.addKeypair(ctx, api.CallerFrom(ctx).ProjectID, k); err != nil {
		return nil, err
	}
	item := map[string]any{"name": k.Name, "public_key": k.PublicKey, "fingerprint": k.Fingerprint, "user_id": k.UserID}
	if v.AtLeast(2) {
		item["type"] = k.Type
	}
	if private != "" {
		item["private_key"] = private
	}
	status := http.StatusCreated
	if !v.AtLeast(2) {
		status = http.StatusOK
	}
	return api.JSON(status, map[string]any{"keypair": item}), nil
}

// addKeypair records k for its user, within the key pairs quota of
// project (the caller's): a name the user has already is Nova's 409.
func (s *Service) addKeypair(ctx context.Context, project string, k *Keypair) error {
	user, name := k.UserID, k.Name
	insert := func(tx *store.Tx) error {
		if _, err := s.getKeypair(ctx, tx, user, name); err == nil {
			return api.Conflict("Key pair '%s' already exists.", name)
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		quota, err := s.quotaFor(ctx, tx, project)
		if err != nil {
			return err
		}
		var count int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_keypairs WHERE user_id = ?", user).Scan(&count); err != nil {
			return err
		}
		if quota.KeyPairs >= 0 && count+1 > quota.KeyPairs {
			return api.Forbidden("Quota exceeded, too many key pairs.")
		}
		if k.ID, err = nextIntID(ctx, tx, "compute_keypairs", "id"); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO compute_keypairs ("+keypairColumns+") VALUES (?, ?, ?, ?, ?, ?, ?)",
			k.ID, k.UserID, k.Name, k.Type, k.PublicKey, k.Fingerprint, store.FormatTime(k.CreatedAt))
		return err
	}
	// Ids are MAX+1: a concurrent create of another name may take the same
	// id, which is retried; a taken name is the 409.
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = s.db.Tx(ctx, insert)
		if !errors.Is(err, store.ErrConflict) {
			break
		}
		if _, gerr := s.getKeypair(ctx, s.db, user, name); gerr == nil {
			break
		}
	}
	if errors.Is(err, store.ErrConflict) {
		// Another create of the same name committed first.
		return api.Conflict("Key pair '%s' already exists.", name)
	}
	return err
}

// keyFingerprint validates an imported public key and returns Nova's
// fingerprint: MD5 of the SSH key blob, or SHA-1 of an X.509 certificate,
// as colon-separated hex (nova/crypto.py).
func keyFingerprint(typ, pub string) (string, error) {
	if typ == "x509" {
		block, _ := pem.Decode([]byte(pub))
		if block == nil {
			return "", keypairInvalid("failed to generate fingerprint")
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return "", keypairInvalid("failed to generate fingerprint")
		}
		return colonHex(sha1Sum(cert.Raw)), nil
	}
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(pub))
	if err != nil {
		return "", keypairInvalid("failed to generate fingerprint")
	}
	return strings.TrimPrefix(ssh.FingerprintLegacyMD5(key), "MD5:"), nil
}

func sha1Sum(b []byte) []byte { h := sha1.Sum(b); return h[:] }

func colonHex(b []byte) string {
	parts := make([]string, len(b))
	for i, c := range b {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ":")
}

// generateKeypair makes an RSA 2048 key as Nova does for a create without
// public_key: an SSH public key commented "Generated-by-Nova", or for x509
// a self-signed certificate.
func generateKeypair(typ, user string) (public, private, fingerprint string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", "", err
	}
	private = string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	if typ == "x509" {
		serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
		tmpl := &x509.Certificate{
			SerialNumber: serial, Subject: pkix.Name{CommonName: user},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().AddDate(10, 0, 0),
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			return "", "", "", err
		}
		public = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		return public, private, colonHex(sha1Sum(der)), nil
	}
	pub, err := ssh.NewPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", "", err
	}
	public = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " Generated-by-Nova"
	return public, private, strings.TrimPrefix(ssh.FingerprintLegacyMD5(pub), "MD5:"), nil
}
