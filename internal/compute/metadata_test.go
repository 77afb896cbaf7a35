package compute_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"nimbus/internal/metadata"
	"nimbus/internal/testenv"
)

// TestMetadataService checks the answers of the metadata service for two
// servers: Nova's listings and files, meta_data.json and
// network_data.json as the server's config drive has them (both come from
// what its driver was given), the EC2 tree, user data present and absent,
// 404 for unknown paths and servers, 405 for a wrong method.
func TestMetadataService(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		sshPub, err := ssh.NewPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))
		kp, _ := json.Marshal(map[string]any{"keypair": map[string]string{"name": "k", "public_key": key}})
		e.must(200, "POST", "/os-keypairs", e.demo, "2.1", string(kp))
		userData := "#cloud-config\nruncmd: [touch /tmp/x]\n"
		// a: user data, a key, metadata and a public IPv4 address.
		a := e.must(202, "POST", "/servers", e.demo, "2.96", `{"server":{"name":"Meta A","imageRef":"`+e.imageID+
			`","flavorRef":"d2.4g.network.ipv4","networks":"auto","key_name":"k","metadata":{"role":"web"},"user_data":"`+
			base64.StdEncoding.EncodeToString([]byte(userData))+`"}}`)["server"].(map[string]any)["id"].(string)
		// b: none of them.
		b := e.must(202, "POST", "/servers", e.demo, "2.96", `{"server":{"name":"meta-b","imageRef":"`+e.imageID+
			`","flavorRef":"p2","networks":"auto"}}`)["server"].(map[string]any)["id"].(string)
		e.wait(a, e.demo, "ACTIVE")
		e.wait(b, e.demo, "ACTIVE")
		sp, ok := e.c.Fake.Spec(a)
		if !ok || len(sp.Ports) != 1 {
			t.Fatalf("spec of a: %v %+v", ok, sp)
		}
		floating := ""
		for _, as := range e.server(a, e.demo, "2.96")["addresses"].(map[string]any) {
			for _, ad := range as.([]any) {
				if m := ad.(map[string]any); m["OS-EXT-IPS:type"] == "floating" {
					floating = m["addr"].(string)
				}
			}
		}
		if floating == "" {
			t.Fatal("server a has no floating address")
		}

		get := func(id, path string) (int, string) {
			t.Helper()
			st, _, body, err := e.c.Compute.Metadata(t.Context(), id, "GET", path, nil)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			return st, string(body)
		}

		// The config drive's files, from what the driver was given.
		drive := metadata.FromSpec(sp)
		drive.AdminPass = "" // a config drive's only
		wantMD, err := drive.MetaData("latest", nil)
		if err != nil {
			t.Fatal(err)
		}
		_, gotMD := get(a, "/openstack/latest/meta_data.json")
		var got, want map[string]any
		json.Unmarshal([]byte(gotMD), &got)
		json.Unmarshal(wantMD, &want)
		if rs, _ := base64.StdEncoding.DecodeString(got["random_seed"].(string)); len(rs) != 512 {
			t.Errorf("random_seed of %d bytes", len(rs))
		}
		delete(got, "random_seed")
		delete(want, "random_seed")
		if !reflect.DeepEqual(got, want) || got["uuid"] != a || got["admin_pass"] != nil {
			t.Errorf("meta_data.json =\n%v\nthe config drive's:\n%v", got, want)
		}
		wantND, err := drive.NetworkData()
		if err != nil {
			t.Fatal(err)
		}
		if _, nd := get(a, "/openstack/latest/network_data.json"); nd != string(wantND) {
			t.Errorf("network_data.json =\n%s\nthe config drive's:\n%s", nd, wantND)
		}

		osVersions := strings.Join(metadata.OpenStackVersions, "\n") + "\nlatest"
		ec2Versions := strings.Join(metadata.EC2Versions, "\n") + "\nlatest"
		cases := []struct {
			server, path string
			status       int
			body         string
		}{
			{a, "/", 200, ec2Versions},
			{a, "/ec2/", 200, ec2Versions},
			{a, "/openstack", 200, osVersions},
			{a, "/openstack/latest/", 200, "meta_data.json\nuser_data\npassword\nvendor_data.json\nnetwork_data.json\nvendor_data2.json"},
			{a, "/openstack/2012-08-10", 200, "meta_data.json\nuser_data"},
			{a, "/openstack/2015-10-15", 200, "meta_data.json\nuser_data\npassword\nvendor_data.json\nnetwork_data.json"},
			{b, "/openstack/latest", 200, "meta_data.json\npassword\nvendor_data.json\nnetwork_data.json\nvendor_data2.json"},
			{a, "/openstack/latest/user_data", 200, userData},
			{a, "/openstack/2012-08-10/user_data", 200, userData},
			{b, "/openstack/latest/user_data", 404, ""},
			{a, "/openstack/latest/vendor_data.json", 200, "{}"},
			{a, "/openstack/latest/vendor_data2.json", 200, "{}"},
			{a, "/openstack/2013-04-04/vendor_data.json", 404, ""},
			{a, "/openstack/2016-06-30/vendor_data2.json", 404, ""},
			{a, "/openstack/2012-08-10/password", 404, ""},
			{a, "/openstack/2099-01-01/meta_data.json", 404, ""},
			{a, "/openstack/latest/nothing", 404, ""},
			{a, "/openstack/content/0000", 404, ""},
			{a, "/latest", 200, "meta-data/\nuser-data"},
			{b, "/latest/", 200, "meta-data/"},
			{a, "/latest/meta-data/", 200, "ami-id\nami-launch-index\nami-manifest-path\nblock-device-mapping/\nhostname\n" +
				"instance-action\ninstance-id\ninstance-type\nlocal-hostname\nlocal-ipv4\nplacement/\npublic-hostname\n" +
				"public-ipv4\npublic-keys/\nreservation-id\nsecurity-groups"},
			{a, "/latest/meta-data/instance-id", 200, metadata.EC2ID("i", a)},
			{a, "/ec2/2009-04-04/meta-data/instance-id", 200, metadata.EC2ID("i", a)},
			{a, "/latest/meta-data/ami-id", 200, metadata.EC2ID("ami", e.imageID)},
			{a, "/latest/meta-data/ami-launch-index", 200, "0"},
			{a, "/latest/meta-data/hostname", 200, "meta-a"},
			{a, "/latest/meta-data/local-hostname", 200, "meta-a"},
			{a, "/latest/meta-data/local-ipv4", 200, sp.Ports[0].IP},
			{a, "/latest/meta-data/public-ipv4", 200, floating},
			{b, "/latest/meta-data/public-ipv4", 200, ""},
			{a, "/latest/meta-data/instance-type", 200, "d2.4g.network.ipv4"},
			{a, "/latest/meta-data/security-groups", 200, "default"},
			{a, "/latest/meta-data/reservation-id", 200, sp.ReservationID},
			{a, "/latest/meta-data/placement", 200, "availability-zone"},
			{a, "/latest/meta-data/placement/availability-zone", 200, sp.Zone},
			{a, "/latest/meta-data/block-device-mapping/root", 200, "/dev/vda"},
			{a, "/latest/meta-data/public-keys", 200, "0=k"},
			{a, "/latest/meta-data/public-keys/0/", 200, "openssh-key"},
			{a, "/latest/meta-data/public-keys/0/openssh-key", 200, key},
			{a, "/latest/meta-data/public-keys/0/_name", 404, ""},
			{b, "/latest/meta-data/public-keys", 404, ""},
			{a, "/latest/user-data", 200, userData},
			{b, "/latest/user-data", 404, ""},
			{a, "/1.0/meta-data/local-hostname", 404, ""},
			{a, "/2007-01-19/meta-data/local-hostname", 200, "meta-a"},
			{a, "/2007-12-15/meta-data/placement", 404, ""},
			{a, "/latest/meta-data/instance-id/more", 404, ""},
			{a, "/2010-01-01/meta-data/", 404, ""},
			{"00000000-0000-0000-0000-000000000000", "/openstack/latest/meta_data.json", 404, ""},
		}
		for _, c := range cases {
			st, body := get(c.server, c.path)
			if st != c.status || (c.status == 200 && body != c.body) {
				t.Errorf("GET %s: %d %q, want %d %q", c.path, st, body, c.status, c.body)
			}
		}
		for _, c := range []struct{ method, path string }{
			{"POST", "/openstack/latest/meta_data.json"}, {"PUT", "/openstack/latest/password"},
			{"DELETE", "/latest/meta-data/instance-id"}, {"POST", "/latest/user-data"},
		} {
			if st, _, _, err := e.c.Compute.Metadata(t.Context(), a, c.method, c.path, nil); err != nil || st != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d %v, want 405", c.method, c.path, st, err)
			}
		}
		if _, ct, _, _ := e.c.Compute.Metadata(t.Context(), a, "GET", "/openstack/latest/meta_data.json", nil); ct != "application/json" {
			t.Errorf("meta_data.json content type %q", ct)
		}
	})
}

// TestMetadataPassword checks the Windows password of the metadata
// service: the guest posts it once (409 after, 400 when too large), reads
// it back, and os-server-password shows and clears the same one.
func TestMetadataPassword(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		id := e.createAs(e.demo, "p2", "")
		e.wait(id, e.demo, "ACTIVE")
		call := func(method, path, body string) (int, string) {
			t.Helper()
			st, _, out, err := e.c.Compute.Metadata(t.Context(), id, method, path, []byte(body))
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			return st, string(out)
		}
		apiPassword := func() string {
			t.Helper()
			return e.must(200, "GET", "/servers/"+id+"/os-server-password", e.demo, "", "")["password"].(string)
		}
		const pw = "c2VjcmV0IGVuY3J5cHRlZCB0byB0aGUga2V5IHBhaXI="
		steps := []struct {
			method, path, body string
			status             int
			want               string // the password after the step
		}{
			{"GET", "/openstack/latest/password", "", 200, ""},
			{"POST", "/openstack/latest/password", strings.Repeat("x", 1021), 400, ""},
			{"POST", "/openstack/latest/password", "\xff\xfe", 400, ""},
			{"POST", "/openstack/latest/password", "", 200, ""},
			{"POST", "/openstack/latest/password", pw, 200, pw},
			{"POST", "/openstack/2013-04-04/password", "other", 409, pw},
			{"POST", "/openstack/2012-08-10/password", "other", 404, pw},
			{"GET", "/openstack/2013-04-04/password", "", 200, pw},
		}
		for _, s := range steps {
			st, _ := call(s.method, s.path, s.body)
			if st != s.status {
				t.Errorf("%s %s %.20q: %d, want %d", s.method, s.path, s.body, st, s.status)
			}
			if _, got := call("GET", "/openstack/latest/password", ""); got != s.want {
				t.Errorf("after %s %s: password %q, want %q", s.method, s.path, got, s.want)
			}
			if got := apiPassword(); got != s.want {
				t.Errorf("after %s %s: os-server-password %q, want %q", s.method, s.path, got, s.want)
			}
		}
		// The largest password Nova takes (four chunks of 255) fits.
		e.must(204, "DELETE", "/servers/"+id+"/os-server-password", e.demo, "", "")
		if _, got := call("GET", "/openstack/latest/password", ""); got != "" {
			t.Errorf("after DELETE the guest reads %q", got)
		}
		long := strings.Repeat("y", 1020)
		if st, _ := call("POST", "/openstack/latest/password", long); st != 200 || apiPassword() != long {
			t.Errorf("a 1020-byte password: %d", st)
		}
		e.must(204, "DELETE", "/servers/"+id, e.demo, "", "")
		e.waitGone(id, e.demo)
		if st, _ := call("GET", "/openstack/latest/password", ""); st != 404 {
			t.Errorf("deleted server: %d, want 404", st)
		}
	})
}
