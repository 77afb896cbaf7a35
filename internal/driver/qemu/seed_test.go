package qemu

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"

	"nimbus/internal/driver"
	"nimbus/internal/metadata"
)

// seedSpec is a server with everything the metadata shows.
func seedSpec() driver.Spec {
	return driver.Spec{
		ServerID:      "6f1c9a52-3b7e-4c1d-9a0e-2f4b8c7d1e05",
		Name:          "Web Server 1",
		Hostname:      "web-server-1",
		ProjectID:     "b2c3d4e5f60718293a4b5c6d7e8f9012",
		Zone:          "zone-a",
		ImageID:       "0d9f5c1e-8a7b-4c6d-9e2f-1a3b5c7d9e0f",
		KeyName:       "alice",
		PublicKey:     "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6bnK9b1rVQ5dJ0cYgXsPp5f8x1g2Yq0l3m4n5o6p7 alice@laptop",
		Metadata:      map[string]string{"role": "web"},
		LaunchIndex:   0,
		ReservationID: "r-3fk2x9qa",
		Ports: []driver.Port{
			{ID: "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", NetworkID: "net-uuid-1", MAC: "FA:16:3E:12:34:56", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", DNS: []string{"10.0.0.53", "9.9.9.9"}, MTU: 1450},
			{ID: "1b2c3d4e-5f60-4718-8293-a4b5c6d7e8f9", NetworkID: "net-uuid-2", MAC: "fa:16:3e:ab:cd:ef", IP: "192.168.7.20", CIDR: "192.168.7.0/26", DNS: []string{"9.9.9.9"}},
		},
	}
}

// fixedRandom is a RandomSeed for byte-stable seeds.
var fixedRandom = bytes.Repeat([]byte{0x42}, 512)

// readISO reads back every file of the ISO at path with the same library's
// reader: slash paths (as Linux shows them) → contents, and the label.
func readISO(t *testing.T, path string) (map[string]string, string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := iso9660.OpenImage(f)
	if err != nil {
		t.Fatal(err)
	}
	label, err := img.Label()
	if err != nil {
		t.Fatal(err)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(dir *iso9660.File, prefix string)
	walk = func(dir *iso9660.File, prefix string) {
		children, err := dir.GetChildren()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range children {
			p := prefix + c.Name()
			if c.IsDir() {
				walk(c, p+"/")
				continue
			}
			b, err := io.ReadAll(c.Reader())
			if err != nil {
				t.Fatal(err)
			}
			out[p] = string(b)
		}
	}
	walk(root, "")
	return out, label
}

func writeAndRead(t *testing.T, s Seed) (map[string]string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "seed.iso")
	if err := WriteSeed(path, s); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("seed mode = %v, want 0600", fi.Mode().Perm())
	}
	if fi.Size() != seedMinSize {
		t.Errorf("seed size = %d, want %d (padded)", fi.Size(), seedMinSize)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("temporary files left beside the seed: %v", ents)
	}
	return readISO(t, path)
}

func sortedPaths(m map[string]string) []string {
	var out []string
	for p := range m {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// jsonEqual compares JSON texts by value.
func jsonEqual(t *testing.T, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%s: bad JSON %q: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: bad expected JSON: %v", what, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s =\n%s\nwant\n%s", what, got, want)
	}
}

func TestSeedConfigDriveTree(t *testing.T) {
	sp := seedSpec()
	sp.UserData = []byte("#!/bin/sh\necho hello > /tmp/hello\n")
	files, label := writeAndRead(t, Seed{ConfigDrive: true, Spec: sp, RandomSeed: fixedRandom})
	if label != "config-2" {
		t.Errorf("label = %q, want config-2", label)
	}
	var want []string
	for _, v := range []string{"2012-08-10", "2013-04-04", "2013-10-17", "2015-10-15", "2016-06-30", "2016-10-06", "2017-02-22", "2018-08-27", "2020-10-14", "latest"} {
		d := "openstack/" + v + "/"
		want = append(want, d+"meta_data.json", d+"user_data")
		if v >= "2013-10-17" {
			want = append(want, d+"vendor_data.json")
		}
		if v >= "2015-10-15" {
			want = append(want, d+"network_data.json")
		}
		if v >= "2016-10-06" {
			want = append(want, d+"vendor_data2.json")
		}
	}
	want = append(want, "ec2/2009-04-04/meta-data.json", "ec2/2009-04-04/user-data", "ec2/latest/meta-data.json", "ec2/latest/user-data")
	sort.Strings(want)
	if got := sortedPaths(files); !reflect.DeepEqual(got, want) {
		t.Errorf("tree =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if got := files["openstack/latest/user_data"]; got != string(sp.UserData) {
		t.Errorf("user_data = %q", got)
	}
	if got := files["ec2/latest/user-data"]; got != string(sp.UserData) {
		t.Errorf("ec2 user-data = %q", got)
	}
	for _, p := range []string{"openstack/latest/vendor_data.json", "openstack/latest/vendor_data2.json"} {
		if files[p] != "{}" {
			t.Errorf("%s = %q, want {}", p, files[p])
		}
	}
	seed := base64.StdEncoding.EncodeToString(fixedRandom)
	jsonEqual(t, "openstack/latest/meta_data.json", files["openstack/latest/meta_data.json"], `{
		"uuid": "6f1c9a52-3b7e-4c1d-9a0e-2f4b8c7d1e05",
		"meta": {"role": "web"},
		"public_keys": {"alice": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6bnK9b1rVQ5dJ0cYgXsPp5f8x1g2Yq0l3m4n5o6p7 alice@laptop"},
		"keys": [{"name": "alice", "type": "ssh", "data": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6bnK9b1rVQ5dJ0cYgXsPp5f8x1g2Yq0l3m4n5o6p7 alice@laptop"}],
		"hostname": "web-server-1",
		"name": "Web Server 1",
		"launch_index": 0,
		"availability_zone": "zone-a",
		"random_seed": "`+seed+`",
		"project_id": "b2c3d4e5f60718293a4b5c6d7e8f9012",
		"devices": [],
		"dedicated_cpus": []
	}`)
	jsonEqual(t, "openstack/latest/network_data.json", files["openstack/latest/network_data.json"], `{
		"links": [
			{"id": "tap9a8b7c6d-5e", "vif_id": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "type": "phy", "mtu": 1450, "ethernet_mac_address": "fa:16:3e:12:34:56"},
			{"id": "tap1b2c3d4e-5f", "vif_id": "1b2c3d4e-5f60-4718-8293-a4b5c6d7e8f9", "type": "phy", "mtu": null, "ethernet_mac_address": "fa:16:3e:ab:cd:ef"}
		],
		"networks": [
			{"id": "network0", "type": "ipv4", "link": "tap9a8b7c6d-5e", "ip_address": "10.0.0.5", "netmask": "255.255.255.0",
			 "routes": [{"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "10.0.0.1"}], "network_id": "net-uuid-1",
			 "services": [{"type": "dns", "address": "10.0.0.53"}, {"type": "dns", "address": "9.9.9.9"}]},
			{"id": "network1", "type": "ipv4", "link": "tap1b2c3d4e-5f", "ip_address": "192.168.7.20", "netmask": "255.255.255.192",
			 "routes": [], "network_id": "net-uuid-2",
			 "services": [{"type": "dns", "address": "9.9.9.9"}]}
		],
		"services": [{"type": "dns", "address": "10.0.0.53"}, {"type": "dns", "address": "9.9.9.9"}]
	}`)
	jsonEqual(t, "ec2/latest/meta-data.json", files["ec2/latest/meta-data.json"], `{
		"ami-id": "`+metadata.EC2ID("ami", sp.ImageID)+`",
		"ami-launch-index": 0,
		"ami-manifest-path": "FIXME",
		"block-device-mapping": {"ami": "vda", "root": "/dev/vda"},
		"hostname": "web-server-1",
		"instance-action": "none",
		"instance-id": "`+metadata.EC2ID("i", sp.ServerID)+`",
		"local-hostname": "web-server-1",
		"local-ipv4": "10.0.0.5",
		"placement": {"availability-zone": "zone-a"},
		"public-hostname": "web-server-1",
		"public-ipv4": "",
		"public-keys": {"0": {"openssh-key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6bnK9b1rVQ5dJ0cYgXsPp5f8x1g2Yq0l3m4n5o6p7 alice@laptop"}},
		"reservation-id": "r-3fk2x9qa",
		"security-groups": []
	}`)
	if files["ec2/2009-04-04/meta-data.json"] != files["ec2/latest/meta-data.json"] {
		t.Error("ec2 2009-04-04 and latest differ")
	}
	if id := metadata.EC2ID("i", sp.ServerID); len(id) != 10 || !strings.HasPrefix(id, "i-") {
		t.Errorf("ec2 instance id %q", id)
	}
}

// TestSeedMetaDataVersions checks what each version's meta_data.json has.
func TestSeedMetaDataVersions(t *testing.T) {
	sp := seedSpec()
	sp.Cells = []driver.Cell{{Node: 0, CPUs: []int{2, 3}, MemoryMB: 512}, {Node: 1, CPUs: []int{10}, MemoryMB: 512}}
	files, err := configDriveFiles(Seed{ConfigDrive: true, Spec: sp, RandomSeed: fixedRandom})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		version string
		has     []string
		hasNot  []string
	}{
		{"2012-08-10", []string{"uuid", "hostname", "name", "launch_index", "availability_zone", "public_keys", "keys", "meta"}, []string{"random_seed", "project_id", "devices", "dedicated_cpus", "admin_pass"}},
		{"2013-04-04", []string{"random_seed"}, []string{"project_id", "devices"}},
		{"2015-10-15", []string{"random_seed", "project_id"}, []string{"devices", "dedicated_cpus"}},
		{"2016-06-30", []string{"project_id", "devices"}, []string{"dedicated_cpus"}},
		{"2018-08-27", []string{"devices"}, []string{"dedicated_cpus"}},
		{"2020-10-14", []string{"devices", "dedicated_cpus"}, nil},
		{"latest", []string{"devices", "dedicated_cpus"}, []string{"admin_pass"}},
	}
	for _, c := range cases {
		t.Run(c.version, func(t *testing.T) {
			var md map[string]any
			if err := json.Unmarshal(files["openstack/"+c.version+"/meta_data.json"], &md); err != nil {
				t.Fatal(err)
			}
			for _, k := range c.has {
				if _, ok := md[k]; !ok {
					t.Errorf("no %s in %v", k, md)
				}
			}
			for _, k := range c.hasNot {
				if _, ok := md[k]; ok {
					t.Errorf("%s in %v", k, md)
				}
			}
			if cpus, ok := md["dedicated_cpus"]; ok && !reflect.DeepEqual(cpus, []any{2.0, 3.0, 10.0}) {
				t.Errorf("dedicated_cpus = %v", cpus)
			}
		})
	}
}

func TestSeedOptionalFields(t *testing.T) {
	bare := driver.Spec{ServerID: "srv-1", Name: "Bare_Box.local"}
	cases := []struct {
		name   string
		seed   Seed
		label  string
		check  map[string]string // meta_data.json key → JSON value ("" must be absent)
		noFile []string
	}{
		{"windows with admin pass", Seed{Windows: true, Spec: func() driver.Spec { s := seedSpec(); s.AdminPass = "S3cret!pw"; return s }()}, "config-2",
			map[string]string{"admin_pass": `"S3cret!pw"`}, nil},
		{"windows without admin pass", Seed{Windows: true, Spec: seedSpec()}, "config-2",
			map[string]string{"admin_pass": ""}, []string{"openstack/latest/user_data", "ec2/latest/user-data"}},
		{"linux config drive with admin pass", Seed{ConfigDrive: true, Spec: func() driver.Spec { s := seedSpec(); s.AdminPass = "pw"; return s }()}, "config-2",
			map[string]string{"admin_pass": `"pw"`}, nil},
		{"bare server", Seed{ConfigDrive: true, Spec: bare}, "config-2",
			map[string]string{"hostname": `"bare-box-local"`, "availability_zone": "null", "public_keys": "", "keys": "", "meta": "", "admin_pass": "", "project_id": `""`},
			[]string{"openstack/latest/user_data", "openstack/2012-08-10/user_data", "ec2/latest/user-data"}},
		{"key without a name", Seed{ConfigDrive: true, Spec: driver.Spec{ServerID: "srv-2", PublicKey: "ssh-rsa AAAA k\n"}}, "config-2",
			map[string]string{"public_keys": `{"default":"ssh-rsa AAAA k"}`, "hostname": `"server-srv-2"`}, nil},
		{"empty user data is user data", Seed{ConfigDrive: true, Spec: driver.Spec{ServerID: "srv-3", UserData: []byte{}}}, "config-2", nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.seed.RandomSeed = fixedRandom
			files, label, err := seedFiles(c.seed)
			if err != nil {
				t.Fatal(err)
			}
			if label != c.label {
				t.Errorf("label = %q, want %q", label, c.label)
			}
			var md map[string]json.RawMessage
			if err := json.Unmarshal(files["openstack/latest/meta_data.json"], &md); err != nil {
				t.Fatal(err)
			}
			for k, want := range c.check {
				got, ok := md[k]
				switch {
				case want == "" && ok:
					t.Errorf("%s = %s, want it absent", k, got)
				case want != "" && !ok:
					t.Errorf("no %s", k)
				case want != "" && string(got) != want:
					t.Errorf("%s = %s, want %s", k, got, want)
				}
			}
			for _, p := range c.noFile {
				if _, ok := files[p]; ok {
					t.Errorf("%s present", p)
				}
			}
			if c.seed.Spec.UserData != nil {
				if got, ok := files["openstack/latest/user_data"]; !ok || !bytes.Equal(got, c.seed.Spec.UserData) {
					t.Errorf("user_data = %q, %v", got, ok)
				}
			}
		})
	}
}

func TestSeedNoCloud(t *testing.T) {
	cases := []struct {
		name     string
		spec     driver.Spec
		metaData string
		userData string
	}{
		{"key, no user data", seedSpec(),
			"instance-id: \"6f1c9a52-3b7e-4c1d-9a0e-2f4b8c7d1e05\"\nlocal-hostname: web-server-1\npublic-keys:\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6bnK9b1rVQ5dJ0cYgXsPp5f8x1g2Yq0l3m4n5o6p7 alice@laptop\n",
			"#cloud-config\nhostname: web-server-1\nssh_authorized_keys:\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6bnK9b1rVQ5dJ0cYgXsPp5f8x1g2Yq0l3m4n5o6p7 alice@laptop\n"},
		{"user data as is", func() driver.Spec {
			s := seedSpec()
			s.UserData = []byte("#cloud-config\npackages: [nginx]\n")
			return s
		}(),
			"instance-id: \"6f1c9a52-3b7e-4c1d-9a0e-2f4b8c7d1e05\"\nlocal-hostname: web-server-1\npublic-keys:\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6bnK9b1rVQ5dJ0cYgXsPp5f8x1g2Yq0l3m4n5o6p7 alice@laptop\n",
			"#cloud-config\npackages: [nginx]\n"},
		{"no key, odd values quoted", driver.Spec{ServerID: "srv-9", Hostname: "yes"},
			"instance-id: srv-9\nlocal-hostname: \"yes\"\n",
			"#cloud-config\nhostname: \"yes\"\n"},
		{"two keys, a comment with a colon", driver.Spec{ServerID: "a1", Hostname: "h1", PublicKey: "ssh-rsa AAAA one\nssh-rsa BBBB two: x #3\n"},
			"instance-id: a1\nlocal-hostname: h1\npublic-keys:\n  - ssh-rsa AAAA one\n  - \"ssh-rsa BBBB two: x #3\"\n",
			"#cloud-config\nhostname: h1\nssh_authorized_keys:\n  - ssh-rsa AAAA one\n  - \"ssh-rsa BBBB two: x #3\"\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			files, label := writeAndRead(t, Seed{Spec: c.spec})
			if label != "cidata" {
				t.Errorf("label = %q, want cidata", label)
			}
			if got := sortedPaths(files); !reflect.DeepEqual(got, []string{"meta-data", "user-data"}) {
				t.Errorf("tree = %v", got)
			}
			if files["meta-data"] != c.metaData {
				t.Errorf("meta-data =\n%s\nwant\n%s", files["meta-data"], c.metaData)
			}
			if files["user-data"] != c.userData {
				t.Errorf("user-data =\n%s\nwant\n%s", files["user-data"], c.userData)
			}
		})
	}
}

// TestSeedDeterministic: the same seed gives the same bytes (the volume
// dates are fixed), and the dates are ECMA-119's "not specified".
func TestSeedDeterministic(t *testing.T) {
	dir := t.TempDir()
	for _, cd := range []bool{true, false} {
		s := Seed{ConfigDrive: cd, Spec: seedSpec(), RandomSeed: fixedRandom}
		a, b := filepath.Join(dir, "a.iso"), filepath.Join(dir, "b.iso")
		if err := WriteSeed(a, s); err != nil {
			t.Fatal(err)
		}
		if err := WriteSeed(b, s); err != nil {
			t.Fatal(err)
		}
		ba, _ := os.ReadFile(a)
		bb, _ := os.ReadFile(b)
		if !bytes.Equal(ba, bb) {
			t.Errorf("config drive %v: two writes differ", cd)
		}
		for _, off := range pvdTimestamps {
			if got := ba[off : off+17]; !bytes.Equal(got, unspecifiedDate) {
				t.Errorf("date at %d = %q", off, got)
			}
		}
		// Overwriting an existing seed works (atomic replace).
		s.Spec.Hostname = "other"
		if err := WriteSeed(a, s); err != nil {
			t.Fatal(err)
		}
		if files, _ := readISO(t, a); !cd && !strings.Contains(files["meta-data"], "local-hostname: other\n") {
			t.Errorf("rewritten meta-data = %q", files["meta-data"])
		}
	}
	// Without RandomSeed, random_seed is 512 random bytes.
	files, _, err := seedFiles(Seed{ConfigDrive: true, Spec: seedSpec()})
	if err != nil {
		t.Fatal(err)
	}
	var md struct {
		RandomSeed []byte `json:"random_seed"`
	}
	if err := json.Unmarshal(files["openstack/latest/meta_data.json"], &md); err != nil || len(md.RandomSeed) != 512 || bytes.Equal(md.RandomSeed, fixedRandom) {
		t.Errorf("random_seed: %d bytes, %v", len(md.RandomSeed), err)
	}
}

func TestSeedErrors(t *testing.T) {
	sp := seedSpec()
	sp.Ports[1].CIDR = "nonsense"
	if err := WriteSeed(filepath.Join(t.TempDir(), "seed.iso"), Seed{ConfigDrive: true, Spec: sp}); err == nil || !strings.Contains(err.Error(), "bad CIDR") {
		t.Errorf("bad CIDR: err = %v", err)
	}
	if err := WriteSeed(filepath.Join(t.TempDir(), "missing", "seed.iso"), Seed{Spec: seedSpec()}); err == nil {
		t.Error("no error for a missing directory")
	}
}

func TestSeedIPv6Network(t *testing.T) {
	md := seedMetadata(Seed{Spec: driver.Spec{Ports: []driver.Port{{ID: "p", MAC: "fa:16:3e:00:00:01", IP: "fd00::5", CIDR: "fd00::/64", Gateway: "fd00::1"}}}})
	nd, err := md.NetworkData()
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Networks json.RawMessage }
	if err := json.Unmarshal(nd, &got); err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, "networks", string(got.Networks), `[{"id": "network0", "type": "ipv6", "link": "tapp", "ip_address": "fd00::5", "netmask": "ffff:ffff:ffff:ffff::",
		"routes": [{"network": "::", "netmask": "::", "gateway": "fd00::1"}], "network_id": ""}]`)
}

// TestSeedAgreesWithMetadataService checks that a config drive says what
// the metadata service answers for the same server: every openstack file
// the same (meta_data.json but its random seed and the admin password,
// which only the drive shows), and every leaf of ec2 meta-data.json the
// service's answer at that path.
func TestSeedAgreesWithMetadataService(t *testing.T) {
	sp := seedSpec()
	sp.UserData = []byte("#cloud-config\n")
	sp.AdminPass = "drive-only"
	sp.Cells = []driver.Cell{{Node: 0, CPUs: []int{4, 5}}}
	s := Seed{ConfigDrive: true, Spec: sp, RandomSeed: fixedRandom, RootDevice: "/dev/sda"}
	files, _, err := seedFiles(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(files["ec2/latest/meta-data.json"]), `"root":"/dev/sda"`) {
		t.Errorf("the drive's root device: %s", files["ec2/latest/meta-data.json"])
	}
	svc := seedMetadata(s)
	svc.AdminPass = ""
	lookup := func(path string) string {
		t.Helper()
		a, err := svc.Lookup(path)
		if err != nil || a.Status != 200 {
			t.Fatalf("GET %s: %d %v", path, a.Status, err)
		}
		return string(a.Body)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, sub := range v {
				walk(path+"/"+k, sub)
			}
		case []any:
			var lines []string
			for _, x := range v {
				lines = append(lines, x.(string))
			}
			if got := lookup(path); got != strings.Join(lines, "\n") {
				t.Errorf("%s: service %q, drive %v", path, got, v)
			}
		case float64:
			if got := lookup(path); got != strconv.Itoa(int(v)) {
				t.Errorf("%s: service %q, drive %v", path, got, v)
			}
		default:
			if got := lookup(path); got != v {
				t.Errorf("%s: service %q, drive %q", path, got, v)
			}
		}
	}
	for path, body := range files {
		switch {
		case strings.HasSuffix(path, "/meta_data.json"):
			var drive, got map[string]any
			json.Unmarshal(body, &drive)
			json.Unmarshal([]byte(lookup(path)), &got)
			if drive["admin_pass"] != "drive-only" {
				t.Errorf("%s: admin_pass %v", path, drive["admin_pass"])
			}
			for _, k := range []string{"random_seed", "admin_pass"} {
				delete(drive, k)
				delete(got, k)
			}
			if !reflect.DeepEqual(drive, got) {
				t.Errorf("%s: service %v, drive %v", path, got, drive)
			}
		case strings.HasSuffix(path, "/meta-data.json"):
			var md map[string]any
			json.Unmarshal(body, &md)
			walk(strings.TrimSuffix(path, ".json"), md)
		default:
			if got := lookup(path); got != string(body) {
				t.Errorf("%s: service %q, drive %q", path, got, body)
			}
		}
	}
}
