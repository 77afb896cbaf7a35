package network

import (
	"context"
	"errors"
	"time"

	"nimbus/internal/store"
)

// A client that deletes its servers and then their security group, subnet
// or network (Tempest's cleanup of a test project does, without waiting
// for the servers to go) would otherwise meet a 409 while compute is
// still destroying the VMs: the ports are released only once they are
// gone. Compute marks the ports of a server whose delete it accepted
// (ServerDeleting); a delete that only such ports block waits up to
// releasingWait for them, then answers as before.

// releasingWait bounds the wait: longer than a VM's destroy under the fake
// driver at its certification step and under TCG; a port still there
// after it (a destroy that failed, a user's port kept) is in use.
var releasingWait = 10 * time.Second

// ServerDeleting marks, in tx, the ports bound to server serverID as being
// released: its delete was accepted.
func (s *Service) ServerDeleting(ctx context.Context, tx *store.Tx, serverID string) error {
	_, err := tx.Exec(ctx, "UPDATE ports SET releasing = 1 WHERE bound_device = ? AND bound_by = ?", serverID, bindCompute)
	return err
}

// stillReleasing is a delete's conflict while every port in the way is
// being released: the caller tries again.
type stillReleasing struct{ conflict error }

func (e stillReleasing) Error() string { return e.conflict.Error() }

// inUse returns conflict, as stillReleasing when all n ports in the way are
// being released.
func inUse(n, releasing int, conflict error) error {
	if n > 0 && releasing == n {
		return stillReleasing{conflict}
	}
	return conflict
}

// afterReleases runs del, again every 50 ms while it fails only for ports
// being released, for up to releasingWait; then the conflict stands.
func afterReleases(ctx context.Context, del func() error) error {
	deadline := time.Now().Add(releasingWait)
	for {
		err := del()
		var r stillReleasing
		if !errors.As(err, &r) {
			return err
		}
		if time.Now().After(deadline) {
			return r.conflict
		}
		select {
		case <-ctx.Done():
			return r.conflict
		case <-time.After(50 * time.Millisecond):
		}
	}
}
