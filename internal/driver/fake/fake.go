// Package fake is the simulated hypervisor fleet: hosts with cores, RAM, disk
// and GPUs from config, and servers that take short, realistic delays to
// change state. It is a product feature (the default driver) and behaves as
// the real drivers do.
package fake

import (
	"context"
	"errors"
	"time"

	"nimbus/internal/driver"
)

// Config sets up the fleet.
type Config struct {
	Hosts []driver.Host
	// Delay scales every operation's simulated duration; 0 means instant.
	Delay time.Duration
	// StateFile, when set, is where the fleet keeps its view of which VMs
	// run, so that it survives a restart as real VMs do.
	StateFile string
}

// Driver is the fake driver.
type Driver struct{ cfg Config }

var _ driver.Driver = (*Driver)(nil)

// New makes a fake fleet.
func New(cfg Config) (*Driver, error) { return &Driver{cfg: cfg}, nil }

// DefaultFleet is the fleet a new install gets.
func DefaultFleet() []driver.Host { return nil }

var errTODO = errors.New("fake: not implemented yet")

func (d *Driver) Name() string                                           { return "fake" }
func (d *Driver) Hosts(ctx context.Context) ([]driver.Host, error)       { return d.cfg.Hosts, nil }
func (d *Driver) Spawn(ctx context.Context, spec driver.Spec) error      { return errTODO }
func (d *Driver) Destroy(ctx context.Context, id string) error           { return errTODO }
func (d *Driver) PowerOff(ctx context.Context, id string, g bool) error  { return errTODO }
func (d *Driver) PowerOn(ctx context.Context, id string) error           { return errTODO }
func (d *Driver) Reboot(ctx context.Context, id string, hard bool) error { return errTODO }
func (d *Driver) Pause(ctx context.Context, id string) error             { return errTODO }
func (d *Driver) Unpause(ctx context.Context, id string) error           { return errTODO }
func (d *Driver) Suspend(ctx context.Context, id string) error           { return errTODO }
func (d *Driver) Resume(ctx context.Context, id string) error            { return errTODO }
func (d *Driver) Resize(ctx context.Context, spec driver.Spec) error     { return errTODO }
func (d *Driver) Snapshot(ctx context.Context, id string) (int64, error) { return 0, errTODO }
func (d *Driver) ConsoleOutput(ctx context.Context, id string, n int) (string, error) {
	return "", errTODO
}
func (d *Driver) List(ctx context.Context) ([]driver.Instance, error) { return nil, errTODO }
func (d *Driver) State(ctx context.Context, id string) (driver.PowerState, error) {
	return 0, errTODO
}

// LoadFleet reads a fleet description (a JSON list of hosts) from a file.
func LoadFleet(path string) ([]driver.Host, error) { return nil, errTODO }
