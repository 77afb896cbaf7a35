// Package fake is the simulated hypervisor fleet: hosts with cores, RAM, disk
// and GPUs from config, and servers that take short, realistic delays to
// change state. It is a product feature (the default driver) and behaves as
// the real drivers do: its view of the VMs survives a restart of the
// controller, operations are idempotent, and an unknown server is
// driver.ErrNotFound.
package fake

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nimbus/internal/driver"
)

// Config sets up the fleet.
type Config struct {
	Hosts []driver.Host
	// Delay scales every operation's simulated duration; 0 means instant.
	Delay time.Duration
	// StateFile, when set, is where the fleet keeps its view of which VMs
	// exist, as an append-only journal of JSON lines (one per change, so a
	// change costs one small write however big the fleet), compacted on
	// start and when it grows past a few lines per VM. A restart keeps
	// running VMs, as real hypervisors do.
	StateFile string
}

// The operation names FailNext takes.
const (
	OpSpawn    = "spawn"
	OpDestroy  = "destroy"
	OpPowerOff = "power_off"
	OpPowerOn  = "power_on"
	OpReboot   = "reboot"
	OpPause    = "pause"
	OpUnpause  = "unpause"
	OpSuspend  = "suspend"
	OpResume   = "resume"
	OpResize   = "resize"
	OpSnapshot = "snapshot"
	OpAttach   = "attach_port"
	OpDetach   = "detach_port"
	// Volume hot-plug (volumes.go).
	OpAttachVolume = "attach_volume"
	OpDetachVolume = "detach_volume"
	OpExtendVolume = "extend_volume"
	OpSwapVolume   = "swap_volume"
)

// How long each operation takes, in units of Config.Delay.
var cost = map[string]int{
	OpSpawn: 3, OpDestroy: 1, OpPowerOff: 1, OpPowerOn: 1, OpReboot: 2, OpPause: 1, OpUnpause: 1,
	OpSuspend: 2, OpResume: 2, OpResize: 3, OpSnapshot: 2, OpAttach: 1, OpDetach: 1,
	OpAttachVolume: 1, OpDetachVolume: 1, OpExtendVolume: 1, OpSwapVolume: 2,
}

// maxConsoleLines bounds the console buffer each VM keeps.
const maxConsoleLines = 300

// vm is the fleet's record of one server.
type vm struct {
	ID      string            `json:"id"`
	Host    string            `json:"host"`
	Power   driver.PowerState `json:"power_state"`
	Spec    driver.Spec       `json:"spec"`
	Console []string          `json:"console"`
	Boots   int               `json:"boots"`
	Since   time.Time         `json:"since"`
	// KeptDiskGB is the size of the disk a resize kept for its revert
	// (Nova's <instance>_resize); nil when there is none.
	KeptDiskGB *int `json:"kept_disk_gb,omitempty"`
}

// Driver is the fake driver.
type Driver struct {
	cfg   Config
	mu    sync.Mutex
	hosts []driver.Host
	vms   map[string]*vm
	fail  map[string][]error

	// Journal writes happen outside mu so that file I/O does not hold up
	// the fleet: seq (taken under mu) orders the records, and persist drops
	// a record that a newer one of the same VM, or a compaction, overtook.
	seq       uint64
	jmu       sync.Mutex // guards the fields below; taken after mu, never before
	journal   *os.File
	lines     int
	compacted uint64
	written   map[string]uint64

	images atomic.Pointer[driver.ImageStore]
	copies map[string]int // CopyVolume's copies by volume id, under mu
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.ImageUser = (*Driver)(nil)
)

// SetImageStore gives the fleet the image service, where snapshots go.
func (d *Driver) SetImageStore(s driver.ImageStore) { d.images.Store(&s) }

// New makes a fake fleet, loading the VMs recorded in cfg.StateFile.
func New(cfg Config) (*Driver, error) {
	d := &Driver{cfg: cfg, vms: map[string]*vm{}, fail: map[string][]error{}, written: map[string]uint64{}}
	now := time.Now().Unix()
	for _, h := range cfg.Hosts {
		if h.Zone == "" {
			h.Zone = "nova"
		}
		if h.Hypervisor == "" {
			h.Hypervisor = "fake"
		}
		if h.Version == 0 {
			h.Version = 1000
		}
		if h.UptimeSince == 0 {
			h.UptimeSince = now
		}
		h.Normalize()
		d.hosts = append(d.hosts, h)
	}
	if cfg.StateFile != "" {
		if err := d.replay(); err != nil {
			return nil, err
		}
		d.mu.Lock()
		err := d.compactLocked()
		d.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	return d, nil
}

// DefaultFleet is the fleet a new install gets: four general hosts and one
// GPU host in zone "nova". Each is a two-socket machine whose first core on
// each socket is kept for the host: 64 pCPUs for servers on the general
// hosts, 96 on the GPU host.
func DefaultFleet() []driver.Host {
	var hosts []driver.Host
	for i := 1; i <= 4; i++ {
		h := driver.Host{
			Name: fmt.Sprintf("fake-host-%d", i), IP: fmt.Sprintf("192.0.2.%d", 10+i),
			MemoryMB: 256 * 1024, DiskGB: 4000, Zone: "nova",
			Hypervisor: "fake", Version: 1000, Up: true,
		}
		Topology(&h, 2, 17, 1)
		hosts = append(hosts, h)
	}
	gpu := driver.Host{
		Name: "fake-gpu-host-1", IP: "192.0.2.21", MemoryMB: 512 * 1024, DiskGB: 8000,
		Zone: "nova", Hypervisor: "fake", Version: 1000, Up: true,
	}
	Topology(&gpu, 2, 25, 1)
	for i := 0; i < 4; i++ {
		gpu.GPUs = append(gpu.GPUs, driver.GPU{Address: fmt.Sprintf("0000:%02x:00.0", 0x3b+i), Vendor: "NVIDIA",
			Model: "A100 80GB", NUMA: i / 2, VendorID: "10de", DeviceID: "20b5", IOMMUGroup: 30 + i, Driver: "vfio-pci"})
	}
	for i := 0; i < 2; i++ {
		gpu.GPUs = append(gpu.GPUs, driver.GPU{Address: fmt.Sprintf("0000:%02x:00.0", 0x86+i), Vendor: "NVIDIA",
			Model: "L4", NUMA: 1, VendorID: "10de", DeviceID: "27b8", IOMMUGroup: 40 + i, Driver: "vfio-pci"})
	}
	return append(hosts, gpu)
}

// Topology gives h the CPUs of a machine with sockets of cores of two
// threads, one NUMA node per socket, numbered as Linux numbers Intel's
// (thread siblings N and N+sockets*cores), and reserves the first reserved
// cores of each socket for the host. Memory is split evenly by node.
func Topology(h *driver.Host, sockets, cores, reserved int) {
	h.CPUs, h.ReservedCPUs, h.NUMANodes = nil, nil, nil
	half := sockets * cores
	for t := 0; t < 2; t++ {
		for s := 0; s < sockets; s++ {
			for c := 0; c < cores; c++ {
				id := t*half + s*cores + c
				first := s*cores + c
				h.CPUs = append(h.CPUs, driver.CPU{ID: id, Core: c, Socket: s, NUMA: s, Siblings: []int{first, first + half}})
				if c < reserved {
					h.ReservedCPUs = append(h.ReservedCPUs, id)
				}
			}
		}
	}
	sort.Slice(h.CPUs, func(i, j int) bool { return h.CPUs[i].ID < h.CPUs[j].ID })
	sort.Ints(h.ReservedCPUs)
	for s := 0; s < sockets; s++ {
		h.NUMANodes = append(h.NUMANodes, driver.NUMANode{ID: s, MemoryMB: h.MemoryMB / sockets})
	}
	h.Normalize()
}

// LoadFleet reads a fleet description (a JSON list of hosts) from a file.
// A host without "up" in the file is up. Keys are checked strictly: a
// misspelt one ("disk" for "disk_gb") would otherwise give a host silently
// without what it meant.
func LoadFleet(path string) ([]driver.Host, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fake: fleet: %w", err)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("fake: fleet %s: want a JSON list of hosts: %w", path, err)
	}
	hosts := make([]driver.Host, len(raw))
	for i, r := range raw {
		up, err := decodeHost(r, &hosts[i])
		if err != nil {
			return nil, fmt.Errorf("fake: fleet %s: host %s: %w", path, hostLabel(r, i), err)
		}
		hosts[i].Up = hosts[i].Up || !up
	}
	seen := map[string]bool{}
	for i := range hosts {
		hosts[i].Normalize()
		h := hosts[i]
		if h.Name == "" {
			return nil, fmt.Errorf("fake: fleet %s: host %d has no name", path, i+1)
		}
		if seen[h.Name] {
			return nil, fmt.Errorf("fake: fleet %s: host %q listed twice", path, h.Name)
		}
		seen[h.Name] = true
		if h.VCPUs <= 0 || h.MemoryMB <= 0 || h.DiskGB < 0 {
			return nil, fmt.Errorf("fake: fleet %s: host %q needs vcpus (or cpus) and memory_mb (or numa_nodes)", path, h.Name)
		}
	}
	return hosts, nil
}

// decodeHost decodes one host of a fleet file, refusing unknown keys (at
// any depth: cpus, gpus and numa_nodes too), and tells whether it says "up".
func decodeHost(r json.RawMessage, h *driver.Host) (hasUp bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(r))
	dec.DisallowUnknownFields()
	if err := dec.Decode(h); err != nil {
		return false, err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(r, &keys); err != nil {
		return false, err
	}
	_, hasUp = keys["up"]
	return hasUp, nil
}

// hostLabel names a fleet file's host for an error: its name when it has
// one, else its place in the list.
func hostLabel(r json.RawMessage, i int) string {
	var h struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(r, &h) == nil && h.Name != "" {
		return strconv.Quote(h.Name)
	}
	return "#" + strconv.Itoa(i+1)
}

// FailNext makes the next call of op (OpSpawn, OpPowerOff, …) fail with err
// instead of doing its work, for tests of error paths. Calls queue up.
func (d *Driver) FailNext(op string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail[op] = append(d.fail[op], err)
}

// SetHostUp marks a host up or down, as a hypervisor that stops answering.
func (d *Driver) SetHostUp(name string, up bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.hosts {
		if d.hosts[i].Name == name {
			d.hosts[i].Up = up
			return true
		}
	}
	return false
}

// Name is "fake".
func (d *Driver) Name() string { return "fake" }

// Hosts lists the fleet.
func (d *Driver) Hosts(ctx context.Context) ([]driver.Host, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]driver.Host, len(d.hosts))
	for i, h := range d.hosts {
		h.GPUs = append([]driver.GPU(nil), h.GPUs...)
		out[i] = h
	}
	return out, nil
}

// wait simulates the time op takes, then takes any injected failure.
func (d *Driver) wait(ctx context.Context, op string) error {
	if dl := time.Duration(cost[op]) * d.cfg.Delay; dl > 0 {
		t := time.NewTimer(dl)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	} else if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if q := d.fail[op]; len(q) > 0 {
		err := q[0]
		d.fail[op] = q[1:]
		return err
	}
	return nil
}

// change runs f on the VM under the lock and saves the VM's record.
func (d *Driver) change(id string, f func(v *vm) error) error {
	d.mu.Lock()
	v, ok := d.vms[id]
	if !ok {
		d.mu.Unlock()
		return driver.ErrNotFound
	}
	if err := f(v); err != nil {
		d.mu.Unlock()
		return err
	}
	w, err := d.saveLocked(v)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return d.persist(w)
}

// entry is one journal line: a VM's whole record, or its removal.
type entry struct {
	Put *vm    `json:"put,omitempty"`
	Del string `json:"del,omitempty"`
}

// replay reads the journal into d.vms; a line that does not parse is an
// error rather than a silently lost VM.
func (d *Driver) replay() error {
	f, err := os.Open(d.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var e entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || (e.Put == nil && e.Del == "") || (e.Put != nil && e.Put.ID == "") {
			return fmt.Errorf("fake: %s line %d: corrupt VM record: %v", d.cfg.StateFile, n, err)
		}
		if e.Put != nil {
			d.vms[e.Put.ID] = e.Put
		} else {
			delete(d.vms, e.Del)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("fake: %s: %w", d.cfg.StateFile, err)
	}
	return nil
}

// compactLocked rewrites the journal as one line per live VM (temp file and
// rename) and reopens it for appending. Callers hold d.mu.
func (d *Driver) compactLocked() error {
	d.jmu.Lock()
	defer d.jmu.Unlock()
	var buf []byte
	for _, v := range d.vms {
		b, err := json.Marshal(entry{Put: forDisk(v)})
		if err != nil {
			return fmt.Errorf("fake: compact: %w", err)
		}
		buf = append(append(buf, b...), '\n')
	}
	if err := os.MkdirAll(filepath.Dir(d.cfg.StateFile), 0o700); err != nil {
		return fmt.Errorf("fake: compact: %w", err)
	}
	tmp := d.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o600); err != nil {
		return fmt.Errorf("fake: compact: %w", err)
	}
	if err := os.Rename(tmp, d.cfg.StateFile); err != nil {
		return fmt.Errorf("fake: compact: %w", err)
	}
	if d.journal != nil {
		d.journal.Close()
	}
	f, err := os.OpenFile(d.cfg.StateFile, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("fake: compact: %w", err)
	}
	d.journal, d.lines, d.compacted = f, len(d.vms), d.seq
	clear(d.written)
	return nil
}

// forDisk is v without what only the guest needs at first boot (user data,
// admin password), which is never kept.
func forDisk(v *vm) *vm {
	rec := *v
	rec.Spec.UserData, rec.Spec.AdminPass = nil, ""
	return &rec
}

// record is one pending journal line.
type record struct {
	id   string
	line []byte
	seq  uint64
}

// saveLocked prepares the journal line of a VM's record for persist.
func (d *Driver) saveLocked(v *vm) (record, error) {
	d.seq++
	if d.cfg.StateFile == "" {
		return record{}, nil
	}
	b, err := json.Marshal(entry{Put: forDisk(v)})
	if err != nil {
		return record{}, fmt.Errorf("fake: save: %w", err)
	}
	return record{id: v.ID, line: append(b, '\n'), seq: d.seq}, nil
}

// removeLocked prepares the journal line of a VM's removal.
func (d *Driver) removeLocked(id string) record {
	d.seq++
	if d.cfg.StateFile == "" {
		return record{}
	}
	b, _ := json.Marshal(entry{Del: id})
	return record{id: id, line: append(b, '\n'), seq: d.seq}
}

// persist appends a prepared line to the journal, unless a newer record of
// the same VM or a compaction got there first. It runs without d.mu, and
// compacts the journal when it has grown past a few lines per VM.
func (d *Driver) persist(r record) error {
	if r.id == "" {
		return nil
	}
	d.jmu.Lock()
	if r.seq <= d.compacted || r.seq <= d.written[r.id] {
		d.jmu.Unlock()
		return nil
	}
	// A write cut short (a full disk) is cut off again: a torn line
	// followed by others would make the journal unreadable at the next
	// start. The record counts as unwritten, so a later one is tried.
	end, serr := d.journal.Seek(0, io.SeekEnd)
	_, err := d.journal.Write(r.line)
	if err != nil && serr == nil {
		d.journal.Truncate(end)
	}
	if err == nil {
		d.written[r.id] = r.seq
	}
	d.lines++
	grown := d.lines > 1000 && d.lines > 8*len(d.written)
	d.jmu.Unlock()
	if err != nil {
		return fmt.Errorf("fake: save: %w", err)
	}
	if grown {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.jmu.Lock()
		need := d.lines > 1000 && d.lines > 4*len(d.vms)
		d.jmu.Unlock()
		if need {
			return d.compactLocked()
		}
	}
	return nil
}

func (d *Driver) hostLocked(name string) (driver.Host, bool) {
	for _, h := range d.hosts {
		if h.Name == name {
			return h, true
		}
	}
	return driver.Host{}, false
}

// console appends lines to a VM's serial console.
func (v *vm) console(lines ...string) {
	stamp := time.Since(v.Since).Seconds()
	for _, l := range lines {
		v.Console = append(v.Console, fmt.Sprintf("[%12.6f] %s", stamp, l))
		stamp += 0.137
	}
	if n := len(v.Console); n > maxConsoleLines {
		v.Console = append([]string(nil), v.Console[n-maxConsoleLines:]...)
	}
}

// boot writes a plausible boot log.
func (v *vm) boot() {
	v.Boots++
	host := v.Spec.Hostname
	if host == "" {
		host = v.Spec.Name
	}
	if host == "" {
		host = "server-" + v.ID
	}
	if b := v.bootVolume(); b != "" {
		// The root disk is the boot volume, as the qemu driver gives it.
		v.console("SeaBIOS (version 1.16.2)", "Booting from volume "+b+" (virtio serial "+b[:min(20, len(b))]+")...")
	}
	if v.Spec.OSType == "windows" {
		v.console("SeaBIOS (version 1.16.2)", "Booting from Hard Disk...",
			"Windows Boot Manager", "cloudbase-init: setting hostname to "+host,
			"cloudbase-init: plugins execution done")
		return
	}
	v.console("Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC",
		fmt.Sprintf("Command line: BOOT_IMAGE=/vmlinuz root=LABEL=cloudimg-rootfs ro console=ttyS0 (boot %d)", v.Boots),
		fmt.Sprintf("smpboot: Allowing %d CPUs, 0 hotplug CPUs", v.Spec.VCPUs),
		fmt.Sprintf("Memory: %dK available", v.Spec.MemoryMB*1024),
		"EXT4-fs (vda1): mounted filesystem with ordered data mode.",
		"systemd[1]: Reached target Network.",
		"cloud-init[512]: Cloud-init v. 23.1 running 'init' at "+time.Now().UTC().Format(time.RFC1123Z),
		"cloud-init[512]: ci-info: +++++++++++++++++++++++Net device info+++++++++++++++++++++++")
	for _, ip := range v.Spec.FixedIPs {
		v.console("cloud-init[512]: ci-info: | eth0 | True | " + ip + " |")
	}
	if v.Spec.KeyName != "" {
		v.console("cloud-init[512]: ci-info: Authorized keys from key pair '" + v.Spec.KeyName + "' installed")
	}
	v.console("cloud-init[640]: Cloud-init v. 23.1 finished. Datasource DataSourceOpenStackLocal.",
		"", host+" login: ")
}

// Spawn creates and boots a server on spec.Host; spawning an existing
// server only makes sure it runs.
func (d *Driver) Spawn(ctx context.Context, spec driver.Spec) error {
	if spec.ServerID == "" {
		return errors.New("fake: spawn: no server id")
	}
	if err := checkBootVolume(spec); err != nil {
		return err
	}
	if err := d.wait(ctx, OpSpawn); err != nil {
		return err
	}
	w, err := d.spawnLocked(spec)
	if err != nil {
		return err
	}
	return d.persist(w)
}

func (d *Driver) spawnLocked(spec driver.Spec) (record, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.vms[spec.ServerID]; ok {
		if v.Power != driver.Running {
			v.Power = driver.Running
			v.boot()
		}
		return d.saveLocked(v)
	}
	h, ok := d.hostLocked(spec.Host)
	if !ok {
		return record{}, fmt.Errorf("fake: spawn %s: no host %q in the fleet", spec.ServerID, spec.Host)
	}
	if !h.Up {
		return record{}, fmt.Errorf("fake: spawn %s: host %q is down", spec.ServerID, spec.Host)
	}
	spec.UserData = append([]byte(nil), spec.UserData...)
	v := &vm{ID: spec.ServerID, Host: spec.Host, Power: driver.Running, Spec: spec, Since: time.Now()}
	v.boot()
	w, err := d.saveLocked(v)
	if err != nil {
		return record{}, err
	}
	d.vms[v.ID] = v
	return w, nil
}

// Destroy removes a server; an unknown server is not an error.
func (d *Driver) Destroy(ctx context.Context, id string) error {
	if err := d.wait(ctx, OpDestroy); err != nil {
		return err
	}
	d.mu.Lock()
	if _, ok := d.vms[id]; !ok {
		d.mu.Unlock()
		return nil
	}
	w := d.removeLocked(id)
	delete(d.vms, id)
	d.mu.Unlock()
	return d.persist(w)
}

// PowerOff stops a server.
func (d *Driver) PowerOff(ctx context.Context, id string, graceful bool) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpPowerOff); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		if v.Power == driver.Shutdown {
			return nil
		}
		if graceful {
			v.console("", "systemd[1]: Stopping session-1.scope - Session 1 of User debian...",
				"reboot: Power down")
		}
		v.Power = driver.Shutdown
		return nil
	})
}

// PowerOn starts a stopped server.
func (d *Driver) PowerOn(ctx context.Context, id string) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpPowerOn); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		if v.Power == driver.Running {
			return nil
		}
		if v.Power == driver.Paused {
			return fmt.Errorf("fake: power on %s: server is paused", id)
		}
		v.Power = driver.Running
		v.boot()
		return nil
	})
}

// Reboot restarts a server; a hard reboot also starts a stopped one.
func (d *Driver) Reboot(ctx context.Context, id string, hard bool) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpReboot); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		if !hard && v.Power != driver.Running {
			return fmt.Errorf("fake: soft reboot %s: server is not running", id)
		}
		if v.Power == driver.Running {
			v.console("", "reboot: Restarting system")
		}
		v.Power = driver.Running
		v.boot()
		return nil
	})
}

// transition moves a VM from one of the from states to to; being in to
// already is success.
func (d *Driver) transition(ctx context.Context, op, id string, to driver.PowerState, from ...driver.PowerState) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, op); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		if v.Power == to {
			return nil
		}
		for _, f := range from {
			if v.Power == f {
				if to == driver.Running && v.Power == driver.Suspended {
					v.console("PM: resume from suspend-to-disk")
				}
				v.Power = to
				return nil
			}
		}
		return fmt.Errorf("fake: %s %s: not possible in power state %d", strings.ReplaceAll(op, "_", " "), id, v.Power)
	})
}

// Pause freezes a running server's vCPUs.
func (d *Driver) Pause(ctx context.Context, id string) error {
	return d.transition(ctx, OpPause, id, driver.Paused, driver.Running)
}

// Unpause thaws a paused server.
func (d *Driver) Unpause(ctx context.Context, id string) error {
	return d.transition(ctx, OpUnpause, id, driver.Running, driver.Paused)
}

// Suspend saves a server's memory to disk and stops it.
func (d *Driver) Suspend(ctx context.Context, id string) error {
	return d.transition(ctx, OpSuspend, id, driver.Suspended, driver.Running, driver.Paused)
}

// Resume brings a suspended server back.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.transition(ctx, OpResume, id, driver.Running, driver.Suspended)
}

// Resize changes a server's CPU, RAM and disk; a running server reboots.
// The disk it had is kept until ConfirmResize; a revert brings it back.
func (d *Driver) Resize(ctx context.Context, spec driver.Spec) error {
	if err := d.exists(spec.ServerID); err != nil {
		return err
	}
	if err := d.wait(ctx, OpResize); err != nil {
		return err
	}
	return d.change(spec.ServerID, func(v *vm) error {
		switch {
		case spec.Revert && v.KeptDiskGB != nil:
			v.Spec.DiskGB, v.KeptDiskGB = *v.KeptDiskGB, nil
		case spec.Revert:
			// Nothing was kept (an older resize): the disk stays.
		case spec.DiskGB > 0 && spec.DiskGB < v.Spec.DiskGB:
			return fmt.Errorf("fake: resize %s: disk cannot shrink from %d to %d GB", v.ID, v.Spec.DiskGB, spec.DiskGB)
		default: // replacing any older copy (one a failed confirm left)
			kept := v.Spec.DiskGB
			v.KeptDiskGB = &kept
		}
		if spec.VCPUs > 0 {
			v.Spec.VCPUs = spec.VCPUs
		}
		if spec.MemoryMB > 0 {
			v.Spec.MemoryMB = spec.MemoryMB
		}
		if spec.DiskGB > 0 && !spec.Revert {
			v.Spec.DiskGB = spec.DiskGB
		}
		if spec.Host != "" {
			v.Host = spec.Host
		}
		if v.Power == driver.Running {
			v.console("", "reboot: Restarting system")
			v.boot()
		}
		return nil
	})
}

// ConfirmResize drops the disk the last resize kept.
func (d *Driver) ConfirmResize(ctx context.Context, id string) error {
	return d.change(id, func(v *vm) error {
		v.KeptDiskGB = nil
		return nil
	})
}

// Snapshot copies a server's boot disk; the size is what a freshly
// installed system occupies, growing with the number of boots.
func (d *Driver) Snapshot(ctx context.Context, id, imageID string) (int64, error) {
	if err := d.exists(id); err != nil {
		return 0, err
	}
	if err := d.wait(ctx, OpSnapshot); err != nil {
		return 0, err
	}
	d.mu.Lock()
	v, ok := d.vms[id]
	var size int64
	if ok {
		size = int64(1<<30) + int64(v.Boots)*(16<<20)
		if max := int64(v.Spec.DiskGB) << 30; max > 0 && size > max {
			size = max
		}
	}
	d.mu.Unlock()
	if !ok {
		return 0, driver.ErrNotFound
	}
	// The image service stores a stand-in of at most 1 MiB: copying
	// gigabytes of zeros per simulated snapshot would only fill disks.
	if p := d.images.Load(); p != nil && imageID != "" {
		n := min(size, maxSnapshotBytes)
		if err := (*p).Upload(ctx, imageID, "", io.LimitReader(zeros{}, n)); err != nil {
			return 0, fmt.Errorf("fake: snapshot %s: %w", id, err)
		}
		return n, nil
	}
	return size, nil
}

// maxSnapshotBytes caps the stand-in data a simulated snapshot stores.
const maxSnapshotBytes = 1 << 20

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Console: the fake fleet's servers have no graphical console.
func (d *Driver) Console(ctx context.Context, id string) (driver.ConsoleEndpoint, error) {
	if err := d.exists(id); err != nil {
		return driver.ConsoleEndpoint{}, err
	}
	return driver.ConsoleEndpoint{}, driver.ErrNoConsole
}

// Spec is the spec server id's VM was built from: what an operator
// inspecting the fleet sees of it.
func (d *Driver) Spec(id string) (driver.Spec, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.vms[id]
	if !ok {
		return driver.Spec{}, false
	}
	return v.Spec, true
}

// Access lists how to log in: SSH (RDP for Windows) to the server's first
// fixed IP, as if the fleet's servers were on a routed network.
func (d *Driver) Access(ctx context.Context, id string) ([]driver.Access, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.vms[id]
	if !ok {
		return nil, driver.ErrNotFound
	}
	if len(v.Spec.FixedIPs) == 0 {
		return []driver.Access{}, nil
	}
	if v.Spec.OSType == "windows" {
		return []driver.Access{{Protocol: "rdp", Host: v.Spec.FixedIPs[0], Port: 3389}}, nil
	}
	return []driver.Access{{Protocol: "ssh", Host: v.Spec.FixedIPs[0], Port: 22}}, nil
}

// ConsoleOutput returns the last lines of the serial console.
func (d *Driver) ConsoleOutput(ctx context.Context, id string, lines int) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.vms[id]
	if !ok {
		return "", driver.ErrNotFound
	}
	c := v.Console
	if lines > 0 && lines < len(c) {
		c = c[len(c)-lines:]
	}
	if len(c) == 0 {
		return "", nil
	}
	return strings.Join(c, "\n") + "\n", nil
}

// List returns every server the fleet has.
func (d *Driver) List(ctx context.Context) ([]driver.Instance, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]driver.Instance, 0, len(d.vms))
	for _, v := range d.vms {
		out = append(out, driver.Instance{ID: v.ID, Host: v.Host, Power: v.Power})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// State returns one server's power state.
func (d *Driver) State(ctx context.Context, id string) (driver.PowerState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.vms[id]
	if !ok {
		return driver.NoState, driver.ErrNotFound
	}
	return v.Power, nil
}

func (d *Driver) exists(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.vms[id]; !ok {
		return driver.ErrNotFound
	}
	return nil
}
