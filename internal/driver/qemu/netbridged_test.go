package qemu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"nimbus/internal/driver"
	"nimbus/internal/netstate"
)

func TestBridgedNetdev(t *testing.T) {
	port := driver.Port{ID: "5f2b6c1e-aaaa-4bbb-8ccc-0123456789ab", MAC: "fa:16:3e:00:00:01", IP: "10.0.0.5", CIDR: "10.0.0.0/24"}
	cases := []struct {
		name    string
		net     BridgedNet
		nic     string
		port    driver.Port
		fw      map[int]int
		want    string
		wantErr string
	}{
		{name: "tap named after the port", nic: "net0", port: port,
			want: "tap,id=net0,ifname=tap5f2b6c1e-aa,script=no,downscript=no,vhost=off"},
		{name: "vhost under KVM", net: BridgedNet{vhost: true}, nic: "net1", port: port,
			want: "tap,id=net1,ifname=tap5f2b6c1e-aa,script=no,downscript=no,vhost=on"},
		{name: "forwards ignored", nic: "net0", port: port, fw: map[int]int{22: 20022},
			want: "tap,id=net0,ifname=tap5f2b6c1e-aa,script=no,downscript=no,vhost=off"},
		{name: "short id", nic: "net0", port: driver.Port{ID: "p1"}, want: "tap,id=net0,ifname=tapp1,script=no,downscript=no,vhost=off"},
		{name: "no port id", nic: "net0", port: driver.Port{MAC: port.MAC}, wantErr: "cannot name a tap"},
		{name: "option injection", nic: "net0", port: driver.Port{ID: "p1,script=/tmp/x"}, wantErr: "cannot name a tap"},
		{name: "bad NIC id", nic: "0net", port: port, wantErr: "bad NIC id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.net.Netdev(tc.nic, tc.port, tc.fw)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestBridgedMachine: in bridged mode every port is a tap NIC, a server
// without ports has no NIC (nothing to forward to), vhost follows the
// accelerator, and access is the primary port's address.
func TestBridgedMachine(t *testing.T) {
	ports := []driver.Port{{ID: "p-one", MAC: "fa:16:3e:00:00:01", IP: "10.0.0.5"}, {ID: "p-two", MAC: "fa:16:3e:00:00:02", IP: "10.1.0.5"}}
	cases := []struct {
		name    string
		accel   string
		spec    driver.Spec
		netdevs []string
		access  []driver.Access
	}{
		{name: "two ports under TCG", accel: "tcg", spec: driver.Spec{Ports: ports},
			netdevs: []string{"tap,id=net0,ifname=tapp-one,script=no,downscript=no,vhost=off", "tap,id=net1,ifname=tapp-two,script=no,downscript=no,vhost=off"},
			access:  []driver.Access{{Protocol: "ssh", Host: "10.0.0.5", Port: 22}}},
		{name: "windows", accel: "tcg", spec: driver.Spec{OSType: "windows", Ports: ports[:1]},
			netdevs: []string{"tap,id=net0,ifname=tapp-one,script=no,downscript=no,vhost=off"},
			access:  []driver.Access{{Protocol: "rdp", Host: "10.0.0.5", Port: 3389}}},
		{name: "KVM", accel: "kvm", spec: driver.Spec{Ports: ports[:1]},
			netdevs: []string{"tap,id=net0,ifname=tapp-one,script=no,downscript=no,vhost=" + map[bool]string{true: "on", false: "off"}[fileExists(vhostNet)]},
			access:  []driver.Access{{Protocol: "ssh", Host: "10.0.0.5", Port: 22}}},
		{name: "no ports", accel: "tcg", spec: driver.Spec{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := &Driver{cfg: Config{Net: withAccel(BridgedNet{}, tc.accel)}, accel: tc.accel}
			if d.forwarding() {
				t.Error("bridged mode forwards host ports")
			}
			tc.spec.ServerID, tc.spec.VCPUs, tc.spec.MemoryMB = "3d4f9b2a-6c1e-4f7a-9b8d-2e5c1a7f0b93", 1, 512
			st := state{Spec: tc.spec, Forwards: map[int]int{22: 20022}}
			m, err := d.machine(tc.spec.ServerID, "/var/lib/nimbus/qemu/instances/x", st, "")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range m.NICs {
				got = append(got, n.Netdev)
			}
			if !slices.Equal(got, tc.netdevs) {
				t.Errorf("netdevs %q, want %q", got, tc.netdevs)
			}
			argv := strings.Join(Command(m), " ")
			if strings.Contains(argv, "hostfwd") || strings.Contains(argv, "user,") {
				t.Errorf("user-mode networking in a bridged command line: %s", argv)
			}
			for i, n := range m.NICs {
				if !strings.Contains(argv, "-netdev "+n.Netdev) || !strings.Contains(argv, "netdev="+n.ID+",mac="+tc.spec.Ports[i].MAC) {
					t.Errorf("NIC %s not on the command line: %s", n.ID, argv)
				}
			}
			if acc := d.access(st); !slices.Equal(acc, tc.access) {
				t.Errorf("access %+v, want %+v", acc, tc.access)
			}
		})
	}
	// User mode is as it was: the forward, and slirp's default NIC.
	d := &Driver{cfg: Config{Net: withAccel(UserNet{AccessHost: "h"}, "kvm")}, accel: "kvm"}
	if !d.forwarding() {
		t.Error("user mode forwards no host ports")
	}
	st := state{Spec: driver.Spec{VCPUs: 1, MemoryMB: 512}, Forwards: map[int]int{22: 20022}}
	m, err := d.machine("3d4f9b2a-6c1e-4f7a-9b8d-2e5c1a7f0b93", "/x", st, "")
	if err != nil || len(m.NICs) != 1 || !strings.Contains(m.NICs[0].Netdev, "hostfwd=tcp:0.0.0.0:20022-10.0.2.15:22") {
		t.Errorf("user mode machine %+v, %v", m, err)
	}
	if acc := d.access(st); len(acc) != 1 || acc[0] != (driver.Access{Protocol: "ssh", Host: "h", Port: 20022}) {
		t.Errorf("user mode access %+v", acc)
	}
}

// wiring is a data plane whose ports become wired a while after a kick.
type wiring struct {
	mu      sync.Mutex
	applied int64
	wired   bool
	after   time.Duration // from a kick until wired; 0: never
	kicks   int
}

func (w *wiring) Wired(ids ...string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wired
}

func (w *wiring) Kick() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.kicks++
	if w.after > 0 && w.kicks == 1 {
		time.AfterFunc(w.after, func() {
			w.mu.Lock()
			w.wired, w.applied = true, w.applied+1
			w.mu.Unlock()
		})
	}
}

func (w *wiring) Applied() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.applied
}

func TestBridgedWaitWired(t *testing.T) {
	ports := []driver.Port{{ID: "p-one"}, {ID: "p-two"}}
	cases := []struct {
		name    string
		w       *wiring
		ports   []driver.Port
		cancel  time.Duration
		wantErr string
		kicks   int
	}{
		{name: "wired already: no kick", w: &wiring{wired: true}, ports: ports},
		{name: "no ports", w: &wiring{}, ports: nil},
		{name: "wired after a kick", w: &wiring{after: 100 * time.Millisecond}, ports: ports, kicks: 1},
		{name: "never wired", w: &wiring{applied: 3}, ports: ports, wantErr: "p-one, p-two were not wired on this host within 300ms", kicks: 1},
		{name: "no state yet, cancelled", w: &wiring{applied: -1}, ports: ports, cancel: 500 * time.Millisecond,
			wantErr: context.Canceled.Error(), kicks: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel > 0 {
				time.AfterFunc(tc.cancel, cancel)
			}
			start := time.Now()
			err := BridgedNet{Wiring: tc.w, WireTimeout: 300 * time.Millisecond}.waitWired(ctx, tc.ports)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if tc.cancel > 0 && time.Since(start) < tc.cancel {
				t.Errorf("gave up after %s, before the agent applied any state", time.Since(start))
			}
			if tc.w.kicks != tc.kicks {
				t.Errorf("%d kicks, want %d", tc.w.kicks, tc.kicks)
			}
		})
	}
	if err := (BridgedNet{}).waitWired(context.Background(), ports); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("no wiring: %v", err)
	}
}

// TestBridgedTapQEMU: QEMU, given the -netdev of a port, opens the tap
// the data plane made (a persistent tap, as l2 makes them) rather than
// one of its own: the tap gets its carrier.
func TestBridgedTapQEMU(t *testing.T) {
	needQEMU(t, "qemu-system-x86_64", "ip")
	b := make([]byte, 4)
	rand.Read(b)
	ns := "h7q-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		if os.Getenv("NIMBUS_REQUIRE_NETNS") == "1" {
			t.Fatalf("cannot make a network namespace: %v: %s", err, out)
		}
		t.Skipf("cannot make a network namespace (NIMBUS_REQUIRE_NETNS=1 makes this a failure): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	port := driver.Port{ID: "5f2b6c1e-aaaa-4bbb-8ccc-0123456789ab", MAC: "fa:16:3e:00:00:01"}
	tap := "tap5f2b6c1e-aa"
	for _, args := range [][]string{{"tuntap", "add", "dev", tap, "mode", "tap"}, {"link", "set", tap, "up"}} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	netdev, err := withAccel(BridgedNet{}, "tcg").Netdev("net0", port, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-nodefaults",
		"-display", "none", "-S", "-netdev", netdev, "-device", "virtio-net-pci,netdev=net0,mac="+port.MAC)
	var out strings.Builder
	q.Stdout, q.Stderr = &out, &out
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Process.Kill(); q.Wait() })
	for {
		l, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", tap).Output()
		if err != nil {
			t.Fatalf("the tap is gone: %v (QEMU: %s)", err, out.String())
		}
		if strings.Contains(string(l), "LOWER_UP") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("QEMU never attached to %s: %s (QEMU: %s)", tap, l, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if l, _ := exec.Command("ip", "-n", ns, "-o", "link", "show").Output(); strings.Count(string(l), "tap") != 1 {
		t.Errorf("QEMU made a tap of its own: %s", l)
	}
}

// TestPassTaps makes two persistent taps as the agent's data plane does,
// in a network namespace of its own (as root only), and has passTaps
// open them for QEMU: descriptors 3 and 4 in NIC order, attached with
// the virtio-net header. A tap that is gone fails, without making one.
func TestPassTaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace and taps)")
	}
	runtime.LockOSThread() // the namespace is this thread's; it dies with it
	if _, err := netns.New(); err != nil {
		if os.Getenv("NIMBUS_REQUIRE_NETNS") == "1" {
			t.Fatalf("cannot make a network namespace: %v", err)
		}
		t.Skipf("cannot make a network namespace (NIMBUS_REQUIRE_NETNS=1 makes this a failure): %v", err)
	}
	ports := []driver.Port{{ID: "11111111-aaaa-4bbb-8ccc-000000000001"}, {ID: "22222222-aaaa-4bbb-8ccc-000000000002"}}
	for _, p := range ports {
		err := netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: netstate.TapName(p.ID)},
			Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_TUN_EXCL})
		if err != nil {
			t.Fatal(err)
		}
	}
	d := &Driver{cfg: Config{Net: BridgedNet{}}}
	m := &Machine{ID: "s", NICs: []NIC{{ID: "net0"}, {ID: "net1"}}}
	files, err := d.passTaps(m, ports)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFiles(files)
	for i, want := range []string{"tap,id=net0,fd=3,vhost=off", "tap,id=net1,fd=4,vhost=off"} {
		if m.NICs[i].Netdev != want {
			t.Errorf("NIC %d: netdev %q, want %q", i, m.NICs[i].Netdev, want)
		}
	}
	if len(files) != 2 {
		t.Fatalf("%d files, want 2", len(files))
	}
	for i, f := range files {
		ifr, err := unix.NewIfreq("")
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNGETIFF, ifr); err != nil {
			t.Fatal(err)
		}
		flags := ifr.Uint16()
		if ifr.Name() != netstate.TapName(ports[i].ID) || flags&unix.IFF_TAP == 0 || flags&unix.IFF_VNET_HDR == 0 || flags&unix.IFF_NO_PI == 0 {
			t.Errorf("file %d is %s with flags %#x, want %s, a tap with vnet_hdr and no PI", i, ifr.Name(), flags, netstate.TapName(ports[i].ID))
		}
	}

	gone := []driver.Port{ports[0], {ID: "33333333-aaaa-4bbb-8ccc-000000000003"}}
	m = &Machine{ID: "s", NICs: []NIC{{ID: "net0"}, {ID: "net1"}}}
	if files, err := d.passTaps(m, gone); err == nil || files != nil {
		t.Fatalf("passTaps with a tap gone: %v, %v", files, err)
	}
	if _, err := net.InterfaceByName(netstate.TapName(gone[1].ID)); err == nil {
		t.Error("passTaps made the missing tap")
	}
}
