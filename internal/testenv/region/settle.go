package region

import (
	"context"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
)

// Settled is what the servers of a load came to.
type Settled struct {
	All     []servers.Server
	Active  map[string]bool // ids of the ACTIVE ones
	Errored int             // in ERROR, each with a fault
}

// Settle waits up to d until the servers whose names start with prefix,
// listed through compute, number at least want and are each ACTIVE or
// ERROR. Past d it fails the test with the servers' status/task counts
// and what stuck(ids of the unsettled) adds. A server in ERROR without a
// fault is an error.
func Settle(t testing.TB, compute *gophercloud.ServiceClient, prefix string, want int, d time.Duration,
	stuck func(ids []string) string) Settled {
	t.Helper()
	var all []servers.Server
	for deadline := time.Now().Add(d); ; time.Sleep(time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		pages, err := servers.List(compute, servers.ListOpts{Name: prefix}).AllPages(ctx)
		cancel()
		states := map[string]int{}
		if err == nil {
			all, _ = servers.ExtractServers(pages)
			for _, sv := range all {
				states[sv.Status+"/"+sv.TaskState]++
			}
		}
		if err == nil && states["ACTIVE/"]+states["ERROR/"] == len(all) && len(all) >= want {
			break
		}
		if time.Now().After(deadline) {
			var ids []string
			for _, sv := range all {
				if sv.Status != "ACTIVE" && sv.Status != "ERROR" {
					ids = append(ids, sv.ID)
				}
			}
			t.Fatalf("not settled after %s: %d servers (want %d) by status/task %v (list: %v)\n%s",
				d, len(all), want, states, err, stuck(ids))
		}
	}
	s := Settled{All: all, Active: map[string]bool{}}
	for _, sv := range all {
		if sv.Status == "ERROR" {
			s.Errored++
			if sv.Fault.Message == "" {
				t.Errorf("server %s in ERROR without a fault", sv.ID)
			} else if s.Errored <= 5 {
				t.Logf("server %s in ERROR: %d %s", sv.ID, sv.Fault.Code, sv.Fault.Message)
			}
			continue
		}
		s.Active[sv.ID] = true
	}
	return s
}
