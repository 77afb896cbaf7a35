package qemu_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/testenv"
)

// TestGuestLifecycle runs the tiny test guest (testenv.TestGuest) through
// everything a server goes through, on one VM booted by direct kernel boot
// and a second one booted from disk (SeaBIOS) off the first one's
// snapshot. Steps run in order and share the VM: a failure stops the rest.
// Under TCG on two cores it takes about two minutes.
func TestGuestLifecycle(t *testing.T) {
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
	events := qemu.NewPowerEvents()
	newDriver := func() *qemu.Driver {
		d := qemu.NewTestDriver(t, dataDir, store, func(c *qemu.Config) { c.ShutdownTimeout = 60 * time.Second })
		d.SetPowerListener(events.Listen)
		return d
	}
	d := newDriver()
	defer func() { d.Close() }()

	host := qemu.ThisHost()
	pcpu := host.CPUs[len(host.CPUs)-1].ID
	id := uuid.NewString()
	spec := driver.Spec{
		ServerID: id, Name: "vm-one", Hostname: "nimbus-one", ProjectID: "p", VCPUs: 1, MemoryMB: 256, DiskGB: 1,
		OSType: "linux", KeyName: "k", PublicKey: authorized, Image: image,
		Cells: []driver.Cell{{Node: 0, CPUs: []int{pcpu}, MemoryMB: 256}},
		Ports: []driver.Port{{ID: "port-1", MAC: "52:54:00:12:34:56", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", DNS: []string{"10.0.0.3"}}},
	}

	// run runs a command in a guest over its forwarded SSH port.
	run := func(t *testing.T, d *qemu.Driver, id, cmd string) string {
		t.Helper()
		acc, err := d.Access(ctx, id)
		if err != nil || len(acc) == 0 {
			t.Fatalf("Access: %+v, %v", acc, err)
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := testenv.SSH(cctx, net.JoinHostPort(acc[0].Host, strconv.Itoa(acc[0].Port)), "root", signer, cmd)
		if err != nil {
			t.Fatalf("ssh %q: %v (%s)", cmd, err, out)
		}
		return strings.TrimSpace(out)
	}
	// waitSSH waits until the guest answers SSH with the seeded key.
	waitSSH := func(t *testing.T, d *qemu.Driver, id string, since time.Time) time.Duration {
		t.Helper()
		acc, err := d.Access(ctx, id)
		if err != nil || len(acc) == 0 {
			t.Fatalf("Access: %+v, %v", acc, err)
		}
		addr := net.JoinHostPort(acc[0].Host, strconv.Itoa(acc[0].Port))
		cctx, cancel := context.WithTimeout(ctx, bootTimeout)
		defer cancel()
		if _, err := testenv.SSH(cctx, addr, "root", signer, "true"); err != nil {
			out, _ := d.ConsoleOutput(ctx, id, 30)
			t.Fatalf("no SSH to %s within %v: %v\nconsole:\n%s", addr, bootTimeout, err, out)
		}
		return time.Since(since)
	}
	bootID := func(t *testing.T, d *qemu.Driver, id string) string {
		return run(t, d, id, "cat /proc/sys/kernel/random/boot_id")
	}
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	var boot1 string
	step("spawn", func(t *testing.T) {
		start := time.Now()
		if err := d.Spawn(ctx, spec); err != nil {
			t.Fatalf("Spawn: %v", err)
		}
		t.Logf("spawn → QMP up: %v", time.Since(start))
		t.Logf("spawn → SSH: %v", waitSSH(t, d, id, start))
		if got := run(t, d, id, "hostname"); got != "nimbus-one" {
			t.Errorf("hostname %q", got)
		}
		if got := run(t, d, id, "nproc"); got != "1" {
			t.Errorf("nproc %q", got)
		}
		memKB, _ := strconv.Atoi(strings.Fields(run(t, d, id, "grep MemTotal /proc/meminfo"))[1])
		if memKB < 256*1024*6/10 || memKB > 256*1024 {
			t.Errorf("MemTotal %d kB for 256 MB", memKB)
		}
		tids, err := d.VCPUThreads(ctx, id)
		if err != nil || len(tids) != 1 {
			t.Fatalf("vCPU threads %v, %v", tids, err)
		}
		if got := qemu.Affinity(t, tids[0]); got != strconv.Itoa(pcpu) {
			t.Errorf("vCPU thread on CPUs %q, want %d", got, pcpu)
		}
		if len(host.ReservedCPUs) > 0 {
			if got := qemu.Affinity(t, d.Pid(t, id)); got != "0" {
				t.Errorf("emulator thread on CPUs %q, want the reserved 0", got)
			}
		}
		out, err := d.ConsoleOutput(ctx, id, 0)
		if err != nil || !strings.Contains(out, "nimbus-guest: ready") {
			t.Errorf("console has no ready marker (%v):\n%s", err, out)
		}
		if out, _ := d.ConsoleOutput(ctx, id, 2); strings.Count(out, "\n") != 2 {
			t.Errorf("ConsoleOutput(2) = %q", out)
		}
		boot1 = bootID(t, d, id)
	})

	step("pause", func(t *testing.T) {
		if err := d.Pause(ctx, id); err != nil {
			t.Fatal(err)
		}
		wantState(t, d, id, driver.Paused)
		if err := d.Unpause(ctx, id); err != nil {
			t.Fatal(err)
		}
		wantState(t, d, id, driver.Running)
		run(t, d, id, "true")
	})

	snapID := "snap-1"
	step("snapshot", func(t *testing.T) {
		run(t, d, id, "echo kept-by-snapshot > /root/marker && sync")
		start := time.Now()
		size, err := d.Snapshot(ctx, id, snapID)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("snapshot: %v, %d bytes", time.Since(start), size)
		path, format := store.Uploaded(snapID)
		if path == "" || format != "qcow2" {
			t.Fatalf("upload: %q %q", path, format)
		}
		info := imgInfo(t, path)
		if info["format"] != "qcow2" || info["backing-filename"] != nil {
			t.Errorf("snapshot is not a standalone qcow2: %v", info)
		}
		if fi, _ := os.Stat(path); fi.Size() != size {
			t.Errorf("size %d, uploaded %d", size, fi.Size())
		}
		wantState(t, d, id, driver.Running)
		run(t, d, id, "true")
	})

	step("suspend", func(t *testing.T) {
		start := time.Now()
		if err := d.Suspend(ctx, id); err != nil {
			t.Fatal(err)
		}
		t.Logf("suspend: %v", time.Since(start))
		wantState(t, d, id, driver.Shutdown)
		start = time.Now()
		if err := d.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		t.Logf("resume: %v", time.Since(start))
		wantState(t, d, id, driver.Running)
		if got := bootID(t, d, id); got != boot1 {
			t.Errorf("boot id %s after resume, was %s: the guest rebooted", got, boot1)
		}
	})

	step("reboot", func(t *testing.T) {
		before := boot1
		for _, hard := range []bool{false, true} {
			start := time.Now()
			if err := d.Reboot(ctx, id, hard); err != nil {
				t.Fatalf("Reboot(hard=%v): %v", hard, err)
			}
			t.Logf("reboot hard=%v: returned after %v, SSH after %v", hard, time.Since(start), waitSSH(t, d, id, start))
			after := bootID(t, d, id)
			if after == before {
				t.Errorf("reboot hard=%v: same boot id", hard)
			}
			before = after
		}
	})

	step("stop, resize, start", func(t *testing.T) {
		pid := d.Pid(t, id)
		start := time.Now()
		if err := d.PowerOff(ctx, id, true); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("graceful power-off: %v", took)
		if took > 20*time.Second {
			t.Errorf("graceful power-off took %v", took)
		}
		wantState(t, d, id, driver.Shutdown)
		if !qemu.Gone(pid) {
			t.Errorf("QEMU %d not reaped", pid)
		}
		if got := events.Of(id); len(got) != 0 {
			t.Errorf("listener heard %v of the driver's own power-off", got)
		}
		bigger := spec
		bigger.MemoryMB, bigger.DiskGB = 384, 2
		bigger.Cells = []driver.Cell{{Node: 0, CPUs: []int{pcpu}, MemoryMB: 384}}
		if err := d.Resize(ctx, bigger); err != nil {
			t.Fatal(err)
		}
		wantState(t, d, id, driver.Shutdown)
		start = time.Now()
		if err := d.PowerOn(ctx, id); err != nil {
			t.Fatal(err)
		}
		t.Logf("power on → SSH: %v", waitSSH(t, d, id, start))
		memKB, _ := strconv.Atoi(strings.Fields(run(t, d, id, "grep MemTotal /proc/meminfo"))[1])
		if memKB < 300*1024 {
			t.Errorf("MemTotal %d kB after resize to 384 MB", memKB)
		}
		sectors, _ := strconv.ParseInt(run(t, d, id, "cat /sys/block/vda/size"), 10, 64)
		if sectors*512 != 2<<30 {
			t.Errorf("disk is %d bytes after resize to 2 GB", sectors*512)
		}
		if got := run(t, d, id, "cat /root/marker"); got != "kept-by-snapshot" {
			t.Errorf("marker %q", got)
		}
	})

	step("re-attach", func(t *testing.T) {
		pid := d.Pid(t, id)
		acc, _ := d.Access(ctx, id)
		boot := bootID(t, d, id)
		d.Close()
		d = newDriver()
		wantState(t, d, id, driver.Running)
		if got := d.Pid(t, id); got != pid {
			t.Fatalf("pid %d after re-attach, want %d", got, pid)
		}
		if acc2, _ := d.Access(ctx, id); len(acc2) != 1 || acc2[0] != acc[0] {
			t.Errorf("Access after re-attach %+v, before %+v", acc2, acc)
		}
		if got := bootID(t, d, id); got != boot {
			t.Errorf("the guest rebooted across the re-attach")
		}
		start := time.Now()
		if err := d.PowerOff(ctx, id, true); err != nil {
			t.Fatal(err)
		}
		t.Logf("graceful power-off through the re-attached monitor: %v", time.Since(start))
		wantState(t, d, id, driver.Shutdown)
		if err := d.PowerOn(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitSSH(t, d, id, time.Now())
	})

	step("host reboot", func(t *testing.T) {
		pid := d.Pid(t, id)
		d.Close()
		syscall.Kill(pid, syscall.SIGKILL)
		waitFor(t, 10*time.Second, "the killed QEMU to be reaped", func() bool { return qemu.Gone(pid) })
		start := time.Now()
		d = newDriver()
		waitSSH(t, d, id, start)
		if got := d.Pid(t, id); got == pid || got == 0 {
			t.Errorf("pid %d after the restart (was %d)", got, pid)
		}
	})

	step("guest poweroff", func(t *testing.T) {
		pid := d.Pid(t, id)
		acc, _ := d.Access(ctx, id)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		testenv.SSH(cctx, net.JoinHostPort(acc[0].Host, strconv.Itoa(acc[0].Port)), "root", signer, "poweroff")
		cancel()
		waitFor(t, 60*time.Second, "the listener to hear Shutdown", func() bool {
			got := events.Of(id)
			return len(got) > 0 && got[len(got)-1] == driver.Shutdown
		})
		wantState(t, d, id, driver.Shutdown)
		waitFor(t, 10*time.Second, "QEMU to be reaped", func() bool { return qemu.Gone(pid) })
		// It stays off across an agent restart (Nova: a guest that
		// powered itself off is SHUTOFF).
		d.Close()
		d = newDriver()
		time.Sleep(500 * time.Millisecond)
		wantState(t, d, id, driver.Shutdown)
	})

	id2 := uuid.NewString()
	step("boot from disk off the snapshot", func(t *testing.T) {
		path, _ := store.Uploaded(snapID)
		snap := qemu.RefOf(t, snapID, "qcow2", path)
		spec2 := driver.Spec{ServerID: id2, Name: "vm-two", Hostname: "nimbus-two", VCPUs: 1, MemoryMB: 256, DiskGB: 1,
			OSType: "linux", PublicKey: authorized, Image: snap, ConfigDrive: true,
			Ports: []driver.Port{{ID: "port-2", MAC: "52:54:00:12:34:57", IP: "10.0.1.5", CIDR: "10.0.1.0/24", Gateway: "10.0.1.1"}}}
		start := time.Now()
		if err := d.Spawn(ctx, spec2); err != nil {
			t.Fatal(err)
		}
		t.Logf("disk boot (SeaBIOS) spawn → SSH: %v", waitSSH(t, d, id2, start))
		if got := run(t, d, id2, "cat /root/marker"); got != "kept-by-snapshot" {
			t.Errorf("marker in the snapshot's server: %q", got)
		}
		if got := run(t, d, id2, "hostname"); got != "nimbus-two" {
			t.Errorf("hostname %q (config drive)", got)
		}
	})

	step("destroy", func(t *testing.T) {
		for _, sid := range []string{id, id2} {
			pid := d.Pid(t, sid)
			if err := d.Destroy(ctx, sid); err != nil {
				t.Fatal(err)
			}
			if pid != 0 && !qemu.Gone(pid) {
				t.Errorf("QEMU %d left", pid)
			}
			if _, err := os.Stat(filepath.Join(dataDir, "instances", sid)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("directory of %s left: %v", sid, err)
			}
		}
		if list, _ := d.List(ctx); len(list) != 0 {
			t.Errorf("List after destroy: %+v", list)
		}
	})
}

func wantState(t *testing.T, d *qemu.Driver, id string, want driver.PowerState) {
	t.Helper()
	got, err := d.State(context.Background(), id)
	if err != nil || got != want {
		t.Fatalf("State = %d, %v; want %d", got, err, want)
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func imgInfo(t *testing.T, path string) map[string]any {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
