package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"nimbus/internal/cloud"
	regiontest "nimbus/internal/testenv/region"
)

// TestControllerKilledUnderLoad: 1,000 servers asked of three controllers
// at once (fifty requests of twenty, spread over them), one controller
// killed (-9) while the requests are coming in. Every server the region
// accepted ends ACTIVE (the fake fleet fails nothing, so an ERROR is the
// region's fault); the fake fleet holds exactly one VM per server; no
// pCPU is pinned by two VMs; every claim belongs to a live server.
func TestControllerKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const (
		requests, perRequest = 50, 20
		total                = requests * perRequest
	)
	ctx := context.Background()
	r := startRegionHosts(t, 3, 2, "100ms", 40) // 40 hosts of 34 pCPUs: room for 1,000 one-pCPU servers
	r.credit(1, 100_000_000)
	// Room beyond the thousand: a request the killed controller took but
	// could not answer is sent again, and may make its twenty twice.
	r.quota(2, 2*total, 2*total)
	image, _, _ := bootChoice(t, r.provider(0, cloud.DemoUser))
	// A network with room for them all (the project's own is a /24).
	nc, err := openstack.NewNetworkV2(r.provider(0, cloud.DemoUser), gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	nw, err := networks.Create(ctx, nc, networks.CreateOpts{Name: "load"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subnets.Create(ctx, nc, subnets.CreateOpts{NetworkID: nw.ID, CIDR: "10.200.0.0/20", IPVersion: gophercloud.IPv4}).Extract(); err != nil {
		t.Fatal(err)
	}
	network := nw.ID
	clients := []*gophercloud.ServiceClient{r.compute(0, cloud.DemoUser, ""), r.compute(1, cloud.DemoUser, ""), r.compute(2, cloud.DemoUser, "")}

	// Five clients send the requests round the controllers; a request
	// that finds its controller dead goes to the next, as a balancer's
	// redispatch does, and one answered 503 busy (its placement lost the
	// race for the same pCPUs to the other controllers' for longer than
	// a placement may take) is sent again after its Retry-After.
	// Controller 0 dies once a fifth were sent.
	var mu sync.Mutex
	accepted, refused, failed, busy, sent := 0, 0, 0, 0, 0
	next := make(chan int)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				for try, busyTries := 0, 0; try < 3; try++ {
					c := (i + try) % 3
					var answered gophercloud.ErrUnexpectedResponseCode
					res := servers.Create(ctx, clients[c], servers.CreateOpts{Name: fmt.Sprint("load-", i), ImageRef: image,
						FlavorRef: "d1.2g.local", Networks: []servers.Network{{UUID: network}}, Min: perRequest, Max: perRequest}, nil)
					mu.Lock()
					switch {
					case res.Err == nil:
						accepted++
					case gophercloud.ResponseCodeIs(res.Err, 403), gophercloud.ResponseCodeIs(res.Err, 400), gophercloud.ResponseCodeIs(res.Err, 409):
						refused++
						t.Errorf("request %d refused: %v", i, res.Err)
					case c == 0 && !errors.As(res.Err, &answered):
						failed++ // the dying controller's connection: sent to another
					case gophercloud.ResponseCodeIs(res.Err, 503) && errors.As(res.Err, &answered) &&
						answered.ResponseHeader.Get("Retry-After") == "1" && busyTries < 20:
						busy++
						busyTries++
						try-- // the same controller again, after Retry-After
						mu.Unlock()
						time.Sleep(time.Second)
						continue
					default:
						failed++
						t.Errorf("request %d to live controller %d: %v", i, c, res.Err)
					}
					done := res.Err == nil || refused > 0
					mu.Unlock()
					if done {
						break
					}
				}
			}
		}()
	}
	var killedAt time.Time
	for i := range requests {
		if i == requests/5 {
			r.ctls[0].stop(t, syscall.SIGKILL)
			killedAt = time.Now()
		}
		next <- i
		sent++
	}
	close(next)
	wg.Wait()
	t.Logf("%d requests sent, %d accepted, %d met the dead controller and went to another, %d answers 503 busy", sent, accepted, failed, busy)
	if accepted != requests {
		t.Errorf("%d of %d requests accepted", accepted, requests)
		for _, p := range r.ctls[1:] {
			b, _ := os.ReadFile(p.log)
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, `"level":"ERROR"`) {
					t.Log(l)
				}
			}
		}
	}

	// Every server there ends ACTIVE or ERROR with a fault.
	settled := regiontest.Settle(t, r.compute(1, cloud.DemoUser, ""), "load-", accepted*perRequest, 3*time.Minute,
		func([]string) string { return r.logs() })
	t.Logf("all settled %.1f s after the kill", time.Since(killedAt).Seconds())

	regiontest.CheckVMs(t, regiontest.FakeJournal(t, filepath.Join(r.agentD, "fake-fleet.json")), settled.Active)
	// The fake fleet fails nothing, and a fault of the region's own (its
	// database away, a controller gone) is no fault of a server's.
	if settled.Errored > 0 {
		t.Errorf("%d servers in ERROR", settled.Errored)
	}
	regiontest.CheckClaims(t, r.dbURL, len(settled.Active), len(settled.Active))
	t.Logf("%d servers: %d ACTIVE, %d ERROR", len(settled.All), len(settled.Active), settled.Errored)
}
