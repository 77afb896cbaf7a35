package qemu

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"nimbus/internal/driver"
)

func init() {
	// -update rewrites testdata/*.golden. Registered here unless another
	// test file of the package already did.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files in testdata")
	}
}

func updateGolden() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// goldenRoot is where the golden cases' files live.
const goldenRoot = "/var/lib/nimbus/qemu"

// cmdCase is one golden command line. machine builds the Machine with its
// files under root.
type cmdCase struct {
	name    string
	machine func(root string) *Machine
	// gpu cases cannot start here (no /dev/vfio): QEMU must fail on the
	// first vfio-pci device.
	gpu bool
}

const goldenID = "3d4f9b2a-6c1e-4f7a-9b8d-2e5c1a7f0b93"

func baseMachine(root string) *Machine {
	dir := filepath.Join(root, "servers", goldenID)
	port := driver.Port{ID: "port-1", MAC: "fa:16:3e:5b:2c:01", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", DNS: []string{"8.8.8.8"}}
	netdev, err := UserNet{ListenAddr: "127.0.0.1"}.Netdev("net0", port, map[int]int{22: 40022})
	if err != nil {
		panic(err)
	}
	return &Machine{
		ID: goldenID, Name: "web-1", Dir: dir, Accel: "tcg",
		VCPUs: 2, MemoryMB: 1024,
		Disk:         Disk{Path: filepath.Join(dir, "disk.qcow2"), Format: "qcow2"},
		Seed:         &SeedDisk{Path: filepath.Join(dir, "seed.iso")},
		NICs:         []NIC{{ID: "net0", MAC: port.MAC, Netdev: netdev}},
		HotplugSlots: 2,
	}
}

var cmdCases = []cmdCase{
	{name: "plain", machine: baseMachine},
	{name: "pinned", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.VCPUs, m.MemoryMB = 4, 2048
		m.Cells = []driver.Cell{{Node: 0, CPUs: []int{2, 3}, MemoryMB: 1024}, {Node: 1, CPUs: []int{10, 11}, MemoryMB: 1024}}
		m.Disk.Format, m.Disk.Path = "raw", filepath.Join(m.Dir, "disk.raw")
		return m
	}},
	{name: "gpu", gpu: true, machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Accel, m.VCPUs, m.MemoryMB = "kvm", 8, 16384
		m.GPUs = []string{"0000:3b:00.0", "0000:af:00.0"}
		m.Firmware = "uefi"
		m.OVMFCode = filepath.Join(root, "firmware", "OVMF_CODE_4M.fd")
		m.OVMFVars = filepath.Join(m.Dir, "OVMF_VARS.fd")
		return m
	}},
	{name: "uefi", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Firmware = "uefi"
		m.OVMFCode = filepath.Join(root, "firmware", "OVMF_CODE_4M.fd")
		m.OVMFVars = filepath.Join(m.Dir, "OVMF_VARS.fd")
		return m
	}},
	{name: "throttled", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Disk.IOPS = driver.IOPS{Read: 75000, Write: 20000}
		return m
	}},
	{name: "configdrive", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Disk.Bus = "scsi" // shares the virtio-scsi controller with the seed
		m.Seed.Bus = "scsi"
		m.Kernel = filepath.Join(root, "images", "kernel-1")
		m.Initrd = filepath.Join(root, "images", "ramdisk-1")
		m.Append = "root=LABEL=root console=ttyS0,115200 quiet"
		return m
	}},
	{name: "windows", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Name, m.Accel, m.VCPUs, m.MemoryMB = "win-1", "kvm", 4, 4096
		m.Windows = true
		m.Disk.Bus = "sata"
		m.Seed.Bus = "sata"
		port := driver.Port{ID: "port-w", MAC: "fa:16:3e:5b:2c:02", IP: "10.0.0.6", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1"}
		netdev, err := UserNet{}.Netdev("net0", port, map[int]int{3389: 43389})
		if err != nil {
			panic(err)
		}
		m.NICs = []NIC{{ID: "net0", MAC: port.MAC, Model: "e1000", Netdev: netdev}}
		return m
	}},
	{name: "incoming", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Incoming = filepath.Join(m.Dir, "suspend.state")
		return m
	}},
	{name: "sandbox_runas", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Sandbox, m.RunAs = true, "nobody"
		return m
	}},
	{name: "sandbox_incoming", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Sandbox = true
		m.Incoming = filepath.Join(m.Dir, "suspend.state")
		return m
	}},
	{name: "sandbox", machine: func(root string) *Machine {
		m := baseMachine(root)
		m.Sandbox = true
		m.Seed.Bus = "virtio"
		m.NICs = append(m.NICs, NIC{ID: "net1", MAC: "fa:16:3e:5b:2c:03", Netdev: "user,id=net1,restrict=on"})
		return m
	}},
}

func TestCommandGolden(t *testing.T) {
	for _, c := range cmdCases {
		t.Run(c.name, func(t *testing.T) {
			got := strings.Join(Command(c.machine(goldenRoot)), "\n") + "\n"
			path := filepath.Join("testdata", c.name+".golden")
			if updateGolden() {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run Golden -update)", err)
			}
			if got != string(want) {
				t.Errorf("%s: command line differs (go test -run Golden -update rewrites it):\n%s", c.name, lineDiff(string(want), got))
			}
			// Deterministic.
			if again := strings.Join(Command(c.machine(goldenRoot)), "\n") + "\n"; again != got {
				t.Error("two calls differ")
			}
		})
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

func TestCommandDetails(t *testing.T) {
	argOf := func(argv []string, flag string) []string {
		var out []string
		for i := 0; i+1 < len(argv); i++ {
			if argv[i] == flag {
				out = append(out, argv[i+1])
			}
		}
		return out
	}
	// memObjects are the -object values that back guest NUMA nodes.
	memObjects := func(argv []string) []string {
		var out []string
		for _, o := range argOf(argv, "-object") {
			if strings.HasPrefix(o, "memory-backend-") {
				out = append(out, o)
			}
		}
		return out
	}
	t.Run("commas escaped", func(t *testing.T) {
		m := baseMachine("/srv/a,b")
		m.Name = "x,y"
		argv := Command(m)
		if got := argOf(argv, "-name")[0]; got != "guest=x,,y,debug-threads=on" {
			t.Errorf("-name %s", got)
		}
		for _, bd := range argOf(argv, "-blockdev") {
			if strings.Contains(bd, "filename=") && !strings.Contains(bd, "/srv/a,,b/") {
				t.Errorf("-blockdev %s", bd)
			}
		}
		if got := argOf(argv, "-pidfile")[0]; got != "/srv/a,b/servers/"+goldenID+"/qemu.pid" {
			t.Errorf("-pidfile %s (not a QemuOpts value: no escaping)", got)
		}
	})
	t.Run("incoming quoted for the shell", func(t *testing.T) {
		m := baseMachine("/srv")
		m.Incoming = "/srv/it's here/state"
		if got := argOf(Command(m), "-incoming")[0]; got != `exec:cat '/srv/it'\''s here/state'` {
			t.Errorf("-incoming %s", got)
		}
	})
	t.Run("uneven cells", func(t *testing.T) {
		m := baseMachine("/srv")
		m.VCPUs, m.MemoryMB = 3, 1000
		m.Cells = []driver.Cell{{Node: 0, CPUs: []int{1, 2}, MemoryMB: 600}, {Node: 1, CPUs: []int{5}, MemoryMB: 400}}
		argv := Command(m)
		if got := argOf(argv, "-smp")[0]; got != "3,sockets=1,cores=3,threads=1" {
			t.Errorf("-smp %s", got)
		}
		if got := argOf(argv, "-numa"); !slices.Equal(got, []string{"node,nodeid=0,cpus=0-1,memdev=mem0", "node,nodeid=1,cpus=2,memdev=mem1"}) {
			t.Errorf("-numa %v", got)
		}
		if got := memObjects(argv); !slices.Equal(got, []string{"memory-backend-ram,id=mem0,size=600M", "memory-backend-ram,id=mem1,size=400M"}) {
			t.Errorf("-object %v", got)
		}
	})
	t.Run("cells that do not add up", func(t *testing.T) {
		m := baseMachine("/srv")
		m.VCPUs, m.MemoryMB = 5, 1025
		m.Cells = []driver.Cell{{Node: 0, CPUs: []int{1}, MemoryMB: 1}, {Node: 1, CPUs: []int{5}, MemoryMB: 1}}
		argv := Command(m)
		if got := argOf(argv, "-numa"); !slices.Equal(got, []string{"node,nodeid=0,cpus=0-2,memdev=mem0", "node,nodeid=1,cpus=3-4,memdev=mem1"}) {
			t.Errorf("-numa %v", got)
		}
		if got := memObjects(argv); !slices.Equal(got, []string{"memory-backend-ram,id=mem0,size=513M", "memory-backend-ram,id=mem1,size=512M"}) {
			t.Errorf("-object %v", got)
		}
	})
	t.Run("one cell, no numa", func(t *testing.T) {
		m := baseMachine("/srv")
		m.Cells = []driver.Cell{{Node: 1, CPUs: []int{4, 5}, MemoryMB: 1024}}
		if got := argOf(Command(m), "-numa"); got != nil {
			t.Errorf("-numa %v", got)
		}
	})
	t.Run("no seed, no disk, no uuid", func(t *testing.T) {
		m := baseMachine("/srv")
		m.ID, m.Seed, m.Disk = "srv-1", nil, Disk{}
		argv := Command(m)
		if slices.Contains(argv, "-uuid") || slices.Contains(argv, "virtio-scsi-pci,id=scsi0") || argOf(argv, "-blockdev") != nil {
			t.Errorf("argv %q", argv)
		}
	})
	t.Run("validate", func(t *testing.T) {
		for _, c := range cmdCases {
			if err := Validate(c.machine(goldenRoot)); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		}
		long := "/" + strings.Repeat("d", 97) // 98 bytes
		for _, bad := range []struct {
			what string
			f    func(m *Machine)
		}{
			{"relative dir", func(m *Machine) { m.Dir = "servers/x" }},
			{"socket path too long", func(m *Machine) { m.Dir = long + "x" }},
			{"accel", func(m *Machine) { m.Accel = "hvf" }},
			{"no memory", func(m *Machine) { m.MemoryMB = 0 }},
			{"uefi without vars", func(m *Machine) { m.Firmware = "uefi" }},
			{"repeated NIC", func(m *Machine) { m.NICs = append(m.NICs, m.NICs[0]) }},
			{"bad NIC id", func(m *Machine) { m.NICs[0].ID = "net 0" }},
			{"bad MAC", func(m *Machine) { m.NICs[0].MAC = "fa:16" }},
		} {
			m := baseMachine("/srv")
			bad.f(m)
			if err := Validate(m); err == nil {
				t.Errorf("%s: no error", bad.what)
			}
		}
		m := baseMachine("/srv")
		m.Dir = long
		if err := Validate(m); err != nil {
			t.Errorf("98-byte dir: %v", err)
		}
	})
	t.Run("windows under tcg has no hyper-v flags", func(t *testing.T) {
		m := baseMachine("/srv")
		m.Windows = true
		if got := argOf(Command(m), "-cpu")[0]; got != "max" {
			t.Errorf("-cpu %s", got)
		}
		m.CPUModel, m.Accel = "Skylake-Server", "kvm"
		if got := argOf(Command(m), "-cpu")[0]; got != "Skylake-Server,hv_relaxed,hv_spinlocks=0x1fff,hv_vapic,hv_time" {
			t.Errorf("-cpu %s", got)
		}
	})
}

// TestCommandQEMU starts QEMU 7.2 with every golden case (files made under
// a directory whose name has a comma, "-S" appended, kvm swapped for tcg
// as KVM does not work here), waits for QMP and quits it: QEMU accepts
// every argument. GPU cases must fail on the missing host device. Skipped
// without qemu-system-x86_64 unless NIMBUS_REQUIRE_QEMU=1.
func TestCommandQEMU(t *testing.T) {
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		if os.Getenv("NIMBUS_REQUIRE_QEMU") == "1" {
			t.Fatal("qemu-system-x86_64 not found and NIMBUS_REQUIRE_QEMU=1")
		}
		t.Skip("qemu-system-x86_64 not found")
	}
	for _, c := range cmdCases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "sandbox_runas" && os.Geteuid() != 0 {
				t.Skip("-runas needs root")
			}
			// Short: Go's test directories can make DIR/qmp.sock longer
			// than a unix socket path may be.
			tmp, err := os.MkdirTemp("", "nq")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(tmp) })
			root := filepath.Join(tmp, "a,b")
			m := c.machine(root)
			if err := Validate(m); err != nil {
				t.Fatal(err)
			}
			prepareFiles(t, m)
			argv := Command(m)
			for i, a := range argv {
				// KVM does not work on the project's machines: check the
				// same arguments under TCG (the Hyper-V flags stay).
				if strings.HasPrefix(a, "q35,accel=kvm") {
					argv[i] = strings.Replace(a, "accel=kvm", "accel=tcg", 1)
				}
				if i > 0 && argv[i-1] == "-cpu" && (a == "host" || strings.HasPrefix(a, "host,")) {
					argv[i] = "max" + strings.TrimPrefix(a, "host")
				}
				// Forward from any free port, not the golden one, which
				// something else may hold.
				if i > 0 && argv[i-1] == "-netdev" {
					argv[i] = hostfwdPort.ReplaceAllString(a, "hostfwd=tcp:$1:0-")
				}
			}
			argv = append(argv, "-S")
			out, err := runQEMU(t, bin, argv, filepath.Join(m.Dir, QMPSocket))
			if c.gpu {
				if err == nil || !strings.Contains(out, "no such host device") {
					t.Fatalf("GPU case: err = %v, want QEMU to fail with no such host device; output:\n%s", err, out)
				}
				t.Logf("GPU case fails as expected: %s", strings.TrimSpace(out))
				return
			}
			if err != nil {
				t.Fatalf("QEMU rejected the command line: %v\nargv: %q\noutput:\n%s", err, argv, out)
			}
			if strings.Contains(strings.ToLower(out), "warning") || strings.Contains(out, "deprecated") {
				t.Errorf("QEMU warned:\n%s", out)
			}
		})
	}
}

var hostfwdPort = regexp.MustCompile(`hostfwd=tcp:([^:]*):[0-9]+-`)

// prepareFiles makes the files m's command line refers to.
func prepareFiles(t *testing.T, m *Machine) {
	t.Helper()
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if m.Disk.Path != "" {
		if m.Disk.Format == "raw" {
			writeSized(t, m.Disk.Path, 1<<20)
		} else {
			out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", m.Disk.Path, "64M").CombinedOutput()
			if err != nil {
				t.Fatalf("qemu-img: %v: %s", err, out)
			}
		}
	}
	if m.Seed != nil {
		if err := WriteSeed(m.Seed.Path, Seed{ConfigDrive: true, Spec: seedSpec(), RandomSeed: fixedRandom}); err != nil {
			t.Fatal(err)
		}
	}
	if m.Kernel != "" {
		mkdirFor(t, m.Kernel)
		if err := os.WriteFile(m.Kernel, fakeBzImage(), 0o600); err != nil {
			t.Fatal(err)
		}
		writeSized(t, m.Initrd, 4096)
	}
	if m.OVMFCode != "" {
		writeSized(t, m.OVMFCode, 2<<20)
		writeSized(t, m.OVMFVars, 128<<10)
	}
	if m.Incoming != "" {
		// An empty state: QEMU waits in "inmigrate" (a stream that is
		// not one makes it exit), long enough to see QMP.
		writeSized(t, m.Incoming, 0)
	}
}

func mkdirFor(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
}

func writeSized(t *testing.T, path string, size int) {
	t.Helper()
	mkdirFor(t, path)
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
}

// fakeBzImage is the smallest file QEMU loads as a Linux bzImage (boot
// protocol 2.15, loaded high); with -S it never runs.
func fakeBzImage() []byte {
	b := make([]byte, 16384)
	b[0x1f1] = 4 // setup sectors
	b[0x1fe], b[0x1ff] = 0x55, 0xaa
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(b[0x206:], 0x020f)
	b[0x211] = 0x01 // LOADED_HIGH
	binary.LittleEndian.PutUint32(b[0x22c:], 0x7fffffff)
	return b
}

// runQEMU starts QEMU, waits for its QMP greeting on qmpPath, quits it
// through QMP and waits for it. It returns QEMU's output, and an error when
// QEMU exited before QMP came up or did not exit cleanly.
func runQEMU(t *testing.T, bin string, argv []string, qmpPath string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, argv...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // always reaped: PID 1 here does not
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-done:
			if err == nil {
				err = errors.New("QEMU exited before QMP came up")
			}
			return out.String(), err
		default:
		}
		c, dialErr := net.Dial("unix", qmpPath)
		if dialErr == nil {
			err := qmpQuit(c)
			c.Close()
			if err != nil {
				// QMP came up and QEMU died under it (a seccomp kill as it
				// drops privileges): its exit status says why.
				select {
				case werr := <-done:
					if werr != nil {
						return out.String(), werr
					}
				case <-time.After(2 * time.Second):
					cmd.Process.Kill()
					<-done
				}
				return out.String(), err
			}
			select {
			case err := <-done:
				return out.String(), err
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
				return out.String(), errors.New("QEMU did not quit")
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return out.String(), fmt.Errorf("no QMP after 20s: %v", dialErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func qmpQuit(c net.Conn) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	greeting, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.Contains(greeting, `"QMP"`) {
		return errors.New("no QMP greeting: " + greeting)
	}
	if _, err := c.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n")); err != nil {
		return err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil // QEMU closed the socket as it quit
		}
		if strings.Contains(line, `"error"`) {
			return errors.New("QMP: " + line)
		}
	}
}

// TestQEMUForms records which forms QEMU 7.2 accepts and rejects, the
// reasons behind Command's choices.
func TestQEMUForms(t *testing.T) {
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		if os.Getenv("NIMBUS_REQUIRE_QEMU") == "1" {
			t.Fatal("qemu-system-x86_64 not found and NIMBUS_REQUIRE_QEMU=1")
		}
		t.Skip("qemu-system-x86_64 not found")
	}
	cases := []struct {
		name    string
		args    []string
		wantErr string // "" when QEMU must accept the arguments
		root    bool
	}{
		{"dotted throttle limits", []string{"-object", "throttle-group,id=tg0,limits.iops-read=100"}, "Invalid parameter 'limits.iops-read'", false},
		{"file: migration URI", []string{"-incoming", "file:/nonexistent"}, "unknown migration protocol: file:/nonexistent", false},
		{"sandbox spawn=deny with exec: incoming", []string{"-sandbox", "on,spawn=deny", "-incoming", "exec:cat /dev/null"}, "bad system call", false},
		{"sandbox elevateprivileges=deny with -runas", []string{"-sandbox", "on,elevateprivileges=deny", "-runas", "nobody"}, "bad system call", true},
		{"sandbox elevateprivileges=children with -runas", []string{"-sandbox", "on,elevateprivileges=children", "-runas", "nobody"}, "bad system call", true},
		{"slirp DNS equal to the gateway", []string{"-netdev", "user,id=n0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.5,dns=10.0.0.1"}, "DNS must be different from host", false},
		{"slirp host outside the net", []string{"-netdev", "user,id=n0,net=10.0.0.0/24,host=10.0.1.1,dhcpstart=10.0.0.5,dns=10.0.0.3"}, "Host doesn't belong to network", false},
		{"slirp defaults with a forward to the DHCP guest", []string{"-netdev", "user,id=n0,ipv6=off,restrict=off,hostfwd=tcp:127.0.0.1:0-:22", "-device", "virtio-net-pci,netdev=n0"}, "", false},
		{"kernel-irqchip under tcg", []string{"-machine", "q35,kernel-irqchip=on"}, "", false},
		{"hyper-v flags under tcg", []string{"-cpu", "max,hv_relaxed,hv_spinlocks=0x1fff,hv_vapic,hv_time"}, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root && os.Geteuid() != 0 {
				t.Skip("-runas needs root")
			}
			tmp, err := os.MkdirTemp("", "nq")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(tmp) })
			qmp := filepath.Join(tmp, "qmp.sock")
			// (The legacy "-qmp unix:PATH,…" form cannot take a path with
			// "=" or ",", such as Go's test directories: use -chardev.)
			argv := append([]string{"-nodefaults", "-display", "none", "-accel", "tcg", "-S",
				"-chardev", "socket,id=qmp,path=" + esc(qmp) + ",server=on,wait=off", "-mon", "chardev=qmp,mode=control"}, c.args...)
			out, err := runQEMU(t, bin, argv, qmp)
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("rejected: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !strings.Contains(out+err.Error(), c.wantErr) {
				t.Fatalf("err = %v, output %q; want %q", err, out, c.wantErr)
			}
			t.Logf("rejected as expected: %s %s", strings.TrimSpace(out), err)
		})
	}
}
