package qemu_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/rbd"
	"nimbus/internal/testenv"
)

// TestVolumeRBD attaches an RBD image of a one-node Ceph to the running
// test guest with the connection the volume service's rbd backend gives
// every host (pool, image, client, key, monitors; no ceph.conf): the
// guest reads what the host wrote into the image, writes its own, and
// after the detach the image holds it.
func TestVolumeRBD(t *testing.T) {
	qemu.NeedQEMU(t)
	ctx := context.Background()
	ceph := testenv.StartCeph(t)
	st, err := rbd.New(rbd.Config{Conf: ceph.Conf, Keyring: ceph.Keyring, User: ceph.Client, Pool: testenv.VolumesPool})
	if err != nil {
		t.Fatal(err)
	}
	volID := uuid.NewString()
	image := rbd.VolumeName(volID)
	if err := st.Create(ctx, image, 64<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Delete(context.Background(), image) })
	conn, err := st.Conn(ctx, image)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte(conn.Key), 0o600); err != nil {
		t.Fatal(err)
	}
	qemuIO := func(t *testing.T, command string) {
		t.Helper()
		out, err := exec.Command("qemu-io", "--object", rbd.SecretObject("k", key), "--image-opts", rbd.ImageOpts(conn, "k"), "-c", command).CombinedOutput()
		if err != nil || strings.Contains(string(out), "Pattern verification failed") {
			t.Fatalf("qemu-io %s: %v\n%s", command, err, out)
		}
	}
	const hostPattern, guestPattern = 0x5a, 0xa5
	qemuIO(t, "write -P "+strconv.Itoa(hostPattern)+" 0 1M")

	start := time.Now()
	g := bootVolumeGuest(t)
	t.Logf("booted in %v", time.Since(start))
	vol := driver.Volume{ID: volID, Device: "/dev/vdb", Conn: conn}
	start = time.Now()
	if err := g.d.AttachVolume(ctx, g.id, vol); err != nil {
		t.Fatalf("AttachVolume: %v", err)
	}
	dev := g.waitDisk(t, volID, false)
	t.Logf("rbd disk %s in the guest %v after AttachVolume", dev, time.Since(start))
	if got := g.run(t, "cat /sys/block/"+dev+"/size"); got != strconv.Itoa(64<<20/512) {
		t.Errorf("%s has %s sectors, want 64 MiB", dev, got)
	}
	want := strings.Repeat(fmt.Sprintf("%02x", hostPattern), 16)
	if got := g.run(t, "dd if=/dev/"+dev+" bs=4096 count=1 iflag=direct 2>/dev/null | od -An -tx1 -v | tr -d ' \\n' | head -c 32"); got != want {
		t.Errorf("the guest reads %q at the start of the volume, want %q", got, want)
	}
	g.run(t, "head -c 4096 /dev/zero | tr '\\000' '\\245' > /tmp/p && dd if=/tmp/p of=/dev/"+dev+" bs=4096 seek=512 count=1 oflag=direct conv=fsync 2>&1")
	if err := g.d.DetachVolume(ctx, g.id, volID); err != nil {
		t.Fatalf("DetachVolume: %v", err)
	}
	g.waitDisk(t, volID, true)
	var out bytes.Buffer
	if err := st.Export(ctx, image, "", &out); err != nil {
		t.Fatal(err)
	}
	b := out.Bytes()
	if !bytes.Equal(b[2<<20:2<<20+4096], bytes.Repeat([]byte{guestPattern}, 4096)) {
		t.Errorf("the image does not hold the guest's write at 2 MiB: % x…", b[2<<20:2<<20+16])
	}
	if !bytes.Equal(b[:1<<20], bytes.Repeat([]byte{hostPattern}, 1<<20)) {
		t.Error("the host's data at the start of the image changed")
	}
}
