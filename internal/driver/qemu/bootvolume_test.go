package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/driver"
)

// TestBootVolumeDevice: a boot volume's disk is the one the firmware
// boots (bootindex 0) whatever its connection; any other volume's is not
// bootable.
func TestBootVolumeDevice(t *testing.T) {
	file := driver.VolumeConn{Driver: driver.VolumeFile, Path: "/v"}
	nbd := driver.VolumeConn{Driver: driver.VolumeNBD, Host: "h", Port: 10809, Export: "e", PSKIdentity: "i"}
	rbd := driver.VolumeConn{Driver: driver.VolumeRBD, Pool: "p", Image: "i", User: "u", Monitors: []string{"m"}}
	for _, c := range []struct {
		name string
		vol  driver.Volume
		want bool
	}{
		{"file boot", driver.Volume{ID: testVolID, Boot: true, Conn: file}, true},
		{"nbd boot", driver.Volume{ID: testVolID, Boot: true, Conn: nbd}, true},
		{"rbd boot throttled", driver.Volume{ID: testVolID, Boot: true, Conn: rbd, Throttle: driver.Throttle{ReadIOPS: 300}}, true},
		{"file data", driver.Volume{ID: testVolID, Conn: file}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := volumeSpec("/srv/x", c.vol, "hpv0")
			idx, ok := p.device["bootindex"]
			if ok != c.want || (ok && idx != 0) {
				t.Errorf("device %s: bootindex %v (set %v), want set %v", jsonArg(p.device), idx, ok, c.want)
			}
			if want := namesOf(c.vol.ID, throttled(c.vol.Throttle)).top; p.device["drive"] != want {
				t.Errorf("drive %v, want the top node %s (its throttle)", p.device["drive"], want)
			}
		})
	}
}

func TestCheckBootVolume(t *testing.T) {
	boot := driver.Volume{ID: "a", Boot: true}
	data := driver.Volume{ID: "b"}
	for _, c := range []struct {
		name string
		vols []driver.Volume
		ok   bool
	}{
		{"none", nil, true},
		{"data only", []driver.Volume{data}, true},
		{"boot first", []driver.Volume{boot, data}, true},
		{"boot second", []driver.Volume{data, boot}, false},
		{"two boots", []driver.Volume{boot, {ID: "c", Boot: true}}, false},
	} {
		if err := checkBootVolume(c.vols); (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", c.name, err, c.ok)
		}
	}
}

func TestResizeVolumes(t *testing.T) {
	file := driver.VolumeConn{Driver: driver.VolumeFile, Path: "/v"}
	boot := driver.Volume{ID: "root", Boot: true, Conn: file}
	data := driver.Volume{ID: "data", Conn: file}
	other := driver.Volume{ID: "other", Conn: file}
	ids := func(vs []driver.Volume) string {
		var s []string
		for _, v := range vs {
			if v.Boot {
				s = append(s, v.ID+"*")
			} else {
				s = append(s, v.ID)
			}
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		name      string
		rec, spec []driver.Volume
		want      string // ids, * marks the boot volume; "error" for a refusal
	}{
		{"no spec volumes keep the record", []driver.Volume{boot, data}, nil, "root*,data"},
		{"spec as is", []driver.Volume{boot, data}, []driver.Volume{boot, other}, "root*,other"},
		{"spec without the boot volume keeps it", []driver.Volume{boot}, []driver.Volume{data}, "root*,data"},
		{"spec with it unflagged", []driver.Volume{boot}, []driver.Volume{data, {ID: "root", Conn: file}}, "root*,data"},
		{"image server", []driver.Volume{data}, []driver.Volume{other}, "other"},
		{"no root to a volume", []driver.Volume{data}, []driver.Volume{boot}, "error"},
		{"no swapped boot volume", []driver.Volume{boot}, []driver.Volume{{ID: "new", Boot: true, Conn: file}}, "error"},
		{"boot not first", []driver.Volume{boot}, []driver.Volume{data, boot}, "error"},
	} {
		got, err := resizeVolumes(c.rec, c.spec)
		g := ids(got)
		if err != nil {
			g = "error"
		}
		if g != c.want {
			t.Errorf("%s: %s (%v), want %s", c.name, g, err, c.want)
		}
	}
}

func TestAttachBootFlag(t *testing.T) {
	file := driver.VolumeConn{Driver: driver.VolumeFile, Path: "/v"}
	for _, c := range []struct {
		name     string
		vol, rec driver.Volume
		had      bool
		boot, ok bool
	}{
		{"new data volume", driver.Volume{ID: "a", Conn: file}, driver.Volume{}, false, false, true},
		{"new boot volume refused", driver.Volume{ID: "a", Boot: true, Conn: file}, driver.Volume{}, false, false, false},
		{"new connection of the boot volume", driver.Volume{ID: "a", Conn: file}, driver.Volume{ID: "a", Boot: true}, true, true, true},
		{"data volume stays data", driver.Volume{ID: "a", Boot: true, Conn: file}, driver.Volume{ID: "a"}, true, false, false},
	} {
		got, err := attachBootFlag("s", c.vol, c.rec, c.had)
		if (err == nil) != c.ok || (err == nil && got.Boot != c.boot) {
			t.Errorf("%s: boot %v err %v, want boot %v ok %v", c.name, got.Boot, err, c.boot, c.ok)
		}
	}
}

// createRecord makes a server's record as Spawn does, without starting
// its QEMU.
func createRecord(t *testing.T, d *Driver, spec driver.Spec) *vm {
	t.Helper()
	v := newVM(spec.ServerID, filepath.Join(d.instances, spec.ServerID))
	d.mu.Lock()
	d.vms[spec.ServerID] = v
	d.mu.Unlock()
	if err := d.create(context.Background(), v, spec); err != nil {
		t.Fatalf("create: %v", err)
	}
	return v
}

// TestBootVolumeServer takes a server that boots from a volume through
// what needs no running guest: its record holds no image, no disk and
// the boot volume first (a key stashed); its command line boots the
// volume and no local disk or kernel; the boot volume cannot be detached,
// a new connection keeps it the boot volume, no other volume becomes
// one; a resize (without volumes in its spec) keeps it and makes no
// disk; a snapshot is refused; destroy leaves the volume's data.
func TestBootVolumeServer(t *testing.T) {
	needQEMU(t)
	ctx := context.Background()
	d := newTestDriver(t, t.TempDir(), nil, nil)
	defer d.Close()
	volFile := filepath.Join(t.TempDir(), "volume-root")
	data := []byte("the volume's own data")
	if err := os.WriteFile(volFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	const id = "0d6f3c1e-2a4b-4c5d-8e9f-0a1b2c3d4e5f"
	root := driver.Volume{ID: testVolID, Boot: true, Throttle: driver.Throttle{ReadIOPS: 300, WriteIOPS: 200},
		Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: volFile}}
	spec := driver.Spec{ServerID: id, Name: "bfv", VCPUs: 1, MemoryMB: 128, DiskGB: 20, OSType: "linux",
		Image: driver.ImageRef{KernelID: "not-used"}, Volumes: []driver.Volume{root}}
	v := createRecord(t, d, spec)

	st, err := readState(v.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Base != "" || st.Kernel != "" || len(st.Spec.Volumes) != 1 || !st.Spec.Volumes[0].Boot {
		t.Errorf("record: base %q kernel %q volumes %+v", st.Base, st.Kernel, st.Spec.Volumes)
	}
	for _, f := range []string{diskFile, seedFile} {
		if got := fileExists(filepath.Join(v.dir, f)); got != (f == seedFile) {
			t.Errorf("%s exists: %v", f, got)
		}
	}
	cmdline := func() string {
		t.Helper()
		v.mu.Lock()
		st := v.st
		v.mu.Unlock()
		m, err := d.machine(id, v.dir, st, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := Validate(m); err != nil {
			t.Fatal(err)
		}
		return strings.Join(Command(m), "\n")
	}
	cl := cmdline()
	for _, bad := range []string{DiskNode, "-kernel", diskFile} {
		if strings.Contains(cl, bad) {
			t.Errorf("command line has %q:\n%s", bad, cl)
		}
	}
	for _, want := range []string{`"bootindex":0`, `"filename":"` + volFile + `"`, `"x-iops-read":300`, SeedDevID} {
		if !strings.Contains(cl, want) {
			t.Errorf("command line lacks %s:\n%s", want, cl)
		}
	}

	if err := d.DetachVolume(ctx, id, root.ID); !errors.Is(err, ErrBootVolume) {
		t.Errorf("DetachVolume of the boot volume: %v", err)
	}
	// A new connection (unshelve elsewhere, a moved export) keeps it the
	// boot volume.
	moved := root
	moved.Boot = false
	moved.Conn = driver.VolumeConn{Driver: driver.VolumeNBD, Host: "10.0.0.2", Port: 10809, Export: "vol", PSKIdentity: "nimbus", PSKKey: "00ff"}
	if err := d.AttachVolume(ctx, id, moved); err != nil {
		t.Fatalf("AttachVolume of a new connection: %v", err)
	}
	if b, ok := v.bootVolume(); !ok || b.Conn.Driver != driver.VolumeNBD || b.Conn.PSKKey != "" {
		t.Errorf("boot volume after a new connection: %+v %v", b, ok)
	}
	if cl := cmdline(); !strings.Contains(cl, `"bootindex":0`) || !strings.Contains(cl, `"driver":"nbd"`) {
		t.Errorf("command line after a new connection:\n%s", cl)
	}
	other := driver.Volume{ID: "other", Boot: true, Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: volFile}}
	if err := d.AttachVolume(ctx, id, other); err == nil {
		t.Error("a second boot volume was attached")
	}

	resized := spec
	resized.VCPUs, resized.MemoryMB, resized.DiskGB, resized.Volumes = 2, 256, 40, nil
	if err := d.Resize(ctx, resized); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if b, ok := v.bootVolume(); !ok || b.ID != root.ID {
		t.Errorf("boot volume after resize: %+v %v", b, ok)
	}
	if st, _ := readState(v.dir); st.Spec.VCPUs != 2 || len(st.Spec.Volumes) != 1 {
		t.Errorf("record after resize: %d vCPUs, volumes %+v", st.Spec.VCPUs, st.Spec.Volumes)
	}
	if fileExists(filepath.Join(v.dir, diskFile)) || fileExists(filepath.Join(v.dir, keptFile)) {
		t.Error("resize made a local disk")
	}
	if err := d.ConfirmResize(ctx, id); err != nil {
		t.Errorf("ConfirmResize: %v", err)
	}
	if _, err := d.Snapshot(ctx, id, "img"); !errors.Is(err, ErrBootVolume) {
		t.Errorf("Snapshot: %v", err)
	}
	if err := d.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(volFile); err != nil || !slices.Equal(got, data) {
		t.Errorf("the volume after destroy: %q %v", got, err)
	}
	if fileExists(v.dir) {
		t.Error("the server's directory is left")
	}
}
