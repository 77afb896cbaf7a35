package qmp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// cancelWait bounds the wait for a cancelled backup job to end.
const cancelWait = 30 * time.Second

// BackupTarget is where Backup writes: a raw file, either opened here and
// handed to QEMU (File, sent with add-fd, for a QEMU that runs as a user
// who may not open it) or named (Path, which QEMU opens itself).
type BackupTarget struct {
	File *os.File
	Path string
}

// Backup copies node, as it is at the start of the call, into target: a
// point-in-time copy taken by the process that writes the node, while
// its writers go on (blockdev-backup, sync=full: QEMU copies each block
// before a write overwrites it). The target file is made as large as node.
// It adds a raw target node (over /dev/fdset/N when target is a File),
// runs the job, waits for BLOCK_JOB_COMPLETED, and removes what it added
// whatever happens; when ctx ends first the job is cancelled. Checked
// against QEMU 7.2's QMP schema (blockdev-backup, add-fd, remove-fd).
func (m *Monitor) Backup(ctx context.Context, node string, target BackupTarget) (err error) {
	var suffix [4]byte
	rand.Read(suffix[:])
	tag := hex.EncodeToString(suffix[:])
	job, tnode, tfile := "bk-"+tag, "bk-"+tag+"-fmt", "bk-"+tag+"-file"
	cleanup := context.WithoutCancel(ctx)

	// The job wants a target of the node's size, which may be behind its
	// file's (an NBD export keeps the size it started with).
	size, err := m.NodeSize(ctx, node)
	if err != nil {
		return err
	}
	if target.File != nil {
		err = target.File.Truncate(size)
	} else if target.Path != "" {
		err = os.Truncate(target.Path, size)
	}
	if err != nil {
		return fmt.Errorf("qmp: backup target: %w", err)
	}

	filename := target.Path
	if target.File != nil {
		var fdset struct {
			ID int `json:"fdset-id"`
		}
		if err := m.ExecuteWithFile(ctx, "add-fd", map[string]any{"opaque": "nimbus backup " + tag}, &fdset, target.File); err != nil {
			return fmt.Errorf("add-fd: %w", err)
		}
		defer func() {
			if rerr := m.Execute(cleanup, "remove-fd", map[string]any{"fdset-id": fdset.ID}, nil); rerr != nil && err == nil {
				err = fmt.Errorf("remove-fd: %w", rerr)
			}
		}()
		filename = fmt.Sprintf("/dev/fdset/%d", fdset.ID)
	}
	if filename == "" {
		return errors.New("qmp: backup: no target")
	}
	add := map[string]any{"driver": "raw", "node-name": tnode,
		"file": map[string]any{"driver": "file", "node-name": tfile, "filename": filename}}
	if err := m.Execute(ctx, "blockdev-add", add, nil); err != nil {
		return fmt.Errorf("blockdev-add %s: %w", tnode, err)
	}
	defer func() {
		if derr := m.Execute(cleanup, "blockdev-del", map[string]any{"node-name": tnode}, nil); derr != nil && err == nil {
			err = fmt.Errorf("blockdev-del %s: %w", tnode, derr)
		}
	}()

	events, cancel := m.Subscribe("BLOCK_JOB_COMPLETED", "BLOCK_JOB_CANCELLED")
	defer cancel()
	if err := m.Execute(ctx, "blockdev-backup", map[string]any{
		"job-id": job, "device": node, "target": tnode, "sync": "full",
	}, nil); err != nil {
		return fmt.Errorf("blockdev-backup %s: %w", node, err)
	}
	wait := ctx
	for {
		ev, werr := WaitEvent(wait, events, "BLOCK_JOB_COMPLETED", "BLOCK_JOB_CANCELLED")
		if werr != nil {
			if err != nil {
				return errors.Join(err, werr) // the cancelled job did not end
			}
			// Stopped: cancel the job and wait for it to go, so that the
			// target node can be deleted.
			var stop context.CancelFunc
			wait, stop, err = m.cancelJob(cleanup, job)
			defer stop()
			if err != nil {
				return errors.Join(werr, err)
			}
			err = werr
			continue
		}
		var data struct {
			Device string `json:"device"`
			Error  string `json:"error"`
			Len    int64  `json:"len"`
			Offset int64  `json:"offset"`
		}
		if json.Unmarshal(ev.Data, &data) != nil || data.Device != job {
			continue
		}
		switch {
		case err != nil:
			return err
		case ev.Name == "BLOCK_JOB_CANCELLED":
			return fmt.Errorf("qmp: backup of %s was cancelled", node)
		case data.Error != "":
			return fmt.Errorf("qmp: backup of %s: %s", node, data.Error)
		case data.Offset != data.Len:
			return fmt.Errorf("qmp: backup of %s stopped at %d of %d bytes", node, data.Offset, data.Len)
		}
		return nil
	}
}

// NodeSize is block node node's size in bytes (query-named-block-nodes).
func (m *Monitor) NodeSize(ctx context.Context, node string) (int64, error) {
	var nodes []struct {
		Name  string `json:"node-name"`
		Image struct {
			Size int64 `json:"virtual-size"`
		} `json:"image"`
	}
	if err := m.Execute(ctx, "query-named-block-nodes", map[string]any{"flat": true}, &nodes); err != nil {
		return 0, fmt.Errorf("query-named-block-nodes: %w", err)
	}
	for _, n := range nodes {
		if n.Name == node {
			return n.Image.Size, nil
		}
	}
	return 0, fmt.Errorf("qmp: no block node %q", node)
}

// cancelJob cancels block job job (force: a ready mirror cancelled
// without it would end as completed) and answers the context to wait for
// its end in, at most cancelWait.
func (m *Monitor) cancelJob(ctx context.Context, job string) (context.Context, context.CancelFunc, error) {
	wait, stop := context.WithTimeout(ctx, cancelWait)
	if err := m.Execute(ctx, "block-job-cancel", map[string]any{"device": job, "force": true}, nil); err != nil {
		return wait, stop, fmt.Errorf("block-job-cancel: %w", err)
	}
	return wait, stop, nil
}
