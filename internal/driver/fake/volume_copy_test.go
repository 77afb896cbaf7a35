package fake

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestCopyInto: the copy has src's bytes and size whatever dst held, and
// stays sparse where src is (a 4 GiB volume with two written blocks
// copies two blocks).
func TestCopyInto(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	const size = 4 << 30
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	block := bytes.Repeat([]byte("data"), 1024)
	for _, off := range []int64{0, 3 << 30} {
		if _, err := f.WriteAt(block, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// dst held other bytes where src has a hole.
	if err := os.WriteFile(dst, bytes.Repeat([]byte{0xff}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := copyInto(src, dst); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Fatalf("dst is %d bytes, want %d", fi.Size(), size)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 1<<20 {
		t.Errorf("dst uses %d bytes on disk: not sparse", used)
	}
	out, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for _, c := range []struct {
		off  int64
		want []byte
	}{{0, block}, {3 << 30, block}, {int64(len(block)), make([]byte, 4096)}, {1 << 30, make([]byte, 4096)}} {
		got := make([]byte, len(c.want))
		if _, err := out.ReadAt(got, c.off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("at %d: %q…, want %q…", c.off, got[:8], c.want[:8])
		}
	}
}
