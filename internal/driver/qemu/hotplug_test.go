package qemu_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/testenv"
)

// TestNICHotplug boots the test guest once under user-mode networking and
// hot-plugs a second NIC: the guest sees eth1 come with the port's MAC
// and go on detach. Attached again, the NIC is in the server's record, so
// a power cycle (a new QEMU) has it from the start; detached then, from
// the pcie-root-port the command line put it on, it is unplugged as
// well, and the record drops it.
func TestNICHotplug(t *testing.T) {
	qemu.NeedQEMU(t)
	guest := testenv.TestGuest(t)
	signer, authorized := testenv.NewSSHKey(t)
	ctx := context.Background()
	const bootTimeout = 120 * time.Second

	store := qemu.NewMemStore(t)
	store.Add("guest-disk", guest.Disk)
	store.Add("guest-kernel", guest.Kernel)
	store.Add("guest-initrd", guest.Initrd)
	image := qemu.RefOf(t, "guest-disk", "qcow2", guest.Disk)
	image.KernelID, image.RamdiskID, image.CommandLine = "guest-kernel", "guest-initrd", guest.Cmdline
	dataDir := t.TempDir()
	d := qemu.NewTestDriver(t, dataDir, store, nil)
	defer d.Close()

	id := uuid.NewString()
	spec := driver.Spec{
		ServerID: id, Name: "hotplug", Hostname: "hotplug", ProjectID: "p", VCPUs: 1, MemoryMB: 256, DiskGB: 1,
		OSType: "linux", KeyName: "k", PublicKey: authorized, Image: image,
		Ports: []driver.Port{{ID: "port-1", MAC: "52:54:00:12:34:56", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1"}},
	}
	second := driver.Port{ID: "port-2", MAC: "52:54:00:ab:cd:02", IP: "10.1.0.5", CIDR: "10.1.0.0/24", Gateway: "10.1.0.1"}
	defer d.Destroy(ctx, id)

	run := func(t *testing.T, cmd string) string {
		t.Helper()
		acc, err := d.Access(ctx, id)
		if err != nil || len(acc) == 0 {
			t.Fatalf("Access: %+v, %v", acc, err)
		}
		cctx, cancel := context.WithTimeout(ctx, bootTimeout)
		defer cancel()
		out, err := testenv.SSH(cctx, net.JoinHostPort(acc[0].Host, strconv.Itoa(acc[0].Port)), "root", signer, cmd)
		if err != nil {
			console, _ := d.ConsoleOutput(ctx, id, 30)
			t.Fatalf("ssh %q: %v (%s)\nconsole:\n%s", cmd, err, out, console)
		}
		return strings.TrimSpace(out)
	}
	// waitNICs waits until the guest's interfaces are want.
	waitNICs := func(t *testing.T, want ...string) {
		t.Helper()
		var got []string
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
			if got = strings.Fields(run(t, "ls /sys/class/net")); slices.Equal(got, want) {
				return
			}
		}
		t.Fatalf("guest interfaces %v, want %v", got, want)
	}
	// recorded are the ports in the server's record on disk.
	recorded := func(t *testing.T) []string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dataDir, "instances", id, "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		var st struct{ Spec driver.Spec }
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, p := range st.Spec.Ports {
			ids = append(ids, p.ID)
		}
		return ids
	}
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	start := time.Now()

	step("boot", func(t *testing.T) {
		if err := d.Spawn(ctx, spec); err != nil {
			t.Fatal(err)
		}
		waitNICs(t, "eth0", "lo")
	})
	step("attach", func(t *testing.T) {
		for range 2 { // the second is a no-op
			if err := d.AttachPort(ctx, id, second); err != nil {
				t.Fatalf("AttachPort: %v", err)
			}
		}
		waitNICs(t, "eth0", "eth1", "lo")
		if mac := run(t, "cat /sys/class/net/eth1/address"); mac != second.MAC {
			t.Errorf("eth1 has MAC %s, want %s", mac, second.MAC)
		}
		if got := recorded(t); !slices.Equal(got, []string{"port-1", "port-2"}) {
			t.Errorf("record has ports %v", got)
		}
	})
	step("detach", func(t *testing.T) {
		for range 2 {
			if err := d.DetachPort(ctx, id, second.ID); err != nil {
				t.Fatalf("DetachPort: %v", err)
			}
		}
		waitNICs(t, "eth0", "lo")
		if got := recorded(t); !slices.Equal(got, []string{"port-1"}) {
			t.Errorf("record has ports %v", got)
		}
	})
	step("attached NIC survives a new QEMU", func(t *testing.T) {
		if err := d.AttachPort(ctx, id, second); err != nil {
			t.Fatalf("AttachPort: %v", err)
		}
		waitNICs(t, "eth0", "eth1", "lo")
		if err := d.PowerOff(ctx, id, false); err != nil {
			t.Fatalf("PowerOff: %v", err)
		}
		if err := d.PowerOn(ctx, id); err != nil {
			t.Fatalf("PowerOn: %v", err)
		}
		waitNICs(t, "eth0", "eth1", "lo")
	})
	step("detach a NIC of the command line", func(t *testing.T) {
		if err := d.DetachPort(ctx, id, second.ID); err != nil {
			t.Fatalf("DetachPort: %v", err)
		}
		waitNICs(t, "eth0", "lo")
		if got := recorded(t); !slices.Equal(got, []string{"port-1"}) {
			t.Errorf("record has ports %v", got)
		}
	})
	t.Logf("VM time: %v", time.Since(start))
}
