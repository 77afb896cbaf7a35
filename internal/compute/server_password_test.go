package compute_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"testing"

	"golang.org/x/crypto/ssh"

	"nimbus/internal/testenv"
)

// TestServerPassword checks os-server-password: a Windows server's
// administrator password encrypted to its RSA key pair, which the key's
// owner decrypts to the adminPass of the create response; nothing for
// Linux; DELETE forgets it.
func TestServerPassword(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		e.flavor("pw", 2, 4096, 40, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local"})
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := ssh.NewPublicKey(&key.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		kp, _ := json.Marshal(map[string]any{"keypair": map[string]string{"name": "win", "public_key": string(ssh.MarshalAuthorizedKey(pub))}})
		e.must(200, "POST", "/os-keypairs", e.demo, "2.1", string(kp))
		var win string
		if err := e.c.DB.QueryRow(t.Context(), "SELECT id FROM images WHERE name = 'Windows Server 2022'").Scan(&win); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name, image string
			encrypted   bool
		}{{"windows", win, true}, {"linux", e.imageID, false}}
		for _, tc := range cases {
			m := e.must(202, "POST", "/servers", e.demo, "2.1",
				`{"server":{"name":"w","imageRef":"`+tc.image+`","flavorRef":"pw","key_name":"win"}}`)["server"].(map[string]any)
			id, adminPass := m["id"].(string), m["adminPass"].(string)
			got := e.must(200, "GET", "/servers/"+id+"/os-server-password", e.demo, "", "")["password"].(string)
			if !tc.encrypted {
				if got != "" {
					t.Errorf("%s: password %q, want none", tc.name, got)
				}
				continue
			}
			ct, err := base64.StdEncoding.DecodeString(got)
			if err != nil {
				t.Fatalf("%s: password %q: %v", tc.name, got, err)
			}
			//lint:ignore SA1019 decrypting as nova get-password does
			plain, err := rsa.DecryptPKCS1v15(nil, key, ct)
			if err != nil || string(plain) != adminPass {
				t.Errorf("%s: decrypts to %q (%v), want adminPass %q", tc.name, plain, err, adminPass)
			}
			e.must(204, "DELETE", "/servers/"+id+"/os-server-password", e.demo, "", "")
			if got := e.must(200, "GET", "/servers/"+id+"/os-server-password", e.demo, "", "")["password"]; got != "" {
				t.Errorf("%s: after DELETE the password is %q", tc.name, got)
			}
			e.must(404, "GET", "/servers/00000000-0000-0000-0000-000000000000/os-server-password", e.demo, "", "")
		}
	})
}
