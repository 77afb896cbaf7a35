package driver

import "context"

// VolumeSwapper is a Driver that moves a server's disk from one volume
// to another while its guest runs (Nova's swap_volume; libvirt's
// blockRebase): the guest keeps its device and sees the new volume's
// data, which is the old one's as it was at the switch. Drivers that
// cannot leave it out: compute then refuses the swap.
type VolumeSwapper interface {
	// SwapVolume copies volume oldID's disk into vol, live, and switches
	// the server's disk to vol, which takes oldID's place in the server's
	// record (its device name and boot flag too). vol must be at least as
	// large; a larger one shows its extra space from the server's next
	// start. A server that already has vol and not oldID is done (a swap
	// asked again); ErrNotRunning when no VM of the server runs;
	// ErrNotFound when the server or oldID is unknown.
	SwapVolume(ctx context.Context, id, oldID string, vol Volume) error
}
