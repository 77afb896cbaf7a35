package qmp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Mirror copies block node node into node target while node's users go
// on writing, then moves those users onto target (blockdev-mirror with
// sync=full; block-job-complete once the job reports BLOCK_JOB_READY,
// the point where both are the same and every write goes to both). From
// then on the device that used node uses target, and node has no user:
// the caller deletes it. target must be as large as node (QEMU's mirror
// refuses another size). When ctx ends or the job fails before the
// switch, the job is cancelled and node stays in use; a switch that
// happened anyway is a success. Checked against QEMU 7.2's QMP schema.
func (m *Monitor) Mirror(ctx context.Context, node, target string) (err error) {
	var suffix [4]byte
	rand.Read(suffix[:])
	job := "mirror-" + hex.EncodeToString(suffix[:])
	cleanup := context.WithoutCancel(ctx)

	if err := ctx.Err(); err != nil {
		return err
	}
	events, cancel := m.Subscribe("BLOCK_JOB_READY", "BLOCK_JOB_COMPLETED", "BLOCK_JOB_CANCELLED")
	defer cancel()
	// The commands are not cut short by ctx: a job started, or a switch
	// asked for, must be known to be so.
	if err := m.Execute(cleanup, "blockdev-mirror", map[string]any{
		"job-id": job, "device": node, "target": target, "sync": "full",
	}, nil); err != nil {
		return fmt.Errorf("blockdev-mirror %s: %w", node, err)
	}
	wait, completing := ctx, false
	for {
		ev, werr := WaitEvent(wait, events, "BLOCK_JOB_READY", "BLOCK_JOB_COMPLETED", "BLOCK_JOB_CANCELLED")
		if werr != nil {
			if err != nil {
				return errors.Join(err, werr) // the cancelled job did not end
			}
			// Stopped: cancel the job and wait for it to go, so that the
			// target can be deleted; one already switching ends anyway.
			var stop context.CancelFunc
			var cerr error
			wait, stop, cerr = m.cancelJob(cleanup, job)
			defer stop()
			if cerr != nil && !completing {
				return errors.Join(werr, cerr)
			}
			err = werr
			continue
		}
		var data struct {
			Device string `json:"device"`
			Error  string `json:"error"`
		}
		if json.Unmarshal(ev.Data, &data) != nil || data.Device != job {
			continue
		}
		switch ev.Name {
		case "BLOCK_JOB_READY":
			if err != nil || completing {
				continue
			}
			if cerr := m.Execute(cleanup, "block-job-complete", map[string]any{"device": job}, nil); cerr != nil {
				err = fmt.Errorf("block-job-complete: %w", cerr)
				var stop context.CancelFunc
				var xerr error
				wait, stop, xerr = m.cancelJob(cleanup, job)
				defer stop()
				if xerr != nil {
					return errors.Join(err, xerr)
				}
				continue
			}
			completing = true
		case "BLOCK_JOB_CANCELLED":
			if err != nil {
				return err
			}
			return fmt.Errorf("qmp: mirror of %s was cancelled", node)
		case "BLOCK_JOB_COMPLETED":
			switch {
			case data.Error != "":
				return errors.Join(err, fmt.Errorf("qmp: mirror of %s: %s", node, data.Error))
			case completing:
				return nil // switched, even if the caller gave up meanwhile
			case err != nil:
				return err
			}
			return fmt.Errorf("qmp: mirror of %s ended before the switch", node)
		}
	}
}
