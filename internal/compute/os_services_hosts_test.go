package compute

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/store"
)

// newResourceService is a compute service over a real SQLite store and the
// fake fleet, for the contracts the servers half calls. (The HTTP tests run
// on both engines; this package cannot import testenv without a cycle.)
func newResourceService(t *testing.T) (*Service, *fake.Driver) {
	t.Helper()
	return serviceOn(t, filepath.Join(t.TempDir(), "nimbus.db"))
}

// serviceOn is a compute service on a fresh database dbURL with the fake
// fleet registered, and that fleet's driver.
func serviceOn(t *testing.T, dbURL string) (*Service, *fake.Driver) {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	drv, err := fake.New(fake.Config{Hosts: fake.DefaultFleet()})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Deps{DB: db, Driver: drv})
	if err := s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	return s, drv
}

// setHostService applies a service action (os-services) to host's compute
// service.
func setHostService(t *testing.T, s *Service, host, action string, forced bool) {
	t.Helper()
	ctx := context.Background()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := scanService(tx.QueryRow(ctx, "SELECT "+serviceColumns+" FROM compute_services WHERE host = ? AND binary_name = ?", host, binCompute))
		if err != nil {
			return err
		}
		return s.setService(ctx, tx, sv, action, "test", forced)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func hostNames(t *testing.T, s *Service) []string {
	t.Helper()
	hosts, err := s.enabledHosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range hosts {
		out = append(out, h.Name)
	}
	return out
}

func TestEnabledHosts(t *testing.T) {
	ctx := context.Background()
	s, drv := newResourceService(t)
	if got := hostNames(t, s); len(got) != 5 {
		t.Fatalf("enabled hosts %v", got)
	}
	change := func(host, action string, forced bool) { setHostService(t, s, host, action, forced) }
	change("fake-host-1", "disable-log-reason", false)
	change("fake-host-2", "force-down", true)
	drv.SetHostUp("fake-host-3", false)
	if _, err := s.db.Exec(ctx, "UPDATE compute_services SET deleted = 1 WHERE host = 'fake-host-4'"); err != nil {
		t.Fatal(err)
	}
	if got := hostNames(t, s); !slices.Equal(got, []string{"fake-gpu-host-1"}) {
		t.Fatalf("enabled hosts %v, want only the GPU host", got)
	}
	change("fake-host-1", "enable", false)
	change("fake-host-2", "force-down", false)
	drv.SetHostUp("fake-host-3", true)
	if err := s.Bootstrap(ctx); err != nil { // a restart re-registers fake-host-4
		t.Fatal(err)
	}
	if got := hostNames(t, s); len(got) != 5 {
		t.Fatalf("after recovery %v", got)
	}
}

// TestServicesForNewHosts: a host that joins later (its agent registered
// it) gets its compute service and is scheduled to, even when other
// controllers' services share the table.
func TestServicesForNewHosts(t *testing.T) {
	ctx := context.Background()
	s, _ := newResourceService(t)
	for i, bin := range []string{binScheduler, binConductor} {
		if _, err := s.db.Exec(ctx, `INSERT INTO compute_services (id, uuid, host, binary_name, zone, node_id, node_uuid,
 created_at, updated_at) VALUES (?, ?, 'other-controller', ?, 'internal', 0, '', '', '')`, 1000+i, fmt.Sprint("u", i), bin); err != nil {
			t.Fatal(err)
		}
	}
	hosts := append(fake.DefaultFleet(), driver.Host{Name: "fake-host-5", VCPUs: 8, MemoryMB: 8192, DiskGB: 100, Up: true})
	drv, err := fake.New(fake.Config{Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	grown := New(Deps{DB: s.db, Driver: drv})
	if got := hostNames(t, grown); !slices.Contains(got, "fake-host-5") {
		t.Fatalf("enabled hosts %v lack the new host", got)
	}
}

// TestHostStates checks host_status as Nova derives it from the host's
// compute service: forced down is DOWN, disabled MAINTENANCE, not up (the
// host stopped reporting) UNKNOWN.
func TestHostStates(t *testing.T) {
	ctx := context.Background()
	s, drv := newResourceService(t)
	set := func(host, action string, forced bool) { setHostService(t, s, host, action, forced) }
	set("fake-host-1", "disable-log-reason", false)
	set("fake-host-2", "force-down", true)
	drv.SetHostUp("fake-host-3", false)
	// Forced down wins over disabled and over a host that does not answer.
	set("fake-host-4", "disable", false)
	set("fake-host-4", "force-down", true)
	drv.SetHostUp("fake-host-4", false)
	got := s.hostStates(ctx)
	want := map[string]string{"fake-host-1": "MAINTENANCE", "fake-host-2": "DOWN", "fake-host-3": "UNKNOWN",
		"fake-host-4": "DOWN", "fake-gpu-host-1": "UP"}
	for h, w := range want {
		if got[h] != w {
			t.Errorf("host_status of %s is %q, want %q", h, got[h], w)
		}
	}
}

func TestResourceContracts(t *testing.T) {
	ctx := context.Background()
	s, _ := newResourceService(t)

	f, err := s.getFlavor(ctx, s.db, "g.l4.x1")
	if err != nil || f.VCPUs != 8 || f.ExtraSpecs["pci_passthrough:alias"] != "l4:1" || !f.IsPublic {
		t.Fatalf("getFlavor %+v %v", f, err)
	}
	if _, err := s.getFlavor(ctx, s.db, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown flavor: %v", err)
	}
	if _, err := s.getFlavor(ctx, s.db, "a\x00b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("NUL flavor id: %v", err)
	}
	priv := &Flavor{ID: "priv", Name: "priv", VCPUs: 1, RAM: 1, RxTxFactor: 1, ExtraSpecs: map[string]string{}, CreatedAt: s.now()}
	if err := s.db.Tx(ctx, func(tx *store.Tx) error { return insertFlavor(ctx, tx, priv) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.flavorAccessible(ctx, s.db, priv, "p1"); ok || err != nil {
		t.Errorf("private flavor accessible before sharing: %v %v", ok, err)
	}
	if _, err := s.db.Exec(ctx, "INSERT INTO compute_flavor_projects (flavor_id, project_id) VALUES ('priv', 'p1')"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.flavorAccessible(ctx, s.db, priv, "p1"); !ok {
		t.Error("shared private flavor not accessible")
	}
	if ok, _ := s.flavorAccessible(ctx, s.db, priv, "p2"); ok {
		t.Error("private flavor accessible to another project")
	}

	q, err := s.quotaFor(ctx, s.db, "p1")
	if err != nil || q != (Quota{Instances: 10, Cores: 20, RAM: 51200, KeyPairs: 100, MetadataItems: 128, ServerGroups: 10, ServerGroupMembers: 10}) {
		t.Fatalf("default quota %+v %v", q, err)
	}
	if _, err := s.db.Exec(ctx, "INSERT INTO compute_quotas (project_id, resource, hard_limit) VALUES ('p1', 'cores', -1)"); err != nil {
		t.Fatal(err)
	}
	if q, _ := s.quotaFor(ctx, s.db, "p1"); q.Cores != -1 || q.Instances != 10 {
		t.Errorf("quota override %+v", q)
	}
	if _, err := s.getKeypair(ctx, s.db, "u", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown keypair: %v", err)
	}
}
