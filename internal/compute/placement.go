package compute

import (
	"errors"

	"nimbus/internal/driver"
)

// errNoValidHost is the scheduler's NoValidHost; its text is Nova's fault
// message, which clients show as is.
//
//lint:ignore ST1005 Nova's exact words (nova/exception.py NoValidHost)
var errNoValidHost = errors.New("No valid host was found. There are not enough hosts available.")

// hostZone is a host's own availability zone, Nova's default "nova" when
// unset.
func hostZone(h driver.Host) string {
	if h.Zone == "" {
		return "nova"
	}
	return h.Zone
}

// zoneIn is a host's availability zone given the zones aggregates set
// (hostZones): an aggregate's zone wins over the host's own.
func zoneIn(h driver.Host, zones map[string]string) string {
	if z := zones[h.Name]; z != "" {
		return z
	}
	return hostZone(h)
}
