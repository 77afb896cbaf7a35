package qemu_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/host"
	"nimbus/internal/testenv"
)

// bootGuest spawns the test guest with mod applied to its spec and the
// driver's config, waits for SSH and returns a command runner.
func bootGuest(t *testing.T, mod func(*driver.Spec), cfg func(*qemu.Config)) (d *qemu.Driver, id string, run func(string) string) {
	t.Helper()
	guest := testenv.TestGuest(t)
	signer, authorized := testenv.NewSSHKey(t)
	ctx := context.Background()
	store := qemu.NewMemStore(t)
	store.Add("guest-disk", guest.Disk)
	store.Add("guest-kernel", guest.Kernel)
	store.Add("guest-initrd", guest.Initrd)
	image := qemu.RefOf(t, "guest-disk", "qcow2", guest.Disk)
	image.KernelID, image.RamdiskID, image.CommandLine = "guest-kernel", "guest-initrd", guest.Cmdline
	d = qemu.NewTestDriver(t, t.TempDir(), store, cfg)
	t.Cleanup(func() { d.Destroy(context.Background(), id); d.Close() })
	h := qemu.ThisHost()
	id = uuid.NewString()
	spec := driver.Spec{ServerID: id, Name: "cap", Hostname: "cap", VCPUs: 1, MemoryMB: 256, DiskGB: 1, OSType: "linux",
		KeyName: "k", PublicKey: authorized, Image: image,
		Cells: []driver.Cell{{Node: h.CPUs[len(h.CPUs)-1].NUMA, CPUs: []int{h.CPUs[len(h.CPUs)-1].ID}, MemoryMB: 256}},
		Ports: []driver.Port{{ID: "p", MAC: "52:54:00:12:34:57", IP: "10.0.0.6", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1"}}}
	if mod != nil {
		mod(&spec)
	}
	if err := d.Spawn(ctx, spec); err != nil {
		t.Fatalf("Spawn: %v", err)
	}
	acc, err := d.Access(ctx, id)
	if err != nil || len(acc) == 0 {
		t.Fatalf("Access: %v %v", acc, err)
	}
	addr := net.JoinHostPort(acc[0].Host, strconv.Itoa(acc[0].Port))
	run = func(cmd string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 120*time.Second)
		defer cancel()
		out, err := testenv.SSH(cctx, addr, "root", signer, cmd)
		if err != nil {
			t.Fatalf("ssh %q: %v", cmd, err)
		}
		return strings.TrimSpace(out)
	}
	return d, id, run
}

// TestKVMBoot boots the guest under KVM where KVM really works (the check
// of FINDINGS §1); elsewhere — every CI machine of this project, whose
// /dev/kvm is PVM — it says why it cannot and skips.
func TestKVMBoot(t *testing.T) {
	qemu.NeedQEMU(t)
	accel, reason, err := qemu.Accelerator("auto")
	if err != nil || accel != "kvm" {
		t.Skipf("KVM is not usable on this machine (%s): the KVM path is covered by the golden command lines", reason)
	}
	d, _, run := bootGuest(t, nil, func(c *qemu.Config) { c.Accel = "kvm" })
	if a, _ := d.Accel(); a != "kvm" {
		t.Fatalf("driver runs %s", a)
	}
	if got := run("grep -c hypervisor /proc/cpuinfo"); got == "0" {
		t.Errorf("guest does not see a hypervisor")
	}
}

// TestGPUPassthrough gives the guest the first GPU of this host that can
// be passed through and finds it on the guest's PCI bus; on a host with
// none (every CI machine) it says why and skips.
func TestGPUPassthrough(t *testing.T) {
	qemu.NeedQEMU(t)
	h, err := host.Discover("/", host.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var gpu *driver.GPU
	var why []string
	for i := range h.GPUs {
		p := host.PassthroughProblems("/", h.GPUs[i])
		if len(p) == 0 {
			gpu = &h.GPUs[i]
			break
		}
		why = append(why, h.GPUs[i].Address+": "+strings.Join(p, "; "))
	}
	if gpu == nil {
		if len(why) == 0 {
			why = []string{"no GPU"}
		}
		t.Skipf("no GPU here can be passed through (%s): the vfio-pci path is covered by the gpu golden command line", strings.Join(why, ", "))
	}
	if accel, reason, _ := qemu.Accelerator("auto"); accel != "kvm" {
		t.Skipf("GPU passthrough needs KVM, which is not usable here (%s)", reason)
	}
	_, _, run := bootGuest(t, func(s *driver.Spec) { s.GPUs = []string{gpu.Address} }, nil)
	vendor, err := os.ReadFile("/sys/bus/pci/devices/" + gpu.Address + "/vendor")
	if err != nil {
		t.Fatal(err)
	}
	if got := run("cat /sys/bus/pci/devices/*/vendor"); !strings.Contains(got, strings.TrimSpace(string(vendor))) {
		t.Errorf("guest PCI vendors %q lack the GPU's %s", got, vendor)
	}
}
