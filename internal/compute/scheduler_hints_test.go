package compute

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/api"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

func TestParseSchedulerHints(t *testing.T) {
	const (
		u1 = "5f0b6a2e-3c1d-4e8f-9a7b-1c2d3e4f5a6b"
		u2 = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
	)
	tests := []struct {
		name    string
		raw     string
		want    schedulerHints
		wantErr string // part of the 400 message; "" for success
	}{
		{name: "absent", raw: ""},
		{name: "empty", raw: `{}`},
		{name: "group", raw: `{"group":"` + u1 + `"}`, want: schedulerHints{Group: u1}},
		{name: "group canonical", raw: `{"group":"` + strings.ToUpper(strings.ReplaceAll(u1, "-", "")) + `"}`, want: schedulerHints{Group: u1}},
		{name: "same_host string", raw: `{"same_host":"` + u1 + `"}`, want: schedulerHints{SameHost: []string{u1}}},
		{name: "same_host list", raw: `{"same_host":["` + u1 + `","` + u2 + `"]}`, want: schedulerHints{SameHost: []string{u1, u2}}},
		{name: "different_host list", raw: `{"different_host":["` + u2 + `"]}`, want: schedulerHints{DifferentHost: []string{u2}}},
		{name: "everything", raw: `{"group":"` + u1 + `","same_host":"` + u2 + `","different_host":["` + u1 + `"],
			"query":"[\"=\",\"$free_ram_mb\",1024]","target_cell":"cell1","different_cell":["c2"],
			"build_near_host_ip":"192.0.2.1","cidr":"/24","custom_hint":{"any":1}}`,
			want: schedulerHints{Group: u1, SameHost: []string{u2}, DifferentHost: []string{u1}}},
		{name: "query object", raw: `{"query":{"a":1}}`},
		{name: "different_cell string", raw: `{"different_cell":"c1"}`},
		{name: "ipv6 near", raw: `{"build_near_host_ip":"2001:db8::1"}`},
		{name: "unknown keys ignored", raw: `{"foo":"bar","baz":[1,2]}`},

		{name: "not an object", raw: `"x"`, wantErr: "Invalid input for field/attribute os:scheduler_hints. Value: x. 'x' is not of type 'object'"},
		{name: "null", raw: `null`, wantErr: "None is not of type 'object'"},
		{name: "list", raw: `[1]`, wantErr: "is not of type 'object'"},
		{name: "group not uuid", raw: `{"group":"abc"}`, wantErr: "Invalid input for field/attribute group. Value: abc. 'abc' is not a 'uuid'"},
		{name: "group number", raw: `{"group":5}`, wantErr: "5 is not of type 'string'"},
		{name: "group list", raw: `{"group":["` + u1 + `"]}`, wantErr: "is not of type 'string'"},
		{name: "same_host not uuid", raw: `{"same_host":"abc"}`, wantErr: "Invalid input for field/attribute same_host. Value: abc. 'abc' is not a 'uuid'"},
		{name: "same_host item", raw: `{"same_host":["` + u1 + `","abc"]}`, wantErr: "Invalid input for field/attribute 1. Value: abc. 'abc' is not a 'uuid'"},
		{name: "different_host item type", raw: `{"different_host":[3]}`, wantErr: "Invalid input for field/attribute 0. Value: 3. 3 is not of type 'string'"},
		{name: "different_host type", raw: `{"different_host":{"a":1}}`, wantErr: "is not of type 'string', 'array'"},
		{name: "query type", raw: `{"query":5}`, wantErr: "5 is not of type 'string', 'object'"},
		{name: "target_cell", raw: `{"target_cell":" c"}`, wantErr: "field/attribute target_cell"},
		{name: "different_cell item", raw: `{"different_cell":[1]}`, wantErr: "1 is not of type 'string'"},
		{name: "near ip", raw: `{"build_near_host_ip":"nope"}`, wantErr: "field/attribute build_near_host_ip"},
		{name: "cidr", raw: `{"cidr":"24"}`, wantErr: "'24' does not match '^/[0-9a-f.:]+$'"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var raw json.RawMessage
			if tc.raw != "" {
				raw = json.RawMessage(tc.raw)
			}
			got, err := parseSchedulerHints(raw)
			if tc.wantErr != "" {
				e := api.AsError(err)
				if err == nil || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, tc.wantErr) {
					t.Fatalf("error %v, want 400 containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Group != tc.want.Group || !slices.Equal(got.SameHost, tc.want.SameHost) || !slices.Equal(got.DifferentHost, tc.want.DifferentHost) {
				t.Errorf("hints %+v, want %+v", got, tc.want)
			}
		})
	}
}

// groupService is a compute service on a fresh database of an engine,
// with the fake fleet registered.
func groupService(t *testing.T, dbURL string) *Service {
	t.Helper()
	s, _ := serviceOn(t, dbURL)
	return s
}

// putServer writes a bare server row on host ("" for none).
func putServer(t *testing.T, s *Service, id, project, host string, deleted bool) {
	t.Helper()
	now := store.FormatTime(s.now())
	_, err := s.db.Exec(context.Background(), `INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, host,
		flavor_id, reservation_id, created_at, updated_at, deleted, doc) VALUES (?, ?, 'u', 'n', 'active', ?, '1', 'r-1', ?, ?, ?, '{}')`,
		id, project, host, now, now, b2int(deleted))
	if err != nil {
		t.Fatal(err)
	}
}

// putGroup writes a server group row.
func putGroup(t *testing.T, s *Service, id, project, policy string, maxPerHost int) {
	t.Helper()
	_, err := s.db.Exec(context.Background(), "INSERT INTO compute_server_groups ("+groupColumns+") VALUES (?, ?, ?, 'u', ?, ?, ?)",
		id, "g-"+policy, project, policy, maxPerHost, store.FormatTime(s.now()))
	if err != nil {
		t.Fatal(err)
	}
}

func wantStatus(t *testing.T, what string, err error, status int, msg string) {
	t.Helper()
	e := api.AsError(err)
	if err == nil || e.Status != status || !strings.Contains(e.Message, msg) {
		t.Fatalf("%s: error %v, want %d containing %q", what, err, status, msg)
	}
}

// TestGroupContracts checks what placement calls: checkGroupForCreate,
// addGroupMember (in the create transaction), groupPlacement counting
// members per host, serverGroupsOf and removeGroupMember.
func TestGroupContracts(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := groupService(t, dbURL)
		const (
			anti   = "11111111-1111-4111-8111-111111111111"
			aff    = "22222222-2222-4222-8222-222222222222"
			other  = "33333333-3333-4333-8333-333333333333"
			absent = "44444444-4444-4444-8444-444444444444"
		)
		putGroup(t, s, anti, "p1", "anti-affinity", 2)
		putGroup(t, s, aff, "p1", "affinity", 0)
		putGroup(t, s, other, "p2", "soft-anti-affinity", 0)

		// Unknown or another project's group: Nova's 400 for a bad hint.
		wantStatus(t, "absent group", s.checkGroupForCreate(ctx, "p1", absent, 1), 400, "Instance group "+absent+" could not be found.")
		wantStatus(t, "other project", s.checkGroupForCreate(ctx, "p1", other, 1), 400, "could not be found")
		if err := s.checkGroupForCreate(ctx, "p1", strings.ToUpper(anti), 1); err != nil {
			t.Fatalf("check: %v", err)
		}
		// An admin's context sees every group, as Nova's does.
		adminCtx := api.WithCaller(ctx, &api.Caller{ProjectID: "p1", Roles: []string{api.RoleAdmin}})
		if err := s.checkGroupForCreate(adminCtx, "p1", other, 1); err != nil {
			t.Fatalf("admin check: %v", err)
		}

		// Members: two on host-1, one on host-2, one not placed, one deleted.
		members := []struct{ id, host string }{
			{"a0000000-0000-4000-8000-000000000001", "fake-host-1"},
			{"a0000000-0000-4000-8000-000000000002", "fake-host-1"},
			{"a0000000-0000-4000-8000-000000000003", "fake-host-2"},
			{"a0000000-0000-4000-8000-000000000004", ""},
		}
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			for _, m := range members {
				if err := s.addGroupMember(ctx, tx, anti, m.id); err != nil {
					return err
				}
			}
			// In the same transaction, before the rows exist, nothing is placed.
			_, _, hosts, err := s.groupPlacement(ctx, tx, anti)
			if err != nil || len(hosts) != 0 {
				t.Errorf("placement before server rows: %v %v", hosts, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			putServer(t, s, m.id, "p1", m.host, false)
		}
		gone := "a0000000-0000-4000-8000-000000000005"
		putServer(t, s, gone, "p1", "fake-host-3", true)
		if _, err := s.db.Exec(ctx, "INSERT INTO compute_server_group_members (server_id, group_id, created_at) VALUES (?, ?, ?)",
			gone, anti, store.FormatTime(s.now())); err != nil {
			t.Fatal(err)
		}

		policy, maxPer, hosts, err := s.groupPlacement(ctx, s.db, anti)
		if err != nil || policy != "anti-affinity" || maxPer != 2 ||
			!maps.Equal(hosts, map[string]int{"fake-host-1": 2, "fake-host-2": 1}) {
			t.Fatalf("groupPlacement = %q %d %v %v", policy, maxPer, hosts, err)
		}
		policy, maxPer, hosts, err = s.groupPlacement(ctx, s.db, aff)
		if err != nil || policy != "affinity" || maxPer != 0 || len(hosts) != 0 {
			t.Fatalf("empty affinity group = %q %d %v %v", policy, maxPer, hosts, err)
		}
		_, _, _, err = s.groupPlacement(ctx, s.db, absent)
		wantStatus(t, "placement of an absent group", err, 400, "could not be found")

		if ids, err := s.serverGroupsOf(ctx, s.db, members[0].id); err != nil || !slices.Equal(ids, []string{anti}) {
			t.Fatalf("serverGroupsOf = %v %v", ids, err)
		}
		if ids, err := s.serverGroupsOf(ctx, s.db, "nope"); err != nil || ids == nil || len(ids) != 0 {
			t.Fatalf("serverGroupsOf(non-member) = %#v %v", ids, err)
		}

		// The default member quota is 10: 4 live members, so 6 more fit.
		if err := s.checkGroupForCreate(ctx, "p1", anti, 6); err != nil {
			t.Fatalf("6 more: %v", err)
		}
		wantStatus(t, "7 more", s.checkGroupForCreate(ctx, "p1", anti, 7), 403, "Quota exceeded, too many servers in group")
		if _, err := s.db.Exec(ctx, "INSERT INTO compute_quotas (project_id, resource, hard_limit) VALUES ('p1', 'server_group_members', 4)"); err != nil {
			t.Fatal(err)
		}
		wantStatus(t, "full group", s.checkGroupForCreate(ctx, "p1", anti, 1), 403, "too many servers in group")
		// The recheck in the transaction refuses a fifth member too.
		err = s.db.Tx(ctx, func(tx *store.Tx) error {
			return s.addGroupMember(ctx, tx, anti, "a0000000-0000-4000-8000-000000000006")
		})
		wantStatus(t, "recheck", err, 403, "too many servers in group")
		err = s.db.Tx(ctx, func(tx *store.Tx) error {
			return s.addGroupMember(ctx, tx, absent, "a0000000-0000-4000-8000-000000000007")
		})
		wantStatus(t, "member of an absent group", err, 400, "could not be found")

		// A deleted server leaves its group.
		err = s.db.Tx(ctx, func(tx *store.Tx) error { return s.removeGroupMember(ctx, tx, members[0].id) })
		if err != nil {
			t.Fatal(err)
		}
		if _, _, hosts, _ := s.groupPlacement(ctx, s.db, anti); !maps.Equal(hosts, map[string]int{"fake-host-1": 1, "fake-host-2": 1}) {
			t.Errorf("after removal: %v", hosts)
		}
		if ids, _ := s.serverGroupsOf(ctx, s.db, members[0].id); len(ids) != 0 {
			t.Errorf("removed member still in %v", ids)
		}
		if err := s.checkGroupForCreate(ctx, "p1", anti, 1); err != nil {
			t.Errorf("a place freed: %v", err)
		}
	})
}

// TestHostZonesCache checks that hostZones follows aggregate changes made
// through the service at once, and calls the scheduler's hook.
func TestHostZonesCache(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := groupService(t, dbURL)
		calls := 0
		s.onAggregatesChanged = func() { calls++ }
		if z, err := s.hostZones(ctx); err != nil || len(z) != 0 {
			t.Fatalf("no aggregates: %v %v", z, err)
		}
		change := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := s.db.Tx(ctx, func(tx *store.Tx) error {
				s.aggregateHostsChanged(tx)
				return f(tx)
			}); err != nil {
				t.Fatal(err)
			}
		}
		now := store.FormatTime(s.now())
		change(func(tx *store.Tx) error {
			for _, q := range []string{
				"INSERT INTO compute_aggregates (id, uuid, name, created_at) VALUES (1, 'u1', 'a1', '" + now + "')",
				"INSERT INTO compute_aggregates (id, uuid, name, created_at) VALUES (2, 'u2', 'a2', '" + now + "')",
				"INSERT INTO compute_aggregate_hosts (aggregate_id, host, created_at) VALUES (1, 'fake-host-1', '" + now + "')",
				"INSERT INTO compute_aggregate_hosts (aggregate_id, host, created_at) VALUES (2, 'fake-host-1', '" + now + "')",
				"INSERT INTO compute_aggregate_hosts (aggregate_id, host, created_at) VALUES (2, 'fake-host-2', '" + now + "')",
				"INSERT INTO compute_aggregate_metadata (aggregate_id, meta_key, value) VALUES (1, 'availability_zone', 'az1')",
				"INSERT INTO compute_aggregate_metadata (aggregate_id, meta_key, value) VALUES (2, 'other', 'x')",
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
		z, err := s.hostZones(ctx)
		if err != nil || !maps.Equal(z, map[string]string{"fake-host-1": "az1"}) || calls != 1 {
			t.Fatalf("zones %v %v, hook calls %d", z, err, calls)
		}
		change(func(tx *store.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO compute_aggregate_metadata (aggregate_id, meta_key, value) VALUES (2, 'availability_zone', 'az1')")
			return err
		})
		if z, _ = s.hostZones(ctx); !maps.Equal(z, map[string]string{"fake-host-1": "az1", "fake-host-2": "az1"}) || calls != 2 {
			t.Fatalf("zones %v, hook calls %d", z, calls)
		}
		// A rolled-back change leaves the cache and calls no hook.
		err = s.db.Tx(ctx, func(tx *store.Tx) error {
			s.aggregateHostsChanged(tx)
			return errors.New("roll back")
		})
		if err == nil || calls != 2 {
			t.Fatalf("rollback: %v, hook calls %d", err, calls)
		}
		// The serviceZone rule: aggregates first, then the host's own zone;
		// the controller's services stay internal.
		svcs, err := loadServices(ctx, s.db)
		if err != nil {
			t.Fatal(err)
		}
		for _, sv := range svcs {
			want := sv.Zone
			if sv.Binary == binCompute && (sv.Host == "fake-host-1" || sv.Host == "fake-host-2") {
				want = "az1"
			}
			if got := serviceZone(sv, z); got != want {
				t.Errorf("%s %s zone %q, want %q", sv.Host, sv.Binary, got, want)
			}
		}
	})
}
