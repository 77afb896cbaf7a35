package region

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/store"
)

// FakeFleet writes, as an agent's --fleet file at path, hosts named names
// of 34 pCPUs each (2 sockets of 17 cores) on the fake driver.
func FakeFleet(t testing.TB, path string, names ...string) {
	t.Helper()
	var hosts []driver.Host
	for _, name := range names {
		h := driver.Host{Name: name, IP: "192.0.2.50", MemoryMB: 256 * 1024, DiskGB: 4000, Zone: "nova",
			Hypervisor: "fake", Version: 1000, Up: true}
		fake.Topology(&h, 2, 17, 1)
		hosts = append(hosts, h)
	}
	b, err := json.Marshal(hosts)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// JournalVM is a VM as the fake driver's journal keeps it.
type JournalVM struct {
	Host  string      `json:"host"`
	Boots int         `json:"boots"`
	Spec  driver.Spec `json:"spec"`
}

// FakeJournal reads an agent's fake driver journal (fake-fleet.json in
// its data directory): each VM now there, by server id.
func FakeJournal(t testing.TB, path string) map[string]JournalVM {
	t.Helper()
	out := map[string]JournalVM{}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var e struct {
			Put *struct {
				ID string `json:"id"`
				JournalVM
			} `json:"put"`
			Del string `json:"del"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a line being written
		}
		if e.Put != nil {
			out[e.Put.ID] = e.Put.JournalVM
		} else {
			delete(out, e.Del)
		}
	}
	return out
}

// CheckVMs holds the fake fleet's VMs to the servers that are ACTIVE:
// exactly one VM, booted once, per ACTIVE server, none for any other, and
// no pCPU pinned by two VMs.
func CheckVMs(t testing.TB, vms map[string]JournalVM, active map[string]bool) {
	t.Helper()
	pinned := map[string]string{}
	for id, vm := range vms {
		if !active[id] {
			t.Errorf("VM %s on %s belongs to no ACTIVE server", id, vm.Host)
		}
		if vm.Boots != 1 {
			t.Errorf("server %s's VM booted %d times", id, vm.Boots)
		}
		for _, c := range vm.Spec.Cells {
			for _, cpu := range c.CPUs {
				k := fmt.Sprint(vm.Host, "/", cpu)
				if other, dup := pinned[k]; dup {
					t.Errorf("pCPU %s is pinned by %s and %s", k, other, id)
				}
				pinned[k] = id
			}
		}
	}
	for id := range active {
		if _, ok := vms[id]; !ok {
			t.Errorf("ACTIVE server %s has no VM", id)
		}
	}
}

// CheckClaims holds the region's claims to its servers: none without a
// live server, and claims claims holding items pCPUs and GPUs in all.
func CheckClaims(t testing.TB, dbURL string, claims, items int) {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []struct{ what, sql string }{
		{"claims without a live server", `SELECT COUNT(*) FROM compute_claims c LEFT JOIN compute_servers s ON s.id = c.server_id
 WHERE s.id IS NULL OR s.deleted = 1`},
		{"claimed pCPUs and GPUs without a live server", `SELECT COUNT(*) FROM compute_claim_items i
 LEFT JOIN compute_servers s ON s.id = i.server_id WHERE s.id IS NULL OR s.deleted = 1`},
	} {
		var n int
		if err := db.QueryRow(ctx, q.sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d %s", n, q.what)
		}
	}
	var nc, ni int
	if err := db.QueryRow(ctx, "SELECT COUNT(*) FROM compute_claims").Scan(&nc); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, "SELECT COUNT(*) FROM compute_claim_items").Scan(&ni); err != nil {
		t.Fatal(err)
	}
	if nc != claims || ni != items {
		t.Errorf("%d claims holding %d items, want %d holding %d", nc, ni, claims, items)
	}
}
