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

// hostZone is a host's availability zone, Nova's default "nova" when unset.
func hostZone(h driver.Host) string {
	if h.Zone == "" {
		return "nova"
	}
	return h.Zone
}
