package fleet

import (
	"context"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
)

// AttachPort hot-plugs a NIC on port into a server, on its host.
func (s *Service) AttachPort(ctx context.Context, id string, port driver.Port) error {
	_, err := s.call(ctx, wire.KindAttachPort, id, "", wire.PortArgs{Port: port})
	return err
}

// DetachPort takes port portID's NIC out of a server, on its host.
func (s *Service) DetachPort(ctx context.Context, id, portID string) error {
	_, err := s.call(ctx, wire.KindDetachPort, id, "", wire.PortArgs{PortID: portID})
	return err
}
