package compute_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/quotasets"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// wireKey is the key of wire capture 47, whose fingerprint Nova computed.
const (
	wireKey         = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGw0KcwyhHQRrHHr5Xd7lXKZWL2QmFNutqMmS7FlpNMD peer@test"
	wireFingerprint = "9a:e4:30:d5:fd:f7:87:59:0c:2d:af:35:9c:7a:4b:c3"
)

func TestKeypairs(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		ctx := context.Background()

		// 2.1: generation, 200, no type.
		gen := rsObj(e.must(200, "POST", "/os-keypairs", e.demo, "", `{"keypair":{"name":"gen-1"}}`), "keypair")
		rsWantKeys(t, "generated at 2.1", gen, "name", "public_key", "fingerprint", "user_id", "private_key")
		if !strings.HasSuffix(gen["public_key"].(string), " Generated-by-Nova") ||
			!strings.HasPrefix(gen["private_key"].(string), "-----BEGIN RSA PRIVATE KEY-----") {
			t.Errorf("generated %v", gen)
		}
		// 2.2+: 201 with type; an import gets Nova's fingerprint.
		imp := rsObj(e.must(201, "POST", "/os-keypairs", e.demo, "2.2", `{"keypair":{"name":"wire-kp2","public_key":"`+wireKey+`"}}`), "keypair")
		rsWantKeys(t, "imported at 2.2", imp, "name", "public_key", "fingerprint", "user_id", "type")
		if imp["fingerprint"] != wireFingerprint || imp["type"] != "ssh" {
			t.Errorf("import %v", imp)
		}
		e.fault(409, "Key pair 'wire-kp2' already exists.", "POST", "/os-keypairs", e.demo, "2.37", `{"keypair":{"name":"wire-kp2","public_key":"`+wireKey+`"}}`)
		x := rsObj(e.must(201, "POST", "/os-keypairs", e.demo, "2.2", `{"keypair":{"name":"cert","type":"x509"}}`), "keypair")
		if !strings.HasPrefix(x["public_key"].(string), "-----BEGIN CERTIFICATE-----") || len(x["fingerprint"].(string)) != 59 {
			t.Errorf("x509 %v", x)
		}
		bad := []struct{ mv, body, msg string }{
			{"", `{"keypair":{"name":"k","public_key":"ssh-rsa notakey"}}`, "Keypair data is invalid: failed to generate fingerprint"},
			{"", `{"keypair":{"name":"bad!name"}}`, "Keypair data is invalid: Keypair name contains unsafe characters"},
			{"2.10", `{"keypair":{"name":"a@b"}}`, "unsafe characters"},
			{"", `{"keypair":{"name":""}}`, "between 1 and 255"},
			{"", `{"keypair":{"name":"k","type":"ssh"}}`, "Additional properties"},
			{"2.2", `{"keypair":{"name":"k","type":"pgp"}}`, "is not one of"},
			{"2.92", `{"keypair":{"name":"k"}}`, "'public_key' is a required property"},
			{"", `{"keypair":{}}`, "'name' is a required property"},
			{"", `{"keypair":{"name":5}}`, "is not of type 'string'"},
			{"", `{"kp":{}}`, "required property"},
			{"", `{`, "Malformed request body"},
		}
		for _, b := range bad {
			e.fault(400, b.msg, "POST", "/os-keypairs", e.demo, b.mv, b.body)
		}
		e.must(201, "POST", "/os-keypairs", e.demo, "2.92", `{"keypair":{"name":"me@host.x","public_key":"`+wireKey+`"}}`)

		// Views per version.
		items := rsList(e.must(200, "GET", "/os-keypairs", e.demo, "", ""), "keypairs")
		if len(items) != 4 {
			t.Fatalf("%d keypairs", len(items))
		}
		rsWantKeys(t, "list item wrapper", items[0], "keypair")
		rsWantKeys(t, "list item at 2.1", rsObj(items[0], "keypair"), "name", "public_key", "fingerprint")
		items = rsList(e.must(200, "GET", "/os-keypairs", e.demo, "2.2", ""), "keypairs")
		rsWantKeys(t, "list item at 2.2", rsObj(items[0], "keypair"), "name", "public_key", "fingerprint", "type")
		show := rsObj(e.must(200, "GET", "/os-keypairs/wire-kp2", e.demo, "", ""), "keypair")
		rsWantKeys(t, "show at 2.1", show, "name", "public_key", "fingerprint", "user_id", "id", "deleted", "created_at", "updated_at", "deleted_at")
		if ca := show["created_at"].(string); len(ca) != 26 || strings.HasSuffix(ca, "Z") {
			t.Errorf("created_at %q", ca)
		}
		rsWantKeys(t, "show at 2.2", rsObj(e.must(200, "GET", "/os-keypairs/wire-kp2", e.demo, "2.2", ""), "keypair"),
			"name", "public_key", "fingerprint", "user_id", "id", "deleted", "created_at", "updated_at", "deleted_at", "type")

		// Paging from 2.35.
		page := e.must(200, "GET", "/os-keypairs?limit=2", e.demo, "2.35", "")
		if len(rsList(page, "keypairs")) != 2 || len(rsList(page, "keypairs_links")) != 1 {
			t.Errorf("page %v", page)
		}
		rest := rsList(e.must(200, "GET", "/os-keypairs?marker=wire-kp2", e.demo, "2.35", ""), "keypairs")
		if len(rest) != 2 {
			t.Errorf("after marker: %d", len(rest))
		}
		e.fault(400, "Marker nope could not be found.", "GET", "/os-keypairs?marker=nope", e.demo, "2.35", "")

		// Key pairs are per user: admin neither sees nor deletes demo's,
		// except by naming the user (2.10); demo cannot name another user.
		e.fault(404, "Keypair wire-kp2 not found for user", "GET", "/os-keypairs/wire-kp2", e.admin, "", "")
		demoUser := imp["user_id"].(string)
		e.must(200, "GET", "/os-keypairs/wire-kp2?user_id="+demoUser, e.admin, "2.10", "")
		e.fault(403, "os_compute_api:os-keypairs:index", "GET", "/os-keypairs?user_id=someone", e.demo, "2.10", "")
		e.fault(403, "os_compute_api:os-keypairs:create", "POST", "/os-keypairs", e.demo, "2.10", `{"keypair":{"name":"z","user_id":"someone"}}`)
		adm := rsObj(e.must(201, "POST", "/os-keypairs", e.admin, "2.10", `{"keypair":{"name":"for-demo","user_id":"`+demoUser+`","public_key":"`+wireKey+`"}}`), "keypair")
		if adm["user_id"] != demoUser {
			t.Errorf("admin create for demo: %v", adm)
		}

		// Delete: 202 at 2.1, 204 from 2.2.
		e.must(202, "DELETE", "/os-keypairs/gen-1", e.demo, "", "")
		e.must(204, "DELETE", "/os-keypairs/cert", e.demo, "2.2", "")
		e.fault(404, "Keypair cert not found", "DELETE", "/os-keypairs/cert", e.demo, "2.2", "")

		// Gophercloud, and the key_pairs quota (403 as keypairs.py).
		demo := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.10")
		pages, err := keypairs.List(demo, nil).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kps, err := keypairs.ExtractKeyPairs(pages)
		if err != nil || len(kps) != 3 {
			t.Fatalf("gophercloud list: %d %v", len(kps), err)
		}
		kp, err := keypairs.Get(ctx, demo, "wire-kp2", nil).Extract()
		if err != nil || kp.Fingerprint != wireFingerprint || kp.UserID != demoUser {
			t.Fatalf("gophercloud get %+v %v", kp, err)
		}
		admin := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "")
		demoProject, _ := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		one := 3
		if _, err := quotasets.Update(ctx, admin, demoProject.ID, quotasets.UpdateOpts{KeyPairs: &one}).Extract(); err != nil {
			t.Fatal(err)
		}
		e.fault(403, "Quota exceeded, too many key pairs.", "POST", "/os-keypairs", e.demo, "2.2", `{"keypair":{"name":"over"}}`)
		if err := keypairs.Delete(ctx, demo, "wire-kp2", nil).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		created, err := keypairs.Create(ctx, demo, keypairs.CreateOpts{Name: "gc", PublicKey: wireKey}).Extract()
		if err != nil || created.Fingerprint != wireFingerprint || created.Type != "ssh" {
			t.Fatalf("gophercloud create %+v %v", created, err)
		}
	})
}
