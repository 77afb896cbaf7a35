package qmp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Status runs query-status: status is QEMU's run state ("prelaunch",
// "running", "paused", "shutdown", …).
func (m *Monitor) Status(ctx context.Context) (status string, running bool, err error) {
	var r struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	err = m.Execute(ctx, "query-status", nil, &r)
	return r.Status, r.Running, err
}

// VCPUThreads runs query-cpus-fast and returns the host thread id of each
// vCPU, ordered by cpu-index (for pinning). Under single-threaded TCG all
// vCPUs may share one thread.
func (m *Monitor) VCPUThreads(ctx context.Context) ([]int, error) {
	type cpu struct {
		Index  int `json:"cpu-index"`
		Thread int `json:"thread-id"`
	}
	var cpus []cpu
	if err := m.Execute(ctx, "query-cpus-fast", nil, &cpus); err != nil {
		return nil, err
	}
	slices.SortFunc(cpus, func(a, b cpu) int { return a.Index - b.Index })
	tids := make([]int, len(cpus))
	for i, c := range cpus {
		tids[i] = c.Thread
	}
	return tids, nil
}

// Stop pauses the guest's vCPUs (event STOP).
func (m *Monitor) Stop(ctx context.Context) error { return m.Execute(ctx, "stop", nil, nil) }

// Cont resumes the guest, or starts it when QEMU ran with -S (event RESUME).
func (m *Monitor) Cont(ctx context.Context) error { return m.Execute(ctx, "cont", nil, nil) }

// SystemPowerdown presses the ACPI power button (event POWERDOWN; the guest
// may or may not shut down, then SHUTDOWN).
func (m *Monitor) SystemPowerdown(ctx context.Context) error {
	return m.Execute(ctx, "system_powerdown", nil, nil)
}

// SystemReset resets the machine (event RESET).
func (m *Monitor) SystemReset(ctx context.Context) error {
	return m.Execute(ctx, "system_reset", nil, nil)
}

// Quit makes QEMU exit and waits until it has closed the connection (Done),
// or until ctx ends. QEMU closes the socket right after its reply, sometimes
// before it, so a connection that ends during (or before) the call counts as
// success — unless it ended because Close was called.
func (m *Monitor) Quit(ctx context.Context) error {
	err := m.Execute(ctx, "quit", nil, nil)
	if errors.Is(err, ErrClosed) {
		m.mu.Lock()
		byMe := m.closedByMe
		m.mu.Unlock()
		if byMe {
			return err
		}
		err = nil
	}
	if err != nil {
		return err
	}
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("qmp: quit accepted but connection still open: %w", ctx.Err())
	}
}

// SetIOThrottle limits a disk live (block_set_io_throttle) to readIOPS and
// writeIOPS (0 = unlimited; both 0 removes the limit), all other limits 0.
// qdevID is the disk's -device id. A virtio-blk device's block backend is
// its child "<id>/virtio-backend" (the bare id answers "Device does not have a
// block device backend"); scsi-hd and ide-hd have it on the id itself, so on
// DeviceNotFound the bare id is tried. An id containing "/" is used as is.
func (m *Monitor) SetIOThrottle(ctx context.Context, qdevID string, readIOPS, writeIOPS int) error {
	args := map[string]any{
		"bps": 0, "bps_rd": 0, "bps_wr": 0,
		"iops": 0, "iops_rd": readIOPS, "iops_wr": writeIOPS,
	}
	if strings.Contains(qdevID, "/") {
		args["id"] = qdevID
		return m.Execute(ctx, "block_set_io_throttle", args, nil)
	}
	args["id"] = qdevID + "/virtio-backend"
	err := m.Execute(ctx, "block_set_io_throttle", args, nil)
	if e, ok := errors.AsType[*Error](err); ok && e.Class == "DeviceNotFound" {
		args["id"] = qdevID
		err = m.Execute(ctx, "block_set_io_throttle", args, nil)
	}
	return err
}

// KVMEnabled runs query-kvm. Beware: on a PVM host (nested, no vmx/svm) QEMU
// reports KVM enabled although guests cannot boot under it.
func (m *Monitor) KVMEnabled(ctx context.Context) (bool, error) {
	var r struct {
		Enabled bool `json:"enabled"`
	}
	err := m.Execute(ctx, "query-kvm", nil, &r)
	return r.Enabled, err
}
