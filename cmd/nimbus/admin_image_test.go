package main

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"nimbus/internal/cloud"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// clearOpenStackEnv keeps the tester's own OS_* variables out of a test.
func clearOpenStackEnv(t *testing.T) {
	for _, v := range []string{"OS_CLOUD", "OS_CLIENT_CONFIG_FILE", "OS_AUTH_URL", "OS_USERNAME", "OS_USER_ID", "OS_PASSWORD",
		"OS_PROJECT_NAME", "OS_PROJECT_ID", "OS_TENANT_NAME", "OS_TENANT_ID", "OS_USER_DOMAIN_NAME", "OS_USER_DOMAIN_ID",
		"OS_PROJECT_DOMAIN_NAME", "OS_PROJECT_DOMAIN_ID", "OS_REGION_NAME", "OS_INTERFACE", "OS_CACERT"} {
		t.Setenv(v, "")
	}
}

// imageFile writes a file of size bytes of random data that starts with
// head, and answers its path and MD5.
func imageFile(t *testing.T, name string, size int, head []byte, at int) (string, string) {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	copy(b[at:], head)
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(b)
	return path, hex.EncodeToString(sum[:])
}

// qcow2Head is a qcow2 header: magic, version 3, a virtual size of 8 GiB.
func qcow2Head() []byte {
	h := make([]byte, 32)
	copy(h, "QFI\xfb")
	binary.BigEndian.PutUint32(h[4:], 3)
	binary.BigEndian.PutUint64(h[24:], 8<<30)
	return h
}

func imageClient(t *testing.T, c *cloud.Cloud, user string) *gophercloud.ServiceClient {
	t.Helper()
	sc, err := openstack.NewImageV2(testenv.Provider(t, c, user), gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// importImage runs "nimbus admin image import" with args and answers its
// stdout and stderr.
func importImage(ctx context.Context, args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	err := runAdmin(ctx, append([]string{"image", "import"}, args...), &out, &errOut)
	return out.String(), errOut.String(), err
}

// imagesNamed lists every image called name (admin sees all).
func imagesNamed(t *testing.T, sc *gophercloud.ServiceClient, name string) []images.Image {
	t.Helper()
	pages, err := images.List(sc, images.ListOpts{Name: name}).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all, err := images.ExtractImages(pages)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

type importOutput struct {
	Image    importedImage `json:"image"`
	Replaced []string      `json:"replaced"`
}

// TestImageImport imports files into a real cloud through its clouds.yaml
// and checks with gophercloud what the image service holds.
func TestImageImport(t *testing.T) {
	clearOpenStackEnv(t)
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		dir := c.Config.DataDir
		admin := imageClient(t, c, cloud.AdminUser)
		ctx := context.Background()

		// Every format, name and flag: the image is active with the file's
		// size and checksum, and what the flags said.
		qcow, qcowSum := imageFile(t, "debian-12-genericcloud-amd64.qcow2", 3<<20, qcow2Head(), 0)
		iso, isoSum := imageFile(t, "install.iso", 40<<10, []byte("CD001"), 0x8001)
		raw, rawSum := imageFile(t, "ubuntu-24.04", 100<<10, nil, 0)
		kernel, kernelSum := imageFile(t, "vmlinuz-6.1.aki", 20<<10, nil, 0)
		for _, tc := range []struct {
			name        string
			args        []string
			sum         string
			size        int64
			want        importedImage
			wantProps   map[string]string
			wantVirtual int64
		}{
			{"qcow2 with flags", []string{qcow, "--name", "Debian 12 real", "--os-type", "linux", "--property", "login_user=debian",
				"--property", "img_config_drive=mandatory", "--min-disk", "3", "--min-ram", "512", "--public"},
				qcowSum, 3 << 20,
				importedImage{Name: "Debian 12 real", DiskFormat: "qcow2", ContainerFormat: "bare", Visibility: "public", MinDisk: 3, MinRAM: 512},
				map[string]string{"os_type": "linux", "login_user": "debian", "img_config_drive": "mandatory"}, 8 << 30},
			{"iso detected, name from the file", []string{iso, "--property", "hw_cdrom_bus=sata"}, isoSum, 40 << 10,
				importedImage{Name: "install", DiskFormat: "iso", ContainerFormat: "bare", Visibility: "private"},
				map[string]string{"hw_cdrom_bus": "sata"}, 0},
			{"raw, a version is no extension", []string{raw}, rawSum, 100 << 10,
				importedImage{Name: "ubuntu-24.04", DiskFormat: "raw", ContainerFormat: "bare", Visibility: "private"}, nil, 100 << 10},
			{"kernel", []string{kernel, "--disk-format", "aki", "--property", "os_command_line=console=ttyS0"}, kernelSum, 20 << 10,
				importedImage{Name: "vmlinuz-6.1", DiskFormat: "aki", ContainerFormat: "aki", Visibility: "private"},
				map[string]string{"os_command_line": "console=ttyS0"}, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				stdout, stderr, err := importImage(ctx, append(tc.args, "--data-dir", dir, "--json")...)
				if err != nil {
					t.Fatalf("import: %v\n%s", err, stderr)
				}
				var out importOutput
				if err := json.Unmarshal([]byte(stdout), &out); err != nil {
					t.Fatalf("output %q: %v", stdout, err)
				}
				img, err := images.Get(ctx, admin, out.Image.ID).Extract()
				if err != nil {
					t.Fatal(err)
				}
				w := tc.want
				if img.Status != images.ImageStatusActive || img.SizeBytes != tc.size || img.Checksum != tc.sum ||
					img.Name != w.Name || img.DiskFormat != w.DiskFormat || img.ContainerFormat != w.ContainerFormat ||
					string(img.Visibility) != w.Visibility || img.MinDiskGigabytes != w.MinDisk || img.MinRAMMegabytes != w.MinRAM ||
					img.VirtualSize != tc.wantVirtual {
					t.Fatalf("image %+v, want %+v of %d bytes, MD5 %s, virtual size %d", img, w, tc.size, tc.sum, tc.wantVirtual)
				}
				for k, v := range tc.wantProps {
					if img.Properties[k] != v {
						t.Errorf("property %s = %v, want %q", k, img.Properties[k], v)
					}
				}
				if out.Image.Status != "active" || out.Image.Checksum != tc.sum || out.Image.Size != tc.size || len(out.Replaced) != 0 {
					t.Errorf("JSON output %+v", out)
				}
				if !strings.Contains(stderr, "100%") {
					t.Errorf("progress %q: no 100%%", stderr)
				}
			})
		}

		t.Run("table output and short progress log", func(t *testing.T) {
			stdout, stderr, err := importImage(ctx, qcow, "--name", "log check", "--data-dir", dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"status            active", "checksum          " + qcowSum, "size              3145728 (3.00 MiB)",
				"disk_format       qcow2"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("output lacks %q:\n%s", want, stdout)
				}
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if len(lines) > 11 || strings.Contains(stderr, "\r") || !strings.HasPrefix(lines[len(lines)-1], " 100%") {
				t.Errorf("progress on a non-terminal, %d lines:\n%s", len(lines), stderr)
			}
		})

		t.Run("replace", func(t *testing.T) {
			small, _ := imageFile(t, "small.raw", 10<<10, nil, 0)
			var ids []string
			for range 2 { // duplicates are allowed without --replace
				stdout, _, err := importImage(ctx, small, "--name", "rep", "--property", "login_user=alice", "--min-disk", "2",
					"--data-dir", dir, "--json")
				if err != nil {
					t.Fatal(err)
				}
				var first importOutput
				json.Unmarshal([]byte(stdout), &first)
				ids = append(ids, first.Image.ID)
			}
			if n := len(imagesNamed(t, admin, "rep")); n != 2 {
				t.Fatalf("%d images named rep, want 2", n)
			}
			stdout, _, err := importImage(ctx, raw, "--name", "rep", "--replace", "--data-dir", dir, "--json")
			if err != nil {
				t.Fatal(err)
			}
			var out importOutput
			json.Unmarshal([]byte(stdout), &out)
			left := imagesNamed(t, admin, "rep")
			// One of the two keeps its id with the new data, the other goes.
			if len(left) != 1 || left[0].ID != out.Image.ID || len(out.Replaced) != 2 || out.Replaced[0] != left[0].ID ||
				left[0].Checksum != rawSum || !slices.Contains(ids, left[0].ID) {
				t.Fatalf("after --replace: %+v, output %+v, old ids %v", left, out, ids)
			}
			// The replacement keeps what the image said of itself.
			if left[0].Properties["login_user"] != "alice" || left[0].MinDiskGigabytes != 2 || left[0].Visibility != "private" {
				t.Fatalf("replacement %+v", left[0])
			}

			// A catalog placeholder becomes a real image under its id: the
			// catalog's properties and visibility stay, the placeholder
			// mark goes.
			stdout, _, err = importImage(ctx, qcow, "--name", "Debian 12", "--replace", "--data-dir", dir, "--json")
			if err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(stdout), &out)
			left = imagesNamed(t, admin, "Debian 12")
			if len(left) != 1 || left[0].ID != imagecatalog.ID("Debian 12") || left[0].Checksum != qcowSum || left[0].Visibility != "public" || left[0].Properties["os_type"] != "linux" ||
				left[0].Properties["login_user"] != "debian" || left[0].MinDiskGigabytes != 10 || left[0].DiskFormat != "qcow2" ||
				left[0].Properties["nimbus_placeholder"] != nil || len(out.Replaced) != 1 || out.Replaced[0] != imagecatalog.ID("Debian 12") {
				t.Fatalf("Debian 12 after --replace: %+v, output %+v", left, out)
			}
			// The demo project cannot see, let alone replace, another
			// project's images: its import is a new image.
			demoClouds := filepath.Join(dir, "clouds.yaml")
			stdout, _, err = importImage(ctx, small, "--name", "rep", "--replace", "--os-cloud", "nimbus-demo", "--clouds", demoClouds, "--json")
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(stdout), &out); err != nil || len(out.Replaced) != 0 || len(imagesNamed(t, admin, "rep")) != 2 {
				t.Fatalf("demo's --replace: %+v %v", out, err)
			}
			// Without the admin role the swap is refused: the new upload
			// replaces demo's image under a new id, and is listed.
			demoOld := out.Image.ID
			stdout, _, err = importImage(ctx, raw, "--name", "rep", "--replace", "--os-cloud", "nimbus-demo", "--clouds", demoClouds, "--json")
			if err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(stdout), &out)
			demoImgs := imagesNamed(t, imageClient(t, c, cloud.DemoUser), "rep")
			if out.Image.ID == demoOld || len(out.Replaced) != 1 || out.Replaced[0] != demoOld || len(demoImgs) != 1 ||
				demoImgs[0].ID != out.Image.ID || demoImgs[0].Hidden || demoImgs[0].Checksum != rawSum {
				t.Fatalf("demo's second --replace: %+v, demo sees %+v", out, demoImgs)
			}
		})

		t.Run("openrc variables", func(t *testing.T) {
			t.Setenv("OS_AUTH_URL", c.IdentityURL)
			t.Setenv("OS_USERNAME", cloud.DemoUser)
			t.Setenv("OS_PASSWORD", c.Secrets.DemoPassword)
			t.Setenv("OS_PROJECT_NAME", cloud.DemoProject)
			t.Setenv("OS_USER_DOMAIN_NAME", "Default")
			t.Setenv("OS_PROJECT_DOMAIN_NAME", "Default")
			t.Setenv("OS_CACERT", c.CACertFile)
			t.Setenv("NIMBUS_DATA_DIR", t.TempDir()) // no clouds.yaml: the variables are used
			stdout, _, err := importImage(ctx, raw, "--name", "from openrc", "--json")
			if err != nil {
				t.Fatal(err)
			}
			var out importOutput
			json.Unmarshal([]byte(stdout), &out)
			demo := imageClient(t, c, cloud.DemoUser)
			img, err := images.Get(ctx, demo, out.Image.ID).Extract()
			if err != nil || img.Owner != out.Image.Owner || img.Status != "active" {
				t.Fatalf("demo's image %+v: %v", img, err)
			}
			if _, _, err := importImage(ctx, raw, "--public"); err == nil || !strings.Contains(err.Error(), "403") ||
				!strings.Contains(err.Error(), "publicize_image") {
				t.Fatalf("demo --public: %v, want the policy's refusal", err)
			}
		})

		t.Run("interrupted", func(t *testing.T) {
			big, _ := imageFile(t, "big.raw", 8<<20, nil, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			importProgressHook = func(sent, total int64) {
				if sent >= total/2 {
					cancel() // as Ctrl-C does
				}
			}
			defer func() { importProgressHook = nil }()
			_, _, err := importImage(ctx, big, "--name", "cut short", "--data-dir", dir)
			if err == nil || !strings.Contains(err.Error(), "upload interrupted") || !strings.Contains(err.Error(), "deleted the incomplete image") {
				t.Fatalf("interrupted import: %v", err)
			}
			if left := imagesNamed(t, admin, "cut short"); len(left) != 0 {
				t.Fatalf("the interrupted image is left: %+v", left)
			}
		})

		t.Run("errors", func(t *testing.T) {
			empty := filepath.Join(t.TempDir(), "empty.img")
			os.WriteFile(empty, nil, 0o600)
			badPw := filepath.Join(t.TempDir(), "clouds.yaml")
			y, _ := os.ReadFile(filepath.Join(dir, "clouds.yaml"))
			os.WriteFile(badPw, bytes.ReplaceAll(y, []byte(c.Secrets.AdminPassword), []byte("wrong")), 0o600)
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"/nonexistent/disk.qcow2", "--data-dir", dir}, "no such file: /nonexistent/disk.qcow2"},
				{[]string{dir, "--data-dir", dir}, "is not a regular file"},
				{[]string{empty, "--data-dir", dir}, "is empty"},
				{[]string{raw, "--disk-format", "qcow3", "--data-dir", dir}, `invalid --disk-format "qcow3"`},
				{[]string{raw, "--container-format", "box", "--data-dir", dir}, `invalid --container-format "box"`},
				{[]string{raw, "--property", "name=x", "--data-dir", dir}, "--property name: set it with --name"},
				{[]string{raw, "--property", "size=1", "--data-dir", dir}, "is an image attribute"},
				{[]string{raw, "--property", "novalue", "--data-dir", dir}, "want key=value"},
				{[]string{raw, "--os-type", "macos", "--data-dir", dir}, `invalid --os-type "macos"`},
				{[]string{raw, "--os-type", "linux", "--property", "os_type=windows", "--data-dir", dir}, "disagree"},
				{[]string{raw, "--min-disk", "-1", "--data-dir", dir}, "must not be negative"},
				{[]string{raw, "--data-dir", t.TempDir()}, "no clouds.yaml at"},
				{[]string{raw, "--data-dir", dir, "--os-cloud", "nope"}, `no cloud "nope" in`},
				{[]string{raw, "--clouds", badPw}, "authentication as admin at " + c.IdentityURL + " failed"},
				{[]string{raw, "--clouds", badPw}, "401 Unauthorized"},
				{[]string{raw, "--data-dir", dir, "--database-url", "postgres://x"}, "flag provided but not defined: -database-url"},
				{[]string{"--data-dir", dir}, "want <file|URL>"},
			} {
				if _, _, err := importImage(ctx, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("import %v: %v, want an error containing %q", tc.args, err, tc.want)
				}
			}
			if left := imagesNamed(t, admin, "ubuntu-24.04"); len(left) != 1 { // the first test's
				t.Errorf("failed imports left images: %d named ubuntu-24.04", len(left))
			}
		})
	})
}

func TestImageImportHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := runAdmin(context.Background(), []string{"image", "import", "-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("help: %v", err)
	}
	for _, want := range []string{"Usage: nimbus admin image import <file|URL>", "-replace", "-checksums", "-cacert", "-os-cloud", "-property"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, errOut.String())
		}
	}
	errOut.Reset()
	runAdmin(context.Background(), []string{"-h"}, &out, &errOut)
	if !strings.Contains(errOut.String(), "Image commands:") {
		t.Errorf("admin usage lacks the image commands:\n%s", errOut.String())
	}
}

func TestImageDetectFormat(t *testing.T) {
	iso := make([]byte, importHeadSize)
	copy(iso[0x8001:], "CD001")
	for _, tc := range []struct {
		name string
		head []byte
		want string
	}{
		{"qcow2", qcow2Head(), "qcow2"},
		{"qcow2 magic only", []byte("QFI\xfb"), "qcow2"},
		{"iso", iso, "iso"},
		{"iso descriptor cut off", iso[:0x8003], "raw"},
		{"raw zeros", make([]byte, importHeadSize), "raw"},
		{"tiny", []byte{1}, "raw"},
		{"qcow1 magic is not qcow2", []byte("QFI\xfa"), "raw"},
	} {
		if got := detectDiskFormat(tc.head); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	for path, want := range map[string]string{
		"/x/debian-12-genericcloud-amd64.qcow2": "debian-12-genericcloud-amd64", "ubuntu-24.04": "ubuntu-24.04",
		"ubuntu-24.04.img": "ubuntu-24.04", "vmlinuz": "vmlinuz", ".hidden": ".hidden", "a.b.iso": "a.b",
	} {
		if got := imageNameFromFile(path); got != want {
			t.Errorf("name of %s: %q, want %q", path, got, want)
		}
	}
	// A format given that the file contradicts is used, with a warning.
	o := &importOptions{diskFormat: "raw", props: kvFlag{}}
	p, err := o.plan("d.qcow2", qcow2Head())
	if err != nil || p.diskFormat != "raw" || len(p.warnings) != 1 || !strings.Contains(p.warnings[0], "looks like qcow2") {
		t.Fatalf("raw for a qcow2 file: %+v %v", p, err)
	}
	o = &importOptions{diskFormat: "ari", props: kvFlag{}}
	if p, err := o.plan("initrd.img", []byte("070701")); err != nil || p.containerFormat != "ari" || len(p.warnings) != 0 {
		t.Fatalf("ramdisk: %+v %v", p, err)
	}
}

func TestImageCloudsYAML(t *testing.T) {
	doc := `# comment
clouds:
  nimbus-admin:
    auth:
      auth_url: https://h:5000/v3   # trailing comment
      username: admin
      password: "p\"w: #1\\"
      project_name: 'it''s'
      user_domain_name: Default
    regions:
      - name: RegionOne
        values:
          x: y
      - RegionTwo
    region_name: RegionOne
    cacert: /tmp/ca.pem
    profile: |
      text: not a key
  "quoted cloud":
    auth:
    interface: internal
other: 1
`
	m, err := parseYAMLMap([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	clouds := m["clouds"].(map[string]any)
	a := clouds["nimbus-admin"].(map[string]any)
	auth := a["auth"].(map[string]any)
	want := map[string]string{"auth_url": "https://h:5000/v3", "username": "admin", "password": `p"w: #1\`,
		"project_name": "it's", "user_domain_name": "Default"}
	for k, v := range want {
		if auth[k] != v {
			t.Errorf("auth.%s = %q, want %q", k, auth[k], v)
		}
	}
	if a["region_name"] != "RegionOne" || a["cacert"] != "/tmp/ca.pem" || a["profile"] != "" || m["other"] != "1" {
		t.Errorf("cloud %v, doc %v", a, m)
	}
	q := clouds["quoted cloud"].(map[string]any)
	if q["auth"] != "" || q["interface"] != "internal" {
		t.Errorf("quoted cloud %v", q)
	}
	for _, bad := range []string{"clouds:\n  a: 1\n   b: 2\n", "key without colon\n", "a: \"open\n", "a:\n\tb: 1\n"} {
		if _, err := parseYAMLMap([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestImageProgress: on a terminal the line is redrawn at most ten times
// a second and ends with a newline; elsewhere a line per tenth.
func TestImageProgress(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	b := &progressBar{w: &buf, tty: true, total: 1 << 30, now: func() time.Time { return now }}
	b.start = now
	for i := int64(1); i <= 1000; i++ {
		now = now.Add(10 * time.Millisecond) // 10 s in all
		b.update(i << 20 * 1024 / 1000)
	}
	b.update(1 << 30)
	b.finish()
	s := buf.String()
	if n := strings.Count(s, "\r"); n < 100 || n > 104 || strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") {
		t.Fatalf("%d redraws in 10 s, output ends %q", n, s[max(0, len(s)-100):])
	}
	last := s[strings.LastIndex(s, "\r")+1:]
	if !strings.Contains(last, " 100%  1.00 / 1.00 GiB") || !strings.Contains(last, "in 0:10") {
		t.Fatalf("last line %q", last)
	}
	mid := strings.Split(s, "\r")[50]
	if !strings.Contains(mid, "MiB/s") || !strings.Contains(mid, "ETA 0:0") {
		t.Fatalf("a middle line %q", mid)
	}

	buf.Reset()
	b = &progressBar{w: &buf, total: 3 << 20, now: time.Now}
	b.start = time.Now()
	for sent := int64(32 << 10); sent <= 3<<20; sent += 32 << 10 {
		b.update(sent)
	}
	b.finish()
	if lines := strings.Split(strings.TrimSpace(buf.String()), "\n"); len(lines) != 10 {
		t.Fatalf("%d lines, want 10:\n%s", len(lines), buf.String())
	}
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{{0, "0:00"}, {59 * time.Second, "0:59"}, {61 * time.Second, "1:01"}, {3723 * time.Second, "1:02:03"}} {
		if got := formatETA(tc.d); got != tc.want {
			t.Errorf("ETA %v: %s, want %s", tc.d, got, tc.want)
		}
	}
	if got := fmt.Sprint(formatBytes(1536, 1<<20), " ", formatBytes(512, 512)); got != "0.00 MiB 512 B" {
		t.Errorf("formatBytes: %s", got)
	}
}

// TestImageUploadBody: the file goes out with its length, not chunked, and
// is hashed on the way; after a start-over (gophercloud's reauthentication)
// the hash is of one copy.
func TestImageUploadBody(t *testing.T) {
	path, sum := imageFile(t, "x.raw", 1<<20+7, nil, 0)
	var gotLen int64
	var gotTE []string
	var gotSum string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotLen, gotTE = r.ContentLength, r.TransferEncoding
		h := md5.New()
		io.Copy(h, r.Body)
		gotSum = hex.EncodeToString(h.Sum(nil))
	}))
	defer srv.Close()
	f, size, _, err := openImageFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var log bytes.Buffer
	body := &uploadReader{r: io.NewSectionReader(f, 0, size), size: size, md5: md5.New(), bar: newProgressBar(&log, size)}
	io.CopyN(io.Discard, body, 1000)
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPut, srv.URL, body)
	resp, err := (&http.Client{Transport: sizedTransport{http.DefaultTransport}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if gotLen != size || len(gotTE) != 0 || gotSum != sum || body.sum() != sum {
		t.Fatalf("server got %d bytes (transfer encoding %v) with MD5 %s, reader MD5 %s; want %d bytes, MD5 %s",
			gotLen, gotTE, gotSum, body.sum(), size, sum)
	}
}

// TestIsTerminal: a character device that is not a terminal, such as
// /dev/null, gets the per-tenth lines, not a redraw ten times a second.
func TestIsTerminal(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for name, w := range map[string]io.Writer{"/dev/null": null, "a file": file, "a buffer": &bytes.Buffer{}} {
		if isTerminal(w) {
			t.Errorf("%s is taken for a terminal", name)
		}
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		if !isTerminal(tty) {
			t.Error("/dev/tty is not taken for a terminal")
		}
	}
}
