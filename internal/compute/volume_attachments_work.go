package compute

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
	"nimbus/internal/volume"
)

// The work of a volume attach, detach or swap, after the API's answer.
// The API leaves a volumeOp in the server's document in the transaction
// that reserves (or begins detaching) the attachment, and enqueues the
// server: its reconcile worker runs the ops before any task step, one at a
// time, so that a hot-plug never races the server's own start, stop or
// delete. Every part is idempotent (Connect, the driver's AttachVolume and
// DetachVolume, Disconnect, Remove), and an op leaves the document only in
// the transaction that ends it, so a controller stopped half-way resumes
// the op at its next Run (resume enqueues servers with ops) and finishes
// or undoes it. A delete does not run ops: it removes every attachment.

// Kinds of volumeOp.
const (
	opAttach = "attach"
	// opAttachUndo takes back an attach that failed: the driver detaches
	// what it may have plugged, then the attachment is removed.
	opAttachUndo = "attach_undo"
	opDetach     = "detach"
	opSwap       = "swap"
)

// volumeOp is one volume change the server's worker owes.
type volumeOp struct {
	Kind         string `json:"kind"`
	AttachmentID string `json:"attachment_id"`
	VolumeID     string `json:"volume_id"`
	// NewAttachmentID and NewVolumeID are a swap's new volume's.
	NewAttachmentID string `json:"new_attachment_id,omitempty"`
	NewVolumeID     string `json:"new_volume_id,omitempty"`
	// RequestID names the instance action the op finishes.
	RequestID string `json:"request_id,omitempty"`
	// Error is why an attach is undone.
	Error string `json:"error,omitempty"`
}

// event is the instance action event an op finishes.
func (op volumeOp) event() string {
	switch op.Kind {
	case opDetach:
		return "compute_detach_volume"
	case opSwap:
		return "compute_swap_volume"
	}
	return "compute_attach_volume"
}

// addVolumeOp appends op to sv's document and saves sv, in tx.
func (s *Service) addVolumeOp(ctx context.Context, tx *store.Tx, sv *server, op volumeOp) error {
	op.RequestID = api.RequestID(ctx)
	sv.Doc.VolumeOps = append(sv.Doc.VolumeOps, op)
	return s.saveServer(ctx, tx, sv)
}

// volumeStep runs sv's first volume op. An op that finds the server's
// host down answers errWaitHost: the server is tried again through the
// queue's backoff.
func (s *Service) volumeStep(ctx context.Context, sv *server, started time.Time) error {
	op := sv.Doc.VolumeOps[0]
	if s.volumes == nil {
		// Block storage went away with the op pending: nothing to do.
		return s.endVolumeOp(ctx, sv.ID, op, started, errors.New("no block storage"), nil)
	}
	ctx = driver.WithOpKey(ctx, sv.ID+"/volume-"+op.Kind+"/"+op.AttachmentID)
	var err error
	switch op.Kind {
	case opAttach:
		err = s.attachWork(ctx, sv, op, started)
	case opAttachUndo:
		err = s.undoAttachWork(ctx, sv, op, started)
	case opDetach:
		err = s.detachWork(ctx, sv, op, started)
	case opSwap:
		err = s.swapWork(ctx, sv, op, started)
	default:
		err = s.endVolumeOp(ctx, sv.ID, op, started, fmt.Errorf("unknown volume op %q", op.Kind), nil)
	}
	return err
}

// volumeVMHost is the host whose VM of sv takes volume changes, "" when
// sv has no VM (shelved-offloaded, or not placed yet): the attachments
// are then only records, connected at its next spawn.
func volumeVMHost(sv *server) string {
	switch sv.VMState {
	case vmBuilding, vmShelvedOffloaded, vmDeleted:
		return ""
	}
	return sv.Host
}

// endVolumeOp ends op in one transaction: f's change of the attachments,
// the op out of the document, the instance action's event; only while the
// server's lease is this controller's.
func (s *Service) endVolumeOp(ctx context.Context, serverID string, op volumeOp, started time.Time, failure error, f func(tx *store.Tx) error) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		cur, err := s.loadServer(ctx, tx, serverID, true)
		if err != nil {
			return err
		}
		if err := s.leases.Hold(ctx, tx, serverLease(serverID)); err != nil {
			return err
		}
		if f != nil {
			if err := f(tx); err != nil {
				return err
			}
		}
		cur.Doc.VolumeOps = slices.DeleteFunc(cur.Doc.VolumeOps, func(o volumeOp) bool {
			return o.Kind == op.Kind && o.AttachmentID == op.AttachmentID
		})
		if err := s.finishAction(ctx, tx, serverID, op.RequestID, op.event(), cur.Host, started, failure); err != nil {
			return err
		}
		return s.saveServer(ctx, tx, cur)
	})
}

// replaceVolumeOp swaps op for next in the server's document.
func (s *Service) replaceVolumeOp(ctx context.Context, serverID string, op, next volumeOp) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		cur, err := s.loadServer(ctx, tx, serverID, true)
		if err != nil {
			return err
		}
		if err := s.leases.Hold(ctx, tx, serverLease(serverID)); err != nil {
			return err
		}
		k := slices.IndexFunc(cur.Doc.VolumeOps, func(o volumeOp) bool {
			return o.Kind == op.Kind && o.AttachmentID == op.AttachmentID
		})
		if k < 0 {
			return nil
		}
		cur.Doc.VolumeOps[k] = next
		return s.saveServer(ctx, tx, cur)
	})
}

// attachWork connects the volume for the server's host and has the driver
// plug it, then completes the attachment; a failure turns the op into an
// undo.
func (s *Service) attachWork(ctx context.Context, sv *server, op volumeOp, started time.Time) error {
	att, err := s.volumes.AttachmentByID(ctx, s.db, op.AttachmentID)
	if errors.Is(err, store.ErrNotFound) {
		return s.endVolumeOp(ctx, sv.ID, op, started, errors.New("the attachment was removed"), nil)
	}
	if err != nil {
		return err
	}
	complete := func(tx *store.Tx) error { return s.volumes.Complete(ctx, tx, att.ID) }
	if att.Status == volume.AttachAttached {
		return s.endVolumeOp(ctx, sv.ID, op, started, nil, nil) // done before a restart
	}
	host := volumeVMHost(sv)
	if host == "" {
		return s.endVolumeOp(ctx, sv.ID, op, started, nil, complete)
	}
	vol, err := s.volumes.Connect(ctx, att.ID, host)
	if err == nil {
		if vol.Device == "" {
			vol.Device = att.Device
		}
		err = retry(ctx, func() error { return s.driver.AttachVolume(ctx, sv.ID, vol) })
	}
	if errors.Is(err, driver.ErrHostDown) {
		return errWaitHost
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("compute: volume attach failed", "server", sv.ID, "volume", att.VolumeID, "error", err)
		undo := op
		undo.Kind, undo.Error = opAttachUndo, err.Error()
		if err := s.replaceVolumeOp(ctx, sv.ID, op, undo); err != nil {
			return err
		}
		return s.undoAttachWork(ctx, sv, undo, started)
	}
	return s.endVolumeOp(ctx, sv.ID, op, started, nil, complete)
}

// undoAttachWork takes back a failed attach: the driver takes out whatever
// it plugged, the connection ends and the attachment goes. When the driver
// cannot take the disk out, the attachment is completed instead, so that
// no disk stays in a VM without its attachment (a detach retries).
func (s *Service) undoAttachWork(ctx context.Context, sv *server, op volumeOp, started time.Time) error {
	cause := errors.New(op.Error)
	if volumeVMHost(sv) != "" {
		err := retry(ctx, func() error { return s.driver.DetachVolume(ctx, sv.ID, op.VolumeID) })
		if errors.Is(err, driver.ErrHostDown) {
			return errWaitHost
		}
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.Error("compute: volume attach could not be undone", "server", sv.ID, "volume", op.VolumeID, "error", err)
			return s.endVolumeOp(ctx, sv.ID, op, started, cause, func(tx *store.Tx) error {
				return s.volumes.Complete(ctx, tx, op.AttachmentID)
			})
		}
	}
	if err := s.volumes.Disconnect(ctx, op.AttachmentID); err != nil {
		return err
	}
	return s.endVolumeOp(ctx, sv.ID, op, started, cause, func(tx *store.Tx) error {
		return s.volumes.Remove(ctx, tx, op.AttachmentID)
	})
}

// detachWork has the driver take the disk out, ends the connection and
// removes the attachment; a driver failure rolls the detach back.
func (s *Service) detachWork(ctx context.Context, sv *server, op volumeOp, started time.Time) error {
	if volumeVMHost(sv) != "" {
		err := retry(ctx, func() error { return s.driver.DetachVolume(ctx, sv.ID, op.VolumeID) })
		if errors.Is(err, driver.ErrHostDown) {
			return errWaitHost
		}
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.Warn("compute: volume detach failed", "server", sv.ID, "volume", op.VolumeID, "error", err)
			return s.endVolumeOp(ctx, sv.ID, op, started, err, func(tx *store.Tx) error {
				return ignoreGone(s.volumes.RollDetach(ctx, tx, op.AttachmentID))
			})
		}
	}
	if err := s.volumes.Disconnect(ctx, op.AttachmentID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return s.endVolumeOp(ctx, sv.ID, op, started, nil, func(tx *store.Tx) error {
		return s.volumes.Remove(ctx, tx, op.AttachmentID)
	})
}

// errSwapUnsupported is why a swap fails on a driver that cannot move a
// guest's disk to another volume live. Nova answers the same for a driver
// without swap_volume: the swap is rolled back and the action records
// the error.
var errSwapUnsupported = errors.New("swap_volume is not supported by the hypervisor driver")

// swapWork moves the server's disk from the old volume to the new one:
// the new one is connected for the server's host, the driver copies the
// data live and switches the guest's disk onto it, the old connection
// ends and the attachments change places (volume.Swap: the new one takes
// the old one's device). A driver that cannot swap, or a swap that
// fails, rolls back: the old volume stays attached and the new one's
// reservation goes.
func (s *Service) swapWork(ctx context.Context, sv *server, op volumeOp, started time.Time) error {
	sw, ok := s.driver.(driver.VolumeSwapper)
	host := volumeVMHost(sv)
	var failure error
	switch {
	case !ok:
		failure = errSwapUnsupported
	case host == "":
		failure = errors.New("the server has no VM whose disk could move")
	default:
		vol, err := s.volumes.Connect(ctx, op.NewAttachmentID, host)
		if err == nil {
			err = retry(ctx, func() error { return sw.SwapVolume(ctx, sv.ID, op.VolumeID, vol) })
		}
		if errors.Is(err, driver.ErrHostDown) {
			return errWaitHost
		}
		if err == nil {
			if err := s.volumes.Disconnect(ctx, op.AttachmentID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			return s.endVolumeOp(ctx, sv.ID, op, started, nil, func(tx *store.Tx) error {
				return s.volumes.Swap(ctx, tx, op.AttachmentID, op.NewAttachmentID)
			})
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("compute: volume swap failed", "server", sv.ID, "volume", op.VolumeID, "new_volume", op.NewVolumeID, "error", err)
		failure = err
	}
	if err := s.volumes.Disconnect(ctx, op.NewAttachmentID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return s.endVolumeOp(ctx, sv.ID, op, started, failure, func(tx *store.Tx) error {
		if err := ignoreGone(s.volumes.RollDetach(ctx, tx, op.AttachmentID)); err != nil {
			return err
		}
		return s.volumes.Remove(ctx, tx, op.NewAttachmentID)
	})
}

// ignoreGone is err unless it says the attachment no longer exists.
func ignoreGone(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}

// specVolumes connects every attached volume of sv for its host, for the
// driver's spec of a start of the VM (spawn, unshelve, resize, rebuild):
// Connect gives the same connection again for the same host.
func (s *Service) specVolumes(ctx context.Context, sv *server) ([]driver.Volume, error) {
	if s.volumes == nil || sv.Host == "" {
		return nil, nil
	}
	atts, err := s.serverAttachments(ctx, s.db, sv.ID)
	if err != nil {
		return nil, err
	}
	var out []driver.Volume
	for _, a := range atts {
		// Only attached ones: an attachment still reserved belongs to an op
		// (run before any step) or to Cinder's own attachment API.
		if a.Status != volume.AttachAttached {
			continue
		}
		vol, err := s.volumes.Connect(ctx, a.ID, sv.Host)
		if err != nil {
			return nil, fmt.Errorf("connecting volume %s: %w", a.VolumeID, err)
		}
		if vol.Device == "" {
			vol.Device = a.Device
		}
		out = append(out, vol)
	}
	return out, nil
}

// disconnectVolumes ends the connections of sv's attachments, once its VM
// is gone from its host (shelve offload, delete).
func (s *Service) disconnectVolumes(ctx context.Context, sv *server) ([]volume.Attachment, error) {
	if s.volumes == nil {
		return nil, nil
	}
	atts, err := s.serverAttachments(ctx, s.db, sv.ID)
	if err != nil {
		return nil, err
	}
	for _, a := range atts {
		if err := s.volumes.Disconnect(ctx, a.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("disconnecting volume %s: %w", a.VolumeID, err)
		}
	}
	return atts, nil
}

// removeVolumes removes the attachments of a deleted server, in the
// delete's transaction, and deletes the volumes attached with
// delete_on_termination.
func (s *Service) removeVolumes(ctx context.Context, tx *store.Tx, atts []volume.Attachment) error {
	for _, a := range atts {
		if err := s.volumes.Remove(ctx, tx, a.ID); err != nil {
			return err
		}
	}
	for _, a := range atts {
		if a.DeleteOnTermination {
			if err := s.volumes.DeleteTerminated(ctx, tx, a.VolumeID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
	}
	return nil
}

// Compute tells the guest of a server that its volume grew.
var _ volume.Extender = (*Service)(nil)

// VolumeExtended is Nova's volume-extended external event: the volume
// service grew an attached volume's data, and a server with a running VM
// has the driver resize its disk so the guest sees it (a stopped or
// offloaded one sees the new size at its next start). It records an
// instance action extend_volume.
func (s *Service) VolumeExtended(ctx context.Context, serverID, volumeID string, sizeBytes int64) error {
	sv, err := s.loadServer(ctx, s.db, serverID, false)
	if err != nil {
		return err
	}
	if sv.Deleted {
		return store.ErrNotFound
	}
	if api.CallerFrom(ctx) == nil {
		// The event is the system's: the action says so as Nova's
		// external events do (the server's project, no user).
		ctx = api.WithCaller(ctx, &api.Caller{ProjectID: sv.ProjectID})
	}
	rid := api.RequestID(ctx)
	if rid == "" {
		rid = "req-" + newUUID()
	}
	started := s.now()
	if err := s.recordActionID(ctx, s.db, sv.ID, "extend_volume", rid); err != nil {
		return err
	}
	var failure error
	running := driver.PowerState(sv.Power) == driver.Running || driver.PowerState(sv.Power) == driver.Paused
	if volumeVMHost(sv) != "" && running {
		failure = retry(ctx, func() error { return s.driver.ExtendVolume(ctx, sv.ID, volumeID, sizeBytes) })
		if errors.Is(failure, driver.ErrNotFound) {
			failure = nil // the volume is not plugged: its next start sees the size
		}
	}
	if err := s.finishAction(ctx, s.db, sv.ID, rid, "compute_extend_volume", sv.Host, started, failure); err != nil {
		return err
	}
	return failure
}
