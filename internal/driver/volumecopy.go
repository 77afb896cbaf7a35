package driver

import "context"

// VolumeCopier is a Driver that copies a volume a server has open, from
// the process that writes it, as it is at one instant (Cinder's snapshot
// of an in-use volume). Drivers that cannot leave it out: the volume
// service then copies the volume's data itself.
type VolumeCopier interface {
	// CopyVolume writes volume volumeID's disk, as the running (or
	// paused) server sees it at the start of the call, into the raw file
	// at target, which the caller made as large as the disk and which
	// must be on the server's host. ErrNotRunning when the server's VM
	// does not run (its disk is not written: a plain copy is as good);
	// ErrNotFound when the server or the volume is unknown to it.
	CopyVolume(ctx context.Context, id, volumeID, target string) error
}

// ErrNotRunning is returned by CopyVolume when no VM of the server runs.
var ErrNotRunning = errNotRunning{}

type errNotRunning struct{}

func (errNotRunning) Error() string { return "driver: the server's VM does not run" }
