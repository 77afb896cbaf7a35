package identity

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"golang.org/x/crypto/argon2"

	"nimbus/internal/store"
)

// Argon2id parameters: OWASP's minimum for argon2id (19 MiB, 2 passes, 1 lane),
// about 20 ms per hash on one core. They are stored in each hash, so they can
// be raised later without breaking old hashes.
const (
	argonTime    = 2
	argonMemory  = 19 * 1024
	argonThreads = 1
	argonKeyLen  = 32
)

// HashPassword returns an encoded argon2id hash of pw, as identity stores
// user passwords, for callers that hash before calling in (the panel's
// registration). It waits for one of the hash slots of the identity service
// configured last (the process's only one under nimbus serve), so hashes
// from outside identity count against the same memory ceiling; a password
// longer than Keystone's max_password_length is refused.
func HashPassword(pw string) (string, error) {
	if err := checkPassword(&pw); err != nil {
		return "", err
	}
	s := slotOwner.Load()
	if s == nil {
		return hashArgon2id(pw), nil
	}
	return s.hashPassword(context.Background(), pw)
}

// slotOwner is the service whose hash slots HashPassword waits for.
var slotOwner atomic.Pointer[Service]

// hashArgon2id returns an encoded argon2id hash of pw; callers bound how
// many run at once.
func hashArgon2id(pw string) string {
	salt := make([]byte, 16)
	rand.Read(salt)
	key := argon2.IDKey([]byte(pw), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	enc := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, argonMemory, argonTime, argonThreads, enc.EncodeToString(salt), enc.EncodeToString(key))
}

// PasswordMatches reports whether the default domain's user name has
// password pw, without counting a failed login (false for no such user).
func (s *Service) PasswordMatches(ctx context.Context, name, pw string) (bool, error) {
	u, err := getUserByName(ctx, s.db, DefaultDomainID, name)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return pw != "" && CheckPassword(u.PasswordHash, pw), nil
}

// CheckPassword reports whether pw matches an encoded hash.
func CheckPassword(encoded, pw string) bool {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false
	}
	var m, t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil {
		return false
	}
	enc := base64.RawStdEncoding
	salt, err1 := enc.DecodeString(parts[4])
	want, err2 := enc.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(want) == 0 {
		return false
	}
	got := argon2.IDKey([]byte(pw), salt, t, m, p, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1
}

// GeneratePassword returns a random password of n URL-safe characters.
func GeneratePassword(n int) string {
	const alphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
