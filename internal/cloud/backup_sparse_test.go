package cloud

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSparseTar: a sparse file goes into a backup tar with its holes, and
// comes out whole and still sparse, through Go's reader and GNU tar; a
// file without holes goes in as a plain entry.
func TestSparseTar(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 48<<20 + 123 // ends in a hole, off a block boundary
	for _, at := range []int64{0, 5<<20 + 7, 30 << 20} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(at>>20) + 1}, 70000), at); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, bytes.Repeat([]byte("x"), 3000), 0o600); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)

	ctx := context.Background()
	out := filepath.Join(dir, "b.tar")
	sink, err := newSink(out + ".partial")
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.dir("volumes"); err != nil {
		t.Fatal(err)
	}
	if _, err := sink.file(ctx, "volumes/v1", src); err != nil {
		t.Fatal(err)
	}
	if _, err := sink.file(ctx, "images/i1", plain); err != nil {
		t.Fatal(err)
	}
	if err := sink.bytes("after", []byte("the entry after")); err != nil {
		t.Fatal(err)
	}
	if err := sink.close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(out+".partial", out); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(out); fi.Size() > 1<<20 {
		t.Errorf("the tar is %d bytes: the holes went in", fi.Size())
	}

	tf, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	tr := tar.NewReader(tf)
	got := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = b
	}
	if !bytes.Equal(got["volumes/v1"], want) || len(got["images/i1"]) != 3000 || string(got["after"]) != "the entry after" {
		t.Fatalf("Go's reader: v1 %d bytes (equal %v), i1 %d, after %q", len(got["volumes/v1"]), bytes.Equal(got["volumes/v1"], want),
			len(got["images/i1"]), got["after"])
	}

	x := filepath.Join(dir, "x")
	os.Mkdir(x, 0o700)
	if b, err := exec.Command("tar", "-xf", out, "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("tar -xf: %v\n%s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(x, "volumes", "v1"))
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("GNU tar's v1: %d bytes, %v", len(b), err)
	}
	fi, _ := os.Stat(filepath.Join(x, "volumes", "v1"))
	if blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 4<<20 {
		t.Errorf("GNU tar's v1 takes %d bytes on disk: not sparse", blocks)
	}
}
