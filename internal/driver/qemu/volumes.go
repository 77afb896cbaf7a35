package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"nimbus/internal/driver"
	"nimbus/internal/qmp"
)

// Volumes (block storage). A volume attached to a server goes into its
// record first (state.json's spec), so that every later start of its QEMU
// has the disk from the command line; a live QEMU then gets it by QMP.
// Both ways make the same thing from the same JSON (volumeParts): the
// objects it needs (a throttle group; the TLS-PSK credentials of an NBD
// connection; the secret of an RBD key), one block node tree — throttle
// filter (when limited) → raw format node → protocol node (file, nbd or
// rbd) — and a virtio-blk-pci device whose serial is the volume id, on a
// pcie-root-port of its own so that it can be unplugged. All names derive
// from the volume id, so a volume is found alike whether it came with the
// command line or was plugged later.
//
// Keys never go on a command line nor into state.json: writeState moves
// them into files (0600) in the server's directory, which QEMU reads
// (tls-creds-psk's dir, a secret object's file=); detach and destroy
// remove them.

// volNames are the QEMU names of one volume's parts.
type volNames struct {
	top     string // the node the device uses: thr when throttled, else fmt
	thr     string // the throttle filter node
	fmt     string // the raw format node
	proto   string // the protocol node (file, nbd, rbd)
	dev     string // the virtio-blk-pci device
	tg      string // the throttle-group object
	tls     string // the tls-creds-psk object (nbd)
	secret  string // the secret object (rbd)
	pskDir  string // the tls-creds-psk directory (in the server's dir), with keys.psk
	keyFile string // the rbd key's file (in the server's dir)
}

// volBase is the stem of a volume's names: QEMU's node names have at most
// 31 characters, too few for a UUID and a suffix, so it is a digest of the
// volume id.
func volBase(volID string) string {
	h := sha256.Sum256([]byte(volID))
	return "vol" + hex.EncodeToString(h[:8])
}

func namesOf(volID string, throttled bool) volNames {
	b := volBase(volID)
	n := volNames{
		thr: b + "-thr", fmt: b + "-fmt", proto: b + "-proto", dev: b + "-dev",
		tg: b + "-tg", tls: b + "-tls", secret: b + "-key",
		pskDir: b + ".psk", keyFile: b + ".key",
	}
	n.top = n.fmt
	if throttled {
		n.top = n.thr
	}
	return n
}

// throttled reports whether t limits anything.
func throttled(t driver.Throttle) bool { return t != driver.Throttle{} }

// volumeParts are the QMP arguments of everything one volume needs in
// QEMU: object-add's for the objects (in creation order), blockdev-add's
// for the node tree, and device_add's for the disk. The same JSON goes on
// the command line (-object, -blockdev, -device), which QEMU takes as JSON
// too.
type volumeParts struct {
	objects []map[string]any
	node    map[string]any
	device  map[string]any
}

// volumeSpec is vol's parts; dir is the server's directory, where its key
// files are, and bus the disk's pcie-root-port.
func volumeSpec(dir string, vol driver.Volume, bus string) volumeParts {
	n := namesOf(vol.ID, throttled(vol.Throttle))
	c := vol.Conn
	var p volumeParts
	ro := vol.ReadOnly
	var proto map[string]any
	switch c.Driver {
	case driver.VolumeNBD:
		p.objects = append(p.objects, map[string]any{
			"qom-type": "tls-creds-psk", "id": n.tls, "endpoint": "client",
			"dir": filepath.Join(dir, n.pskDir), "username": c.PSKIdentity,
			"priority": driver.NBDTLSPriority,
		})
		proto = map[string]any{
			"driver": "nbd", "node-name": n.proto, "read-only": ro,
			"server": map[string]any{"type": "inet", "host": c.Host, "port": strconv.Itoa(c.Port)},
			"export": c.Export, "tls-creds": n.tls,
		}
	case driver.VolumeRBD:
		p.objects = append(p.objects, map[string]any{
			"qom-type": "secret", "id": n.secret, "file": filepath.Join(dir, n.keyFile), "format": "base64",
		})
		var servers []map[string]any
		for _, m := range c.Monitors {
			host, port := monitorAddr(m)
			servers = append(servers, map[string]any{"host": host, "port": port})
		}
		proto = map[string]any{
			"driver": "rbd", "node-name": n.proto, "read-only": ro,
			"pool": c.Pool, "image": c.Image, "user": c.User,
			"key-secret": n.secret, "auth-client-required": []string{"cephx"}, "server": servers,
		}
	default:
		// As the boot disk: cache=none (O_DIRECT), thread pool I/O.
		proto = map[string]any{
			"driver": "file", "node-name": n.proto, "read-only": ro, "filename": c.Path,
			"cache": map[string]any{"direct": true}, "aio": "threads",
		}
	}
	p.node = map[string]any{"driver": "raw", "node-name": n.fmt, "read-only": ro, "file": proto}
	if t := vol.Throttle; throttled(t) {
		// QEMU refuses a total limit together with a read or write one:
		// the total wins.
		if t.TotalIOPS > 0 {
			t.ReadIOPS, t.WriteIOPS = 0, 0
		}
		if t.TotalBytes > 0 {
			t.ReadBytes, t.WriteBytes = 0, 0
		}
		tg := map[string]any{"qom-type": "throttle-group", "id": n.tg}
		for k, v := range map[string]int64{
			"x-iops-read": t.ReadIOPS, "x-iops-write": t.WriteIOPS, "x-iops-total": t.TotalIOPS,
			"x-bps-read": t.ReadBytes, "x-bps-write": t.WriteBytes, "x-bps-total": t.TotalBytes,
		} {
			if v > 0 {
				tg[k] = v
			}
		}
		p.objects = append(p.objects, tg)
		p.node = map[string]any{"driver": "throttle", "node-name": n.thr, "read-only": ro,
			"throttle-group": n.tg, "file": p.node}
	}
	p.device = map[string]any{"driver": "virtio-blk-pci", "id": n.dev, "drive": n.top, "serial": vol.ID}
	if vol.Boot {
		p.device["bootindex"] = 0
	}
	if bus != "" {
		p.device["bus"] = bus
	}
	return p
}

// monitorAddr splits a Ceph monitor address ("host", "host:port",
// "[v6]:port") into QEMU's host and port (6789 when none).
func monitorAddr(m string) (host, port string) {
	if h, p, err := net.SplitHostPort(m); err == nil {
		return h, p
	}
	return strings.Trim(m, "[]"), "6789"
}

// validVolume checks what of vol becomes QEMU names, file contents and
// node options.
func validVolume(vol driver.Volume) error {
	if vol.ID == "" || len(vol.ID) > 255 || strings.ContainsFunc(vol.ID, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("bad volume id %q", vol.ID)
	}
	t := vol.Throttle
	if min(t.ReadIOPS, t.WriteIOPS, t.TotalIOPS, t.ReadBytes, t.WriteBytes, t.TotalBytes) < 0 {
		return fmt.Errorf("volume %s: negative throttle limit", vol.ID)
	}
	c := vol.Conn
	switch c.Driver {
	case driver.VolumeFile:
		if !filepath.IsAbs(c.Path) {
			return fmt.Errorf("volume %s: file path %q is not absolute", vol.ID, c.Path)
		}
	case driver.VolumeNBD:
		if c.Host == "" || c.Port <= 0 || c.Port > 65535 || c.Export == "" {
			return fmt.Errorf("volume %s: bad NBD server %s:%d export %q", vol.ID, c.Host, c.Port, c.Export)
		}
		if c.PSKIdentity == "" || strings.ContainsAny(c.PSKIdentity, ":\n\r") {
			return fmt.Errorf("volume %s: bad PSK identity %q", vol.ID, c.PSKIdentity)
		}
		if c.PSKKey != "" {
			if _, err := hex.DecodeString(c.PSKKey); err != nil {
				return fmt.Errorf("volume %s: the PSK is not hex", vol.ID)
			}
		}
	case driver.VolumeRBD:
		if c.Pool == "" || c.Image == "" || c.User == "" || len(c.Monitors) == 0 {
			return fmt.Errorf("volume %s: an RBD connection needs pool, image, user and monitors", vol.ID)
		}
		if c.Key != "" {
			if _, err := base64.StdEncoding.DecodeString(c.Key); err != nil {
				return fmt.Errorf("volume %s: the RBD key is not base64", vol.ID)
			}
		}
	default:
		return fmt.Errorf("volume %s: unknown connection type %q", vol.ID, c.Driver)
	}
	return nil
}

// volumeKeyFiles are the files of dir that hold vol's key, relative to
// dir (directories first), none when it has no key.
func volumeKeyFiles(vol driver.Volume) []string {
	n := namesOf(vol.ID, false)
	switch vol.Conn.Driver {
	case driver.VolumeNBD:
		return []string{n.pskDir, filepath.Join(n.pskDir, "keys.psk")}
	case driver.VolumeRBD:
		return []string{n.keyFile}
	}
	return nil
}

// stashVolumeKeys writes the keys of vols into their files in dir and
// returns vols without them, as state.json keeps them. A volume without a
// key (one read back from state.json) keeps its files as they are.
func stashVolumeKeys(dir string, vols []driver.Volume) ([]driver.Volume, error) {
	if !slices.ContainsFunc(vols, func(v driver.Volume) bool { return v.Conn.PSKKey != "" || v.Conn.Key != "" }) {
		return vols, nil
	}
	out := slices.Clone(vols)
	for i := range out {
		c := &out[i].Conn
		n := namesOf(out[i].ID, false)
		switch {
		case c.Driver == driver.VolumeNBD && c.PSKKey != "":
			d := filepath.Join(dir, n.pskDir)
			if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("qemu: volume %s: %w", out[i].ID, err)
			}
			if err := writeFileAtomic(filepath.Join(d, "keys.psk"), []byte(c.PSKIdentity+":"+c.PSKKey+"\n"), 0o600); err != nil {
				return nil, err
			}
		case c.Driver == driver.VolumeRBD && c.Key != "":
			if err := writeFileAtomic(filepath.Join(dir, n.keyFile), []byte(c.Key), 0o600); err != nil {
				return nil, err
			}
		}
		c.PSKKey, c.Key = "", ""
	}
	return out, nil
}

// removeVolumeKeys removes vol's key files from dir.
func removeVolumeKeys(dir string, vol driver.Volume) {
	if f := volumeKeyFiles(vol); len(f) > 0 {
		os.RemoveAll(filepath.Join(dir, f[0]))
	}
}

// volumeFiles checks a server's volumes (a spawn's spec has not been
// checked yet) and that their key files are there, and lets QEMU's user
// read those.
func (d *Driver) volumeFiles(dir string, vols []driver.Volume) error {
	var names []string
	for _, vol := range vols {
		if err := validVolume(vol); err != nil {
			return fmt.Errorf("qemu: %w", err)
		}
		f := volumeKeyFiles(vol)
		for _, name := range f {
			if !fileExists(filepath.Join(dir, name)) {
				return fmt.Errorf("qemu: volume %s: its key file %s is missing", vol.ID, name)
			}
		}
		names = append(names, f...)
	}
	return d.chownForQEMU(dir, names...)
}

// sameConn reports whether a volume recorded for a server (keys stashed
// in dir) is vol as it is asked for now.
func sameConn(dir string, rec, vol driver.Volume) bool {
	a, b := rec.Conn, vol.Conn
	ka, kb := a.PSKKey+a.Key, b.PSKKey+b.Key
	a.PSKKey, a.Key, b.PSKKey, b.Key, a.SizeBytes, b.SizeBytes = "", "", "", "", 0, 0
	if a.Driver != b.Driver || a.Path != b.Path || a.Host != b.Host || a.Port != b.Port || a.Export != b.Export ||
		a.PSKIdentity != b.PSKIdentity || a.Pool != b.Pool || a.Image != b.Image || a.User != b.User ||
		!slices.Equal(a.Monitors, b.Monitors) || rec.ReadOnly != vol.ReadOnly || rec.Throttle != vol.Throttle {
		return false
	}
	if ka == "" && kb != "" {
		// The recorded key is in its file.
		n := namesOf(rec.ID, false)
		var got []byte
		var want string
		switch a.Driver {
		case driver.VolumeNBD:
			got, _ = os.ReadFile(filepath.Join(dir, n.pskDir, "keys.psk"))
			want = b.PSKIdentity + ":" + kb + "\n"
		case driver.VolumeRBD:
			got, _ = os.ReadFile(filepath.Join(dir, n.keyFile))
			want = kb
		}
		return bytes.Equal(got, []byte(want))
	}
	return ka == kb || kb == ""
}

// AttachVolume records vol in the server's spec and, when its QEMU runs,
// plugs its disk. A disk already there with the same connection is left
// as it is; one with another connection must be detached first.
func (d *Driver) AttachVolume(ctx context.Context, id string, vol driver.Volume) error {
	if err := validVolume(vol); err != nil {
		return fmt.Errorf("qemu: attach volume: %w", err)
	}
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	if v.want() == wantSuspended {
		// The QEMU that resumes the saved state must have its devices.
		return fmt.Errorf("qemu: server %s: attach volume %s: the server is suspended", id, vol.ID)
	}
	p := v.current()
	var mon *qmp.Monitor
	if p != nil {
		mon = p.mon
	}
	rec, had := v.volume(vol.ID)
	if vol, err = attachBootFlag(id, vol, rec, had); err != nil {
		return err
	}
	same := had && sameConn(v.dir, rec, vol)
	if mon != nil {
		dev, err := diskOf(ctx, mon, vol.ID)
		if err != nil {
			return fmt.Errorf("qemu: server %s: attach volume %s: %w", id, vol.ID, err)
		}
		plugged := dev != ""
		switch {
		case plugged && same:
			return nil
		case plugged:
			return fmt.Errorf("qemu: server %s: volume %s is attached with another connection; detach it first", id, vol.ID)
		}
	} else if same {
		return nil
	}
	if err := d.recordVolume(v, vol); err != nil {
		return err
	}
	if mon == nil {
		return nil // a stopped server: its next start has the disk
	}
	err = d.volumeFiles(v.dir, []driver.Volume{vol})
	if err == nil {
		err = plugVolume(ctx, mon, v.dir, vol)
	}
	if err != nil {
		// Leave no record of a disk the VM does not have.
		d.dropVolume(v, vol)
		return fmt.Errorf("qemu: server %s: attach volume %s: %w", id, vol.ID, err)
	}
	d.log.Info("qemu: volume attached", "server", id, "volume", vol.ID, "type", vol.Conn.Driver)
	return nil
}

// DetachVolume unplugs volume volumeID's disk from a running QEMU (waiting
// for the guest to let it go), deletes its nodes and objects, then drops
// it from the server's record. A volume the server does not have is not
// an error.
func (d *Driver) DetachVolume(ctx context.Context, id, volumeID string) error {
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	vol, ok := v.volume(volumeID)
	if !ok {
		return nil
	}
	if err := refuseBootVolumeDetach(id, vol); err != nil {
		return err
	}
	if v.want() == wantSuspended {
		// The saved state has the disk: the QEMU that resumes it must too.
		return fmt.Errorf("qemu: server %s: detach volume %s: the server is suspended", id, volumeID)
	}
	if p := v.current(); p != nil && p.mon != nil {
		if err := unplugVolume(ctx, p.mon, vol); err != nil {
			return fmt.Errorf("qemu: server %s: detach volume %s: %w", id, volumeID, err)
		}
	}
	if err := d.dropVolume(v, vol); err != nil {
		return err
	}
	d.log.Info("qemu: volume detached", "server", id, "volume", volumeID)
	return nil
}

// ExtendVolume tells a running QEMU that volume volumeID grew to
// sizeBytes (block_resize of its top node, which the guest's virtio-blk
// sees as a capacity change). A stopped server sees the size at its next
// start.
func (d *Driver) ExtendVolume(ctx context.Context, id, volumeID string, sizeBytes int64) error {
	if sizeBytes <= 0 {
		return fmt.Errorf("qemu: extend volume %s: bad size %d", volumeID, sizeBytes)
	}
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	vol, ok := v.volume(volumeID)
	if !ok {
		return fmt.Errorf("qemu: server %s: extend volume %s: %w", id, volumeID, driver.ErrNotFound)
	}
	p := v.current()
	if p == nil || p.mon == nil {
		return nil
	}
	n := namesOf(vol.ID, throttled(vol.Throttle))
	if err := p.mon.Execute(ctx, "block_resize", map[string]any{"node-name": n.top, "size": sizeBytes}, nil); err != nil {
		if vol.Conn.Driver == driver.VolumeNBD {
			// QEMU's NBD client keeps the size it negotiated ("Cannot grow
			// NBD nodes"): a new connection (the next start) sees it.
			return fmt.Errorf("qemu: server %s: extend volume %s: an NBD disk cannot grow while attached: %w", id, volumeID, err)
		}
		return fmt.Errorf("qemu: server %s: extend volume %s: block_resize: %w", id, volumeID, err)
	}
	d.log.Info("qemu: volume extended", "server", id, "volume", volumeID, "bytes", sizeBytes)
	return nil
}

// volume is volume id as v's record has it.
func (v *vm) volume(id string) (driver.Volume, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := slices.IndexFunc(v.st.Spec.Volumes, func(r driver.Volume) bool { return r.ID == id })
	if k < 0 {
		return driver.Volume{}, false
	}
	return v.st.Spec.Volumes[k], true
}

// recordVolume puts vol into v's record, in place of the one with its id.
func (d *Driver) recordVolume(v *vm, vol driver.Volume) error {
	return saveVolumes(v, func(vols []driver.Volume) ([]driver.Volume, error) {
		if k := slices.IndexFunc(vols, func(r driver.Volume) bool { return r.ID == vol.ID }); k >= 0 {
			vols[k] = vol
			return vols, nil
		}
		return append(vols, vol), nil
	})
}

// saveVolumes writes v's record with the volumes change makes of a copy
// of its own, their keys moved into files.
func saveVolumes(v *vm, change func([]driver.Volume) ([]driver.Volume, error)) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	st := v.st
	vols, err := change(slices.Clone(st.Spec.Volumes))
	if err != nil {
		return err
	}
	stashed, err := stashVolumeKeys(v.dir, vols)
	if err != nil {
		return err
	}
	st.Spec.Volumes = stashed
	if err := writeState(v.dir, st); err != nil {
		return err
	}
	v.st.Spec.Volumes = stashed
	return nil
}

// dropVolume removes vol from v's record and its key files.
func (d *Driver) dropVolume(v *vm, vol driver.Volume) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	st := v.st
	st.Spec.Volumes = slices.DeleteFunc(slices.Clone(st.Spec.Volumes), func(r driver.Volume) bool { return r.ID == vol.ID })
	if err := writeState(v.dir, st); err != nil {
		return err
	}
	v.st.Spec.Volumes = st.Spec.Volumes
	removeVolumeKeys(v.dir, vol)
	return nil
}

// plugVolume adds vol's objects, nodes and device to a live QEMU, on a
// free spare pcie-root-port. What it added is taken out again when a
// later step fails.
func plugVolume(ctx context.Context, mon *qmp.Monitor, dir string, vol driver.Volume) (err error) {
	// What an attempt cut short left would make the adds fail.
	cleanVolume(context.WithoutCancel(ctx), mon, vol)
	defer func() {
		if err != nil {
			cleanVolume(context.WithoutCancel(ctx), mon, vol)
		}
	}()
	slot, err := freeHotplugSlot(ctx, mon)
	if err != nil {
		return err
	}
	parts := volumeSpec(dir, vol, slot)
	for _, o := range parts.objects {
		if err := mon.Execute(ctx, "object-add", o, nil); err != nil {
			return fmt.Errorf("object-add %s: %w", o["qom-type"], err)
		}
	}
	if err := mon.Execute(ctx, "blockdev-add", parts.node, nil); err != nil {
		return fmt.Errorf("blockdev-add: %w", err)
	}
	if err := mon.Execute(ctx, "device_add", parts.device, nil); err != nil {
		return fmt.Errorf("device_add: %w", err)
	}
	return nil
}

// unplugVolume takes vol's disk out of a live QEMU: device_del, the
// guest's DEVICE_DELETED (bounded by unplugTimeout), then its nodes and
// objects.
func unplugVolume(ctx context.Context, mon *qmp.Monitor, vol driver.Volume) error {
	dev, err := diskOf(ctx, mon, vol.ID)
	if err != nil {
		return err
	}
	if dev != "" {
		if err := deviceDel(ctx, mon, dev, "disk"); err != nil {
			return err
		}
	}
	return cleanVolume(ctx, mon, vol)
}

// cleanVolume deletes vol's node tree and objects from a live QEMU; those
// not there are fine.
func cleanVolume(ctx context.Context, mon *qmp.Monitor, vol driver.Volume) error {
	var errs []error
	n := namesOf(vol.ID, throttled(vol.Throttle))
	// Either top: a volume's throttle can have changed since it was
	// plugged only through a detach, but a cut-short attempt may have
	// left either.
	for _, node := range []string{n.thr, n.fmt} {
		err := mon.Execute(ctx, "blockdev-del", map[string]string{"node-name": node}, nil)
		if err != nil && !notFound(err) {
			errs = append(errs, fmt.Errorf("blockdev-del %s: %w", node, err))
		}
	}
	for _, obj := range []string{n.tg, n.tls, n.secret} {
		err := mon.Execute(ctx, "object-del", map[string]string{"id": obj}, nil)
		if err != nil && !notFound(err) {
			errs = append(errs, fmt.Errorf("object-del %s: %w", obj, err))
		}
	}
	return errors.Join(errs...)
}

// notFound reports whether a QMP error says the thing is not there.
func notFound(err error) bool {
	e, ok := errors.AsType[*qmp.Error](err)
	if !ok {
		return false
	}
	if e.Class == "DeviceNotFound" {
		return true
	}
	// blockdev-del and object-del answer GenericError.
	d := strings.ToLower(e.Desc)
	return strings.Contains(d, "failed to find") || strings.Contains(d, "cannot find") || strings.Contains(d, "not found")
}

// diskOf is the qdev id of the device whose disk is volume volID's node
// tree in a live QEMU, "" when none is. It is found by the node it uses,
// not by name: a disk whose volume was swapped keeps the device (and its
// id, made from the old volume's) but uses the new volume's nodes.
func diskOf(ctx context.Context, mon *qmp.Monitor, volID string) (string, error) {
	var blocks []struct {
		QDev     string `json:"qdev"`
		Inserted *struct {
			Node string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := mon.Execute(ctx, "query-block", nil, &blocks); err != nil {
		return "", fmt.Errorf("query-block: %w", err)
	}
	n := namesOf(volID, true)
	for _, b := range blocks {
		if b.Inserted == nil || (b.Inserted.Node != n.thr && b.Inserted.Node != n.fmt) {
			continue
		}
		// A -device with an id answers it; virtio-blk-pci's backend
		// answers its QOM path, /machine/peripheral/<id>/virtio-backend.
		if rest, ok := strings.CutPrefix(b.QDev, "/machine/peripheral/"); ok {
			b.QDev, _, _ = strings.Cut(rest, "/")
		}
		return b.QDev, nil
	}
	return "", nil
}
