package fake

import (
	"context"
	"slices"

	"nimbus/internal/driver"
)

// AttachPort adds port to a server's NICs (its spec's ports), as a
// hot-plug does; a port it has already is left as it is.
func (d *Driver) AttachPort(ctx context.Context, id string, port driver.Port) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpAttach); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		if !slices.ContainsFunc(v.Spec.Ports, func(p driver.Port) bool { return p.ID == port.ID }) {
			v.Spec.Ports = append(v.Spec.Ports, port)
		}
		return nil
	})
}

// DetachPort removes port portID from a server's NICs; a port it does not
// have is not an error.
func (d *Driver) DetachPort(ctx context.Context, id, portID string) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpDetach); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		v.Spec.Ports = slices.DeleteFunc(v.Spec.Ports, func(p driver.Port) bool { return p.ID == portID })
		return nil
	})
}
