package qemu

import (
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
)

// TestLetPass: with --qemu-user, every directory above the data
// directory lets QEMU's user pass (a hot-plugged volume's key is read
// after QEMU dropped to it). Ours get search permission for others and
// nothing more; another owner's that bars the way is an error naming it.
func TestLetPass(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (directories of another owner)")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	d := &Driver{runAs: nobody, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	mk := func(p string, mode os.FileMode, uid int) string {
		t.Helper()
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	root := mk(filepath.Join(t.TempDir(), "root"), 0o700, 0)
	agent := mk(filepath.Join(root, "agent"), 0o700, 0)
	open := mk(filepath.Join(agent, "open"), 0o755, 0)
	theirs := mk(filepath.Join(root, "theirs"), 0o700, 54321)
	inner := mk(filepath.Join(theirs, "inner"), 0o700, 0)

	if err := d.letPass(filepath.Join(open, "qemu")); err != nil {
		t.Fatalf("letPass under our own directories: %v", err)
	}
	for p, want := range map[string]os.FileMode{root: 0o701, agent: 0o701, open: 0o755} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o, want %o", p, got, want)
		}
	}
	err = d.letPass(filepath.Join(inner, "qemu"))
	if err == nil || !strings.Contains(err.Error(), theirs) {
		t.Errorf("letPass under another owner's 0700 directory: %v, want an error naming %s", err, theirs)
	}
	if fi, _ := os.Stat(theirs); fi.Mode().Perm() != 0o700 {
		t.Errorf("another owner's directory changed to %o", fi.Mode().Perm())
	}
}
