package main

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
)

// benchVM measures real VMs with the qemu driver against QEMU alone, on
// the test guest (test/guest/build.sh): a bare QEMU boot to SSH login of
// the same guest, then through Nimbus's API create → ACTIVE and create →
// SSH login, the memory each adds per VM, and the disk throttles as the
// guest measures them. Runs alternate bare and Nimbus, so that load on the
// machine falls on both alike.
func benchVM(guestDir string, runs int) error {
	g, err := loadGuest(guestDir)
	if err != nil {
		return err
	}
	signer, pub, err := newBenchKey()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nimbus-vm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	nb, err := startVMCloud(filepath.Join(dir, "cloud"), g, pub)
	if err != nil {
		return err
	}
	defer nb.c.Close()

	var bare, active, login []time.Duration
	var bareRSS, nimbusRSS []int64
	var heap []int64
	for i := range runs {
		d, rss, err := bareBoot(filepath.Join(dir, fmt.Sprintf("bare-%d", i)), g, signer, pub)
		if err != nil {
			return fmt.Errorf("bare QEMU boot: %w", err)
		}
		bare, bareRSS = append(bare, d), append(bareRSS, rss)
		before := goHeap()
		r, err := nb.boot(fmt.Sprintf("bench-%d", i), nb.flavor, signer)
		if err != nil {
			return fmt.Errorf("nimbus boot: %w", err)
		}
		heap = append(heap, goHeap()-before)
		active, login, nimbusRSS = append(active, r.active), append(login, r.login), append(nimbusRSS, r.rss)
		if err := nb.delete(r.id); err != nil {
			return err
		}
	}
	fmt.Printf("VM boot, test guest, %s, %d runs each (median, min–max):\n", nb.accel, runs)
	fmt.Printf("  bare QEMU, start → SSH login:          %s\n", spread(bare))
	fmt.Printf("  Nimbus, create → ACTIVE:               %s\n", spread(active))
	fmt.Printf("  Nimbus, create → SSH login:            %s  (%+.1f %% on bare)\n", spread(login),
		100*(median(login).Seconds()/median(bare).Seconds()-1))
	fmt.Printf("  QEMU RSS at login, bare / Nimbus:      %d / %d MiB\n", median(bareRSS)>>20, median(nimbusRSS)>>20)
	fmt.Printf("  Nimbus process heap per VM (live):     %+d KiB\n", median(heap)>>10)

	// Throttles: the disk type's figures are on QEMU's command line; a
	// flavor with low operator-set limits shows they bind in the guest.
	for _, tc := range []struct {
		name   string
		flavor string
		iops   driver.IOPS
	}{
		{"local disk type", nb.flavor, driver.IOPS{Read: 75000, Write: 20000}},
		{"operator's 200/100 flavor", nb.slowFlavor, driver.IOPS{Read: 200, Write: 100}},
	} {
		r, err := nb.boot("throttle", tc.flavor, signer)
		if err != nil {
			return err
		}
		cmdline := qemuCmdline(r.pid)
		want := fmt.Sprintf("x-iops-read=%d,x-iops-write=%d", tc.iops.Read, tc.iops.Write)
		rd, wr, err := guestIOPS(r.addr, signer)
		if err != nil {
			return err
		}
		fmt.Printf("  throttle, %-26s QEMU has %s: %v; guest measures %.0f read / %.0f write IOPS (4 KiB, O_DIRECT)\n",
			tc.name+":", want, strings.Contains(cmdline, want), rd, wr)
		if err := nb.delete(r.id); err != nil {
			return err
		}
	}
	return nil
}

// vmCloud is the in-process cloud the benchmark drives.
type vmCloud struct {
	c                 *cloud.Cloud
	compute           *gophercloud.ServiceClient
	image, flavor     string
	slowFlavor, accel string
}

func startVMCloud(dir string, g benchGuest, pub string) (*vmCloud, error) {
	ctx := context.Background()
	c, err := cloud.Start(ctx, cloud.Config{DataDir: dir, Listen: "127.0.0.1", Driver: "qemu",
		QEMU:           cloud.QEMUOptions{Accel: "auto", ReservedCPUs: []int{}, ReservedMemoryMB: -1, AccessHost: "127.0.0.1"},
		AgentHeartbeat: 2 * time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	nb := &vmCloud{c: c}
	fail := func(err error) (*vmCloud, error) { c.Close(); return nil, err }
	pc, err := provider(c, cloud.AdminUser, c.Secrets.AdminPassword, "admin")
	if err != nil {
		return fail(err)
	}
	if nb.compute, err = openstack.NewComputeV2(pc, gophercloud.EndpointOpts{}); err != nil {
		return fail(err)
	}
	nb.compute.Microversion = "2.79"
	imgc, err := openstack.NewImageV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		return fail(err)
	}
	upload := func(name, file, format string, props map[string]string) (string, error) {
		img, err := images.Create(ctx, imgc, images.CreateOpts{Name: name, DiskFormat: format, ContainerFormat: "bare",
			Properties: props}).Extract()
		if err != nil {
			return "", err
		}
		f, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer f.Close()
		return img.ID, imagedata.Upload(ctx, imgc, img.ID, f).ExtractErr()
	}
	kernel, err := upload("guest-kernel", g.kernel, "aki", nil)
	if err != nil {
		return fail(err)
	}
	initrd, err := upload("guest-initrd", g.initrd, "ari", nil)
	if err != nil {
		return fail(err)
	}
	if nb.image, err = upload("guest", g.disk, "qcow2", map[string]string{"kernel_id": kernel, "ramdisk_id": initrd,
		"os_command_line": g.cmdline, "login_user": "root"}); err != nil {
		return fail(err)
	}
	mk := func(name string, specs map[string]string) (string, error) {
		disk := 1
		f, err := flavors.Create(ctx, nb.compute, flavors.CreateOpts{Name: name, VCPUs: 1, RAM: 256, Disk: &disk}).Extract()
		if err != nil {
			return "", err
		}
		_, err = flavors.CreateExtraSpecs(ctx, nb.compute, f.ID, flavors.ExtraSpecsOpts(specs)).Extract()
		return f.ID, err
	}
	if nb.flavor, err = mk("vm.bench", map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local"}); err != nil {
		return fail(err)
	}
	if nb.slowFlavor, err = mk("vm.bench.slow", map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local",
		"quota:disk_read_iops_sec": "200", "quota:disk_write_iops_sec": "100"}); err != nil {
		return fail(err)
	}
	if _, err := keypairs.Create(ctx, nb.compute, keypairs.CreateOpts{Name: "bench", PublicKey: pub}).Extract(); err != nil {
		return fail(err)
	}
	nb.accel, _, _ = qemu.Accelerator("auto")
	return nb, nil
}

type vmRun struct {
	id, addr      string
	pid           int
	active, login time.Duration
	rss           int64
}

// boot creates a server and times it to ACTIVE and to an SSH login.
func (nb *vmCloud) boot(name, flavor string, signer ssh.Signer) (vmRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	sv, err := servers.Create(ctx, nb.compute, keypairs.CreateOptsExt{
		CreateOptsBuilder: servers.CreateOpts{Name: name, ImageRef: nb.image, FlavorRef: flavor, Networks: "auto"},
		KeyName:           "bench"}, nil).Extract()
	if err != nil {
		return vmRun{}, err
	}
	r := vmRun{id: sv.ID}
	for {
		s, err := servers.Get(ctx, nb.compute, sv.ID).Extract()
		if err != nil {
			return r, err
		}
		if s.Status == "ERROR" {
			return r, fmt.Errorf("server %s: ERROR %v", sv.ID, s.Fault)
		}
		if s.Status == "ACTIVE" {
			r.active = time.Since(start)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var acc struct {
		Access []driver.Access `json:"access"`
	}
	if _, err := nb.compute.Get(ctx, nb.compute.ServiceURL("servers", sv.ID, "access"), &acc, nil); err != nil {
		return r, err
	}
	if len(acc.Access) == 0 {
		return r, errors.New("no access entry")
	}
	r.addr = net.JoinHostPort(acc.Access[0].Host, strconv.Itoa(acc.Access[0].Port))
	if err := sshUntil(ctx, r.addr, signer); err != nil {
		return r, err
	}
	r.login = time.Since(start)
	r.pid = qemuPID(sv.ID)
	r.rss = rssOf(strconv.Itoa(r.pid))
	return r, nil
}

func (nb *vmCloud) delete(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := servers.Delete(ctx, nb.compute, id).ExtractErr(); err != nil {
		return err
	}
	for {
		if _, err := servers.Get(ctx, nb.compute, id).Extract(); gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return nil
		} else if ctx.Err() != nil {
			return fmt.Errorf("server %s not deleted", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// bareBoot boots the guest with QEMU alone, as FINDINGS §3 does (same
// kernel, seed, memory, entropy device and forwarded SSH), and times
// start → SSH login.
func bareBoot(dir string, g benchGuest, signer ssh.Signer, pub string) (time.Duration, int64, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, 0, err
	}
	overlay, seed := filepath.Join(dir, "overlay.qcow2"), filepath.Join(dir, "seed.iso")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", g.disk, overlay, "1G").CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("qemu-img: %v: %s", err, out)
	}
	if err := qemu.WriteSeed(seed, qemu.Seed{Spec: driver.Spec{ServerID: "00000000-0000-4000-8000-000000000001",
		Name: "bare", Hostname: "bare", KeyName: "bench", PublicKey: pub}}); err != nil {
		return 0, 0, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	accel, _, _ := qemu.Accelerator("auto")
	start := time.Now()
	cmd := exec.Command("qemu-system-x86_64", "-machine", "q35", "-accel", accel, "-m", "256", "-smp", "1", "-nodefaults",
		"-display", "none", "-serial", "file:"+filepath.Join(dir, "serial.log"),
		"-kernel", g.kernel, "-initrd", g.initrd, "-append", g.cmdline,
		"-drive", "file="+overlay+",if=none,id=disk0,format=qcow2,cache=none,aio=threads",
		"-device", "virtio-blk-pci,drive=disk0,bootindex=1",
		"-drive", "file="+seed+",if=none,id=seed,format=raw,readonly=on,media=cdrom",
		"-device", "virtio-scsi-pci,id=scsi0", "-device", "scsi-cd,drive=seed,bus=scsi0.0",
		"-netdev", fmt.Sprintf("user,id=net0,hostfwd=tcp:127.0.0.1:%d-:22", port), "-device", "virtio-net-pci,netdev=net0",
		"-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0")
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := sshUntil(ctx, fmt.Sprintf("127.0.0.1:%d", port), signer); err != nil {
		return 0, 0, err
	}
	return time.Since(start), rssOf(strconv.Itoa(cmd.Process.Pid)), nil
}

// sshUntil retries an SSH login (a command run) until it works or ctx ends.
func sshUntil(ctx context.Context, addr string, signer ssh.Signer) error {
	var last error
	for ctx.Err() == nil {
		if _, last = sshRun(addr, signer, "true", 5*time.Second); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("ssh %s: %w (last: %v)", addr, ctx.Err(), last)
}

func sshRun(addr string, signer ssh.Signer, command string, timeout time.Duration) (string, error) {
	cfg := &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: timeout}
	// Slirp accepts a forwarded connection before the guest listens: the
	// whole handshake has a deadline, or an early try hangs and skews the
	// figure.
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	conn.SetDeadline(time.Now().Add(min(timeout, 3*time.Second)))
	cc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return "", err
	}
	conn.SetDeadline(time.Now().Add(timeout))
	c := ssh.NewClient(cc, chans, reqs)
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	out, err := s.CombinedOutput(command)
	return string(out), err
}

// guestIOPS measures 4 KiB O_DIRECT reads of the boot disk and writes of a
// file in the guest, timed from here less an empty command's round trip.
func guestIOPS(addr string, signer ssh.Signer) (read, write float64, err error) {
	timed := func(cmd string) (time.Duration, error) {
		start := time.Now()
		out, err := sshRun(addr, signer, cmd, 2*time.Minute)
		if err != nil {
			return 0, fmt.Errorf("%s: %v: %s", cmd, err, out)
		}
		return time.Since(start), nil
	}
	base, err := timed("true")
	if err != nil {
		return 0, 0, err
	}
	const n = 600
	rd, err := timed(fmt.Sprintf("dd if=/dev/vda of=/dev/null bs=4k count=%d iflag=direct", n))
	if err != nil {
		return 0, 0, err
	}
	wr, err := timed(fmt.Sprintf("dd if=/dev/zero of=/root/iops bs=4k count=%d oflag=direct conv=fsync", n/2))
	if err != nil {
		return 0, 0, err
	}
	return n / max(rd-base, time.Millisecond).Seconds(), n / 2 / max(wr-base, time.Millisecond).Seconds(), nil
}

type benchGuest struct{ disk, kernel, initrd, cmdline string }

// loadGuest finds the built test guest.
func loadGuest(dir string) (benchGuest, error) {
	if dir == "" {
		cache := os.Getenv("NIMBUS_CACHE")
		if cache == "" {
			base, err := os.UserCacheDir()
			if err != nil {
				return benchGuest{}, err
			}
			cache = filepath.Join(base, "nimbus")
		}
		dir = filepath.Join(cache, "test-guest-v2")
	}
	g := benchGuest{disk: filepath.Join(dir, "guest.qcow2"), kernel: filepath.Join(dir, "vmlinuz"), initrd: filepath.Join(dir, "initrd.img")}
	b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return g, fmt.Errorf("no test guest in %s (build it with test/guest/build.sh): %w", dir, err)
	}
	g.cmdline = strings.TrimSpace(string(b))
	return g, nil
}

func newBenchKey() (ssh.Signer, string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, "", err
	}
	return s, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))), nil
}

// provider authenticates to c as user in project.
func provider(c *cloud.Cloud, user, password, project string) (*gophercloud.ProviderClient, error) {
	pem, err := os.ReadFile(c.CACertFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	pc, err := openstack.NewClient(c.IdentityURL)
	if err != nil {
		return nil, err
	}
	pc.HTTPClient = http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return pc, openstack.Authenticate(context.Background(), pc, gophercloud.AuthOptions{Username: user, Password: password,
		DomainName: "Default", TenantName: project, AllowReauth: true})
}

// qemuPID is the QEMU process whose command line names server id.
func qemuPID(id string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if c := qemuCmdline(pid); strings.Contains(c, "qemu-system") && strings.Contains(c, id) {
			return pid
		}
	}
	return 0
}

func qemuCmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// rssOf is a process's resident memory in bytes ("self" for this one),
// 0 when it cannot be read.
func rssOf(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// goHeap is the live heap after a collection.
func goHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// sorted is a sorted copy of v.
func sorted[T cmp.Ordered](v []T) []T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s
}

func median[T cmp.Ordered](v []T) T { return sorted(v)[len(v)/2] }

func spread(d []time.Duration) string {
	s := sorted(d)
	return fmt.Sprintf("%6.2f s  (%.2f–%.2f)", median(s).Seconds(), s[0].Seconds(), s[len(s)-1].Seconds())
}
