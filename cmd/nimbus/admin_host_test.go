package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store/storetest"
)

// TestAdminHosts: "host token" prints a one-time token that enrols an
// agent; "host list" shows the hosts agents registered, up or down.
func TestAdminHosts(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		ctx := context.Background()
		out, err := f.admin(t, "host", "token", "--ttl", "1h")
		if err != nil {
			t.Fatal(err)
		}
		tok := strings.TrimSpace(out)
		if !strings.HasPrefix(tok, "nimbus-enrol-") || strings.Contains(tok, "\n") {
			t.Fatalf("token output %q", out)
		}
		svc := fleet.New(f.db, fleet.Config{})
		id, _, err := svc.Enrol(ctx, tok, "hv-1")
		if err != nil {
			t.Fatalf("enrol with the printed token: %v", err)
		}
		if _, _, err := svc.Enrol(ctx, tok, "hv-2"); err == nil {
			t.Fatal("the token enrolled twice")
		}
		var js struct {
			Token     string `json:"token"`
			ExpiresAt string `json:"expires_at"`
		}
		f.adminJSON(t, &js, "host", "token")
		if exp, err := time.Parse(time.RFC3339, js.ExpiresAt); err != nil || !strings.HasPrefix(js.Token, "nimbus-enrol-") ||
			exp.Before(time.Now().Add(23*time.Hour)) {
			t.Fatalf("token JSON %+v (%v): want the 24h default", js, err)
		}

		if _, err := svc.Register(ctx, id, []driver.Host{{Name: "hv-1", VCPUs: 8, MemoryMB: 8192, Up: true},
			{Name: "hv-2", VCPUs: 8, MemoryMB: 8192, Up: true}}); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Heartbeat(ctx, id, wire.Heartbeat{Observed: 1, Hosts: []wire.HostStatus{{Name: "hv-1", Up: true},
			{Name: "hv-2", Up: false, Health: "disk failed"}}, Instances: []wire.Instance{{ID: "s1", Host: "hv-1", Power: 1}}}); err != nil {
			t.Fatal(err)
		}
		var list struct {
			Hosts []fleet.HostInfo `json:"hosts"`
		}
		f.adminJSON(t, &list, "host", "list")
		if len(list.Hosts) != 2 || !list.Hosts[0].Up || list.Hosts[0].Servers != 1 || list.Hosts[0].AgentName != "hv-1" ||
			list.Hosts[1].Up || list.Hosts[1].Health != "disk failed" {
			b, _ := json.Marshal(list)
			t.Fatalf("host list %s", b)
		}
		table, err := f.admin(t, "host", "list")
		if err != nil || !strings.Contains(table, "NAME") || !strings.Contains(table, "hv-1 (") || !strings.Contains(table, "disk failed") {
			t.Fatalf("host list table:\n%s%v", table, err)
		}

		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"host", "token", "--ttl", "0s"}, "--ttl must be positive"},
			{[]string{"host", "token", "extra"}, "want no arguments"},
			{[]string{"host", "list", "--down-after", "-1s"}, "--down-after must be positive"},
			{[]string{"host", "frobnicate"}, `unknown command "frobnicate"`},
			{[]string{"host", "token", "--billing-currency", "EUR"}, "flag provided but not defined"},
		} {
			if out, err := f.admin(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) || out != "" {
				t.Errorf("nimbus admin %v: %q %v, want an error containing %q", c.args, out, err, c.want)
			}
		}
	})
}
