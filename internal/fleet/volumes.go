package fleet

import (
	"context"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
)

// AttachVolume hot-plugs vol's disk into a server, on its host.
func (s *Service) AttachVolume(ctx context.Context, id string, vol driver.Volume) error {
	_, err := s.call(ctx, wire.KindAttachVolume, id, "", wire.VolumeArgs{Volume: vol})
	return err
}

// DetachVolume takes volume volumeID's disk out of a server, on its host.
func (s *Service) DetachVolume(ctx context.Context, id, volumeID string) error {
	_, err := s.call(ctx, wire.KindDetachVolume, id, "", wire.VolumeArgs{VolumeID: volumeID})
	return err
}

// ExtendVolume tells a server, on its host, that a volume's disk grew.
func (s *Service) ExtendVolume(ctx context.Context, id, volumeID string, sizeBytes int64) error {
	_, err := s.call(ctx, wire.KindExtendVolume, id, "", wire.VolumeArgs{VolumeID: volumeID, SizeBytes: sizeBytes})
	return err
}

var _ driver.VolumeCopier = (*Service)(nil)

// CopyVolume copies a volume's disk live, on the server's host, into the
// file target there.
func (s *Service) CopyVolume(ctx context.Context, id, volumeID, target string) error {
	_, err := s.call(ctx, wire.KindCopyVolume, id, "", wire.VolumeArgs{VolumeID: volumeID, Target: target})
	return err
}

var _ driver.VolumeSwapper = (*Service)(nil)

// SwapVolume moves a server's disk from volume oldID onto vol, live, on
// its host.
func (s *Service) SwapVolume(ctx context.Context, id, oldID string, vol driver.Volume) error {
	_, err := s.call(ctx, wire.KindSwapVolume, id, "", wire.VolumeArgs{VolumeID: oldID, Volume: vol})
	return err
}
