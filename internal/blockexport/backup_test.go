package blockexport

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"nimbus/internal/qmp"
)

// TestBackup copies an export's volume inside its daemon, while the
// export serves, into a file of the same size: the copy has the data
// written through the export, and the daemon is left with its own node
// only, no job, and still serving. A name not exported is
// ErrNotExported.
func TestBackup(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	e := newExporter(t, filepath.Join(dir, "state"))
	path := volumeFile(t, dir, "vol-b", 16<<20)
	ctx := context.Background()
	conn, err := e.Export(ctx, "vol-b", path, false)
	if err != nil {
		t.Fatal(err)
	}
	if out, ok := qemuIO(t, conn, conn.PSKIdentity, conn.PSKKey, "write -P 0x3c 1M 2M", "write -P 0xc3 15M 1M", "flush"); !ok {
		t.Fatalf("qemu-io:\n%s", out)
	}
	target := volumeFile(t, dir, "copy", 16<<20)
	if err := e.Backup(ctx, "vol-b", target); err != nil {
		t.Fatalf("Backup: %v", err)
	}
	want, _ := os.ReadFile(path)
	got, _ := os.ReadFile(target)
	if !bytes.Equal(got, want) {
		t.Fatal("the copy differs from the volume")
	}
	if !bytes.Equal(got[1<<20:3<<20], bytes.Repeat([]byte{0x3c}, 2<<20)) || got[15<<20] != 0xc3 {
		t.Fatal("the copy lacks the data written through the export")
	}

	m, err := qmp.Dial(ctx, filepath.Join(dir, "state", "vol-b", "qmp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	var nodes []struct {
		Name string `json:"node-name"`
	}
	if err := m.Execute(ctx, "query-named-block-nodes", nil, &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].Name != "vol" {
		t.Errorf("nodes after the copy: %+v", nodes)
	}
	var jobs []any
	if err := m.Execute(ctx, "query-block-jobs", nil, &jobs); err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 0 {
		t.Errorf("jobs after the copy: %+v", jobs)
	}
	m.Close()
	if out, ok := qemuIO(t, conn, conn.PSKIdentity, conn.PSKKey, "read -P 0x3c 1M 2M"); !ok {
		t.Fatalf("the export after the copy:\n%s", out)
	}

	if err := e.Backup(ctx, "nothing", target); !errors.Is(err, ErrNotExported) {
		t.Errorf("Backup of a name not exported: %v", err)
	}
	if got := e.Exports(); len(got) != 1 {
		t.Errorf("Exports() = %v", got)
	}
}
