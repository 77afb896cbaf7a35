package metadata

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func testServer() Server {
	return Server{
		UUID: "6f1c9a52-3b7e-4c1d-9a0e-2f4b8c7d1e05", Name: "Web 1", ProjectID: "p1", AZ: "zone-a",
		LaunchIndex: 2, ReservationID: "r-abc", ImageID: "img-1", InstanceType: "d1.2g", KeyName: "alice",
		PublicKey: "ssh-ed25519 AAAA alice@laptop\n", UserData: []byte("#!/bin/sh\n"), AdminPass: "shown-on-the-drive-only",
		Meta: map[string]string{"role": "web"}, FloatingIP: "203.0.113.7", SecurityGroups: []string{"default", "web"},
		Ports: []Port{{ID: "9a8b7c6d-5e4f-4a3b", NetworkID: "n1", MAC: "FA:16:3E:00:00:01", IP: "10.0.0.5",
			CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", DNS: []string{"10.0.0.53"}, MTU: 1450}},
		Password: "enc",
	}
}

// TestLookup checks the answers to paths of Nova's tree: listings (one
// entry a line, directories with "/"), files by version, the EC2 tree by
// version, cleaned paths, and 404 for what the tree does not have.
func TestLookup(t *testing.T) {
	s := testServer()
	bare := Server{UUID: "u2"}
	nd, _ := s.NetworkData()
	const txt, js = TextPlain, JSON
	cases := []struct {
		srv    *Server
		path   string
		status int
		ctype  string
		body   string
	}{
		{&s, "/", 200, txt, strings.Join(EC2Versions, "\n") + "\nlatest"},
		{&s, "", 200, txt, strings.Join(EC2Versions, "\n") + "\nlatest"},
		{&s, "/openstack/", 200, txt, strings.Join(OpenStackVersions, "\n") + "\nlatest"},
		{&s, "/openstack/latest", 200, txt, "meta_data.json\nuser_data\npassword\nvendor_data.json\nnetwork_data.json\nvendor_data2.json"},
		{&s, "/openstack/2012-08-10/", 200, txt, "meta_data.json\nuser_data"},
		{&s, "/openstack/2013-10-17", 200, txt, "meta_data.json\nuser_data\npassword\nvendor_data.json"},
		{&bare, "/openstack/2016-10-06", 200, txt, "meta_data.json\npassword\nvendor_data.json\nnetwork_data.json\nvendor_data2.json"},
		{&s, "/openstack/latest/user_data", 200, txt, "#!/bin/sh\n"},
		{&bare, "/openstack/latest/user_data", 404, txt, ""},
		{&s, "/openstack/latest/password", 200, txt, "enc"},
		{&s, "/openstack/2012-08-10/password", 404, txt, ""},
		{&s, "/openstack/latest/vendor_data.json", 200, js, "{}"},
		{&s, "/openstack/2013-04-04/vendor_data.json", 404, txt, ""},
		{&s, "/openstack/latest/vendor_data2.json", 200, js, "{}"},
		{&s, "/openstack/2016-06-30/vendor_data2.json", 404, txt, ""},
		{&s, "/openstack/latest/network_data.json", 200, txt, string(nd)},
		{&s, "/openstack/2012-08-10/network_data.json", 200, txt, string(nd)}, // as Nova: unlisted, served
		{&s, "/openstack/2011-01-01/meta_data.json", 404, txt, ""},
		{&s, "/openstack/latest/meta_data.json/x", 404, txt, ""},
		{&s, "/openstack/latest/unknown", 404, txt, ""},
		{&s, "/latest", 200, txt, "meta-data/\nuser-data"},
		{&bare, "/ec2/latest", 200, txt, "meta-data/"},
		{&s, "/latest/meta-data", 200, txt, "ami-id\nami-launch-index\nami-manifest-path\nblock-device-mapping/\nhostname\n" +
			"instance-action\ninstance-id\ninstance-type\nlocal-hostname\nlocal-ipv4\nplacement/\npublic-hostname\n" +
			"public-ipv4\npublic-keys/\nreservation-id\nsecurity-groups"},
		{&s, "/1.0/meta-data", 200, txt, "ami-id\nami-launch-index\nami-manifest-path\nhostname\ninstance-id\nlocal-ipv4\n" +
			"public-keys/\nreservation-id\nsecurity-groups"},
		{&bare, "/2009-04-04/meta-data/", 200, txt, "ami-id\nami-launch-index\nami-manifest-path\nblock-device-mapping/\nhostname\n" +
			"instance-action\ninstance-id\nlocal-hostname\nlocal-ipv4\nplacement/\npublic-hostname\npublic-ipv4\n" +
			"reservation-id\nsecurity-groups"},
		{&s, "/latest/meta-data/instance-id", 200, txt, EC2ID("i", s.UUID)},
		{&s, "/latest/meta-data/ami-id", 200, txt, EC2ID("ami", "img-1")},
		{&s, "/latest/meta-data/ami-launch-index", 200, txt, "2"},
		{&s, "/latest/meta-data/hostname", 200, txt, "web-1"},
		{&s, "/latest/meta-data/local-ipv4", 200, txt, "10.0.0.5"},
		{&s, "/latest/meta-data/public-ipv4", 200, txt, "203.0.113.7"},
		{&s, "/latest/meta-data/security-groups", 200, txt, "default\nweb"},
		{&bare, "/latest/meta-data/security-groups", 200, txt, ""},
		{&s, "/latest/meta-data/instance-type", 200, txt, "d1.2g"},
		{&bare, "/latest/meta-data/instance-type", 404, txt, ""},
		{&s, "/latest/meta-data/placement/", 200, txt, "availability-zone"},
		{&s, "/latest/meta-data/placement/availability-zone", 200, txt, "zone-a"},
		{&s, "/latest/meta-data/block-device-mapping", 200, txt, "ami\nroot"},
		{&s, "/latest/meta-data/public-keys", 200, txt, "0=alice"},
		{&s, "/latest/meta-data/public-keys/0", 200, txt, "openssh-key"},
		{&s, "/latest/meta-data/public-keys/0/openssh-key", 200, txt, "ssh-ed25519 AAAA alice@laptop"},
		{&s, "/latest/meta-data/public-keys/0/_name", 404, txt, ""},
		{&bare, "/latest/meta-data/public-keys", 404, txt, ""},
		{&s, "/latest/user-data", 200, txt, "#!/bin/sh\n"},
		{&bare, "/latest/user-data", 404, txt, ""},
		{&s, "/2007-01-19/meta-data/public-ipv4", 200, txt, "203.0.113.7"},
		{&s, "/1.0/meta-data/public-ipv4", 404, txt, ""},
		{&s, "/2008-02-01/meta-data/instance-action", 404, txt, ""},
		{&s, "/2008-09-01/meta-data/instance-action", 200, txt, "none"},
		{&s, "/latest/meta-data/hostname/more", 404, txt, ""},
		{&s, "/2009-04-05/meta-data/", 404, txt, ""},
		{&s, "/meta-data/", 404, txt, ""},
		// Cleaned as Nova's posixpath.normpath; the query is no part of it.
		{&s, "//latest//meta-data/./placement/../instance-id/", 200, txt, EC2ID("i", s.UUID)},
		{&s, "/../openstack/latest/user_data?x=1", 200, txt, "#!/bin/sh\n"},
	}
	for _, c := range cases {
		a, err := c.srv.Lookup(c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if a.Status != c.status || a.ContentType != c.ctype || (c.status == 200 && string(a.Body) != c.body) {
			t.Errorf("%s: %d %s %q, want %d %s %q", c.path, a.Status, a.ContentType, a.Body, c.status, c.ctype, c.body)
		}
		if a.Password != (c.status == 200 && strings.HasSuffix(c.path, "/password")) {
			t.Errorf("%s: Password = %v", c.path, a.Password)
		}
	}
}

// TestMetaDataJSON checks the service's meta_data.json: what the config
// drive has (but the admin password, which only a config drive shows),
// with a fresh random seed for every answer.
func TestMetaDataJSON(t *testing.T) {
	s := testServer()
	seed := bytes.Repeat([]byte{7}, 512)
	drive, err := s.ConfigDrive(seed)
	if err != nil {
		t.Fatal(err)
	}
	svc := s
	svc.AdminPass = ""
	var seeds []string
	for range 2 {
		a, err := svc.Lookup("/openstack/latest/meta_data.json")
		if err != nil {
			t.Fatal(err)
		}
		var got, want map[string]any
		if err := json.Unmarshal(a.Body, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(drive["openstack/latest/meta_data.json"], &want); err != nil {
			t.Fatal(err)
		}
		if want["admin_pass"] != "shown-on-the-drive-only" || got["admin_pass"] != nil {
			t.Errorf("admin_pass: drive %v, service %v", want["admin_pass"], got["admin_pass"])
		}
		seeds = append(seeds, got["random_seed"].(string))
		delete(got, "random_seed")
		delete(want, "random_seed")
		delete(want, "admin_pass")
		if !reflect.DeepEqual(got, want) {
			t.Errorf("service %v\ndrive %v", got, want)
		}
	}
	if seeds[0] == seeds[1] || len(seeds[0]) != 684 {
		t.Errorf("random seeds %.16q… %.16q…", seeds[0], seeds[1])
	}
}

// TestConfigDriveErrors: a port's bad address fails the drive and the
// service's network_data.json alike.
func TestConfigDriveErrors(t *testing.T) {
	s := testServer()
	s.Ports[0].CIDR = "10.0.0.0"
	if _, err := s.ConfigDrive(nil); err == nil || !strings.Contains(err.Error(), "bad CIDR") {
		t.Errorf("drive: %v", err)
	}
	if _, err := s.Lookup("/openstack/latest/network_data.json"); err == nil {
		t.Error("network_data.json: no error")
	}
	if a, err := s.Lookup("/openstack/latest/meta_data.json"); err != nil || a.Status != http.StatusOK {
		t.Errorf("meta_data.json: %v %v", a.Status, err)
	}
}
