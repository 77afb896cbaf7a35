package compute

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"net/http"

	"golang.org/x/crypto/ssh"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// encryptPassword encrypts a Windows server's administrator password to
// its key pair, as cloudbase-init does before it posts the password to
// Nova's metadata service (RSA PKCS #1 v1.5, base64), so that
// "nova get-password <server> <private key>" decrypts it. Without an RSA
// key there is nothing to encrypt to: the password is the create
// response's adminPass alone.
func encryptPassword(authorizedKey, password string) string {
	if authorizedKey == "" || password == "" {
		return ""
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(authorizedKey))
	if err != nil {
		return ""
	}
	ck, ok := pub.(ssh.CryptoPublicKey)
	if !ok {
		return ""
	}
	rk, ok := ck.CryptoPublicKey().(*rsa.PublicKey)
	if !ok {
		return ""
	}
	//lint:ignore SA1019 the format clients decrypt (nova get-password runs openssl rsautl, PKCS #1 v1.5), as cloudbase-init writes it
	ct, err := rsa.EncryptPKCS1v15(rand.Reader, rk, []byte(password))
	if err != nil {
		return ""
	}
	return base64.StdEncoding.EncodeToString(ct)
}

// handleGetPassword is GET /servers/{id}/os-server-password: the
// encrypted administrator password, "" when there is none.
func (s *Service) handleGetPassword(r *http.Request) (*api.Response, error) {
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"password": sv.Doc.Password}), nil
}

// handleClearPassword is DELETE /servers/{id}/os-server-password: it
// forgets the encrypted password (the server's own is unchanged).
func (s *Service) handleClearPassword(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		cur, err := s.loadServer(ctx, tx, sv.ID, true)
		if err != nil {
			return err
		}
		if cur.Doc.Password == "" {
			return nil
		}
		cur.Doc.Password = ""
		return s.saveServer(ctx, tx, cur)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}
