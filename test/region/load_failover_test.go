package region_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"nimbus/internal/store"
	"nimbus/internal/testenv/region"
)

// TestPrimaryKilledUnderLoad: 1,000 servers asked of the region through
// HAProxy (fifty requests of twenty from five clients, spread by HAProxy
// over three controllers; the hosts' agent reaches them through HAProxy
// too), and the PostgreSQL primary's node killed (SIGKILL) while the
// requests come in. The synchronous standby takes over. Each request
// answers within its deadline, 2xx or 503 in Nova's shape with
// Retry-After, never anything else; a client sends a request that met a
// 503 again after Retry-After, as gophercloud's users do. Every request
// acknowledged has its twenty servers, each ends ACTIVE (the fake fleet
// fails nothing, so an ERROR is the region's fault); the fake fleet holds
// exactly one VM per server; no pCPU is pinned twice; every claim belongs
// to a live server.
func TestPrimaryKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, Patroni, PostgreSQL, HAProxy and nimbus as processes")
	}
	region.Need(t, "NIMBUS_REQUIRE_PGHA", "etcd", "patroni", "haproxy")
	const (
		requests, perRequest = 50, 20
		hosts                = 40 // of 34 pCPUs: room for 1,000 one-pCPU servers, and for a request sent twice
	)
	r := region.StartRegion(t, "127.0.0.20", []string{"127.0.0.21", "127.0.0.22", "127.0.0.23"},
		"--billing-credit-limit", "100000000000", "--down-after", "30s")
	cluster, bal, procs := r.Cluster, r.Balancer, r.Procs()

	var names []string
	for i := range hosts {
		names = append(names, fmt.Sprint("hv-", i))
	}
	agentDir := t.TempDir()
	fleet := filepath.Join(agentDir, "fleet.json")
	region.FakeFleet(t, fleet, names...)
	agent := r.StartAgent(t, agentDir, fleet, "--fake-delay", "100ms", "--heartbeat", "1s")
	procs = append(procs, agent)

	cl := region.Connect(t, bal.URL("identity")+"/v3", r.CA, requestDeadline)
	cl.Unlimit(t)
	region.WaitFor(t, 90*time.Second, "the agent's hosts up through HAProxy", func() bool { return cl.HostsUp(t) == hosts }, procs...)
	ctx := context.Background()
	image := imageFor(t, cl, 20, 2048) // d1.2g.local's disk and RAM
	nw, err := networks.Create(ctx, cl.Network, networks.CreateOpts{Name: "load"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subnets.Create(ctx, cl.Network, subnets.CreateOpts{NetworkID: nw.ID, CIDR: "10.200.0.0/20",
		IPVersion: gophercloud.IPv4}).Extract(); err != nil {
		t.Fatal(err)
	}
	cluster.WaitSynchronous(t, 60*time.Second)

	// Five clients send the requests; one that meets a 503 waits its
	// Retry-After and sends it again, for up to two minutes.
	var mu sync.Mutex
	var reqs []region.Request
	acked := map[int]bool{}
	next := make(chan int)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				giveUp := time.Now().Add(2 * time.Minute)
				for {
					r := createMany(cl.Compute, fmt.Sprint("mass-", i), image, nw.ID, perRequest)
					mu.Lock()
					reqs = append(reqs, r)
					if r.Status/100 == 2 {
						acked[i] = true
					}
					mu.Unlock()
					if r.Status != http.StatusServiceUnavailable || time.Now().After(giveUp) {
						break
					}
					wait, _ := strconv.Atoi(r.RetryAfter)
					time.Sleep(time.Duration(min(max(wait, 1), 5)) * time.Second)
				}
			}
		}()
	}
	var old *region.Node
	var killed time.Time
	for i := range requests {
		if i == requests/5 {
			if old = cluster.Primary(); old == nil {
				t.Fatal("no primary")
			}
			old.Kill()
			killed = time.Now()
		}
		next <- i
	}
	close(next)
	wg.Wait()
	loadDone := time.Since(killed)
	var promoted string
	if p := cluster.Primary(); p != nil {
		promoted = p.Name
	}

	s := region.Summarize(t, reqs)
	t.Logf("primary %s killed after %d of %d requests; %s primary now; the last request answered %.1f s after the kill",
		old.Name, requests/5, requests, promoted, loadDone.Seconds())
	t.Logf("through HAProxy: %s", s)
	if s.Hung > 0 || s.NoAnswer > 0 || len(s.Other) > 0 {
		t.Errorf("want only 2xx and 503: %s\n%s", s, region.Tails(procs...))
	}
	if !s.LastFailure.IsZero() {
		t.Logf("creates answered 503 from %.1f s to %.1f s after the kill", s.FirstFailure.Sub(killed).Seconds(),
			s.LastFailure.Sub(killed).Seconds())
	}
	if len(acked) != requests {
		t.Errorf("%d of %d requests acknowledged", len(acked), requests)
	}

	// Every server there ends ACTIVE, or ERROR with a fault.
	settled := region.Settle(t, cl.Compute, "mass-", len(acked)*perRequest, 4*time.Minute, func(stuck []string) string {
		return "their ops:\n" + fleetOps(t, cluster.URL, stuck) + "\n" + region.Tails(procs...)
	})
	t.Logf("all settled %.1f s after the kill", time.Since(killed).Seconds())
	perReq := map[string]int{}
	for _, sv := range settled.All {
		perReq[sv.Name[:strings.LastIndex(sv.Name, "-")]]++
	}
	for i := range acked {
		// A request whose answer the failover cut may have been kept
		// and been sent again: twice its servers.
		if n := perReq[fmt.Sprint("mass-", i)]; n != perRequest && n != 2*perRequest {
			t.Errorf("acknowledged request %d has %d servers", i, n)
		}
	}
	region.CheckVMs(t, region.FakeJournal(t, filepath.Join(agentDir, "data", "fake-fleet.json")), settled.Active)
	// The fake fleet fails nothing, and a fault of the region's own (its
	// database away, a controller gone) is no fault of a server's.
	if settled.Errored > 0 {
		t.Errorf("%d servers in ERROR", settled.Errored)
	}
	region.CheckClaims(t, cluster.URL, len(settled.Active), len(settled.Active))
	t.Logf("%d servers: %d ACTIVE, %d ERROR", len(settled.All), len(settled.Active), settled.Errored)
}

// createMany asks for count servers named name in one request, with
// requestDeadline for its answer.
func createMany(compute *gophercloud.ServiceClient, name, image, network string, count int) region.Request {
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	defer cancel()
	r := region.Request{Op: "server", Start: time.Now()}
	res := servers.Create(ctx, compute, servers.CreateOpts{Name: name, ImageRef: image, FlavorRef: "d1.2g.local",
		Networks: []servers.Network{{UUID: network}}, Min: count, Max: count}, nil)
	r.End = time.Now()
	return region.Answered(ctx, r, http.StatusAccepted, res.Err)
}

// imageFor is the first image a flavor of diskGB and ramMB boots.
func imageFor(t *testing.T, cl *region.Clients, diskGB, ramMB int) string {
	t.Helper()
	pages, err := images.List(cl.Image, images.ListOpts{}).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := images.ExtractImages(pages)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if img.MinDiskGigabytes <= diskGB && img.MinRAMMegabytes <= ramMB {
			return img.ID
		}
	}
	t.Fatalf("no image fits a flavor of %d GB disk and %d MB RAM", diskGB, ramMB)
	return ""
}

// fleetOps describes the hypervisor operations of servers, as the
// region's database holds them, for a failure's message.
func fleetOps(t *testing.T, dbURL string, servers []string) string {
	t.Helper()
	db, err := store.Open(context.Background(), dbURL)
	if err != nil {
		return err.Error()
	}
	defer db.Close()
	var b strings.Builder
	for _, id := range servers {
		rows, err := db.Query(context.Background(), `SELECT op_key, kind, state, created_at, COALESCE(done_at, ''), error
 FROM fleet_ops WHERE server_id = ? ORDER BY created_at`, id)
		if err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  server %s:\n", id)
		for rows.Next() {
			var key, kind, state, created, done, msg string
			if err := rows.Scan(&key, &kind, &state, &created, &done, &msg); err != nil {
				rows.Close()
				return err.Error()
			}
			fmt.Fprintf(&b, "    %s %s %s created %s done %s %s\n", key, kind, state, created, done, msg)
		}
		rows.Close()
	}
	return b.String()
}
