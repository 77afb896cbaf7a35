package rbd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/cephtest"
)

func TestMain(m *testing.M) { os.Exit(cephtest.CephMain(m)) }

const mib = 1 << 20

// newStore is a store on the shared cluster's volumes pool.
func newStore(t testing.TB, mod ...func(*Config)) (*Store, *cephtest.Ceph) {
	t.Helper()
	c := cephtest.SharedCeph(t)
	cfg := Config{Conf: c.Conf, Keyring: c.Keyring, User: c.Client, Pool: cephtest.VolumesPool}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func newName() string { return VolumeName(uuid.NewString()) }

// qemu runs a QEMU tool on conn's image the way the qemu driver opens
// it: --image-opts with the key in a secret object, no ceph.conf.
func qemu(t testing.TB, s *Store, name string, args func(img string) []string) string {
	t.Helper()
	conn, err := s.Conn(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(conn.Key), 0o600); err != nil {
		t.Fatal(err)
	}
	a := args(ImageOpts(conn, "sec0"))
	tool, obj := a[0], []string{"--object", SecretObject("sec0", keyFile)}
	if tool == "qemu-img" { // after its subcommand
		a = append(append([]string{a[1]}, obj...), a[2:]...)
	} else {
		a = append(obj, a[1:]...)
	}
	out, err := exec.Command(tool, a...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(a, " "), err, out)
	}
	return string(out)
}

// write puts data at offset through QEMU.
func write(t testing.TB, s *Store, name string, off int64, pattern byte, n int) {
	t.Helper()
	qemu(t, s, name, func(img string) []string {
		return []string{"qemu-io", "--image-opts", img, "-c", "write -P " + itoa(int64(pattern)) + " " + itoa(off) + " " + itoa(int64(n))}
	})
}

// verify checks through QEMU that data at offset has the pattern.
func verify(t testing.TB, s *Store, name string, off int64, pattern byte, n int) {
	t.Helper()
	out := qemu(t, s, name, func(img string) []string {
		return []string{"qemu-io", "--image-opts", img, "-c", "read -P " + itoa(int64(pattern)) + " " + itoa(off) + " " + itoa(int64(n))}
	})
	if strings.Contains(out, "Pattern verification failed") {
		t.Fatalf("%s at %d: not pattern %d:\n%s", name, off, pattern, out)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestNames(t *testing.T) {
	id := "0b7e2a4e-2c8e-4c1a-9d3e-5f6a7b8c9d0e"
	for _, tc := range []struct {
		name string
		err  error
		f    func(string) error
	}{
		{VolumeName(id), nil, checkImage},
		{BackupBaseName(id), nil, checkImage},
		{"volume-" + id + ".backup." + id, nil, checkImage},
		{"volume-" + strings.ToUpper(id), ErrInvalid, checkImage},
		{"volume-" + id + ".deleted", ErrInvalid, checkImage},
		{"volume-x", ErrInvalid, checkImage},
		{"../volume-" + id, ErrInvalid, checkImage},
		{"volume-" + id + "@snap", ErrInvalid, checkImage},
		{SnapshotName(id), nil, checkSnap},
		{"backup." + id + ".snap.1732512345", nil, checkSnap},
		{"backup." + id + ".snap.1732512345.25", nil, checkSnap},
		{id + cloneSnapSuffix, ErrInvalid, checkSnap},
		{"snapshot-" + id + ",x", ErrInvalid, checkSnap},
	} {
		if err := tc.f(tc.name); !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("%q: %v, want %v", tc.name, err, tc.err)
		}
	}
}

// TestLifecycle: create, size, extend, refuse to shrink, delete, and
// delete again.
func TestLifecycle(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	name := newName()
	if ok, err := s.Exists(ctx, name); ok || err != nil {
		t.Fatalf("Exists before create = %v, %v", ok, err)
	}
	if err := s.Create(ctx, name, 64*mib); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, name, 64*mib); !errors.Is(err, ErrExists) {
		t.Errorf("second Create: %v, want ErrExists", err)
	}
	for _, tc := range []struct {
		size int64
		err  error
	}{
		{128 * mib, nil},
		{128 * mib, nil},
		{1<<30 + 4096, nil},
		{64 * mib, ErrInvalid},
	} {
		err := s.Extend(ctx, name, tc.size)
		if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("Extend(%d): %v, want %v", tc.size, err, tc.err)
		}
	}
	if size, err := s.Size(ctx, name); size != 1<<30+4096 || err != nil {
		t.Errorf("Size = %d, %v", size, err)
	}
	if err := s.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, name); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, err := s.Size(ctx, name); !errors.Is(err, ErrNotFound) {
		t.Errorf("Size after delete: %v, want ErrNotFound", err)
	}
	if err := s.Extend(ctx, name, 256*mib); !errors.Is(err, ErrNotFound) {
		t.Errorf("Extend after delete: %v, want ErrNotFound", err)
	}
	var ce *CmdError
	if err := s.Extend(ctx, name, 256*mib); !errors.As(err, &ce) || !strings.Contains(ce.Stderr, "No such file") {
		t.Errorf("error %v lacks rbd's stderr", err)
	}
}

// TestSnapshotsAndClones: the order Cinder enforces between volumes,
// snapshots and clones, and the deferred delete of a cloned source.
func TestSnapshotsAndClones(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	vol, snap := newName(), SnapshotName(uuid.NewString())
	if err := s.Create(ctx, vol, 16*mib); err != nil {
		t.Fatal(err)
	}
	write(t, s, vol, 0, 0xa1, 1*mib)
	if err := s.CreateSnapshot(ctx, vol, snap); err != nil {
		t.Fatal(err)
	}
	write(t, s, vol, 0, 0xb2, 1*mib) // after the snapshot: not in clones of it

	fromSnap := newName()
	if err := s.CloneFromSnapshot(ctx, vol, snap, fromSnap, 32*mib); err != nil {
		t.Fatal(err)
	}
	verify(t, s, fromSnap, 0, 0xa1, 1*mib)
	if size, _ := s.Size(ctx, fromSnap); size != 32*mib {
		t.Errorf("clone's size %d, want %d", size, 32*mib)
	}
	if err := s.CloneFromSnapshot(ctx, vol, snap, newName(), 8*mib); !errors.Is(err, ErrInvalid) {
		t.Errorf("clone smaller than its snapshot: %v, want ErrInvalid", err)
	}

	for _, tc := range []struct {
		what string
		do   func() error
		err  error
	}{
		{"delete a volume that has a snapshot", func() error { return s.Delete(ctx, vol) }, ErrBusy},
		{"delete a snapshot a clone depends on", func() error { return s.DeleteSnapshot(ctx, vol, snap) }, ErrBusy},
		{"delete the clone", func() error { return s.Delete(ctx, fromSnap) }, nil},
		{"delete the snapshot", func() error { return s.DeleteSnapshot(ctx, vol, snap) }, nil},
		{"delete the snapshot again", func() error { return s.DeleteSnapshot(ctx, vol, snap) }, nil},
	} {
		if err := tc.do(); !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Fatalf("%s: %v, want %v", tc.what, err, tc.err)
		}
	}

	// CloneVolume: src@<dest>.clone_snap; deleting src while the clone
	// lives hides it as .deleted; deleting the clone removes both.
	clone := newName()
	if err := s.CloneVolume(ctx, vol, clone, 0); err != nil {
		t.Fatal(err)
	}
	verify(t, s, clone, 0, 0xb2, 1*mib)
	if ok, _ := s.HasSnapshot(ctx, vol, clone+cloneSnapSuffix); !ok {
		t.Errorf("no %s%s on the source", clone, cloneSnapSuffix)
	}
	if err := s.Delete(ctx, vol); err != nil {
		t.Fatalf("delete a cloned source: %v", err)
	}
	if ok, _ := s.Exists(ctx, vol); ok {
		t.Error("source still visible after delete")
	}
	if _, err := s.info(ctx, vol+deletedSuffix); err != nil {
		t.Errorf("source not kept as %s%s: %v", vol, deletedSuffix, err)
	}
	verify(t, s, clone, 0, 0xb2, 1*mib)
	if err := s.Delete(ctx, clone); err != nil {
		t.Fatal(err)
	}
	if _, err := s.info(ctx, vol+deletedSuffix); !errors.Is(err, ErrNotFound) {
		t.Errorf("hidden source left after its last clone went: %v", err)
	}
}

// TestCloneDepth: a clone whose source has MaxCloneDepth ancestors is
// flattened and leaves no snapshot behind; MaxCloneDepth < 0 copies.
func TestCloneDepth(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		maxDepth   int
		wantDepths []int // of each clone in a chain of three
	}{
		{maxDepth: 2, wantDepths: []int{1, 2, 0}},
		{maxDepth: -1, wantDepths: []int{0, 0, 0}},
	} {
		s, _ := newStore(t, func(c *Config) { c.MaxCloneDepth = tc.maxDepth })
		prev := newName()
		if err := s.Create(ctx, prev, 4*mib); err != nil {
			t.Fatal(err)
		}
		write(t, s, prev, 4096, 0x5c, 4096)
		names := []string{prev}
		for i, want := range tc.wantDepths {
			next := newName()
			if err := s.CloneVolume(ctx, prev, next, 8*mib); err != nil {
				t.Fatal(err)
			}
			if d, err := s.depth(ctx, next); d != want || err != nil {
				t.Errorf("max %d: clone %d has depth %d, %v; want %d", tc.maxDepth, i, d, err, want)
			}
			if has, _ := s.HasSnapshot(ctx, prev, next+cloneSnapSuffix); has != (want > 0) {
				t.Errorf("max %d: clone %d: source snapshot kept = %v", tc.maxDepth, i, has)
			}
			verify(t, s, next, 4096, 0x5c, 4096)
			names = append(names, next)
			prev = next
		}
		// Deleting in creation order exercises the deferred deletes.
		for _, n := range names {
			if err := s.Delete(ctx, n); err != nil {
				t.Fatalf("delete %s: %v", n, err)
			}
		}
		out, err := s.rbd(ctx, "ls", s.cfg.Pool)
		for _, n := range names {
			if err != nil || strings.Contains(string(out), n) {
				t.Errorf("%s left in the pool (%v): %s", n, err, out)
			}
		}
	}
}

// TestBackupDiffs: a full and an incremental backup into the backups
// pool as the Ceph backup driver makes them, and a restore of each into
// a new volume, compared byte for byte.
func TestBackupDiffs(t *testing.T) {
	s, _ := newStore(t)
	backups, err := s.InPool(cephtest.BackupsPool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	volID := uuid.NewString()
	vol, base := VolumeName(volID), BackupBaseName(volID)
	if err := s.Create(ctx, vol, 32*mib); err != nil {
		t.Fatal(err)
	}
	write(t, s, vol, 0, 0x11, 2*mib)
	write(t, s, vol, 20*mib, 0x22, 64*1024)

	export := func(st *Store, img, snap string) []byte {
		var b bytes.Buffer
		if err := st.Export(ctx, img, snap, &b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	// diff streams image's changes from..to into target.
	diff := func(from *Store, img, fromSnap, toSnap string, to *Store, target string) int {
		var b bytes.Buffer
		if err := from.ExportDiff(ctx, img, fromSnap, toSnap, &b); err != nil {
			t.Fatal(err)
		}
		n := b.Len()
		if err := to.ImportDiff(ctx, target, &b); err != nil {
			t.Fatal(err)
		}
		return n
	}

	snap1 := BackupSnapName(uuid.NewString(), time.Now())
	if err := s.CreateSnapshot(ctx, vol, snap1); err != nil {
		t.Fatal(err)
	}
	if err := backups.Create(ctx, base, 32*mib); err != nil {
		t.Fatal(err)
	}
	full := diff(s, vol, "", snap1, backups, base)

	write(t, s, vol, 8*mib, 0x33, 4096)
	snap2 := BackupSnapName(uuid.NewString(), time.Now())
	if err := s.CreateSnapshot(ctx, vol, snap2); err != nil {
		t.Fatal(err)
	}
	incr := diff(s, vol, snap1, snap2, backups, base)
	if incr >= full || incr > 64*1024 {
		t.Errorf("incremental diff %d bytes, full %d: the increment should hold about 4 KiB", incr, full)
	}
	if got, want := export(backups, base, snap2), export(s, vol, snap2); !bytes.Equal(got, want) {
		t.Error("backup base at snap2 differs from the volume at snap2")
	}

	// Restore each backup into a new volume: a full diff up to its snapshot.
	for _, snap := range []string{snap1, snap2} {
		restored := newName()
		if err := s.Create(ctx, restored, 32*mib); err != nil {
			t.Fatal(err)
		}
		diff(backups, base, "", snap, s, restored)
		got := export(s, restored, "")
		if want := export(s, vol, snap); !bytes.Equal(got, want) {
			t.Errorf("volume restored from %s differs from the volume at %s", snap, snap)
		}
		// import-diff left the snapshot on the restored volume: backup
		// snapshots go with the volume.
		if err := s.Delete(ctx, restored); err != nil {
			t.Errorf("delete restored volume: %v", err)
		}
	}
	// The volume's backup snapshots are protected; Delete drops them.
	if err := s.Delete(ctx, vol); err != nil {
		t.Errorf("delete volume with backup snapshots: %v", err)
	}
}

// TestImportImage: a qcow2 made with qemu-img lands in a volume with
// its data; a volume too small for it is refused.
func TestImportImage(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.qcow2")
	for _, args := range [][]string{
		{"create", "-f", "qcow2", img, "48M"},
	} {
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
	}
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x7e 1M 3M", "-c", "write -P 0x42 40M 4k", img).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		format string
		size   int64
		err    error
	}{
		{"qcow2", 64 * mib, nil},
		{"qcow2", 0, nil},
		{"qcow2", 32 * mib, ErrInvalid},
		{"iso", 64 * mib, ErrInvalid},
	} {
		name := newName()
		err := s.ImportImage(ctx, name, img, tc.format, tc.size)
		if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("ImportImage(%s, %d): %v, want %v", tc.format, tc.size, err, tc.err)
			continue
		}
		if ok, _ := s.Exists(ctx, name); ok != (tc.err == nil) {
			t.Errorf("ImportImage(%s, %d): image exists = %v", tc.format, tc.size, ok)
		}
		if tc.err != nil {
			continue
		}
		want := tc.size
		if want == 0 {
			want = 48 * mib
		}
		if size, _ := s.Size(ctx, name); size != want {
			t.Errorf("size %d, want %d", size, want)
		}
		verify(t, s, name, 1*mib, 0x7e, 3*mib)
		verify(t, s, name, 40*mib, 0x42, 4096)
		verify(t, s, name, 0, 0, 1*mib)
		s.Delete(ctx, name)
	}
}

// TestConn: the connection QEMU gets needs no ceph.conf or keyring: the
// monitors (from the monitor map) and the key are all it takes to
// write, read back and see the size, as the qemu driver will open it.
func TestConn(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	name := newName()
	if err := s.Create(ctx, name, 24*mib); err != nil {
		t.Fatal(err)
	}
	defer s.Delete(ctx, name)
	conn, err := s.Conn(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if conn.Driver != "rbd" || conn.Pool != "volumes" || conn.Image != name || conn.User != c.Client ||
		conn.Key != c.Key || conn.SizeBytes != 24*mib || strings.Join(conn.Monitors, ",") != strings.Join(c.Monitors, ",") {
		t.Errorf("Conn = %+v; cluster %+v", conn, c)
	}
	write(t, s, name, 5*mib, 0x9d, 1*mib)
	verify(t, s, name, 5*mib, 0x9d, 1*mib)
	out := qemu(t, s, name, func(img string) []string {
		return []string{"qemu-img", "info", "--output=json", "--image-opts", img}
	})
	if !strings.Contains(out, `"virtual-size": 25165824`) {
		t.Errorf("qemu-img info: %s", out)
	}
	if _, err := s.Conn(ctx, newName()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Conn of a missing image: %v", err)
	}
}

// TestCopy: Copy writes a snapshot over another pool's image whole,
// its zeroes too, so what the target held before is gone; Snapshots
// lists the source's snapshot.
func TestCopy(t *testing.T) {
	s, _ := newStore(t)
	backups, err := s.InPool(cephtest.BackupsPool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, dst := newName(), newName()
	if err := s.Create(ctx, src, 8*mib); err != nil {
		t.Fatal(err)
	}
	if err := backups.Create(ctx, dst, 16*mib); err != nil {
		t.Fatal(err)
	}
	write(t, s, src, mib, 0x41, 64*1024)
	snap := SnapshotName(uuid.NewString())
	if err := s.CreateSnapshot(ctx, src, snap); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Snapshots(ctx, src); err != nil || len(got) != 1 || got[0] != snap {
		t.Errorf("Snapshots = %q, %v; want [%s]", got, err, snap)
	}
	write(t, s, src, mib, 0x42, 64*1024) // after the snapshot: not copied
	write(t, backups, dst, 0, 0x77, 8*mib)
	if err := s.Copy(ctx, src, snap, backups, dst); err != nil {
		t.Fatal(err)
	}
	verify(t, backups, dst, 0, 0, int(mib))
	verify(t, backups, dst, mib, 0x41, 64*1024)
	verify(t, backups, dst, mib+64*1024, 0, int(7*mib-64*1024))
	// ExportFile: the same bytes as Export, zeroes left as holes.
	file := filepath.Join(t.TempDir(), "dst.raw")
	if err := backups.ExportFile(ctx, dst, "", file); err != nil {
		t.Fatal(err)
	}
	var whole bytes.Buffer
	if err := backups.Export(ctx, dst, "", &whole); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, whole.Bytes()) {
		t.Errorf("ExportFile: %d bytes (%v), Export %d, not the same", len(got), err, whole.Len())
	}
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil || st.Blocks*512 > 8*mib {
		t.Errorf("ExportFile: %d bytes on disk for 16 MiB with 64 KiB of data (%v)", st.Blocks*512, err)
	}
	if err := backups.Copy(ctx, dst, "", s, src); !errors.Is(err, ErrInvalid) {
		t.Errorf("copy of 16 MiB onto 8 MiB: %v, want ErrInvalid", err)
	}
	for _, c := range []struct {
		st   *Store
		name string
	}{{backups, dst}, {s, src}} {
		if c.st == s {
			if err := s.DeleteSnapshot(ctx, src, snap); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.st.Delete(ctx, c.name); err != nil {
			t.Error(err)
		}
	}
}
