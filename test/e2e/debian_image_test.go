package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"nimbus/internal/imagebuild"
	"nimbus/internal/testenv"
)

// debianBootTimeout bounds create → SSH login of the Debian image: systemd
// and cloud-init under TCG take about a minute alone, more on a loaded
// machine.
const debianBootTimeout = 8 * time.Minute

// TestDebianImageBuild builds the Debian 12 image with "nimbus admin image
// build debian-12" (cached after the first run: about 2 to 3 minutes cold),
// which replaces the catalog's placeholder, and boots it once with the qemu
// driver under TCG: cloud-init sets the hostname and the key pair's key,
// SSH logs in as debian at the address /access gives, sudo works, the root
// file system has grown to the flavor's 10 GB disk, and the boot partition
// is mounted for kernel updates.
func TestDebianImageBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Debian image and boots it")
	}
	q := startQEMUCloud(t)
	ctx := context.Background()
	r, _ := imagebuild.Lookup("debian-12")
	start := time.Now()
	res, err := imagebuild.Build(ctx, r, imagebuild.Options{Log: testWriter{t}})
	switch {
	case errors.Is(err, imagebuild.ErrMissingTools) && os.Getenv("NIMBUS_REQUIRE_QEMU") != "1":
		t.Skipf("skipping (NIMBUS_REQUIRE_QEMU=1 makes this a failure): %v", err)
	case err != nil:
		t.Fatal(err)
	}
	t.Logf("image %s (cached %v) in %s: %d bytes, virtual %d", res.Image, res.Cached, time.Since(start).Round(time.Second), res.Size, res.VirtualSize)

	placeholder := q.imageNamed(ctx, "Debian 12")
	got := q.runBuildCommand(ctx)
	if got.Image.Name != "Debian 12" || got.Image.Properties["nimbus_build_sha256"] != res.SHA256 ||
		got.Image.Properties["nimbus_placeholder"] == "true" || got.Image.Properties["login_user"] != "debian" ||
		got.Image.Properties["hw_qemu_guest_agent"] != "yes" {
		t.Fatalf("imported %+v; want Debian 12, real, login_user debian, the guest agent, nimbus_build_sha256 %s", got.Image, res.SHA256)
	}
	// The catalog image keeps its id, so flavors, quotes and the panel's
	// choices still name it.
	if got.Image.ID != placeholder {
		t.Errorf("the built image has id %s, want the placeholder's %s", got.Image.ID, placeholder)
	}
	if len(got.Replaced) == 0 || got.Replaced[0] != placeholder {
		t.Errorf("replaced %v, want the placeholder %s", got.Replaced, placeholder)
	}

	signer, pub := testenv.NewSSHKey(t)
	q.key = signer
	if _, err := keypairs.Create(ctx, q.compute, keypairs.CreateOpts{Name: "e2e", PublicKey: pub}).Extract(); err != nil {
		t.Fatal(err)
	}
	flavor := q.flavor(ctx, "e2e.debian", 1, 1024, 10)
	created := time.Now()
	sv := q.create(ctx, "deb-1", got.Image.ID, flavor)
	t.Cleanup(func() { // on failure too: no VM outlives the test
		if len(qemuProcesses(sv.ID)) == 0 {
			return
		}
		servers.Delete(context.Background(), q.compute, sv.ID)
		for deadline := time.Now().Add(vmTimeout); len(qemuProcesses(sv.ID)) > 0 && time.Now().Before(deadline); {
			time.Sleep(250 * time.Millisecond)
		}
	})
	addr, user := q.access(ctx, sv.ID)
	if user != "debian" {
		t.Errorf("/access user %q, want debian", user)
	}
	sctx, cancel := context.WithTimeout(ctx, debianBootTimeout)
	defer cancel()
	out, err := testenv.SSH(sctx, addr, user, q.key, "hostname; id -un; sudo -n id -un; df -B1 --output=size / | tail -n 1; findmnt -n -o FSTYPE /boot/syslinux")
	if err != nil {
		t.Fatalf("ssh %s@%s: %v", user, addr, err)
	}
	t.Logf("create → SSH login as debian in %s", time.Since(created).Round(100*time.Millisecond))
	lines := strings.Fields(out)
	if len(lines) != 5 || lines[0] != "deb-1" || lines[1] != "debian" || lines[2] != "root" || lines[4] != "vfat" {
		t.Fatalf("hostname, user, sudo, root size, boot partition: %q; want deb-1, debian, root, …, vfat", out)
	}
	// A 10 GB disk less the 1 MiB gap and the boot partition, less ext4's
	// own overhead: at least 9 GB, where the image's root is under 1 GB.
	if size, _ := strconv.ParseInt(lines[3], 10, 64); size < 9e9 {
		t.Errorf("root file system is %s bytes, want grown to the 10 GB disk", lines[3])
	}
	q.deleteServer(ctx, sv.ID)
}

// deleteServer deletes server id and waits until it and its QEMU are gone
// (a VM outlives the test process otherwise).
func (q *qemuCloud) deleteServer(ctx context.Context, id string) {
	t := q.t
	t.Helper()
	if err := servers.Delete(ctx, q.compute, id).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, vmTimeout, "server "+id+" and its QEMU gone", func() bool {
		_, err := servers.Get(ctx, q.compute, id).Extract()
		return gophercloud.ResponseCodeIs(err, 404) && len(qemuProcesses(id)) == 0
	})
}

// buildOutput is "nimbus admin image build --json"'s answer.
type buildOutput struct {
	Image struct {
		ID, Name   string
		Properties map[string]string
	} `json:"image"`
	Replaced []string `json:"replaced"`
}

// runBuildCommand runs "nimbus admin image build debian-12" (the built
// binary) against the cloud, with the clouds.yaml it wrote.
func (q *qemuCloud) runBuildCommand(ctx context.Context) buildOutput {
	t := q.t
	bin := filepath.Join(t.TempDir(), "nimbus")
	if out, err := exec.Command("go", "build", "-o", bin, "nimbus/cmd/nimbus").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin, "admin", "image", "build", "debian-12", "--data-dir", q.c.Config.DataDir, "--json")
	cmd.Env = append(os.Environ(), "OS_CLOUD=", "OS_CLIENT_CONFIG_FILE=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("nimbus admin image build debian-12:\n%s", stderr.String())
	if err != nil {
		t.Fatalf("nimbus admin image build: %v", err)
	}
	var got buildOutput
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return got
}

// imageNamed is the id of the one image called name.
func (q *qemuCloud) imageNamed(ctx context.Context, name string) string {
	q.t.Helper()
	pages, err := images.List(q.image, images.ListOpts{Name: name}).AllPages(ctx)
	if err != nil {
		q.t.Fatal(err)
	}
	all, err := images.ExtractImages(pages)
	if err != nil || len(all) != 1 {
		q.t.Fatalf("images named %q: %v, %v", name, all, err)
	}
	return all[0].ID
}

// testWriter logs each write to t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
