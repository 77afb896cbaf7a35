package compute

import (
	"context"
	"errors"
	"sort"

	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// errNoValidHost is the scheduler's NoValidHost; its text is Nova's fault
// message, which clients show as is.
//
//lint:ignore ST1005 Nova's exact words (nova/exception.py NoValidHost)
var errNoValidHost = errors.New("No valid host was found. There are not enough hosts available.")

// placementLock is the PostgreSQL advisory lock that serialises host
// choices, so two concurrent transactions cannot both take the last free
// cores of a host. SQLite transactions are already serial (BEGIN IMMEDIATE).
const placementLock = 7_316_284_202

func lockPlacement(ctx context.Context, tx *store.Tx) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(?)", int64(placementLock))
	return err
}

// need is what a server asks of a host.
type need struct{ VCPUs, MemoryMB, DiskGB int }

// chooseHost picks, inside tx (after lockPlacement), a host of zone (any
// zone when "") with room for n once what is placed there is counted.
// vCPUs are dedicated: no overcommit. except names a host to avoid.
// It spreads: the host with most free vCPUs wins.
func (s *Service) chooseHost(ctx context.Context, tx *store.Tx, hosts []driver.Host, zone string, n need, except string) (string, error) {
	usage, err := s.hostUsage(ctx, tx)
	if err != nil {
		return "", err
	}
	type cand struct {
		name string
		free int
	}
	var cands []cand
	for _, h := range hosts {
		if !h.Up || (zone != "" && hostZone(h) != zone) || h.Name == except {
			continue
		}
		u := usage[h.Name]
		if h.VCPUs-u.VCPUs >= n.VCPUs && h.MemoryMB-u.MemoryMB >= n.MemoryMB && h.DiskGB-u.DiskGB >= n.DiskGB {
			cands = append(cands, cand{h.Name, h.VCPUs - u.VCPUs})
		}
	}
	if len(cands) == 0 {
		return "", errNoValidHost
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].free > cands[j].free })
	return cands[0].name, nil
}

// fitsOn reports whether host has room for extra more once placed servers
// are counted (used by resize on the same host).
func (s *Service) fitsOn(ctx context.Context, tx *store.Tx, hosts []driver.Host, host string, extra need) (bool, error) {
	usage, err := s.hostUsage(ctx, tx)
	if err != nil {
		return false, err
	}
	for _, h := range hosts {
		if h.Name == host {
			u := usage[h.Name]
			return h.Up && h.VCPUs-u.VCPUs >= extra.VCPUs && h.MemoryMB-u.MemoryMB >= extra.MemoryMB && h.DiskGB-u.DiskGB >= extra.DiskGB, nil
		}
	}
	return false, nil
}

// hostZone is a host's availability zone, Nova's default "nova" when unset.
func hostZone(h driver.Host) string {
	if h.Zone == "" {
		return "nova"
	}
	return h.Zone
}
