package qemu

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"nimbus/internal/driver"
)

// Boot from volume. A server whose Spec.Volumes[0] has Boot set (Nova's
// boot_index 0, a `network` flavor's disk) boots from that volume: its
// disk is the volume's node tree (volumeSpec, the same as a hot-plugged
// volume's, with its throttle) with bootindex 0, and the server has no
// local root disk — no image is fetched, no overlay made, the image's
// kernel_id does not apply. It still gets its seed (NoCloud or config
// drive). The volume's data is never the driver's: destroy (and so
// shelve-offload) removes the server's directory only, resize keeps the
// volume as it is, and the volume cannot be detached.

// ErrBootVolume is returned for what a boot volume cannot do: be detached,
// or be attached to a server as its boot volume after its spawn.
var ErrBootVolume = errors.New("qemu: the volume is the server's boot volume")

// bootVolume is the boot volume of a server's volumes, if it has one.
func bootVolume(vols []driver.Volume) (driver.Volume, bool) {
	if len(vols) > 0 && vols[0].Boot {
		return vols[0], true
	}
	return driver.Volume{}, false
}

// bootVolume is the boot volume of v's record, if it has one.
func (v *vm) bootVolume() (driver.Volume, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return bootVolume(v.st.Spec.Volumes)
}

// checkBootVolume refuses volumes where a Boot one is not the first.
func checkBootVolume(vols []driver.Volume) error {
	for i, vol := range vols {
		if vol.Boot && i > 0 {
			return fmt.Errorf("qemu: volume %s: a boot volume must come first (it is #%d)", vol.ID, i)
		}
	}
	return nil
}

// createFromVolume is create's part for a server that boots from its
// volume: the record and the seed, no disk.
func (d *Driver) createFromVolume(v *vm, spec driver.Spec) (state, error) {
	boot, _ := bootVolume(spec.Volumes)
	if err := checkBootVolume(spec.Volumes); err != nil {
		return state{}, err
	}
	if err := validVolume(boot); err != nil {
		return state{}, err
	}
	if spec.VCPUs <= 0 || spec.MemoryMB <= 0 {
		return state{}, fmt.Errorf("bad flavor: %d vCPUs, %d MB", spec.VCPUs, spec.MemoryMB)
	}
	st := state{Power: wantRunning, Created: time.Now().UTC(), Firmware: "bios"}
	return st, nil
}

// refuseBootVolumeDetach is DetachVolume's guard.
func refuseBootVolumeDetach(id string, vol driver.Volume) error {
	if vol.Boot {
		return fmt.Errorf("qemu: server %s: detach volume %s: %w", id, vol.ID, ErrBootVolume)
	}
	return nil
}

// attachBootFlag gives vol, asked to be attached to a server whose record
// has rec (had) of the same id, the boot flag it may have: a boot volume
// stays one (a new connection for it keeps it the boot disk), and no
// volume becomes one after the spawn.
func attachBootFlag(id string, vol driver.Volume, rec driver.Volume, had bool) (driver.Volume, error) {
	switch {
	case had && rec.Boot:
		vol.Boot = true
	case vol.Boot:
		return vol, fmt.Errorf("qemu: server %s: attach volume %s: a server gets its boot volume when it is spawned, not by an attach", id, vol.ID)
	}
	return vol, nil
}

// resizeVolumes are the volumes a resize leaves the server: the spec's,
// or the record's when the spec has none; the boot volume stays the
// server's root in either case.
func resizeVolumes(rec, spec []driver.Volume) ([]driver.Volume, error) {
	if len(spec) == 0 {
		return rec, nil
	}
	if err := checkBootVolume(spec); err != nil {
		return nil, err
	}
	rb, rok := bootVolume(rec)
	sb, sok := bootVolume(spec)
	switch {
	case rok && !sok:
		// Resize keeps the root disk: the spec omitted it or lost its
		// flag.
		if k := slices.IndexFunc(spec, func(v driver.Volume) bool { return v.ID == rb.ID }); k >= 0 {
			sb = spec[k]
			sb.Boot = true
			rest := slices.Delete(slices.Clone(spec), k, k+1)
			return append([]driver.Volume{sb}, rest...), nil
		}
		return append([]driver.Volume{rb}, spec...), nil
	case sok && !rok:
		return nil, fmt.Errorf("qemu: volume %s: a resize cannot move the root disk to a volume", sb.ID)
	case sok && rok && sb.ID != rb.ID:
		return nil, fmt.Errorf("qemu: volume %s: a resize cannot swap the boot volume %s", sb.ID, rb.ID)
	}
	return spec, nil
}
