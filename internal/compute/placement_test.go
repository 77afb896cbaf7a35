package compute_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// smallHost is a host of two NUMA nodes of two cores with two threads each
// (CPUs 0-3 on node 0, 4-7 on node 1), whose first core (CPUs 0 and 1) is
// reserved for the host: six CPUs for servers, 8 GiB per node, 100 GB disk.
func smallHost(name string, gpus ...driver.GPU) driver.Host {
	h := driver.Host{Name: name, IP: "192.0.2.1", DiskGB: 100, Zone: "nova", Up: true, GPUs: gpus,
		ReservedCPUs: []int{0, 1}, NUMANodes: []driver.NUMANode{{ID: 0, MemoryMB: 8192}, {ID: 1, MemoryMB: 8192}}}
	for id := 0; id < 8; id++ {
		core := id / 2
		h.CPUs = append(h.CPUs, driver.CPU{ID: id, Core: core, Socket: id / 4, NUMA: id / 4, Siblings: []int{core * 2, core*2 + 1}})
	}
	return h
}

// smallFleet is two plain hosts and one with two L4 GPUs on node 1: 18
// CPUs for servers in all.
func smallFleet() []driver.Host {
	return []driver.Host{smallHost("plain-1"), smallHost("plain-2"), smallHost("gpu-1",
		driver.GPU{Address: "0000:86:00.0", Vendor: "NVIDIA", Model: "L4", NUMA: 1, IOMMUGroup: 40},
		driver.GPU{Address: "0000:87:00.0", Vendor: "NVIDIA", Model: "L4", NUMA: 1, IOMMUGroup: 41})}
}

// placementEnv is a cloud on smallFleet with two flavors: p2 (2 dedicated
// vCPUs, 1 GiB, 10 GB local disk) and pg (the same with one L4), and a demo
// quota that never stands in the way.
func placementEnv(t *testing.T, dbURL string, opts ...testenv.Options) *env {
	t.Helper()
	e := newEnv(t, dbURL, append([]testenv.Options{func(c *cloud.Config) { c.Fleet = smallFleet() }}, opts...)...)
	e.flavor("p2", 2, 1024, 10, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local"})
	e.flavor("pg", 2, 1024, 10, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local",
		"nimbus:gpu_model": "L4", "pci_passthrough:alias": "l4:1"})
	var project string
	if err := e.c.DB.QueryRow(context.Background(), "SELECT id FROM projects WHERE name = ?", cloud.DemoProject).Scan(&project); err != nil {
		t.Fatal(err)
	}
	e.must(200, "PUT", "/os-quota-sets/"+project, e.admin, "", `{"quota_set":{"instances":1000,"cores":10000,"ram":10000000}}`)
	e.flavorID = "p2"
	return e
}

func (e *env) flavor(id string, vcpus, ram, disk int, specs map[string]string) {
	e.t.Helper()
	e.must(200, "POST", "/flavors", e.admin, "", fmt.Sprintf(`{"flavor":{"name":%q,"id":%q,"vcpus":%d,"ram":%d,"disk":%d}}`, id, id, vcpus, ram, disk))
	b, _ := json.Marshal(map[string]any{"extra_specs": specs})
	e.must(200, "POST", "/flavors/"+id+"/os-extra_specs", e.admin, "", string(b))
}

// createAs posts a create of flavor with extra server fields and returns
// the first server's id.
func (e *env) createAs(tok, flavor, extra string) string {
	e.t.Helper()
	return e.createHinted(tok, flavor, extra, "")
}

// createHinted is createAs with scheduler hints (a JSON object, or "").
func (e *env) createHinted(tok, flavor, extra, hints string) string {
	e.t.Helper()
	top := ""
	if hints != "" {
		top = `,"os:scheduler_hints":` + hints
	}
	body := fmt.Sprintf(`{"server":{"name":"p","imageRef":%q,"flavorRef":%q,"networks":"none"%s}%s}`, e.imageID, flavor, extra, top)
	m := e.must(202, "POST", "/servers", tok, "2.96", body)
	return m["server"].(map[string]any)["id"].(string)
}

// settle waits until no server of the cloud has a task or is building.
func (e *env) settle() {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := e.c.DB.QueryRow(context.Background(), `SELECT COUNT(*) FROM compute_servers WHERE deleted = 0
 AND (task_state <> '' OR vm_state = 'building')`).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatal("servers did not settle")
}

// placementInvariants checks the allocation tables against the servers and
// the fleet: no pCPU or GPU held twice, no reserved CPU held, every placed
// server holding exactly its flavor (vCPUs, memory, GPUs) on its own host,
// nothing held by servers that are not placed, memory and disk counters
// equal to what the claims hold and within capacity. It returns the number
// of placed servers.
func placementInvariants(t *testing.T, db *store.DB, fleet []driver.Host) int {
	t.Helper()
	ctx := context.Background()
	hosts := map[string]driver.Host{}
	for _, h := range fleet {
		h.Normalize()
		hosts[h.Name] = h
	}
	type claim struct {
		host  string
		cells []struct {
			Node     int   `json:"Node"`
			CPUs     []int `json:"CPUs"`
			MemoryMB int   `json:"MemoryMB"`
		}
		gpus []string
		disk int
	}
	claims := map[string]*claim{}
	rows, err := db.Query(ctx, `SELECT server_id, host, cells, gpus, disk_gb FROM compute_claims`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, cells, gpus string
		c := &claim{}
		if err := rows.Scan(&id, &c.host, &cells, &gpus, &c.disk); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(cells), &c.cells); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(gpus), &c.gpus); err != nil {
			t.Fatal(err)
		}
		claims[id] = c
	}
	rows.Close()

	// Items: each held once (the key says so; counted anyway), by a claim
	// that names it.
	held := map[string]string{}
	rows, err = db.Query(ctx, `SELECT host, item, server_id FROM compute_claim_items`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var host, item, sid string
		if err := rows.Scan(&host, &item, &sid); err != nil {
			t.Fatal(err)
		}
		k := host + "|" + item
		if prev, ok := held[k]; ok {
			t.Errorf("%s held by %s and %s", k, prev, sid)
		}
		held[k] = sid
	}
	rows.Close()
	want := map[string]string{}
	memUsed := map[string]int{}
	diskUsed := map[string]int{}
	for id, c := range claims {
		h, ok := hosts[c.host]
		if !ok {
			t.Errorf("claim %s on unknown host %s", id, c.host)
			continue
		}
		for _, cell := range c.cells {
			for _, cpu := range cell.CPUs {
				for _, r := range h.ReservedCPUs {
					if cpu == r {
						t.Errorf("claim %s holds reserved CPU %d of %s", id, cpu, c.host)
					}
				}
				node := -1
				for _, hc := range h.CPUs {
					if hc.ID == cpu {
						node = hc.NUMA
					}
				}
				if node != cell.Node {
					t.Errorf("claim %s: CPU %d is on node %d, not its cell's node %d", id, cpu, node, cell.Node)
				}
				k := c.host + "|cpu:" + strconv.Itoa(cpu)
				if prev, dup := want[k]; dup {
					t.Errorf("%s in claims %s and %s", k, prev, id)
				}
				want[k] = id
			}
			memUsed[fmt.Sprintf("%s|%d", c.host, cell.Node)] += cell.MemoryMB
		}
		for _, g := range c.gpus {
			want[c.host+"|gpu:"+g] = id
		}
		diskUsed[c.host] += c.disk
	}
	for k, id := range want {
		if held[k] != id {
			t.Errorf("%s: claim %s names it, items say %q", k, id, held[k])
		}
	}
	for k, id := range held {
		if want[k] != id {
			t.Errorf("%s held by %s with no claim naming it", k, id)
		}
	}

	// Counters: equal to the claims, within capacity.
	rows, err = db.Query(ctx, `SELECT host, node, total, used FROM compute_host_capacity`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var host string
		var node, total, used int
		if err := rows.Scan(&host, &node, &total, &used); err != nil {
			t.Fatal(err)
		}
		exp := memUsed[fmt.Sprintf("%s|%d", host, node)]
		if node == -1 {
			exp = diskUsed[host]
		}
		if used != exp || used > total {
			t.Errorf("capacity %s node %d: used %d, claims hold %d, total %d", host, node, used, exp, total)
		}
	}
	rows.Close()

	// Servers: a placed server holds exactly its flavor; others hold nothing.
	rows, err = db.Query(ctx, `SELECT id, vm_state, host, doc FROM compute_servers WHERE deleted = 0`)
	if err != nil {
		t.Fatal(err)
	}
	placed := 0
	for rows.Next() {
		var id, vm, host, doc string
		if err := rows.Scan(&id, &vm, &host, &doc); err != nil {
			t.Fatal(err)
		}
		var d struct {
			Flavor struct {
				VCPUs      int               `json:"vcpus"`
				RAM        int               `json:"ram"`
				ExtraSpecs map[string]string `json:"extra_specs"`
			} `json:"flavor"`
		}
		if err := json.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		c := claims[id]
		if host == "" {
			if c != nil {
				t.Errorf("server %s (%s) has no host but holds a claim on %s", id, vm, c.host)
			}
			continue
		}
		placed++
		if c == nil {
			t.Errorf("server %s (%s) on %s holds no claim", id, vm, host)
			continue
		}
		if c.host != host {
			t.Errorf("server %s is on %s but its claim is on %s", id, host, c.host)
		}
		cpus, mem := 0, 0
		for _, cell := range c.cells {
			cpus += len(cell.CPUs)
			mem += cell.MemoryMB
		}
		wantGPUs := 0
		if d.Flavor.ExtraSpecs["nimbus:gpu_model"] != "" {
			wantGPUs = 1
		}
		if cpus != d.Flavor.VCPUs || mem != d.Flavor.RAM || len(c.gpus) != wantGPUs {
			t.Errorf("server %s holds %d CPUs, %d MiB, %d GPUs; its flavor wants %d, %d, %d", id, cpus, mem, len(c.gpus), d.Flavor.VCPUs, d.Flavor.RAM, wantGPUs)
		}
	}
	rows.Close()
	for id, c := range claims {
		if strings.HasSuffix(id, "/resize-source") {
			continue
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT COUNT(*) FROM compute_servers WHERE id = ? AND deleted = 0 AND host = ?`, id, c.host).Scan(&n); err != nil || n != 1 {
			t.Errorf("claim %s on %s belongs to no placed server", id, c.host)
		}
	}
	return placed
}

// TestPlacementRace has many clients race for the last pCPUs and GPUs at
// once: exactly as many servers as the fleet's CPUs allow become ACTIVE,
// the rest go to ERROR with Nova's fault, and the allocation tables hold
// every invariant.
func TestPlacementRace(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		const plain, gpu = 12, 4 // 32 vCPUs asked of 18
		var wg sync.WaitGroup
		ids := make(chan string, plain+gpu)
		for i := 0; i < plain+gpu; i++ {
			flavor := "p2"
			if i%4 == 3 {
				flavor = "pg"
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids <- e.createAs(e.demo, flavor, "")
			}()
		}
		wg.Wait()
		close(ids)
		e.settle()
		active, failed, gpus := 0, 0, 0
		for id := range ids {
			sv := e.server(id, e.demo, "2.96")
			switch sv["status"] {
			case "ACTIVE":
				active++
				if sv["flavor"].(map[string]any)["original_name"] == "pg" {
					gpus++
				}
			case "ERROR":
				failed++
				fault, _ := sv["fault"].(map[string]any)
				if fault == nil || !strings.HasPrefix(fault["message"].(string), "No valid host was found") {
					t.Errorf("server %s: ERROR without NoValidHost: %v", id, fault)
				}
			default:
				t.Errorf("server %s: status %v", id, sv["status"])
			}
		}
		if active != 9 || failed != plain+gpu-9 || gpus > 2 {
			t.Errorf("active %d (want 9), failed %d (want %d), GPU servers %d (at most 2)", active, failed, plain+gpu-9, gpus)
		}
		if n := placementInvariants(t, e.c.DB, smallFleet()); n != active {
			t.Errorf("%d servers placed, %d ACTIVE", n, active)
		}
	})
}

// topology is GET /servers/{id}/topology at 2.78 as tok sees it.
func (e *env) topology(id, tok string) []map[string]any {
	e.t.Helper()
	m := e.must(200, "GET", "/servers/"+id+"/topology", tok, "2.78", "")
	var out []map[string]any
	for _, n := range m["nodes"].([]any) {
		out = append(out, n.(map[string]any))
	}
	return out
}

// pinned lists the host CPUs an admin sees a server pinned to.
func (e *env) pinned(id string) []int {
	e.t.Helper()
	var cpus []int
	for _, n := range e.topology(id, e.admin) {
		for _, p := range n["cpu_pinning"].(map[string]any) {
			cpus = append(cpus, int(p.(float64)))
		}
	}
	sort.Ints(cpus)
	return cpus
}

// TestAllocationLife follows one server's claim through its life: stop
// keeps it, shelve-offload frees it, unshelve places it again, resize
// claims the new flavor beside the old until confirm, revert gives the old
// one back, delete frees everything.
func TestAllocationLife(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		e.flavor("p4", 4, 2048, 10, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local"})
		fleet := smallFleet()
		id := e.createAs(e.demo, "p2", "")
		e.wait(id, e.demo, "ACTIVE")
		if got := e.pinned(id); len(got) != 2 {
			t.Fatalf("pinned to %v, want 2 CPUs", got)
		}
		// The owner sees cells without host details; before 2.78 there is no topology.
		for _, n := range e.topology(id, e.demo) {
			if _, ok := n["cpu_pinning"]; ok {
				t.Errorf("a customer sees cpu_pinning: %v", n)
			}
			if n["memory_mb"] != float64(1024) {
				t.Errorf("cell memory %v, want 1024", n["memory_mb"])
			}
		}
		e.must(404, "GET", "/servers/"+id+"/topology", e.demo, "2.77", "")

		before := e.pinned(id)
		e.action(id, e.demo, "2.96", `{"os-stop":null}`, 202)
		e.wait(id, e.demo, "SHUTOFF")
		if got := e.pinned(id); fmt.Sprint(got) != fmt.Sprint(before) {
			t.Errorf("stop changed the pinning: %v → %v", before, got)
		}
		placementInvariants(t, e.c.DB, fleet)

		e.action(id, e.demo, "2.96", `{"shelve":null}`, 202)
		e.wait(id, e.demo, "SHELVED_OFFLOADED")
		if n := placementInvariants(t, e.c.DB, fleet); n != 0 {
			t.Errorf("%d servers placed after shelve-offload", n)
		}
		if nodes := e.topology(id, e.admin); len(nodes) != 0 {
			t.Errorf("shelved server has topology %v", nodes)
		}
		e.action(id, e.demo, "2.96", `{"unshelve":null}`, 202)
		e.wait(id, e.demo, "ACTIVE")
		if got := e.pinned(id); len(got) != 2 {
			t.Errorf("unshelved server pinned to %v", got)
		}
		placementInvariants(t, e.c.DB, fleet)

		// Resize holds both until confirm.
		e.action(id, e.demo, "2.96", `{"resize":{"flavorRef":"p4"}}`, 202)
		e.wait(id, e.demo, "VERIFY_RESIZE")
		if got := e.pinned(id); len(got) != 4 {
			t.Errorf("resized server pinned to %v, want 4 CPUs", got)
		}
		var held int
		if err := e.c.DB.QueryRow(context.Background(), `SELECT COUNT(*) FROM compute_claim_items WHERE server_id LIKE ?`, id+"%").Scan(&held); err != nil || held != 6 {
			t.Errorf("during resize the server holds %d items, want 6 (old 2 + new 4): %v", held, err)
		}
		e.action(id, e.demo, "2.96", `{"revertResize":null}`, 202)
		e.wait(id, e.demo, "ACTIVE")
		if got := e.pinned(id); len(got) != 2 {
			t.Errorf("reverted server pinned to %v", got)
		}
		placementInvariants(t, e.c.DB, fleet)
		e.action(id, e.demo, "2.96", `{"resize":{"flavorRef":"p4"}}`, 202)
		e.wait(id, e.demo, "VERIFY_RESIZE")
		e.action(id, e.demo, "2.96", `{"confirmResize":null}`, 204)
		e.wait(id, e.demo, "ACTIVE")
		if err := e.c.DB.QueryRow(context.Background(), `SELECT COUNT(*) FROM compute_claim_items WHERE server_id LIKE ?`, id+"%").Scan(&held); err != nil || held != 4 {
			t.Errorf("after confirm the server holds %d items, want 4: %v", held, err)
		}
		placementInvariants(t, e.c.DB, fleet)

		e.must(204, "DELETE", "/servers/"+id, e.demo, "", "")
		e.settle()
		if n := placementInvariants(t, e.c.DB, fleet); n != 0 {
			t.Errorf("%d servers placed after delete", n)
		}
		var items int
		if err := e.c.DB.QueryRow(context.Background(), `SELECT COUNT(*) FROM compute_claim_items`).Scan(&items); err != nil || items != 0 {
			t.Errorf("%d items held after delete", items)
		}
	})
}

// TestMinMaxCount: min_count is all or nothing; beyond it, as many as fit.
func TestMinMaxCount(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		ctx := context.Background()
		count := func(state string) int {
			var n int
			if err := e.c.DB.QueryRow(ctx, `SELECT COUNT(*) FROM compute_servers WHERE deleted = 0 AND vm_state = ?`, state).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		// 9 fit; ask for 5 to 7, then 4 to 6: 7, then the 2 left.
		e.createAs(e.demo, "p2", `,"min_count":5,"max_count":7`)
		e.settle()
		if a := count("active"); a != 7 {
			t.Fatalf("%d ACTIVE after 5..7, want 7", a)
		}
		e.createAs(e.demo, "p2", `,"min_count":1,"max_count":6`)
		e.settle()
		if a := count("active"); a != 9 {
			t.Fatalf("%d ACTIVE after 1..6, want 9", a)
		}
		// Nothing left: a minimum of 2 fails both, holding nothing.
		e.createAs(e.demo, "p2", `,"min_count":2,"max_count":3`)
		e.settle()
		if a, f := count("active"), count("error"); a != 9 || f != 3 {
			t.Errorf("after an unplaceable 2..3: %d ACTIVE, %d ERROR; want 9 and 3", a, f)
		}
		placementInvariants(t, e.c.DB, smallFleet())
	})
}

// TestPlacementRules: NUMA, GPU models, disabled hosts, requested hosts.
func TestPlacementRules(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		e.flavor("n1", 3, 1024, 10, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "1"})
		e.flavor("p5", 5, 1024, 10, map[string]string{"hw:cpu_policy": "dedicated"})
		e.flavor("a100", 2, 1024, 10, map[string]string{"nimbus:gpu_model": "A100 80GB", "pci_passthrough:alias": "a100-80gb:1"})

		// 3 vCPUs on one node fit only node 1 (node 0 keeps 2 of its 4 for the host).
		id := e.createAs(e.demo, "n1", "")
		e.wait(id, e.demo, "ACTIVE")
		nodes := e.topology(id, e.admin)
		if len(nodes) != 1 || nodes[0]["host_node"] != float64(1) {
			t.Errorf("hw:numa_nodes=1 server cells: %v", nodes)
		}
		// 5 vCPUs fit no node: spread over both.
		id5 := e.createAs(e.demo, "p5", "")
		e.wait(id5, e.demo, "ACTIVE")
		if nodes := e.topology(id5, e.admin); len(nodes) != 2 {
			t.Errorf("5-vCPU server cells: %v", nodes)
		}
		// No A100 anywhere.
		ida := e.createAs(e.demo, "a100", "")
		e.wait(ida, e.demo, "ERROR")
		// A GPU server lands on the GPU host with an L4.
		idg := e.createAs(e.demo, "pg", "")
		e.wait(idg, e.demo, "ACTIVE")
		if h := e.server(idg, e.admin, "2.96")["OS-EXT-SRV-ATTR:host"]; h != "gpu-1" {
			t.Errorf("GPU server on %v", h)
		}

		// A disabled host takes no new servers.
		var svcs []any = e.must(200, "GET", "/os-services?binary=nova-compute", e.admin, "2.53", "")["services"].([]any)
		for _, s := range svcs {
			s := s.(map[string]any)
			if s["host"] == "plain-2" {
				e.must(200, "PUT", "/os-services/"+s["id"].(string), e.admin, "2.53", `{"status":"disabled","disabled_reason":"maintenance"}`)
			}
		}
		for i := 0; i < 4; i++ {
			id := e.createAs(e.demo, "p2", "")
			sv := e.server(id, e.admin, "2.96")
			if h := sv["OS-EXT-SRV-ATTR:host"]; h == "plain-2" {
				t.Errorf("server placed on disabled host plain-2")
			}
		}
		// An admin's requested host is the only candidate (2.74).
		body := fmt.Sprintf(`{"server":{"name":"h","imageRef":%q,"flavorRef":"p2","networks":"none","host":"plain-2"}}`, e.imageID)
		e.must(400, "POST", "/servers", e.admin, "2.74", body)
		e.settle()
		placementInvariants(t, e.c.DB, smallFleet())
	})
}

// TestWeighers: spread puts two servers on two hosts, pack on one; both
// keep the GPU host for GPU flavors while a plain host has room.
func TestWeighers(t *testing.T) {
	for _, tc := range []struct {
		weigher   string
		sameHost  bool
		wantHosts int
	}{{"spread", false, 2}, {"pack", true, 1}} {
		t.Run(tc.weigher, func(t *testing.T) {
			p, err := scheduler.ParsePolicy(tc.weigher, true)
			if err != nil {
				t.Fatal(err)
			}
			e := placementEnv(t, "", func(c *cloud.Config) { c.Scheduler = &p })
			hosts := map[string]bool{}
			for i := 0; i < 2; i++ {
				id := e.createAs(e.demo, "p2", "")
				h := e.server(id, e.admin, "2.96")["OS-EXT-SRV-ATTR:host"].(string)
				if h == "gpu-1" {
					t.Errorf("%s: a plain server went to the GPU host while plain hosts had room", tc.weigher)
				}
				hosts[h] = true
			}
			if len(hosts) != tc.wantHosts {
				t.Errorf("%s: servers on %v, want %d host(s)", tc.weigher, hosts, tc.wantHosts)
			}
		})
	}
}

// TestPlacementTwoControllers races creates through two controllers on one
// PostgreSQL database: the store's re-check keeps every invariant.
func TestPlacementTwoControllers(t *testing.T) {
	var pg string
	for _, eng := range testenv.Engines(t) {
		if eng.Name == "postgres" {
			pg = eng.URL
		}
	}
	if pg == "" {
		t.Skip("PostgreSQL not available (set NIMBUS_TEST_POSTGRES)")
	}
	e1 := placementEnv(t, pg)
	c2 := testenv.StartCloud(t, pg, func(c *cloud.Config) { c.Fleet = smallFleet() })
	e2 := &env{t: t, c: c2, client: testenv.HTTPClient(t, c2), imageID: e1.imageID, flavorID: "p2"}
	e2.demo = testenv.Token(t, c2, cloud.DemoUser)
	var wg sync.WaitGroup
	ids := make(chan string, 24)
	for i := 0; i < 24; i++ {
		e := e1
		if i%2 == 1 {
			e = e2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids <- e.createAs(e.demo, "p2", "")
		}()
	}
	wg.Wait()
	close(ids)
	e1.settle()
	active := 0
	for id := range ids {
		if e1.server(id, e1.demo, "2.96")["status"] == "ACTIVE" {
			active++
		}
	}
	if active != 9 {
		t.Errorf("%d ACTIVE across two controllers, want 9", active)
	}
	if n := placementInvariants(t, e1.c.DB, smallFleet()); n != active {
		t.Errorf("%d placed, %d ACTIVE", n, active)
	}
}

// TestGroupsAndHints: server groups' policies, same_host/different_host
// hints and zones set by aggregates steer placement as Nova's filters do.
func TestGroupsAndHints(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		host := func(id string) string {
			sv := e.server(id, e.admin, "2.96")
			h, ok := sv["OS-EXT-SRV-ATTR:host"].(string)
			if !ok {
				t.Fatalf("server %s has no host: %v %v", id, sv["status"], sv["fault"])
			}
			return h
		}
		group := func(policy string) string {
			m := e.must(200, "POST", "/os-server-groups", e.demo, "2.64", fmt.Sprintf(`{"server_group":{"name":%q,"policy":%q}}`, policy, policy))
			return m["server_group"].(map[string]any)["id"].(string)
		}
		hint := func(k, v string) string { return fmt.Sprintf(`{%q:%q}`, k, v) }

		// Anti-affinity: three hosts, three members on three hosts; a fourth has none.
		anti := group("anti-affinity")
		seen := map[string]bool{}
		for i := 0; i < 3; i++ {
			id := e.createHinted(e.demo, "p2", "", hint("group", anti))
			e.wait(id, e.demo, "ACTIVE")
			if seen[host(id)] {
				t.Errorf("anti-affinity member %d on %s again", i, host(id))
			}
			seen[host(id)] = true
		}
		fourth := e.createHinted(e.demo, "p2", "", hint("group", anti))
		e.wait(fourth, e.demo, "ERROR")
		members := e.must(200, "GET", "/os-server-groups/"+anti, e.demo, "2.64", "")["server_group"].(map[string]any)["members"].([]any)
		if len(members) != 4 {
			t.Errorf("group members %v, want 4 (the failed one is a member too, as in Nova)", members)
		}
		// A multi-create in an anti-affinity group spreads within the batch.
		anti2 := group("anti-affinity")
		e.createHinted(e.demo, "p2", `,"min_count":2,"max_count":2`, hint("group", anti2))
		e.settle()
		ms := e.must(200, "GET", "/os-server-groups/"+anti2, e.demo, "2.64", "")["server_group"].(map[string]any)["members"].([]any)
		if len(ms) != 2 || host(ms[0].(string)) == host(ms[1].(string)) {
			t.Errorf("anti-affinity batch: members %v", ms)
		}

		// Free the fleet for the rest.
		for _, x := range e.must(200, "GET", "/servers", e.demo, "2.96", "")["servers"].([]any) {
			e.must(204, "DELETE", "/servers/"+x.(map[string]any)["id"].(string), e.demo, "", "")
		}
		e.settle()

		// Affinity: every member where the first went.
		aff := group("affinity")
		first := e.createHinted(e.demo, "p2", "", hint("group", aff))
		second := e.createHinted(e.demo, "p2", "", hint("group", aff))
		e.settle()
		if host(first) != host(second) {
			t.Errorf("affinity members on %s and %s", host(first), host(second))
		}
		// Hints by server.
		same := e.createHinted(e.demo, "p2", "", hint("same_host", first))
		diff := e.createHinted(e.demo, "p2", "", hint("different_host", first))
		e.settle()
		if e.server(same, e.demo, "2.96")["status"] == "ACTIVE" && host(same) != host(first) {
			t.Errorf("same_host: %s, want %s", host(same), host(first))
		}
		if host(diff) == host(first) {
			t.Errorf("different_host landed on %s", host(diff))
		}
		e.must(400, "POST", "/servers", e.demo, "2.96", fmt.Sprintf(`{"server":{"name":"x","imageRef":%q,"flavorRef":"p2","networks":"none"},"os:scheduler_hints":{"group":"not-a-uuid"}}`, e.imageID))

		// A zone made by an aggregate: only its host serves it.
		agg := e.must(200, "POST", "/os-aggregates", e.admin, "2.41", `{"aggregate":{"name":"edge","availability_zone":"edge"}}`)["aggregate"].(map[string]any)
		aid := fmt.Sprint(agg["id"])
		e.must(200, "POST", "/os-aggregates/"+aid+"/action", e.admin, "2.41", `{"add_host":{"host":"gpu-1"}}`)
		id := e.createAs(e.demo, "pg", `,"availability_zone":"edge"`)
		sv := e.wait(id, e.demo, "ACTIVE")
		if host(id) != "gpu-1" || sv["OS-EXT-AZ:availability_zone"] != "edge" {
			t.Errorf("edge server on %s in zone %v", host(id), sv["OS-EXT-AZ:availability_zone"])
		}
		placementInvariants(t, e.c.DB, smallFleet())
	})
}

// TestHostDownWaits: work for a server whose host is down waits for the
// host instead of failing the server, the server shows host_status
// UNKNOWN meanwhile, and the host takes no new servers; a delete goes
// through at once (Nova's local delete).
func TestHostDownWaits(t *testing.T) {
	e := placementEnv(t, "")
	ctx := context.Background()
	body := func(name string) string {
		return fmt.Sprintf(`{"server":{"name":%q,"imageRef":%q,"flavorRef":"p2","networks":"none","host":"plain-1"}}`, name, e.imageID)
	}
	id := e.must(202, "POST", "/servers", e.admin, "2.74", body("a"))["server"].(map[string]any)["id"].(string)
	other := e.must(202, "POST", "/servers", e.admin, "2.74", body("b"))["server"].(map[string]any)["id"].(string)
	e.wait(id, e.admin, "ACTIVE")
	e.wait(other, e.admin, "ACTIVE")
	setUp := func(up bool) {
		e.c.Fake.SetHostUp("plain-1", up)
		if err := e.c.Agent.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	setUp(false)
	e.action(id, e.admin, "2.96", `{"os-stop":null}`, 202)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		sv := e.server(id, e.admin, "2.96")
		if sv["status"] != "ACTIVE" || sv["OS-EXT-STS:task_state"] != "powering-off" {
			t.Fatalf("while its host is down the server is %v/%v", sv["status"], sv["OS-EXT-STS:task_state"])
		}
		if sv["host_status"] != "UNKNOWN" {
			t.Errorf("host_status %v, want UNKNOWN", sv["host_status"])
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Nothing new lands on a down host.
	e.must(400, "POST", "/servers", e.admin, "2.74", body("c"))
	// A delete does not wait.
	e.must(204, "DELETE", "/servers/"+other, e.admin, "", "")
	gone := time.Now().Add(10 * time.Second)
	for {
		if st, _, _ := e.do("GET", "/servers/"+other, e.admin, "2.96", ""); st == 404 {
			break
		}
		if time.Now().After(gone) {
			t.Fatal("a server on a down host was not deleted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	setUp(true)
	e.wait(id, e.admin, "SHUTOFF")
	placementInvariants(t, e.c.DB, smallFleet())
}
