package qemu_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"nimbus/internal/cloud"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// TestPlaceholderRefused: a server of a catalog image whose data is still
// the placeholder never reaches QEMU on the qemu driver. It ends in ERROR
// with a fault naming the image, why, and the command that fixes it; its
// host's CPUs and RAM are free again, it is never charged, and no QEMU
// process ran. No VM boots here.
func TestPlaceholderRefused(t *testing.T) {
	qemu.NeedQEMU(t)
	testenv.ForEachEngine(t, testPlaceholderRefused)
}

func testPlaceholderRefused(t *testing.T, dbURL string) {
	// QEMU's unix sockets under the data directory allow 107 bytes: the
	// subtest's own TempDir is too long.
	dir, err := os.MkdirTemp("", "ph")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := testenv.StartCloud(t, dbURL, func(cfg *cloud.Config) {
		cfg.DataDir = dir
		cfg.Driver = "qemu"
		cfg.QEMU = cloud.QEMUOptions{Accel: "tcg", ReservedCPUs: []int{}, ReservedMemoryMB: -1, AccessHost: "127.0.0.1"}
		cfg.AgentHeartbeat = 2 * time.Second
	})
	ctx := context.Background()
	admin := testenv.Compute(t, testenv.Provider(t, c, cloud.AdminUser), "2.79")
	demo := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.79")
	if _, err := flavors.Create(ctx, admin, flavors.CreateOpts{Name: "ph.small", ID: "ph.small", VCPUs: 1, RAM: 512,
		Disk: gophercloud.IntToPointer(10)}).Extract(); err != nil {
		t.Fatal(err)
	}
	before := hostUsage(t, admin)

	const name = "Ubuntu 24.04"
	start := time.Now()
	sv, err := servers.Create(ctx, demo, servers.CreateOpts{Name: "ph", ImageRef: imagecatalog.ID(name),
		FlavorRef: "ph.small", Networks: "auto"}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	got := waitError(t, demo, sv.ID)
	t.Logf("create → ERROR in %v", time.Since(start).Round(time.Millisecond))
	for _, want := range []string{`"` + name + `"`, imagecatalog.PlaceholderReason,
		`nimbus admin image import --replace --name "Ubuntu 24.04" --checksums https://cloud-images.ubuntu.com/noble/current/SHA256SUMS ` +
			"https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"} {
		if !strings.Contains(got.Fault.Message, want) {
			t.Errorf("fault %q does not say %q", got.Fault.Message, want)
		}
	}
	if after := hostUsage(t, admin); after != before {
		t.Errorf("host usage %+v after the failed build, %+v before", after, before)
	}
	var claims int
	if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM compute_claims WHERE server_id = ?", sv.ID).Scan(&claims); err != nil || claims != 0 {
		t.Errorf("failed server holds %d claims (%v)", claims, err)
	}
	if _, err := c.Billing.ChargeUntil(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"metering_periods", "billing_ledger"} {
		var n int
		if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM "+table+" WHERE resource_id = ?", sv.ID).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d rows for a server that never ran (%v)", table, n, err)
		}
	}
	if p := qemuPids(sv.ID); len(p) != 0 {
		t.Errorf("QEMU processes %v for a placeholder", p)
	}
	if _, err := os.Stat(filepath.Join(c.Config.DataDir, "qemu", "instances", sv.ID)); !os.IsNotExist(err) {
		t.Errorf("instance directory left behind (%v)", err)
	}
	// Refused before anything was prepared: not even the data was fetched.
	if cached, _ := os.ReadDir(filepath.Join(c.Config.DataDir, "qemu", "images")); len(cached) != 0 {
		t.Errorf("the placeholder's data reached the host's image cache: %v", cached)
	}
}

type usage struct{ vcpus, ramMB int }

// hostUsage is the hypervisors' vCPUs and RAM in use, summed.
func hostUsage(t *testing.T, admin *gophercloud.ServiceClient) usage {
	t.Helper()
	pages, err := hypervisors.List(admin, nil).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hs, err := hypervisors.ExtractHypervisors(pages)
	if err != nil {
		t.Fatal(err)
	}
	var u usage
	for _, h := range hs {
		u.vcpus += h.VCPUsUsed
		u.ramMB += h.MemoryMBUsed
	}
	return u
}

// waitError waits for a server to reach ERROR.
func waitError(t *testing.T, sc *gophercloud.ServiceClient, id string) *servers.Server {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		sv, err := servers.Get(context.Background(), sc, id).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if sv.Status == "ERROR" {
			return sv
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s: status %s, want ERROR", id, sv.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// qemuPids are the live QEMU processes whose command line names id.
func qemuPids(id string) []string {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, f := range dirs {
		cmd, err := os.ReadFile(f)
		if err == nil && bytes.Contains(cmd, []byte("qemu-system")) && bytes.Contains(cmd, []byte(id)) {
			out = append(out, filepath.Base(filepath.Dir(f)))
		}
	}
	return out
}
