package main

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"nimbus/internal/cloud"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// vendorServer is a vendor's download site over HTTPS: image files, a
// SHA256SUMS of what they should be, and a log of the Range headers asked.
type vendorServer struct {
	*httptest.Server
	mu     sync.Mutex
	files  map[string][]byte // what is served
	sums   map[string][]byte // what SHA256SUMS lists
	cut    map[string]bool   // cut the connection halfway through the next full answer
	ranges []string          // the Range header of each image request
	cacert string
}

func newVendorServer(t *testing.T) *vendorServer {
	v := &vendorServer{files: map[string][]byte{}, sums: map[string][]byte{}, cut: map[string]bool{}}
	v.Server = httptest.NewTLSServer(http.HandlerFunc(v.serve))
	t.Cleanup(v.Close)
	v.cacert = filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: v.Certificate().Raw})
	if err := os.WriteFile(v.cacert, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return v
}

// add serves data as name and lists listed's SHA-256 for it.
func (v *vendorServer) add(name string, data, listed []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.files[name], v.sums[name] = data, listed
}

func (v *vendorServer) serve(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	name := strings.TrimPrefix(r.URL.Path, "/images/")
	if r.URL.Path == "/images/SHA256SUMS" {
		for n, b := range v.sums {
			sum := sha256.Sum256(b)
			fmt.Fprintf(w, "%s *%s\n", hex.EncodeToString(sum[:]), n)
		}
		return
	}
	data, ok := v.files[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	v.ranges = append(v.ranges, r.Header.Get("Range"))
	sum := sha256.Sum256(data)
	w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:8])+`"`)
	if v.cut[name] && r.Header.Get("Range") == "" {
		v.cut[name] = false
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		w.Write(data[:len(data)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops
	}
	http.ServeContent(w, r, name, time.Unix(1700000000, 0), bytes.NewReader(data))
}

func (v *vendorServer) takeRanges() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	r := v.ranges
	v.ranges = nil
	return r
}

// randomBytes is n random bytes starting with head.
func randomBytes(n int, head []byte) []byte {
	b := make([]byte, n)
	rand.Read(b)
	copy(b, head)
	return b
}

func md5Hex(b []byte) string { s := md5.Sum(b); return hex.EncodeToString(s[:]) }

// cacheFiles lists what the download cache holds.
func cacheFiles(t *testing.T, cache string) []string {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(cache, "nimbus", "downloads"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestImageImportURL imports from a vendor's HTTPS site into a real cloud:
// verified, refused, resumed, and in place of a catalog placeholder.
func TestImageImportURL(t *testing.T) {
	clearOpenStackEnv(t)
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		dir := c.Config.DataDir
		admin := imageClient(t, c, cloud.AdminUser)
		ctx := context.Background()
		v := newVendorServer(t)
		sums := v.URL + "/images/SHA256SUMS"
		run := func(name string, args ...string) (importOutput, string, error) {
			base := []string{v.URL + "/images/" + name, "--checksums", sums, "--cacert", v.cacert, "--data-dir", dir, "--json"}
			stdout, stderr, err := importImage(ctx, append(base, args...)...)
			var out importOutput
			if err == nil {
				if jerr := json.Unmarshal([]byte(stdout), &out); jerr != nil {
					t.Fatalf("output %q: %v", stdout, jerr)
				}
			}
			return out, stderr, err
		}
		// active checks the image holds exactly data.
		active := func(t *testing.T, id string, data []byte) *images.Image {
			t.Helper()
			img, err := images.Get(ctx, admin, id).Extract()
			if err != nil || img.Status != images.ImageStatusActive || img.SizeBytes != int64(len(data)) || img.Checksum != md5Hex(data) {
				t.Fatalf("image %+v (%v), want active, %d bytes, MD5 %s", img, err, len(data), md5Hex(data))
			}
			return img
		}

		t.Run("good", func(t *testing.T) {
			data := randomBytes(3<<20, qcow2Head())
			v.add("good-cloud.qcow2", data, data)
			out, stderr, err := run("good-cloud.qcow2")
			if err != nil {
				t.Fatalf("import: %v\n%s", err, stderr)
			}
			img := active(t, out.Image.ID, data)
			if img.Name != "good-cloud" || img.DiskFormat != "qcow2" || !strings.Contains(stderr, "100%") {
				t.Fatalf("image %+v, stderr %s", img, stderr)
			}
			if left := cacheFiles(t, cache); len(left) != 0 {
				t.Errorf("the cache keeps %v", left)
			}
		})

		t.Run("corrupted", func(t *testing.T) {
			good := randomBytes(1<<20, nil)
			bad := bytes.Clone(good)
			bad[1000] ^= 0xff
			v.add("corrupt.raw", bad, good)
			_, _, err := run("corrupt.raw")
			if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "sha256") {
				t.Fatalf("corrupted download: %v, want a refusal", err)
			}
			if left := imagesNamed(t, admin, "corrupt"); len(left) != 0 {
				t.Errorf("images left: %+v", left)
			}
			if left := cacheFiles(t, cache); len(left) != 0 {
				t.Errorf("the cache keeps %v", left)
			}
		})

		t.Run("interrupted", func(t *testing.T) {
			data := randomBytes(2<<20+3, nil)
			v.add("cut.raw", data, data)
			v.mu.Lock()
			v.cut["cut.raw"] = true
			v.mu.Unlock()
			v.takeRanges()
			out, stderr, err := run("cut.raw")
			if err != nil {
				t.Fatalf("import: %v\n%s", err, stderr)
			}
			active(t, out.Image.ID, data)
			want := []string{"", fmt.Sprintf("bytes=%d-", len(data)/2)}
			if got := v.takeRanges(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("requests with Range %q, want %q\n%s", got, want, stderr)
			}
		})

		// A rerun finds the partial file of an earlier run: it resumes it
		// when the server's file is the same (ETag), else starts over.
		for _, tc := range []struct {
			name, validator string
			wantRange       bool
		}{
			{"rerun resumes", "", true},
			{"rerun of a file changed since", `"an older file"`, true},
			{"rerun without a validator", "none", false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				name := strings.ReplaceAll(tc.name, " ", "-") + ".raw"
				data := randomBytes(1<<20+11, nil)
				v.add(name, data, data)
				key := sha256.Sum256([]byte(v.URL + "/images/" + name))
				part := filepath.Join(cache, "nimbus", "downloads", hex.EncodeToString(key[:8])+"-"+name+".part")
				os.MkdirAll(filepath.Dir(part), 0o700)
				// The earlier run's bytes: the right ones, or garbage for a changed file.
				old := data[:len(data)/3]
				if tc.validator != "" {
					old = randomBytes(len(data)/3, nil)
				}
				os.WriteFile(part, old, 0o600)
				sum := sha256.Sum256(data)
				validator := `"` + hex.EncodeToString(sum[:8]) + `"`
				if tc.validator == "none" {
					validator = ""
				} else if tc.validator != "" {
					validator = tc.validator
				}
				if validator != "" {
					os.WriteFile(part+".validator", []byte(validator), 0o600)
				}
				v.takeRanges()
				out, stderr, err := run(name)
				if err != nil {
					t.Fatalf("import: %v\n%s", err, stderr)
				}
				active(t, out.Image.ID, data)
				want := []string{""}
				if tc.wantRange {
					want = []string{fmt.Sprintf("bytes=%d-", len(data)/3)}
				}
				if got := v.takeRanges(); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("requests with Range %q, want %q", got, want)
				}
				if left := cacheFiles(t, cache); len(left) != 0 {
					t.Errorf("the cache keeps %v", left)
				}
			})
		}

		t.Run("replace a catalog placeholder", func(t *testing.T) {
			data := randomBytes(2<<20, qcow2Head())
			v.add("noble-server-cloudimg-amd64.img", data, data)
			id := imagecatalog.ID("Ubuntu 24.04")
			before, err := images.Get(ctx, admin, id).Extract()
			if err != nil || before.Properties["nimbus_placeholder"] != "true" {
				t.Fatalf("placeholder %+v: %v", before, err)
			}
			out, stderr, err := run("noble-server-cloudimg-amd64.img", "--name", "Ubuntu 24.04", "--replace",
				"--property", "hw_qemu_guest_agent=yes", "--property", "login_user=ubuntu", "--min-disk", "12")
			if err != nil {
				t.Fatalf("import: %v\n%s", err, stderr)
			}
			img := active(t, id, data)
			if out.Image.ID != id || img.Name != "Ubuntu 24.04" || img.Visibility != before.Visibility ||
				img.MinDiskGigabytes != 12 || img.DiskFormat != "qcow2" || img.Properties["hw_qemu_guest_agent"] != "yes" ||
				img.Properties["os_distro"] != "ubuntu" || img.Properties["login_user"] != "ubuntu" ||
				img.Properties["nimbus_placeholder"] != nil {
				t.Fatalf("after --replace %+v, output %+v", img, out)
			}
			if n := len(imagesNamed(t, admin, "Ubuntu 24.04")); n != 1 {
				t.Fatalf("%d images named Ubuntu 24.04", n)
			}
			rd, err := imagedata.Download(ctx, imageClient(t, c, cloud.DemoUser), id).Extract()
			if err != nil {
				t.Fatal(err)
			}
			back, _ := io.ReadAll(rd)
			rd.Close()
			if !bytes.Equal(back, data) {
				t.Fatalf("downloaded %d bytes back, not the import", len(back))
			}
		})

		t.Run("errors", func(t *testing.T) {
			data := randomBytes(10<<10, nil)
			v.add("unlisted.raw", data, nil)
			v.mu.Lock()
			delete(v.sums, "unlisted.raw")
			v.mu.Unlock()
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{v.URL + "/images/unlisted.raw", "--cacert", v.cacert, "--data-dir", dir}, "needs --checksums"},
				{[]string{v.URL + "/images/unlisted.raw", "--checksums", sums, "--cacert", v.cacert, "--data-dir", dir}, "no line for unlisted.raw"},
				{[]string{v.URL + "/images/unlisted.raw", "--checksums", sums, "--data-dir", dir}, "certificate"},
				{[]string{v.URL + "/images/unlisted.raw", "--checksums", sums, "--signature", sums + ".gpg", "--cacert", v.cacert, "--data-dir", dir}, "needs --keyring"},
				{[]string{v.URL + "/images/gone.raw", "--checksums", v.URL + "/images/gone.SUMS", "--cacert", v.cacert, "--data-dir", dir}, "404"},
			} {
				if _, _, err := importImage(ctx, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("import %v: %v, want an error containing %q", tc.args, err, tc.want)
				}
			}
		})
	})
}

// TestFindSum reads the vendors' checksum lists: GNU lines (text and
// binary mode, paths), BSD lines, the hash kind from the name or length.
func TestFindSum(t *testing.T) {
	s256 := sha256.Sum256([]byte("a"))
	s512 := sha512.Sum512([]byte("a"))
	h256, h512 := hex.EncodeToString(s256[:]), hex.EncodeToString(s512[:])
	for _, tc := range []struct {
		name, list, listName, file string
		want                       expectedSum
		err                        string
	}{
		{"Debian SHA512SUMS", h256[:10] + "  other.qcow2\n" + h512 + "  debian-12-genericcloud-amd64.qcow2\n", "SHA512SUMS", "debian-12-genericcloud-amd64.qcow2", expectedSum{"sha512", h512}, ""},
		{"Ubuntu binary mode", h256 + " *noble-server-cloudimg-amd64.img\n", "SHA256SUMS", "noble-server-cloudimg-amd64.img", expectedSum{"sha256", h256}, ""},
		{"Fedora BSD", "# Fedora-Cloud-41\nSHA256 (Fedora-Cloud-Base-Generic-41.qcow2) = " + h256 + "\n", "Fedora-Cloud-41-x86_64-CHECKSUM", "Fedora-Cloud-Base-Generic-41.qcow2", expectedSum{"sha256", h256}, ""},
		{"by length", strings.ToUpper(h512) + "  x.raw\n", "CHECKSUM", "x.raw", expectedSum{"sha512", h512}, ""},
		{"a path in the list", h256 + "  ./images/x.raw\n", "sha256sum.txt", "x.raw", expectedSum{"sha256", h256}, ""},
		{"missing", h256 + "  y.raw\n" + h256 + "  z.raw\n", "SHA256SUMS", "x.raw", expectedSum{}, "no line for x.raw"},
		{"a per-file sum naming the versioned file", h256 + "  openSUSE-Leap-15.6-Minimal-VM.x86_64-15.6.0-Cloud-Build8.3.qcow2\n",
			"openSUSE-Leap-15.6-Minimal-VM.x86_64-Cloud.qcow2.sha256", "openSUSE-Leap-15.6-Minimal-VM.x86_64-Cloud.qcow2", expectedSum{"sha256", h256}, ""},
		{"wrong length for the list", h256 + "  x.raw\n", "SHA512SUMS", "x.raw", expectedSum{}, "no 128-digit hex"},
		{"not hex", strings.Repeat("z", 64) + "  x.raw\n", "SHA256SUMS", "x.raw", expectedSum{}, "no line for x.raw"},
		{"Fedora clear-signed, one file", "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n# F.qcow2: 5 bytes\nSHA256 (F.qcow2) = " + h256 +
			"\n-----BEGIN PGP SIGNATURE-----\n\niHUEARYKAB0WIQ abc\n-----END PGP SIGNATURE-----\n", "CHECKSUM", "latest.qcow2", expectedSum{"sha256", h256}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findSum([]byte(tc.list), tc.listName, tc.file)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%+v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("%+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestVerifySignature checks a checksum list's detached signature with the
// real gpgv against a keyring made here with gpg.
func TestVerifySignature(t *testing.T) {
	if _, err := exec.LookPath("gpg"); err != nil {
		t.Skip("no gpg to make a key with")
	}
	home := t.TempDir()
	// gpg starts an agent for the home: it goes with the test.
	t.Cleanup(func() { exec.Command("gpgconf", "--homedir", home, "--kill", "all").Run() })
	gpg := func(args ...string) {
		t.Helper()
		cmd := exec.Command("gpg", append([]string{"--homedir", home, "--batch", "--yes", "--passphrase", "", "--pinentry-mode", "loopback"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gpg %v: %v\n%s", args, err, out)
		}
	}
	dir := t.TempDir()
	list := []byte("0123  debian-12-genericcloud-amd64.qcow2\n")
	os.WriteFile(filepath.Join(dir, "SHA512SUMS"), list, 0o600)
	gpg("--quick-gen-key", "Vendor <cloud@vendor.invalid>", "ed25519", "sign", "never")
	gpg("--detach-sign", "-o", filepath.Join(dir, "SHA512SUMS.sign"), filepath.Join(dir, "SHA512SUMS"))
	keyring := filepath.Join(dir, "vendor.gpg")
	gpg("--export", "-o", keyring)
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	for _, tc := range []struct {
		name    string
		list    []byte
		keyring string
		want    string
	}{
		{"good", list, keyring, ""},
		{"a changed list", bytes.Replace(list, []byte("0123"), []byte("4567"), 1), keyring, "does not verify"},
		{"no keyring", list, "", "needs --keyring"},
		{"another key", list, filepath.Join(t.TempDir(), "empty.gpg"), "does not verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "another key" {
				os.WriteFile(tc.keyring, nil, 0o600)
			}
			err := verifySignature(context.Background(), srv.Client(), tc.list, srv.URL+"/SHA512SUMS.sign", tc.keyring)
			if (tc.want == "" && err != nil) || (tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want))) {
				t.Fatalf("%v, want %q", err, tc.want)
			}
		})
	}
}
