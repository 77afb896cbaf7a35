package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/qmp"
)

// Config sets up the driver on one host.
type Config struct {
	// DataDir holds instances/<server id>/ (one private directory per
	// server) and images/ (the image cache), e.g. /var/lib/nimbus/qemu.
	DataDir string
	// Binary is QEMU (default qemu-system-x86_64 from PATH), QemuImg its
	// image tool (default qemu-img).
	Binary  string
	QemuImg string
	// Accel is "auto" (default: KVM only where it really works), "kvm" or
	// "tcg".
	Accel string
	// Host is this host's inventory (internal/host.Discover); the driver
	// sets its Hypervisor and Version from QEMU.
	Host driver.Host
	// Net is the data plane (default UserNet{AccessHost: Host.IP}).
	Net DataPlane
	// PortRange are the host ports forwarded to guests (default
	// 20000–29999).
	PortRange [2]int
	// ConsoleListen is the TCP address of the VNC console relay that the
	// controller's console proxy connects to (console.go; default: Host.IP
	// on any free port).
	ConsoleListen string
	// ShutdownTimeout is how long a graceful power-off waits for the guest
	// before stopping it hard (default 60 s, Nova's shutdown_timeout).
	ShutdownTimeout time.Duration
	// Sandbox runs QEMU under its seccomp sandbox (-sandbox). The zero
	// Config leaves it off; the agent's flag turns it on by default.
	Sandbox bool
	// RunAs is an unprivileged user QEMU drops to after start (only when
	// the agent runs as root); the driver gives it what QEMU must open.
	RunAs string
	Log   *slog.Logger
}

// Driver runs each server of this host as one QEMU process. It implements
// driver.Driver, driver.ImageUser and driver.PowerNotifier.
type Driver struct {
	cfg         Config
	log         *slog.Logger
	accel       string
	accelReason string
	version     int
	host        driver.Host
	instances   string
	cache       *imageCache
	ports       *portPool
	runAs       *user.User

	mu  sync.Mutex
	vms map[string]*vm

	store    atomic.Pointer[driver.ImageStore]
	listener atomic.Pointer[driver.PowerListener]

	closing   chan struct{}
	closeOnce sync.Once
	closed    bool // under mu: no watcher starts any more
	wg        sync.WaitGroup
}

// maxRootDisk bounds a root disk whose size comes from its image (a flavor
// of disk 0): 2 TiB.
const maxRootDisk = 2 << 40

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.ImageUser     = (*Driver)(nil)
	_ driver.PowerNotifier = (*Driver)(nil)
)

// vm is the driver's record of one server.
type vm struct {
	id, dir string

	// op is held (a 1-slot semaphore, so that waiting honours ctx) by the
	// one operation at work on the server; busy counts them for the
	// watcher.
	op       chan struct{}
	busy     atomic.Int32
	notified atomic.Int32 // the power state last told the listener, -1 none

	mu    sync.Mutex // guards the fields below; never held across slow work
	st    state
	ready bool // state.json is written: the server exists
	gone  bool // destroyed
	proc  *proc
}

func newVM(id, dir string) *vm {
	v := &vm{id: id, dir: dir, op: make(chan struct{}, 1)}
	v.notified.Store(-1)
	return v
}

// New makes the driver: it checks QEMU, picks the accelerator, and takes
// over the servers in DataDir — re-attaching the QEMUs that still run (they
// outlive an agent restart) and starting again those that should run but do
// not (after a host reboot or a crash).
func New(cfg Config) (*Driver, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("qemu: no data directory")
	}
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	if cfg.QemuImg == "" {
		cfg.QemuImg = "qemu-img"
	}
	if cfg.Accel == "" {
		cfg.Accel = "auto"
	}
	if cfg.PortRange == [2]int{} {
		cfg.PortRange = [2]int{20000, 29999}
	}
	if cfg.PortRange[0] <= 0 || cfg.PortRange[1] > 65535 || cfg.PortRange[0] > cfg.PortRange[1] {
		return nil, fmt.Errorf("qemu: bad port range %d-%d", cfg.PortRange[0], cfg.PortRange[1])
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 60 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Net == nil {
		cfg.Net = UserNet{AccessHost: cfg.Host.IP}
	}
	var err error
	if cfg.Binary, err = exec.LookPath(cfg.Binary); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	if cfg.QemuImg, err = exec.LookPath(cfg.QemuImg); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	cfg.DataDir = dataDir
	d := &Driver{cfg: cfg, log: cfg.Log, vms: map[string]*vm{}, closing: make(chan struct{}),
		instances: filepath.Join(dataDir, "instances"), cache: newImageCache(filepath.Join(dataDir, "images"), cfg.QemuImg, cfg.Log)}
	// QEMU's sockets live in the server directories: their paths must fit
	// a sockaddr_un.
	if n := len(filepath.Join(d.instances, "00000000-0000-0000-0000-000000000000", migrateSock)); n > 107 {
		return nil, fmt.Errorf("qemu: data directory %s is too long for QEMU's unix sockets (%d > 107 bytes)", dataDir, n)
	}
	if cfg.RunAs != "" && os.Geteuid() == 0 {
		if d.runAs, err = user.Lookup(cfg.RunAs); err != nil {
			return nil, fmt.Errorf("qemu: run as: %w", err)
		}
	}
	if d.version, err = qemuVersion(cfg.Binary); err != nil {
		return nil, err
	}
	if d.accel, d.accelReason, err = Accelerator(cfg.Accel); err != nil {
		return nil, err
	}
	d.cfg.Net = withAccel(d.cfg.Net, d.accel)
	bind := ""
	if un, ok := cfg.Net.(UserNet); ok {
		bind = un.ListenAddr
	}
	d.ports = newPortPool(cfg.PortRange[0], cfg.PortRange[1], bind)
	d.host = cfg.Host
	d.host.Up = true
	d.host.Hypervisor = HypervisorType(d.accel)
	d.host.Version = d.version
	if d.host.Name == "" {
		d.host.Name, _ = os.Hostname()
	}
	if d.host.Zone == "" {
		d.host.Zone = "nova"
	}
	if d.host.UptimeSince == 0 {
		d.host.UptimeSince = bootTime()
	}
	for _, dir := range []string{dataDir, d.instances, d.cache.dir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
	}
	if d.runAs != nil {
		// QEMU, once it is RunAs, reaches into its server directory (the
		// suspend stream's socket and file, a hot-plugged volume's TLS
		// key): let it pass through, not list.
		for _, dir := range []string{dataDir, d.instances} {
			if err := os.Chmod(dir, 0o711); err != nil {
				return nil, fmt.Errorf("qemu: %w", err)
			}
		}
		if err := d.letPass(dataDir); err != nil {
			return nil, err
		}
	}
	d.log.Info("qemu: driver ready", "accel", d.accel, "why", d.accelReason, "qemu_version", d.version, "data_dir", dataDir)
	if err := d.recover(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

var versionRE = regexp.MustCompile(`version (\d+)\.(\d+)(?:\.(\d+))?`)

// qemuVersion is QEMU's version as Nova reports hypervisor_version:
// major*1000000 + minor*1000 + micro (7.2.22 → 7002022).
func qemuVersion(binary string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("qemu: %s --version: %w", binary, err)
	}
	return parseVersion(string(out))
}

func parseVersion(s string) (int, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("qemu: no version in %.80q", s)
	}
	v := 0
	for i, mul := range []int{1000000, 1000, 1} {
		n, _ := strconv.Atoi(m[i+1])
		v += n * mul
	}
	return v, nil
}

// bootTime is when the host booted (unix seconds), from /proc/stat.
func bootTime() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "btime" {
				if n, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return time.Now().Unix()
}

// recover takes over the servers found in DataDir/instances.
func (d *Driver) recover() error {
	ents, err := os.ReadDir(d.instances)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() || !validID(e.Name()) {
			continue
		}
		id := e.Name()
		dir := filepath.Join(d.instances, id)
		st, err := readState(dir)
		if errors.Is(err, os.ErrNotExist) {
			// A spawn that did not get as far as its record: nothing runs
			// from it (QEMU is only started after the record is written).
			if pid := readPid(dir); qemuAlive(pid, dir) {
				d.log.Warn("qemu: QEMU running for a server without a record; leaving it", "server", id, "pid", pid)
				continue
			}
			d.log.Info("qemu: removing an unfinished spawn", "server", id)
			os.RemoveAll(dir)
			continue
		}
		if err != nil {
			d.log.Error("qemu: unreadable server record; leaving the server alone", "server", id, "error", err)
			continue
		}
		v := newVM(id, dir)
		v.st, v.ready = st, true
		d.ports.claim(id, st.Forwards)
		d.mu.Lock()
		d.vms[id] = v
		d.mu.Unlock()
		if pid := readPid(dir); qemuAlive(pid, dir) {
			d.reattach(v, pid)
			continue
		}
		if st.Power == wantRunning || st.Power == wantPaused {
			// Should run, does not: the host rebooted or QEMU died while
			// no agent watched. Start it again, holding its op lock so that
			// ops queue behind the start.
			v.op <- struct{}{}
			v.busy.Add(1)
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				defer d.release(v)
				d.restart(v)
			}()
		}
	}
	return nil
}

// reattach takes over a QEMU started by an earlier agent process.
func (d *Driver) reattach(v *vm, pid int) {
	p := &proc{pid: pid, dir: v.dir, exited: make(chan struct{}), started: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mon, err := qmp.Dial(ctx, filepath.Join(v.dir, qmpSock))
	if err != nil {
		d.log.Error("qemu: re-attaching: no QMP; the VM runs unmanaged until the next agent start", "server", v.id, "pid", pid, "error", err)
	} else {
		p.mon = mon
		v.mu.Lock()
		pins := v.st.Pinning
		v.mu.Unlock()
		if err := d.pin(ctx, p, pins); err != nil {
			d.log.Warn("qemu: re-attaching: pinning", "server", v.id, "error", err)
		}
	}
	d.log.Info("qemu: re-attached", "server", v.id, "pid", pid)
	d.attach(v, p)
}

// restart starts a server that should run and does not.
func (d *Driver) restart(v *vm) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-d.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	v.mu.Lock()
	want := v.st.Power
	v.mu.Unlock()
	d.log.Info("qemu: starting a server that should run", "server", v.id, "power", want)
	p, err := d.launchRetry(ctx, v, "")
	if err == nil && want == wantPaused {
		err = p.mon.Stop(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		d.log.Error("qemu: could not start the server again", "server", v.id, "error", err)
		v.mu.Lock()
		v.st.Power = wantShutoff
		werr := writeState(v.dir, v.st)
		v.mu.Unlock()
		if werr != nil {
			d.log.Error("qemu: saving state", "server", v.id, "error", werr)
		}
		d.notify(v, driver.Shutdown)
	}
}

// Close stops supervising the VMs; it does not stop them: they outlive an
// agent restart and the next New re-attaches them.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		d.mu.Unlock()
		close(d.closing)
		d.wg.Wait()
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, v := range d.vms {
			v.mu.Lock()
			if v.proc != nil {
				v.proc.closeMon()
			}
			v.mu.Unlock()
		}
	})
	return nil
}

// SetImageStore gives the driver the image service.
func (d *Driver) SetImageStore(s driver.ImageStore) { d.store.Store(&s) }

// SetPowerListener sets who hears of power changes the driver did not make.
func (d *Driver) SetPowerListener(l driver.PowerListener) { d.listener.Store(&l) }

func (d *Driver) imageStore() driver.ImageStore {
	if p := d.store.Load(); p != nil {
		return *p
	}
	return nil
}

// Name is "qemu".
func (d *Driver) Name() string { return "qemu" }

// Hosts is this one host.
func (d *Driver) Hosts(ctx context.Context) ([]driver.Host, error) {
	h := d.host
	h.GPUs = append([]driver.GPU(nil), h.GPUs...)
	h.CPUs = append([]driver.CPU(nil), h.CPUs...)
	h.ReservedCPUs = append([]int(nil), h.ReservedCPUs...)
	h.NUMANodes = append([]driver.NUMANode(nil), h.NUMANodes...)
	return []driver.Host{h}, nil
}

// Accel is the accelerator the driver runs QEMU with, and why.
func (d *Driver) Accel() (accel, reason string) { return d.accel, d.accelReason }

// lookup finds a server.
func (d *Driver) lookup(id string) *vm {
	if !validID(id) {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.vms[id]
}

// acquire takes a server's op lock; release gives it back.
func (d *Driver) acquire(ctx context.Context, id string) (*vm, error) {
	v := d.lookup(id)
	if v == nil {
		return nil, driver.ErrNotFound
	}
	if err := d.lock(ctx, v); err != nil {
		return nil, err
	}
	v.mu.Lock()
	ok := v.ready && !v.gone
	v.mu.Unlock()
	if !ok {
		d.release(v)
		return nil, driver.ErrNotFound
	}
	return v, nil
}

func (d *Driver) lock(ctx context.Context, v *vm) error {
	select {
	case v.op <- struct{}{}:
		v.busy.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *Driver) release(v *vm) {
	v.notified.Store(-1)
	v.busy.Add(-1)
	<-v.op
}

// current is v's live process, or nil.
func (v *vm) current() *proc {
	v.mu.Lock()
	p := v.proc
	v.mu.Unlock()
	if p == nil || p.done() {
		return nil
	}
	return p
}

// setPower records the desired power state.
func (v *vm) setPower(want string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.st.Power == want {
		return nil
	}
	v.st.Power = want
	return writeState(v.dir, v.st)
}

func (v *vm) want() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.st.Power
}

// procPower is the power state of a live QEMU from its run state.
func (d *Driver) procPower(ctx context.Context, p *proc) driver.PowerState {
	if p.done() {
		return driver.Shutdown
	}
	if p.mon == nil {
		return driver.Running
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	status, _, err := p.mon.Status(ctx)
	if err != nil {
		if p.done() {
			return driver.Shutdown
		}
		return driver.NoState
	}
	return powerOf(status)
}

// powerOf maps QEMU's run state to Nova's power state, as libvirt's domain
// states map in nova/virt/libvirt.
func powerOf(status string) driver.PowerState {
	switch status {
	case "running":
		return driver.Running
	case "shutdown":
		return driver.Shutdown
	case "internal-error", "guest-panicked":
		return driver.Crashed
	}
	return driver.Paused
}

// power is a server's power state: off (Shutdown, also when suspended, as
// Nova's libvirt driver reports a managed-saved domain) without a process,
// else what QEMU says.
func (d *Driver) power(ctx context.Context, v *vm) driver.PowerState {
	p := v.current()
	if p == nil {
		return driver.Shutdown
	}
	return d.procPower(ctx, p)
}

// State returns one server's power state.
func (d *Driver) State(ctx context.Context, id string) (driver.PowerState, error) {
	v := d.lookup(id)
	if v == nil {
		return driver.NoState, driver.ErrNotFound
	}
	v.mu.Lock()
	ok := v.ready && !v.gone
	v.mu.Unlock()
	if !ok {
		return driver.NoState, driver.ErrNotFound
	}
	return d.power(ctx, v), nil
}

// List returns this host's servers.
func (d *Driver) List(ctx context.Context) ([]driver.Instance, error) {
	d.mu.Lock()
	vms := make([]*vm, 0, len(d.vms))
	for _, v := range d.vms {
		vms = append(vms, v)
	}
	d.mu.Unlock()
	out := make([]driver.Instance, 0, len(vms))
	for _, v := range vms {
		v.mu.Lock()
		ok := v.ready && !v.gone
		v.mu.Unlock()
		if ok {
			out = append(out, driver.Instance{ID: v.id, Host: d.host.Name, Power: d.power(ctx, v)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Spawn creates and boots a server; spawning an existing server only makes
// sure it runs.
func (d *Driver) Spawn(ctx context.Context, spec driver.Spec) error {
	id := spec.ServerID
	if !validID(id) {
		return fmt.Errorf("qemu: spawn: %w: %q", errInvalidID, id)
	}
	d.mu.Lock()
	v := d.vms[id]
	if v == nil {
		v = newVM(id, filepath.Join(d.instances, id))
		d.vms[id] = v
	}
	d.mu.Unlock()
	if err := d.lock(ctx, v); err != nil {
		return err
	}
	defer d.release(v)
	v.mu.Lock()
	ready, gone := v.ready, v.gone
	v.mu.Unlock()
	if gone {
		return fmt.Errorf("qemu: spawn %s: the server was destroyed meanwhile", id)
	}
	if ready {
		return d.ensureRunning(ctx, v)
	}
	start := time.Now()
	if err := d.create(ctx, v, spec); err != nil {
		os.RemoveAll(v.dir)
		d.ports.release(id)
		d.mu.Lock()
		if d.vms[id] == v {
			delete(d.vms, id)
		}
		d.mu.Unlock()
		v.mu.Lock()
		v.gone = true
		v.mu.Unlock()
		return fmt.Errorf("qemu: spawn %s: %w", id, err)
	}
	d.log.Info("qemu: server created", "server", id, "ms", time.Since(start).Milliseconds())
	if _, err := d.launchRetry(ctx, v, ""); err != nil {
		return err
	}
	return nil
}

// ensureRunning brings an existing server to running from whatever state
// it is in.
func (d *Driver) ensureRunning(ctx context.Context, v *vm) error {
	if p := v.current(); p != nil {
		if d.procPower(ctx, p) == driver.Paused {
			if err := p.mon.Cont(ctx); err != nil {
				return fmt.Errorf("qemu: %s: cont: %w", v.id, err)
			}
		}
		return v.setPower(wantRunning)
	}
	if fileExists(filepath.Join(v.dir, suspendFile)) {
		return d.resume(ctx, v)
	}
	if err := v.setPower(wantRunning); err != nil {
		return err
	}
	_, err := d.launchRetry(ctx, v, "")
	return err
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// create makes a new server's directory: the cached images, the disk, the
// seed, the forwarded ports and the record.
func (d *Driver) create(ctx context.Context, v *vm, spec driver.Spec) error {
	img := spec.Image
	if img.ID == "" {
		img.ID = spec.ImageID
	}
	if err := checkBootVolume(spec.Volumes); err != nil {
		return err
	}
	if _, ok := bootVolume(spec.Volumes); ok {
		st, err := d.createFromVolume(v, spec)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(v.dir, 0o700); err != nil {
			return err
		}
		return d.finishCreate(v, spec, img, st)
	}
	if img.ID == "" {
		return errors.New("no image nor boot volume to boot from")
	}
	if err := refusePlaceholder(img); err != nil {
		return err
	}
	if spec.VCPUs <= 0 || spec.MemoryMB <= 0 {
		return fmt.Errorf("bad flavor: %d vCPUs, %d MB", spec.VCPUs, spec.MemoryMB)
	}
	if err := os.MkdirAll(v.dir, 0o700); err != nil {
		return err
	}
	store := d.imageStore()
	base, err := d.cache.get(ctx, store, img)
	if err != nil {
		return err
	}
	format, vsize, err := d.checkImage(ctx, base, img.DiskFormat)
	if err != nil {
		// The data is what the image service has, and unusable: do not
		// keep it.
		os.Remove(base)
		return fmt.Errorf("image %s: %w", img.ID, err)
	}
	st := state{Power: wantRunning, Base: base, BaseFormat: format, Created: time.Now().UTC(), Firmware: "bios"}
	if img.KernelID != "" {
		if st.Kernel, err = d.cache.get(ctx, store, driver.ImageRef{ID: img.KernelID}); err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
		if img.RamdiskID != "" {
			if st.Initrd, err = d.cache.get(ctx, store, driver.ImageRef{ID: img.RamdiskID}); err != nil {
				return fmt.Errorf("ramdisk: %w", err)
			}
		}
	}
	// The virtual size is the image owner's to write: it never makes a
	// root disk larger than the flavor's (compute refuses such an image
	// too), nor, on a flavor that takes the image's size, past maxRootDisk.
	switch {
	case spec.DiskGB > 0 && vsize > int64(spec.DiskGB)<<30:
		return fmt.Errorf("the image's virtual size (%d bytes) is larger than the flavor's disk (%d GB)", vsize, spec.DiskGB)
	case vsize > maxRootDisk:
		return fmt.Errorf("the image's virtual size (%d bytes) is larger than %d bytes", vsize, int64(maxRootDisk))
	}
	size := max(int64(spec.DiskGB)<<30, vsize)
	tmp := filepath.Join(v.dir, "."+diskFile+".tmp")
	os.Remove(tmp)
	if err := d.createOverlay(ctx, tmp, base, format, size); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, diskFile)); err != nil {
		return err
	}
	return d.finishCreate(v, spec, img, st)
}

// finishCreate writes what every new server has beside its disk: the
// seed, the UEFI variables, the forwarded ports, and then the record.
func (d *Driver) finishCreate(v *vm, spec driver.Spec, img driver.ImageRef, st state) error {
	windows := strings.EqualFold(spec.OSType, "windows")
	if err := WriteSeed(filepath.Join(v.dir, seedFile), Seed{ConfigDrive: spec.ConfigDrive || windows, Spec: spec, Windows: windows}); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if strings.EqualFold(img.Properties["hw_firmware_type"], "uefi") {
		code, vars := findOVMF()
		if code == "" {
			return errors.New("the image needs UEFI (hw_firmware_type=uefi) and no OVMF firmware is installed")
		}
		b, err := os.ReadFile(vars)
		if err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(v.dir, varsFile), b, 0o600); err != nil {
			return err
		}
		st.Firmware = "uefi"
	}
	if d.forwarding() {
		guest := 22
		if windows {
			guest = 3389
		}
		hp, err := d.ports.take(v.id)
		if err != nil {
			return err
		}
		st.Forwards = map[int]int{guest: hp}
	}
	st.Spec = spec
	st.Spec.Image = img
	st.Pinning = pinning(spec)
	if err := d.chownForQEMU(v.dir, diskFile, seedFile, varsFile); err != nil {
		return err
	}
	if err := writeState(v.dir, st); err != nil {
		return err
	}
	v.mu.Lock()
	v.st = st
	v.st.Spec.UserData, v.st.Spec.AdminPass = nil, ""
	v.ready = true
	v.mu.Unlock()
	return nil
}

// refusePlaceholder keeps QEMU off a catalog image whose data is still the
// 1 MiB stand-in (nimbus_placeholder=true): it would sit on a disk of
// zeros with no console and no error. The error names the image, why, and
// the command that puts the real image in its place.
func refusePlaceholder(img driver.ImageRef) error {
	if img.Properties["nimbus_placeholder"] != "true" {
		return nil
	}
	name := img.Name
	if name == "" {
		name = img.ID
	}
	return fmt.Errorf("image %q (%s) cannot boot: %s; put the real image in its place with: %s",
		name, img.ID, imagecatalog.PlaceholderReason, imagecatalog.PlaceholderFix(img.ID, name))
}

// ovmfPaths are where Debian and Fedora install OVMF (code, vars).
var ovmfPaths = [][2]string{
	{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"},
	{"/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd"},
	{"/usr/share/edk2/ovmf/OVMF_CODE.fd", "/usr/share/edk2/ovmf/OVMF_VARS.fd"},
}

func findOVMF() (code, vars string) {
	for _, p := range ovmfPaths {
		if fileExists(p[0]) && fileExists(p[1]) {
			return p[0], p[1]
		}
	}
	return "", ""
}

// letPass makes sure the RunAs user may pass through every directory
// above dir, as QEMU must after it dropped its privileges. A directory of
// ours (owned by this process's user, an agent's data directory made
// 0700, say) gets search permission for others, never read; one of
// another owner that bars the way is an error that names it.
func (d *Driver) letPass(dir string) error {
	uid, _ := strconv.Atoi(d.runAs.Uid)
	gid, _ := strconv.Atoi(d.runAs.Gid)
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("qemu: %w", err)
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		passes := mode&0o001 != 0 || (st != nil && int(st.Gid) == gid && mode&0o010 != 0) ||
			(st != nil && int(st.Uid) == uid && mode&0o100 != 0)
		switch {
		case passes:
		case st != nil && int(st.Uid) == os.Geteuid():
			if err := os.Chmod(p, mode|0o001); err != nil {
				return fmt.Errorf("qemu: letting QEMU's user %s pass through %s: %w", d.runAs.Username, p, err)
			}
			d.log.Info("qemu: QEMU's user may now pass through (not list) a directory above its data", "dir", p, "user", d.runAs.Username)
		default:
			return fmt.Errorf("qemu: QEMU's user %s cannot pass through %s (mode %o), above the data directory: give it search permission (chmod o+x)",
				d.runAs.Username, p, mode)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// chownForQEMU gives the RunAs user the server directory and the files
// QEMU opens (or reopens) after it dropped its privileges.
func (d *Driver) chownForQEMU(dir string, names ...string) error {
	if d.runAs == nil {
		return nil
	}
	uid, _ := strconv.Atoi(d.runAs.Uid)
	gid, _ := strconv.Atoi(d.runAs.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return err
	}
	for _, n := range names {
		if err := os.Chown(filepath.Join(dir, n), uid, gid); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// machine builds the Machine of a server from its record.
func (d *Driver) machine(id, dir string, st state, incoming string) (*Machine, error) {
	spec := st.Spec
	props := spec.Image.Properties
	windows := strings.EqualFold(spec.OSType, "windows")
	m := &Machine{
		ID: id, Name: spec.Name, Dir: dir, Accel: d.accel,
		VCPUs: spec.VCPUs, MemoryMB: spec.MemoryMB, Cells: spec.Cells,
		Disk: Disk{Path: filepath.Join(dir, diskFile), Format: "qcow2", Bus: strings.ToLower(props["hw_disk_bus"]), IOPS: spec.DiskIOPS},
		Seed: &SeedDisk{Path: filepath.Join(dir, seedFile), Bus: strings.ToLower(props["hw_cdrom_bus"])},
		GPUs: spec.GPUs, Windows: windows, Firmware: st.Firmware,
		HotplugSlots: 4, Incoming: incoming, Sandbox: d.cfg.Sandbox,
	}
	if m.Name == "" {
		m.Name = id
	}
	if _, ok := bootVolume(spec.Volumes); ok {
		m.Disk = Disk{} // the boot volume is the disk
	}
	if d.runAs != nil {
		m.RunAs = d.runAs.Username
	}
	if len(m.Cells) > 0 && len(st.Pinning) == 0 {
		// Cells that are no pinning give no NUMA layout either.
		m.Cells = nil
	}
	if st.Kernel != "" {
		m.Kernel, m.Initrd, m.Append = st.Kernel, st.Initrd, spec.Image.CommandLine
	}
	if st.Firmware == "uefi" {
		m.OVMFCode, _ = findOVMF()
		m.OVMFVars = filepath.Join(dir, varsFile)
	}
	model, err := nicModel(props["hw_vif_model"])
	if err != nil {
		return nil, err
	}
	if err := d.volumeFiles(dir, spec.Volumes); err != nil {
		return nil, err
	}
	m.Volumes = spec.Volumes
	ports := spec.Ports
	if len(ports) == 0 && d.forwarding() {
		// A server without ports still gets one NIC on slirp's default
		// network, so that its forwarded ports reach it.
		ports = []driver.Port{{ID: "default", CIDR: "10.0.2.0/24", IP: "10.0.2.15", Gateway: "10.0.2.2"}}
	}
	for i, port := range ports {
		if port.MAC == "" {
			port.MAC = macFor(id, i)
		}
		nic := NIC{ID: fmt.Sprintf("net%d", i), MAC: port.MAC, Model: model}
		var fw map[int]int
		if i == 0 {
			fw = st.Forwards
		}
		if nic.Netdev, err = d.cfg.Net.Netdev(nic.ID, port, fw); err != nil {
			return nil, fmt.Errorf("qemu: server %s: port %s: %w", id, port.ID, err)
		}
		m.NICs = append(m.NICs, nic)
	}
	return m, nil
}

// macFor is a stable locally administered MAC (QEMU's 52:54:00 prefix)
// for NIC i of a server whose port has none.
func macFor(id string, i int) string {
	h := sha256.Sum256([]byte(id + "/" + strconv.Itoa(i)))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
}

// nicModel maps an image's hw_vif_model to QEMU's device.
func nicModel(prop string) (string, error) {
	switch strings.ToLower(prop) {
	case "", "virtio":
		return "virtio-net-pci", nil
	case "e1000":
		return "e1000", nil
	case "e1000e":
		return "e1000e", nil
	case "rtl8139":
		return "rtl8139", nil
	}
	return "", fmt.Errorf("qemu: hw_vif_model %q is not supported", prop)
}

// launchRetry launches QEMU; when its forwarded host port was taken by
// something else meanwhile, it takes another port and tries again.
func (d *Driver) launchRetry(ctx context.Context, v *vm, incoming string) (*proc, error) {
	if err := d.wire(ctx, v); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		p, err := d.launch(ctx, v, incoming)
		if err == nil || attempt == 2 || !errors.Is(err, errStartFailed) || !strings.Contains(err.Error(), "forwarding") {
			return p, err
		}
		v.mu.Lock()
		fw := map[int]int{}
		var terr error
		for g := range v.st.Forwards {
			if fw[g], terr = d.ports.take(v.id); terr != nil {
				break
			}
		}
		if terr == nil {
			for _, hp := range v.st.Forwards {
				d.ports.drop(hp)
			}
			v.st.Forwards = fw
			terr = writeState(v.dir, v.st)
		}
		v.mu.Unlock()
		if terr != nil {
			return nil, err
		}
		d.log.Warn("qemu: a forwarded port was taken; trying others", "server", v.id, "forwards", fw)
	}
}

// stop ends a server's QEMU: with graceful, by the ACPI power button
// (pressed again every 10 s, as Nova does, for a guest that missed it while
// booting) for up to timeout, then hard: QMP quit, then SIGKILL.
func (d *Driver) stop(ctx context.Context, v *vm, p *proc, graceful bool, timeout time.Duration) error {
	p.expect.Store(true)
	start := time.Now()
	if graceful && p.mon != nil && d.procPower(ctx, p) == driver.Running {
		deadline := time.Now().Add(timeout)
		for !p.done() {
			left := time.Until(deadline)
			if left <= 0 {
				d.log.Info("qemu: guest did not power off in time; stopping it hard", "server", v.id, "timeout", timeout)
				break
			}
			if err := p.mon.SystemPowerdown(ctx); err != nil && !errors.Is(err, qmp.ErrClosed) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				d.log.Warn("qemu: system_powerdown", "server", v.id, "error", err)
				break
			}
			p.wait(ctx, min(10*time.Second, left))
			if err := ctx.Err(); err != nil && !p.done() {
				return err
			}
		}
	}
	if !p.done() && p.mon != nil {
		qctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p.mon.Quit(qctx)
		cancel()
		p.wait(context.Background(), 5*time.Second)
	}
	if !p.done() {
		p.kill()
		if !p.wait(context.Background(), 10*time.Second) {
			return fmt.Errorf("qemu: %s: QEMU (pid %d) does not die", v.id, p.pid)
		}
	}
	p.closeMon()
	v.mu.Lock()
	if v.proc == p {
		v.proc = nil
	}
	v.mu.Unlock()
	d.log.Info("qemu: stopped", "server", v.id, "graceful", graceful, "ms", time.Since(start).Milliseconds())
	return nil
}

// PowerOff stops a server.
func (d *Driver) PowerOff(ctx context.Context, id string, graceful bool) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	if v.want() == wantSuspended {
		// Powering off a suspended server drops its saved state.
		os.Remove(filepath.Join(v.dir, suspendFile))
	}
	if err := v.setPower(wantShutoff); err != nil {
		return err
	}
	p := v.current()
	if p == nil {
		return nil
	}
	return d.stop(ctx, v, p, graceful, d.cfg.ShutdownTimeout)
}

// PowerOn starts a stopped server (a suspended one is resumed).
func (d *Driver) PowerOn(ctx context.Context, id string) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	if p := v.current(); p != nil {
		if d.procPower(ctx, p) == driver.Paused {
			return fmt.Errorf("qemu: power on %s: the server is paused", id)
		}
		return v.setPower(wantRunning)
	}
	if fileExists(filepath.Join(v.dir, suspendFile)) {
		return d.resume(ctx, v)
	}
	if err := v.setPower(wantRunning); err != nil {
		return err
	}
	_, err = d.launchRetry(ctx, v, "")
	return err
}

// Reboot restarts a server. Soft: the guest shuts down by ACPI and the VM
// starts again (Nova's libvirt soft reboot), hard when the guest does not
// within ShutdownTimeout. Hard: a machine reset of a running QEMU, else a
// fresh start; a hard reboot also starts a stopped server and drops a
// suspended one's saved state.
func (d *Driver) Reboot(ctx context.Context, id string, hard bool) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	p := v.current()
	if !hard {
		if p == nil {
			return fmt.Errorf("qemu: soft reboot %s: the server is not running", id)
		}
		if d.procPower(ctx, p) == driver.Running {
			p.expect.Store(true)
			if err := d.stop(ctx, v, p, true, d.cfg.ShutdownTimeout); err != nil {
				return err
			}
			if err := v.setPower(wantRunning); err != nil {
				return err
			}
			_, err := d.launchRetry(ctx, v, "")
			return err
		}
	}
	os.Remove(filepath.Join(v.dir, suspendFile))
	if err := v.setPower(wantRunning); err != nil {
		return err
	}
	if p != nil && p.mon != nil {
		err := p.mon.SystemReset(ctx)
		if err == nil && d.procPower(ctx, p) != driver.Running {
			err = p.mon.Cont(ctx)
		}
		if err == nil {
			return nil
		}
		d.log.Warn("qemu: reset failed; restarting QEMU", "server", id, "error", err)
	}
	if p != nil {
		if err := d.stop(ctx, v, p, false, 0); err != nil {
			return err
		}
	}
	_, err = d.launchRetry(ctx, v, "")
	return err
}

// Pause freezes a running server's vCPUs.
func (d *Driver) Pause(ctx context.Context, id string) error { return d.freeze(ctx, id, true) }

// Unpause thaws a paused server.
func (d *Driver) Unpause(ctx context.Context, id string) error { return d.freeze(ctx, id, false) }

// freeze stops (pause) or continues a running server's vCPUs; asking for
// the state it is in does nothing.
func (d *Driver) freeze(ctx context.Context, id string, pause bool) error {
	what, want, to, call := "unpause", driver.Running, wantRunning, (*qmp.Monitor).Cont
	if pause {
		what, want, to, call = "pause", driver.Paused, wantPaused, (*qmp.Monitor).Stop
	}
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	p := v.current()
	if p == nil || p.mon == nil {
		return fmt.Errorf("qemu: %s %s: the server is not running", what, id)
	}
	if d.procPower(ctx, p) != want {
		if err := call(p.mon, ctx); err != nil {
			return fmt.Errorf("qemu: %s %s: %w", what, id, err)
		}
	}
	return v.setPower(to)
}

// Resize gives a server its new flavor: the VM stops (gracefully), a copy
// of its disk is kept (Nova's <instance>_resize) and the disk grows, and
// it starts again with the new vCPUs, RAM and pinning if it ran. A revert
// puts the kept disk back instead; ConfirmResize drops it.
func (d *Driver) Resize(ctx context.Context, spec driver.Spec) error {
	v, err := d.acquire(ctx, spec.ServerID)
	if err != nil {
		return err
	}
	defer d.release(v)
	if spec.VCPUs <= 0 || spec.MemoryMB <= 0 {
		return fmt.Errorf("qemu: resize %s: bad flavor: %d vCPUs, %d MB", v.id, spec.VCPUs, spec.MemoryMB)
	}
	want := v.want()
	if want == wantSuspended {
		return fmt.Errorf("qemu: resize %s: the server is suspended", v.id)
	}
	v.mu.Lock()
	vols, err := resizeVolumes(v.st.Spec.Volumes, spec.Volumes)
	v.mu.Unlock()
	if err != nil {
		return fmt.Errorf("qemu: resize %s: %w", v.id, err)
	}
	_, fromVolume := bootVolume(vols)
	p := v.current()
	if p != nil {
		if err := d.stop(ctx, v, p, true, d.cfg.ShutdownTimeout); err != nil {
			return err
		}
	}
	if !fromVolume {
		// A boot volume is not the driver's to copy or grow.
		if err := d.swapDisk(v.dir, spec.Revert); err != nil {
			return fmt.Errorf("qemu: resize %s: %w", v.id, err)
		}
		if _, err := d.growDisk(ctx, filepath.Join(v.dir, diskFile), int64(spec.DiskGB)<<30); err != nil {
			return fmt.Errorf("qemu: resize %s: %w", v.id, err)
		}
	}
	v.mu.Lock()
	st := v.st
	img := st.Spec.Image
	st.Spec = spec
	st.Spec.Volumes = vols
	st.Spec.Image = img // the disk already is what it is
	st.Pinning = pinning(spec)
	if p != nil {
		st.Power = wantRunning
	}
	err = writeState(v.dir, st)
	if err == nil {
		st.Spec.UserData, st.Spec.AdminPass = nil, ""
		v.st = st
	}
	v.mu.Unlock()
	if err != nil || p == nil {
		return err
	}
	_, err = d.launchRetry(ctx, v, "")
	return err
}

// swapDisk, for a stopped server in dir, keeps a copy of its disk before a
// resize, replacing any older copy (one a failed confirm left), or on a
// revert puts the kept disk back; a revert with nothing kept leaves the
// disk as it is.
func (d *Driver) swapDisk(dir string, revert bool) error {
	disk, kept := filepath.Join(dir, diskFile), filepath.Join(dir, keptFile)
	if revert {
		err := os.Rename(kept, disk)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return d.chownForQEMU(dir, diskFile)
	}
	tmp := kept + ".tmp"
	if err := copyFile(disk, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, kept)
}

// copyFile copies src to a new file dst (copy_file_range, so a file
// system that can shares the blocks).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ConfirmResize drops the disk the server's last resize kept.
func (d *Driver) ConfirmResize(ctx context.Context, id string) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	if err := os.Remove(filepath.Join(v.dir, keptFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("qemu: confirm resize %s: %w", id, err)
	}
	return nil
}

// Snapshot copies a server's disk — its overlay and base flattened into
// one standalone qcow2 — and uploads it as image imageID. A running VM is
// paused for the copy (QEMU flushes its disks when it stops) and runs again
// before the upload.
func (d *Driver) Snapshot(ctx context.Context, id, imageID string) (int64, error) {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return 0, err
	}
	defer d.release(v)
	if b, ok := v.bootVolume(); ok {
		return 0, fmt.Errorf("qemu: snapshot %s: the server boots from volume %s (%w): snapshot the volume", id, b.ID, ErrBootVolume)
	}
	store := d.imageStore()
	if store == nil {
		return 0, fmt.Errorf("qemu: snapshot %s: no image store", id)
	}
	tmp, err := os.CreateTemp(v.dir, ".snapshot-*.qcow2")
	if err != nil {
		return 0, fmt.Errorf("qemu: snapshot %s: %w", id, err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	start := time.Now()
	p := v.current()
	paused := false
	if p != nil && p.mon != nil && d.procPower(ctx, p) == driver.Running {
		if err := p.mon.Stop(ctx); err != nil {
			return 0, fmt.Errorf("qemu: snapshot %s: pause: %w", id, err)
		}
		paused = true
	}
	args := []string{"convert", "-O", "qcow2", "-f", "qcow2"}
	if p != nil {
		args = append(args, "-U")
	}
	_, err = d.qemuImg(ctx, append(args, filepath.Join(v.dir, diskFile), tmp.Name())...)
	frozen := time.Since(start)
	if paused {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cerr := p.mon.Cont(cctx)
		cancel()
		if cerr != nil && !p.done() {
			d.log.Error("qemu: snapshot: could not resume the server", "server", id, "error", cerr)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("qemu: snapshot %s: %w", id, err)
	}
	f, err := os.Open(tmp.Name())
	if err != nil {
		return 0, fmt.Errorf("qemu: snapshot %s: %w", id, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("qemu: snapshot %s: %w", id, err)
	}
	if err := store.Upload(ctx, imageID, "qcow2", f); err != nil {
		return 0, fmt.Errorf("qemu: snapshot %s: upload: %w", id, err)
	}
	d.log.Info("qemu: snapshot", "server", id, "image", imageID, "bytes", fi.Size(), "paused_ms", frozen.Milliseconds(),
		"ms", time.Since(start).Milliseconds())
	return fi.Size(), nil
}

// Destroy stops a server's QEMU and removes everything it had on the host.
func (d *Driver) Destroy(ctx context.Context, id string) error {
	if !validID(id) {
		return nil
	}
	v := d.lookup(id)
	if v == nil {
		// Not known: remove what a crashed spawn may have left.
		dir := filepath.Join(d.instances, id)
		if pid := readPid(dir); qemuAlive(pid, dir) {
			p := &proc{pid: pid, dir: dir, exited: make(chan struct{})}
			p.kill()
			p.wait(ctx, 10*time.Second)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("qemu: destroy %s: %w", id, err)
		}
		return nil
	}
	if err := d.lock(ctx, v); err != nil {
		return err
	}
	defer d.release(v)
	if p := v.current(); p != nil {
		if err := d.stop(ctx, v, p, false, 0); err != nil {
			return err
		}
	} else {
		// A process that was never attached (re-attach failed) still dies.
		if pid := readPid(v.dir); qemuAlive(pid, v.dir) {
			p := &proc{pid: pid, dir: v.dir, exited: make(chan struct{})}
			p.kill()
			p.wait(ctx, 10*time.Second)
		}
	}
	v.mu.Lock()
	v.gone = true
	v.mu.Unlock()
	if err := os.RemoveAll(v.dir); err != nil {
		return fmt.Errorf("qemu: destroy %s: %w", id, err)
	}
	d.mu.Lock()
	if d.vms[id] == v {
		delete(d.vms, id)
	}
	d.mu.Unlock()
	d.ports.release(id)
	d.log.Info("qemu: destroyed", "server", id)
	return nil
}

// Access lists how to reach a server: its forwarded ports.
func (d *Driver) Access(ctx context.Context, id string) ([]driver.Access, error) {
	v := d.lookup(id)
	if v == nil {
		return nil, driver.ErrNotFound
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.ready || v.gone {
		return nil, driver.ErrNotFound
	}
	acc := d.access(v.st)
	if acc == nil {
		acc = []driver.Access{}
	}
	return acc, nil
}

// maxConsole bounds the console output returned.
const maxConsole = 1 << 20

// ConsoleOutput returns the last lines of the serial console.
func (d *Driver) ConsoleOutput(ctx context.Context, id string, lines int) (string, error) {
	v := d.lookup(id)
	if v == nil {
		return "", driver.ErrNotFound
	}
	v.mu.Lock()
	ok := v.ready && !v.gone
	v.mu.Unlock()
	if !ok {
		return "", driver.ErrNotFound
	}
	out, err := tailLines(filepath.Join(v.dir, serialFile), lines, maxConsole)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return out, err
}

// tailLines returns the last n lines (all when n <= 0) of a file, reading
// at most limit bytes from its end, without NULs and carriage returns.
func tailLines(path string, n int, limit int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return "", err
	}
	const chunk = 64 << 10
	var buf []byte
	pos := end
	for pos > 0 && int64(len(buf)) < limit {
		size := min(int64(chunk), pos, limit-int64(len(buf)))
		pos -= size
		b := make([]byte, size)
		if _, err := f.ReadAt(b, pos); err != nil && err != io.EOF {
			return "", err
		}
		buf = append(b, buf...)
		if n > 0 && bytes.Count(buf, []byte{'\n'}) > n {
			break
		}
	}
	if pos > 0 {
		// Started mid-line: drop the partial first line.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	buf = bytes.ReplaceAll(buf, []byte{0}, nil)
	buf = bytes.ReplaceAll(buf, []byte{'\r'}, nil)
	if n > 0 {
		trimmed := bytes.TrimSuffix(buf, []byte{'\n'})
		ls := bytes.Split(trimmed, []byte{'\n'})
		if len(ls) > n {
			ls = ls[len(ls)-n:]
		}
		buf = append(bytes.Join(ls, []byte{'\n'}), '\n')
		if len(trimmed) == 0 {
			return "", nil
		}
	}
	return string(buf), nil
}
