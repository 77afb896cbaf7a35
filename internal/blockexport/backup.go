package blockexport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"nimbus/internal/qmp"
)

// ErrNotExported is returned by Backup for a name no daemon serves now.
var ErrNotExported = errors.New("blockexport: name not exported")

// Backup copies export name's volume, as it is at the start of the call,
// into the raw file at target (as large as the volume), inside the daemon
// that serves it: the daemon is the only writer of the file (every write of
// the remote guest passes through it), so its blockdev-backup (qmp.Backup
// of node "vol") is the volume at one instant while the guest goes on
// writing. The daemon runs as this process's user and opens the file by
// its name (qemu-storage-daemon 7.2 has no add-fd).
func (e *Exporter) Backup(ctx context.Context, name, target string) error {
	if !filepath.IsAbs(target) {
		return fmt.Errorf("blockexport: target %q is not absolute", target)
	}
	if !validName.MatchString(name) {
		return ErrNotExported
	}
	return e.locked(name, false, func(x *export) error {
		if x.proc == nil {
			e.drop(name, x) // locked made it
			return ErrNotExported
		}
		select {
		case <-x.exited:
			return ErrNotExported
		default:
		}
		m, err := qmp.Dial(ctx, filepath.Join(e.dir, name, "qmp.sock"))
		if err != nil {
			return fmt.Errorf("blockexport: %s: %w", name, err)
		}
		defer m.Close()
		start := time.Now()
		if err := m.Backup(ctx, "vol", qmp.BackupTarget{Path: target}); err != nil {
			return fmt.Errorf("blockexport: %s: %w", name, err)
		}
		if err := syncFile(target); err != nil {
			return fmt.Errorf("blockexport: %w", err)
		}
		e.log.Info("blockexport: copied live", "export", name, "target", target, "took", time.Since(start))
		return nil
	})
}

// syncFile flushes the file at path to its disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
