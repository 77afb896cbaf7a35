package e2e

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/backups"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/volumeattach"

	"nimbus/internal/testenv"
)

// liveWriter is the guest's load on the volume's file system: generation
// g is written in place into block A of file AB, then into its block B,
// each a 4 KiB block synced on its own, for ever; every 8th generation
// also writes a new file f<g> and appends its md5 to sums (synced). AB
// was written whole at once, so A (its first block) and B (640 MiB on)
// lie 640 MiB apart on the disk: a copy of the disk that is not one
// instant reads one long before the other, while the guest wrote
// generations in between. In a point-in-time copy A's generation is B's
// or one more, and every file sums lists is whole.
const liveWriter = `cd /mnt/live && g=0
while :; do
	g=$((g+1))
	printf 'gen %08d\n' $g | dd of=AB bs=4096 count=1 conv=notrunc,sync,fsync 2>/dev/null
	printf 'gen %08d\n' $g | dd of=AB bs=4096 count=1 seek=163840 conv=notrunc,sync,fsync 2>/dev/null
	if [ $((g % 8)) -eq 0 ]; then
		dd if=/dev/urandom of=f$g bs=16k count=4 conv=fsync 2>/dev/null
		md5sum f$g | dd of=sums oflag=append conv=notrunc,fsync 2>/dev/null
	fi
done`

// TestLiveVolumeSnapshot is issue 14's "snapshot an attached volume while
// the guest writes and restore a consistent file system", through the
// public API on a real VM: a volume with an ext4 file system (made on the
// host) is attached to a running server, whose guest writes to it without
// pause (liveWriter); a forced snapshot is taken meanwhile, and a forced
// backup, and then an admin swaps the volume for a new one (the guest's
// file system, unmounted after, is whole on the new volume); a volume
// made from the snapshot is attached to the server and mounted, and the
// backup is restored to another: all are clean for
// e2fsck once their journal is replayed (as a mount does), A and B agree,
// and every file sums lists has its checksum. A copy of the volume's file
// taken while the guest writes (what a snapshot was before it was taken
// in the VM's QEMU) fails the A and B check.
func TestLiveVolumeSnapshot(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "e2fsck", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (e2fsprogs)", tool)
		}
	}
	q := startQEMUCloud(t)
	ctx := context.Background()
	signer, pub := testenv.NewSSHKey(t)
	q.key = signer
	if _, err := keypairs.Create(ctx, q.compute, keypairs.CreateOpts{Name: "e2e", PublicKey: pub}).Extract(); err != nil {
		t.Fatal(err)
	}
	bs, err := openstack.NewBlockStorageV3(q.demo, gophercloud.EndpointOpts{})
	must(t, err)
	image := q.uploadGuest(ctx)
	flavor := q.flavor(ctx, "e2e.live", 1, 256, 1)
	sv := q.create(ctx, "writer", image, flavor)

	waitVolume := func(id, want string) {
		t.Helper()
		waitFor(t, vmTimeout, "volume "+id+" "+want, func() bool {
			v, err := volumes.Get(ctx, bs, id).Extract()
			if err == nil && strings.HasPrefix(v.Status, "error") {
				t.Fatalf("volume %s: %s", id, v.Status)
			}
			return err == nil && v.Status == want
		})
	}
	newVolume := func(opts volumes.CreateOpts) string {
		t.Helper()
		v, err := volumes.Create(ctx, bs, opts, nil).Extract()
		must(t, err)
		waitVolume(v.ID, "available")
		return v.ID
	}
	// attach plugs volume id into the server and answers its disk there.
	attach := func(id string) string {
		t.Helper()
		_, err := volumeattach.Create(ctx, q.compute, sv.ID, volumeattach.CreateOpts{VolumeID: id}).Extract()
		must(t, err)
		waitVolume(id, "in-use")
		return q.ssh(ctx, sv.ID, fmt.Sprintf(`i=0; while [ $i -lt 300 ]; do for b in /sys/block/vd*; do
[ "$(cat $b/serial 2>/dev/null)" = %q ] && { basename $b; exit 0; }; done; sleep 0.1; i=$((i+1)); done; exit 1`, id[:20]))
	}

	vol := newVolume(volumes.CreateOpts{Size: 1, Name: "live"})
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-b", "4096", "-L", "live", q.c.Volumes.DataPath(vol)).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	dev := attach(vol)
	q.ssh(ctx, sv.ID, fmt.Sprintf(`mkdir -p /mnt/live && mount -t ext4 /dev/%s /mnt/live && cd /mnt/live &&
dd if=/dev/zero of=AB bs=1M count=641 conv=fsync 2>/dev/null && : > sums && sync`, dev))
	q.ssh(ctx, sv.ID, "cat > /tmp/writer.sh <<'EOF'\n"+liveWriter+"\nEOF\nsetsid sh /tmp/writer.sh </dev/null >/dev/null 2>&1 & echo $! > /tmp/writer.pid")
	gen := func() int {
		n, _ := strconv.Atoi(strings.TrimPrefix(q.ssh(ctx, sv.ID, "head -c 12 /mnt/live/AB"), "gen "))
		return n
	}
	waitFor(t, vmTimeout, "the guest writing", func() bool { return gen() >= 16 })

	// The snapshot, and a forced backup, while the guest writes.
	before := gen()
	start := time.Now()
	sn, err := snapshots.Create(ctx, bs, snapshots.CreateOpts{VolumeID: vol, Force: true, Name: "live"}).Extract()
	must(t, err)
	waitFor(t, vmTimeout, "snapshot available", func() bool {
		s, err := snapshots.Get(ctx, bs, sn.ID).Extract()
		if err == nil && s.Status == "error" {
			t.Fatalf("snapshot %s: error", sn.ID)
		}
		return err == nil && s.Status == "available"
	})
	t.Logf("live snapshot of a 1 GiB volume (%d MiB written) in %v", 641, time.Since(start).Round(time.Millisecond))
	bk, err := backups.Create(ctx, bs, backups.CreateOpts{VolumeID: vol, Force: true, Name: "live"}).Extract()
	must(t, err)
	waitFor(t, vmTimeout, "backup available", func() bool {
		b, err := backups.Get(ctx, bs, bk.ID).Extract()
		if err == nil && b.Status == "error" {
			t.Fatalf("backup %s: error", bk.ID)
		}
		return err == nil && b.Status == "available"
	})
	if after := gen(); after <= before {
		t.Errorf("the guest stopped writing: generation %d before the snapshot, %d after", before, after)
	}

	// An admin swaps the volume for another while the guest writes
	// (Nova's swap_volume): the mounted file system moves whole, and the
	// old volume is free.
	swapped := newVolume(volumes.CreateOpts{Size: 1, Name: "swapped"})
	admin := testenv.Compute(t, q.admin, "2.96")
	before, start = gen(), time.Now()
	_, err = admin.Put(ctx, admin.ServiceURL("servers", sv.ID, "os-volume_attachments", vol),
		map[string]any{"volumeAttachment": map[string]any{"volumeId": swapped}}, nil, &gophercloud.RequestOpts{OkCodes: []int{202}})
	must(t, err)
	waitVolume(vol, "available")
	waitVolume(swapped, "in-use")
	t.Logf("live swap of a 1 GiB volume (%d MiB written) in %v", 641, time.Since(start).Round(time.Millisecond))
	if after := gen(); after <= before {
		t.Errorf("the guest stopped writing: generation %d before the swap, %d after", before, after)
	}
	q.ssh(ctx, sv.ID, "kill $(cat /tmp/writer.pid); sleep 0.5; cd / && umount /mnt/live")
	a, b, files := checkLiveImage(t, q.c.Volumes.DataPath(swapped))
	t.Logf("swapped: A at %d, B at %d, %d files", a, b, files)
	if a < before {
		t.Errorf("the swapped volume has generation %d, the guest was at %d before the swap", a, before)
	}

	// The volume from the snapshot, checked on the host, then in the guest.
	fromSnap := newVolume(volumes.CreateOpts{Size: 1, SnapshotID: sn.ID, Name: "from-snapshot"})
	a, b, files = checkLiveImage(t, q.c.Volumes.DataPath(fromSnap))
	t.Logf("snapshot: A at %d, B at %d, %d files", a, b, files)
	dev = attach(fromSnap)
	out := q.ssh(ctx, sv.ID, fmt.Sprintf(`mkdir -p /mnt/snap && mount -t ext4 -o ro /dev/%s /mnt/snap && cd /mnt/snap &&
head -c 12 AB; echo; dd if=AB bs=4096 skip=163840 count=1 2>/dev/null | head -c 12; echo; { md5sum -c sums >/tmp/c 2>&1 && echo sums-ok || cat /tmp/c; }; cd /; umount /mnt/snap`, dev))
	if want := fmt.Sprintf("gen %08d\ngen %08d\nsums-ok", a, b); out != want {
		t.Errorf("the snapshot's volume in the guest:\n%s\nwant\n%s", out, want)
	}

	// The backup, restored.
	r, err := backups.RestoreFromBackup(ctx, bs, bk.ID, backups.RestoreOpts{Name: "restored"}).Extract()
	must(t, err)
	waitVolume(r.VolumeID, "available")
	a, b, files = checkLiveImage(t, q.c.Volumes.DataPath(r.VolumeID))
	t.Logf("backup: A at %d, B at %d, %d files", a, b, files)
}

// checkLiveImage checks a copy of liveWriter's file system (in the file
// at path): e2fsck replays its journal and then finds it clean; A's
// generation is B's or one more; every file in sums has its md5. It
// answers the generations and the number of files.
func checkLiveImage(t *testing.T, path string) (a, b, files int) {
	t.Helper()
	if out, err := exec.Command("e2fsck", "-fy", "-E", "journal_only", path).CombinedOutput(); err != nil {
		if e, ok := err.(*exec.ExitError); !ok || e.ExitCode() > 1 {
			t.Fatalf("e2fsck (journal): %v\n%s", err, out)
		}
	}
	if out, err := exec.Command("e2fsck", "-fn", path).CombinedOutput(); err != nil {
		t.Errorf("e2fsck: the file system is not clean: %v\n%s", err, out)
	}
	cat := func(name string) []byte {
		out, err := exec.Command("debugfs", "-R", "cat /"+name, path).Output()
		if err != nil {
			t.Fatalf("debugfs cat %s: %v", name, err)
		}
		return out
	}
	// genAt reads the generation in AB's block n, where the file
	// system has it (debugfs bmap: its block on the disk; 4 KiB blocks).
	img, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	genAt := func(n int) int {
		out, err := exec.Command("debugfs", "-R", fmt.Sprintf("bmap /AB %d", n), path).Output()
		if err != nil {
			t.Fatalf("debugfs bmap: %v", err)
		}
		phys, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil || phys == 0 {
			t.Fatalf("AB's block %d: %q", n, out)
		}
		buf := make([]byte, 12)
		if _, err := img.ReadAt(buf, phys*4096); err != nil {
			t.Fatal(err)
		}
		g, err := strconv.Atoi(strings.TrimPrefix(string(buf), "gen "))
		if err != nil {
			t.Fatalf("AB's block %d holds %q", n, buf)
		}
		return g
	}
	a, b = genAt(0), genAt(163840)
	if a != b && a != b+1 {
		t.Errorf("not one instant: A is at generation %d, B at %d", a, b)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(cat("sums")), "\n"), "\n") {
		if line == "" && files == 0 {
			break // none yet
		}
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[1], "f") {
			t.Errorf("sums has a line no md5sum wrote: %.80q", line)
			continue
		}
		sum := md5.Sum(cat(f[1]))
		if hex.EncodeToString(sum[:]) != f[0] {
			t.Errorf("%s: md5 %x, sums says %s", f[1], sum, f[0])
		}
		files++
	}
	return a, b, files
}
