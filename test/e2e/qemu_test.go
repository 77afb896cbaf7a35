package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"golang.org/x/crypto/ssh"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// vmTimeout bounds each wait on a real VM: TCG on a loaded two-core
// machine varies by ±50 % (FINDINGS §9).
const vmTimeout = 180 * time.Second

// qemuCloud is a cloud whose local agent runs real VMs with the qemu
// driver on this machine: TCG unless KVM really works, no CPU kept for the
// host (the machine has two), SSH forwarded on loopback.
type qemuCloud struct {
	t       *testing.T
	c       *cloud.Cloud
	admin   *gophercloud.ProviderClient
	demo    *gophercloud.ProviderClient
	compute *gophercloud.ServiceClient
	image   *gophercloud.ServiceClient
	key     ssh.Signer
	guest   testenv.Guest
}

func startQEMUCloud(t *testing.T) *qemuCloud {
	t.Helper()
	guest := testenv.TestGuest(t)
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.DataDir = vmDir(t)
		cfg.Driver = "qemu"
		cfg.QEMU = cloud.QEMUOptions{Accel: "auto", ReservedCPUs: []int{}, ReservedMemoryMB: -1, AccessHost: "127.0.0.1"}
		cfg.AgentHeartbeat = 2 * time.Second
	})
	q := &qemuCloud{t: t, c: c, guest: guest,
		admin: testenv.Provider(t, c, cloud.AdminUser), demo: testenv.Provider(t, c, cloud.DemoUser)}
	q.compute = testenv.Compute(t, q.demo, "2.79")
	var err error
	if q.image, err = openstack.NewImageV2(q.demo, gophercloud.EndpointOpts{}); err != nil {
		t.Fatal(err)
	}
	return q
}

// vmDir is a data directory for a cloud of real VMs. The VMs outlive the
// cloud's close on purpose (they survive a controller's restart), so what
// runs from the directory is killed once the cloud is closed.
func vmDir(t *testing.T) string {
	dir := t.TempDir()
	t.Cleanup(func() { killUnder(dir) })
	return dir
}

// uploadGuest uploads the test guest as three images — its kernel, its
// initrd and its disk, which names the other two as Nova's direct kernel
// boot has it — and returns the disk image's id.
func (q *qemuCloud) uploadGuest(ctx context.Context) string {
	t := q.t
	t.Helper()
	upload := func(name, file, disk, container string, props map[string]string) string {
		img, err := images.Create(ctx, q.image, images.CreateOpts{Name: name, DiskFormat: disk, ContainerFormat: container,
			Properties: props}).Extract()
		if err != nil {
			t.Fatalf("image %s: %v", name, err)
		}
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := imagedata.Upload(ctx, q.image, img.ID, f).ExtractErr(); err != nil {
			t.Fatalf("upload %s: %v", name, err)
		}
		return img.ID
	}
	kernel := upload("guest-kernel", q.guest.Kernel, "aki", "aki", nil)
	initrd := upload("guest-initrd", q.guest.Initrd, "ari", "ari", nil)
	return upload("guest", q.guest.Disk, "qcow2", "bare", map[string]string{
		"kernel_id": kernel, "ramdisk_id": initrd, "os_command_line": q.guest.Cmdline,
		"os_type": "linux", "login_user": "root"})
}

// flavor makes a dedicated-CPU flavor as the operator.
func (q *qemuCloud) flavor(ctx context.Context, name string, vcpus, ramMB, diskGB int) string {
	q.t.Helper()
	admin := testenv.Compute(q.t, q.admin, "2.79")
	f, err := flavors.Create(ctx, admin, flavors.CreateOpts{Name: name, VCPUs: vcpus, RAM: ramMB, Disk: &diskGB}).Extract()
	if err != nil {
		q.t.Fatal(err)
	}
	if _, err := flavors.CreateExtraSpecs(ctx, admin, f.ID, flavors.ExtraSpecsOpts{
		"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local"}).Extract(); err != nil {
		q.t.Fatal(err)
	}
	return f.ID
}

// create boots a server and waits for ACTIVE.
func (q *qemuCloud) create(ctx context.Context, name, image, flavor string) *servers.Server {
	q.t.Helper()
	sv, err := servers.Create(ctx, q.compute, keypairs.CreateOptsExt{
		CreateOptsBuilder: servers.CreateOpts{Name: name, ImageRef: image, FlavorRef: flavor, Networks: "auto"},
		KeyName:           "e2e"}, nil).Extract()
	if err != nil {
		q.t.Fatalf("create %s: %v", name, err)
	}
	return q.waitStatus(ctx, sv.ID, "ACTIVE")
}

func (q *qemuCloud) waitStatus(ctx context.Context, id, want string) *servers.Server {
	q.t.Helper()
	deadline := time.Now().Add(vmTimeout)
	for {
		sv, err := servers.Get(ctx, q.compute, id).Extract()
		if err != nil {
			q.t.Fatalf("server %s: %v", id, err)
		}
		if sv.Status == want && sv.TaskState == "" {
			return sv
		}
		if sv.Status == "ERROR" {
			q.t.Fatalf("server %s went to ERROR: %+v", id, sv.Fault)
		}
		if time.Now().After(deadline) {
			q.t.Fatalf("server %s: %s/%s after %s, want %s", id, sv.Status, sv.TaskState, vmTimeout, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// access is GET /servers/{id}/access's SSH entry.
func (q *qemuCloud) access(ctx context.Context, id string) (addr, user string) {
	q.t.Helper()
	var body struct {
		Access []struct {
			Protocol, Host, User string
			Port                 int
		} `json:"access"`
	}
	if _, err := q.compute.Get(ctx, q.compute.ServiceURL("servers", id, "access"), &body, nil); err != nil {
		q.t.Fatalf("access %s: %v", id, err)
	}
	for _, a := range body.Access {
		if a.Protocol == "ssh" {
			return fmt.Sprintf("%s:%d", a.Host, a.Port), a.User
		}
	}
	q.t.Fatalf("server %s: no ssh access in %+v", id, body.Access)
	return "", ""
}

// ssh runs command on server id as its access entry says.
func (q *qemuCloud) ssh(ctx context.Context, id, command string) string {
	q.t.Helper()
	addr, user := q.access(ctx, id)
	cctx, cancel := context.WithTimeout(ctx, vmTimeout)
	defer cancel()
	out, err := testenv.SSH(cctx, addr, user, q.key, command)
	if err != nil {
		q.t.Fatalf("ssh %s %q: %v", addr, command, err)
	}
	return strings.TrimSpace(out)
}

// qemuProcesses are the live QEMU processes whose command line names id.
func qemuProcesses(id string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmd, []byte("qemu-system")) || !bytes.Contains(cmd, []byte(id)) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && strings.Contains(string(st), ") Z ") {
			pids = append(pids, -pid) // a zombie: reported negated
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// TestQEMUServerLife is the walk through real VMs, through the
// public API with gophercloud: create with a key pair and SSH in (hostname,
// vCPUs, RAM), stop and start, a file that survives shelve and unshelve,
// an image made from the server booting a second server, the console
// output, and a delete that leaves no process and no file.
func TestQEMUServerLife(t *testing.T) {
	q := startQEMUCloud(t)
	ctx := context.Background()
	signer, pub := testenv.NewSSHKey(t)
	q.key = signer
	if _, err := keypairs.Create(ctx, q.compute, keypairs.CreateOpts{Name: "e2e", PublicKey: pub}).Extract(); err != nil {
		t.Fatal(err)
	}
	image := q.uploadGuest(ctx)
	flavor := q.flavor(ctx, "e2e.1c", 1, 256, 1)

	sv := q.create(ctx, "web-1", image, flavor)
	if got := q.ssh(ctx, sv.ID, "hostname"); got != "web-1" {
		t.Errorf("hostname %q, want web-1", got)
	}
	if got := q.ssh(ctx, sv.ID, "nproc"); got != "1" {
		t.Errorf("nproc %q, want 1", got)
	}
	memKB, _ := strconv.Atoi(strings.Fields(q.ssh(ctx, sv.ID, "grep MemTotal /proc/meminfo") + " x 0")[1])
	if memKB < 180*1024 || memKB > 256*1024 {
		t.Errorf("MemTotal %d kB, want a little under 256 MiB", memKB)
	}

	// Stop and start.
	if err := servers.Stop(ctx, q.compute, sv.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	q.waitStatus(ctx, sv.ID, "SHUTOFF")
	if err := servers.Start(ctx, q.compute, sv.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	q.waitStatus(ctx, sv.ID, "ACTIVE")

	// A file survives shelve and unshelve.
	q.ssh(ctx, sv.ID, "echo kept-across-shelve > /root/mark && sync")
	if err := servers.Shelve(ctx, q.compute, sv.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	q.waitStatus(ctx, sv.ID, "SHELVED_OFFLOADED")
	if p := qemuProcesses(sv.ID); len(p) != 0 {
		t.Errorf("shelved server still has QEMU processes %v", p)
	}
	if err := servers.Unshelve(ctx, q.compute, sv.ID, servers.UnshelveOpts{}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	q.waitStatus(ctx, sv.ID, "ACTIVE")
	if got := q.ssh(ctx, sv.ID, "cat /root/mark"); got != "kept-across-shelve" {
		t.Errorf("after unshelve /root/mark is %q", got)
	}

	// An image of the server boots a second server with the same file.
	q.ssh(ctx, sv.ID, "echo in-the-snapshot > /root/snap && sync")
	snapID, err := servers.CreateImage(ctx, q.compute, sv.ID, servers.CreateImageOpts{Name: "web-1-snap"}).ExtractImageID()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(vmTimeout)
	for {
		img, err := images.Get(ctx, q.image, snapID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if img.Status == images.ImageStatusActive {
			if img.DiskFormat != "qcow2" || img.SizeBytes == 0 {
				t.Errorf("snapshot %s: format %s, %d bytes", snapID, img.DiskFormat, img.SizeBytes)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot still %s", img.Status)
		}
		time.Sleep(250 * time.Millisecond)
	}
	q.waitStatus(ctx, sv.ID, "ACTIVE")
	sv2 := q.create(ctx, "web-2", snapID, flavor)
	if got := q.ssh(ctx, sv2.ID, "cat /root/snap; hostname"); got != "in-the-snapshot\nweb-2" {
		t.Errorf("second server: %q", got)
	}

	// Console output is the serial log.
	out, err := servers.ShowConsoleOutput(ctx, q.compute, sv.ID, servers.ShowConsoleOutputOpts{Length: 200}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "nimbus-guest: ready") {
		t.Errorf("console output has no ready marker:\n%s", out)
	}

	// A guest that powers itself off is SHUTOFF, as Nova's power sync has it.
	addr, user := q.access(ctx, sv2.ID)
	_, _ = testenv.SSH(ctx, addr, user, q.key, "poweroff") // the connection may drop as it goes
	q.waitStatus(ctx, sv2.ID, "SHUTOFF")

	// Delete leaves nothing behind.
	for _, id := range []string{sv.ID, sv2.ID} {
		if err := servers.Delete(ctx, q.compute, id).ExtractErr(); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{sv.ID, sv2.ID} {
		deadline := time.Now().Add(vmTimeout)
		for {
			_, err := servers.Get(ctx, q.compute, id).Extract()
			if gophercloud.ResponseCodeIs(err, 404) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("server %s not deleted", id)
			}
			time.Sleep(250 * time.Millisecond)
		}
		if p := qemuProcesses(id); len(p) != 0 {
			t.Errorf("deleted server %s left QEMU processes %v (negative: zombies)", id, p)
		}
		if _, err := os.Stat(filepath.Join(q.c.Config.DataDir, "qemu", "instances", id)); !os.IsNotExist(err) {
			t.Errorf("deleted server %s left its directory (%v)", id, err)
		}
	}
}

// TestQEMUBootFailure: a VM that cannot start puts its server in ERROR
// with the reason as its fault, and frees what the server held. Two
// reasons: an image that is no disk, and an image whose ramdisk_id names
// another project's private image (issue 16: QEMU must never get it).
func TestQEMUBootFailure(t *testing.T) {
	q := startQEMUCloud(t)
	ctx := context.Background()
	_, pub := testenv.NewSSHKey(t)
	if _, err := keypairs.Create(ctx, q.compute, keypairs.CreateOpts{Name: "e2e", PublicKey: pub}).Extract(); err != nil {
		t.Fatal(err)
	}
	flavor := q.flavor(ctx, "e2e.fail", 1, 256, 1)

	broken := q.upload(ctx, q.image, "broken", "qcow2", strings.NewReader(strings.Repeat("not a disk image\n", 4096)), nil)
	q.bootFails(ctx, broken, flavor, "qcow2")

	// The operator's project keeps a private image; the customer cannot
	// see it, and names it as the ramdisk of an image of their own.
	adminImage, err := openstack.NewImageV2(q.admin, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	secret := q.upload(ctx, adminImage, "admin-secret", "raw", strings.NewReader("operator's secret data\n"), nil)
	if _, err := images.Get(ctx, q.image, secret).Extract(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Fatalf("the customer sees the operator's private image: %v", err)
	}
	kf, err := os.Open(q.guest.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	kernel := q.upload(ctx, q.image, "my-kernel", "aki", kf, nil)
	df, err := os.Open(q.guest.Disk)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()
	borrowing := q.upload(ctx, q.image, "borrowing", "qcow2", df, map[string]string{
		"kernel_id": kernel, "ramdisk_id": secret, "os_command_line": q.guest.Cmdline})
	q.bootFails(ctx, borrowing, flavor, "ramdisk_id "+secret)
	if b, err := os.ReadFile(filepath.Join(q.c.Config.DataDir, "qemu", "images", "id-"+secret)); err == nil {
		t.Errorf("the operator's image reached the customer's host cache (%d bytes)", len(b))
	}
}

// upload makes an image through client and stores data in it.
func (q *qemuCloud) upload(ctx context.Context, client *gophercloud.ServiceClient, name, format string, data io.Reader, props map[string]string) string {
	q.t.Helper()
	container := "bare"
	if format == "aki" || format == "ari" {
		container = format
	}
	img, err := images.Create(ctx, client, images.CreateOpts{Name: name, DiskFormat: format, ContainerFormat: container, Properties: props}).Extract()
	if err != nil {
		q.t.Fatalf("image %s: %v", name, err)
	}
	if err := imagedata.Upload(ctx, client, img.ID, data).ExtractErr(); err != nil {
		q.t.Fatalf("upload %s: %v", name, err)
	}
	return img.ID
}

// bootFails creates a server of image and checks that it goes to ERROR
// with a fault that says why, holding no claim and no QEMU process.
func (q *qemuCloud) bootFails(ctx context.Context, image, flavor, why string) {
	t := q.t
	t.Helper()
	sv, err := servers.Create(ctx, q.compute, keypairs.CreateOptsExt{
		CreateOptsBuilder: servers.CreateOpts{Name: "broken", ImageRef: image, FlavorRef: flavor, Networks: "auto"},
		KeyName:           "e2e"}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(vmTimeout)
	var got *servers.Server
	for {
		if got, err = servers.Get(ctx, q.compute, sv.ID).Extract(); err != nil {
			t.Fatal(err)
		}
		if got.Status == "ERROR" || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if got.Status != "ERROR" || !strings.Contains(got.Fault.Message, why) {
		t.Fatalf("server %s: status %s, fault %+v; want ERROR saying %q", sv.ID, got.Status, got.Fault, why)
	}
	var held int
	if err := q.c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM compute_claims WHERE server_id = ?", sv.ID).Scan(&held); err != nil || held != 0 {
		t.Errorf("failed server still holds %d claims (%v)", held, err)
	}
	if p := qemuProcesses(sv.ID); len(p) != 0 {
		t.Errorf("failed server left QEMU processes %v", p)
	}
}
