package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store/storetest"
	"nimbus/internal/testenv"
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

// TestAdminHostLifecycle: "host disable|enable|remove" and the compute API's
// service set and delete are one state, seen both ways; remove is refused
// while a server lives on the host and goes through once it is drained.
func TestAdminHostLifecycle(t *testing.T) {
	clearOpenStackEnv(t)
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		ctx := context.Background()
		f := &adminFixture{db: c.DB, flags: []string{"--data-dir", c.Config.DataDir}}
		if dbURL != "" {
			f.flags = []string{"--database-url", dbURL}
		}
		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.AdminUser), "2.53")
		service := func(host string) *services.Service {
			t.Helper()
			pages, err := services.List(sc, services.ListOpts{Host: host, Binary: "nova-compute"}).AllPages(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l, err := services.ExtractServices(pages)
			if err != nil || len(l) > 1 {
				t.Fatalf("services of %s: %+v %v", host, l, err)
			}
			if len(l) == 0 {
				return nil
			}
			return &l[0]
		}
		listed := func(host string) *hostRow {
			t.Helper()
			var list struct {
				Hosts []hostRow `json:"hosts"`
			}
			f.adminJSON(t, &list, "host", "list")
			for _, h := range list.Hosts {
				if h.Name == host {
					return &h
				}
			}
			return nil
		}

		// admin → compute API.
		if out, err := f.admin(t, "host", "disable", "fake-host-1", "--reason", "new disks"); err != nil || out != "fake-host-1: disabled\n" {
			t.Fatalf("host disable: %q %v", out, err)
		}
		if s := service("fake-host-1"); s.Status != "disabled" || s.DisabledReason != "new disks" {
			t.Fatalf("compute service after host disable: %+v", s)
		}
		if h := listed("fake-host-1"); h.Status != "disabled" || h.DisabledReason != "new disks" {
			t.Fatalf("host list after host disable: %+v", h)
		}
		if _, err := f.admin(t, "host", "enable", "fake-host-1"); err != nil {
			t.Fatal(err)
		}
		if s := service("fake-host-1"); s.Status != "enabled" || s.DisabledReason != "" {
			t.Fatalf("compute service after host enable: %+v", s)
		}

		// compute API → admin.
		s2 := service("fake-host-2")
		if _, err := services.Update(ctx, sc, s2.ID, services.UpdateOpts{Status: services.ServiceDisabled, DisabledReason: "fan"}).Extract(); err != nil {
			t.Fatal(err)
		}
		if h := listed("fake-host-2"); h.Status != "disabled" || h.DisabledReason != "fan" {
			t.Fatalf("host list after compute service set --disable: %+v", h)
		}
		table, err := f.admin(t, "host", "list")
		if err != nil || !strings.Contains(table, "STATUS") || !strings.Contains(table, "disabled (fan)") {
			t.Fatalf("host list table:\n%s%v", table, err)
		}

		// remove: refused while a server lives there, then done.
		var imageID string
		if err := c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = 'Debian 12'").Scan(&imageID); err != nil {
			t.Fatal(err)
		}
		hc := testenv.HTTPClient(t, c)
		tok := testenv.Token(t, c, cloud.AdminUser)
		resp, body := testenv.Do(t, hc, "POST", c.ComputeURL+"/servers", tok, fmt.Sprintf(
			`{"server":{"name":"on3","imageRef":%q,"flavorRef":"3","networks":"none","host":"fake-host-3"}}`, imageID),
			"OpenStack-API-Version", "compute 2.74")
		testenv.MustStatus(t, resp, body, 202)
		var created struct {
			Server struct{ ID string } `json:"server"`
		}
		if err := json.Unmarshal([]byte(body), &created); err != nil {
			t.Fatal(err)
		}
		if out, err := f.admin(t, "host", "remove", "fake-host-3"); err == nil || !strings.Contains(err.Error(), "still has servers") {
			t.Fatalf("remove with a server: %q %v", out, err)
		}
		if service("fake-host-3") == nil || listed("fake-host-3") == nil {
			t.Fatal("a refused remove removed something")
		}
		resp, body = testenv.Do(t, hc, "DELETE", c.ComputeURL+"/servers/"+created.Server.ID, tok, "")
		testenv.MustStatus(t, resp, body, 204)
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, body = testenv.Do(t, hc, "GET", c.ComputeURL+"/servers/"+created.Server.ID, tok, "")
			if resp.StatusCode == 404 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("server not deleted: %d %s", resp.StatusCode, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		var stderr bytes.Buffer
		if err := runAdmin(ctx, append([]string{"host", "remove", "fake-host-3"}, f.flags...), io.Discard, &stderr); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stderr.String(), "will register it again") {
			t.Errorf("no warning that the live agent presents the host: %q", stderr.String())
		}
		if service("fake-host-3") != nil || listed("fake-host-3") != nil {
			t.Fatal("fake-host-3 still a compute service or a listed host after host remove")
		}

		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"host", "remove", "nowhere"}, `no host "nowhere"`},
			{[]string{"host", "enable", "nowhere"}, `no compute service for host "nowhere"`},
			{[]string{"host", "disable"}, "want <host>"},
			{[]string{"host", "disable", "fake-host-1", "--reason", strings.Repeat("x", 256)}, "at most 255 bytes"},
			{[]string{"host", "disable", "fake-host-1", "--reason", "\xff"}, "valid UTF-8"},
		} {
			if out, err := f.admin(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) || out != "" {
				t.Errorf("nimbus admin %v: %q %v, want an error containing %q", c.args, out, err, c.want)
			}
		}
	})
}
