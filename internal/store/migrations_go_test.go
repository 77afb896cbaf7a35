package store

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"nimbus/internal/store/storetest"
)

// TestMoveShelveMetadata checks migration 0017 on both engines: shelve's
// keys leave every server's user metadata, and only a shelved server whose
// image its own project owns keeps them, as system state.
func TestMoveShelveMetadata(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		const now = "2026-11-24T10:00:00.000000Z"
		for _, img := range []struct{ id, owner string }{{"own-img", "p1"}, {"catalog-img", "admin"}} {
			if _, err := db.Exec(ctx, `INSERT INTO images (id, status, visibility, owner, created_at, updated_at)
 VALUES (?, 'active', 'public', ?, ?, ?)`, img.id, img.owner, now, now); err != nil {
				t.Fatal(err)
			}
		}
		servers := []struct {
			id, state string
			meta      map[string]string
			wantMeta  map[string]string
			wantShelf map[string]any
		}{
			{"honest", "shelved_offloaded",
				map[string]string{"shelved_image_id": "own-img", "shelved_at": "2026-11-20T08:00:00.000000", "shelved_host": "h1", "role": "web"},
				map[string]string{"role": "web"},
				map[string]any{"image_id": "own-img", "host": "h1", "at": "2026-11-20T08:00:00Z"}},
			{"forged-shelved", "shelved",
				map[string]string{"shelved_image_id": "catalog-img"}, map[string]string{}, nil},
			{"forged-active", "active",
				map[string]string{"shelved_image_id": "catalog-img", "shelved_host": "x"}, map[string]string{}, nil},
			{"plain", "active", map[string]string{"a": "b"}, map[string]string{"a": "b"}, nil},
		}
		for _, s := range servers {
			doc, _ := json.Marshal(map[string]any{"metadata": s.meta, "instance_name": "i-" + s.id})
			if _, err := db.Exec(ctx, `INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, flavor_id, reservation_id, created_at, updated_at, doc)
 VALUES (?, 'p1', 'u1', ?, ?, 'f', 'r', ?, ?, ?)`, s.id, s.id, s.state, now, now, string(doc)); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := db.sql.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := moveShelveMetadata(ctx, tx, db.dialect); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, s := range servers {
			var raw string
			if err := db.QueryRow(ctx, "SELECT doc FROM compute_servers WHERE id = ?", s.id).Scan(&raw); err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Metadata map[string]string `json:"metadata"`
				Shelved  map[string]any    `json:"shelved"`
				Name     string            `json:"instance_name"`
			}
			if err := json.Unmarshal([]byte(raw), &doc); err != nil {
				t.Fatal(err)
			}
			if got, want := mustJSON(doc.Metadata), mustJSON(s.wantMeta); got != want {
				t.Errorf("%s: metadata %s, want %s", s.id, got, want)
			}
			if got, want := mustJSON(doc.Shelved), mustJSON(s.wantShelf); got != want {
				t.Errorf("%s: shelved %s, want %s", s.id, got, want)
			}
			if doc.Name != "i-"+s.id {
				t.Errorf("%s: other document fields lost: %s", s.id, raw)
			}
		}
	})
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestFillSourceImage checks migration 0050 on both engines: volumes and
// snapshots made before it get their source image from the image id their
// image metadata had, and the others none.
func TestFillSourceImage(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		const now = "2026-11-28T10:00:00.000000Z"
		if _, err := db.Exec(ctx, "INSERT INTO volume_types (id, name, created_at, updated_at) VALUES ('t', 't', ?, ?)", now, now); err != nil {
			t.Fatal(err)
		}
		rows := []struct{ table, id, imeta, want string }{
			{"volumes", "v-img", `{"image_id":"img-1","image_name":"win"}`, "img-1"},
			{"volumes", "v-blank", `{}`, ""},
			{"volume_snapshots", "s-img", `{"image_id":"img-2"}`, "img-2"},
			{"volume_snapshots", "s-blank", `{"image_name":"x"}`, ""},
		}
		for _, r := range rows {
			var q string
			if r.table == "volumes" {
				q = `INSERT INTO volumes (id, project_id, user_id, size, new_size, status, volume_type_id, availability_zone,
 bootable, image_id, metadata, image_metadata, error, created_at, updated_at, snapshot_id, source_volid)
 VALUES (?, 'p1', 'u1', 1, 0, 'available', 't', 'nova', 0, '', '{}', ?, '', ?, ?, '', '')`
			} else {
				q = `INSERT INTO volume_snapshots (id, project_id, user_id, volume_id, volume_type_id, size, status,
 image_metadata, created_at, updated_at) VALUES (?, 'p1', 'u1', 'v', 't', 1, 'available', ?, ?, ?)`
			}
			if _, err := db.Exec(ctx, q, r.id, r.imeta, now, now); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := db.sql.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := fillSourceImage(ctx, tx, db.dialect); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			var got string
			if err := db.QueryRow(ctx, "SELECT source_image_id FROM "+r.table+" WHERE id = ?", r.id).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != r.want {
				t.Errorf("%s %s: source_image_id %q, want %q", r.table, r.id, got, r.want)
			}
		}
	})
}

// TestEndFlavorAddressPeriods checks migration 0056 on both engines: the
// open period of an address a billed server's flavor gave it ends; that
// of a shelved server's address, of a deleted server's and of a floating
// IP of the customer's own stay open.
func TestEndFlavorAddressPeriods(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		const then = "2026-11-24T10:00:00.000000Z"
		var net string
		if err := db.QueryRow(ctx, "SELECT id FROM networks LIMIT 1").Scan(&net); err != nil {
			if _, err := db.Exec(ctx, `INSERT INTO networks (id, name, project_id, created_at, updated_at) VALUES ('n', 'public', '', ?, ?)`, then, then); err != nil {
				t.Fatal(err)
			}
			net = "n"
		}
		cases := []struct {
			server, state, host string
			deleted             int
			wantOpen            bool
		}{
			{"running", "active", "h1", 0, false},
			{"stopped", "stopped", "h1", 0, false},
			{"shelved", "shelved_offloaded", "", 0, true},
			{"deleted", "deleted", "h1", 1, true},
			{"", "", "", 0, true}, // the customer's own floating IP
		}
		for i, c := range cases {
			fip := fmt.Sprintf("fip-%d", i)
			var server any
			if c.server != "" {
				server = c.server
				if _, err := db.Exec(ctx, `INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, flavor_id, reservation_id, created_at, updated_at, doc, host, deleted)
 VALUES (?, 'p1', 'u1', ?, ?, 'f', 'r', ?, ?, '{}', ?, ?)`, c.server, c.server, c.state, then, then, c.host, c.deleted); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.Exec(ctx, `INSERT INTO floatingips (id, project_id, floating_network_id, floating_subnet_id, floating_ip_address, server_id, created_at, updated_at)
 VALUES (?, 'p1', ?, 's', ?, ?, ?, ?)`, fip, net, fmt.Sprintf("203.0.113.%d", i), server, then, then); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(ctx, `INSERT INTO metering_periods (id, resource_id, kind, project_id, spec, started_at, ended_at, changed_at)
 VALUES (?, ?, 'public_ipv4', 'p1', '{"public_ipv4":true}', ?, '', ?)`, "period-"+fip, fip, then, then); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := db.sql.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := endFlavorAddressPeriods(ctx, tx, db.dialect); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for i, c := range cases {
			var ended string
			if err := db.QueryRow(ctx, "SELECT ended_at FROM metering_periods WHERE resource_id = ?", fmt.Sprintf("fip-%d", i)).Scan(&ended); err != nil {
				t.Fatal(err)
			}
			if (ended == "") != c.wantOpen {
				t.Errorf("fip-%d (%s): ended_at %q, want open %v", i, c.server, ended, c.wantOpen)
			}
		}
	})
}

// TestMovePanelTOTP checks migration 0061 on both engines: every panel
// user with a two-factor secret gets it as a TOTP credential and, unless it
// has MFA rules already, the panel's rules; the panel's column is gone.
func TestMovePanelTOTP(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		// The column as 0028 made it, before this migration dropped it.
		if _, err := db.Exec(ctx, "ALTER TABLE panel_accounts ADD COLUMN totp_secret TEXT NOT NULL DEFAULT ''"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, "INSERT INTO domains (id, name) VALUES ('default', 'Default')"); err != nil {
			t.Fatal(err)
		}
		const adminRules = `{"multi_factor_auth_rules":[["password","totp"]]}`
		for _, u := range []struct{ id, secret, options string }{
			{"on", "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ", "{}"},
			{"ruled", "MFRGGZDFMZTWQ2LKNNWG23TPOBYXE43U", adminRules},
			{"off", "", "{}"},
		} {
			if _, err := db.Exec(ctx, "INSERT INTO users (id, name, domain_id, created_at, options) VALUES (?, ?, 'default', '', ?)",
				u.id, u.id, u.options); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(ctx, "INSERT INTO panel_accounts (user_id, email, created_at, totp_secret) VALUES (?, ?, 0, ?)",
				u.id, u.id+"@example.com", u.secret); err != nil {
				t.Fatal(err)
			}
		}
		// A panel row whose user is gone has nothing to protect.
		if _, err := db.Exec(ctx, "INSERT INTO panel_accounts (user_id, email, created_at, totp_secret) VALUES ('gone', 'g@example.com', 0, 'GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ')"); err != nil {
			t.Fatal(err)
		}
		tx, err := db.sql.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := movePanelTOTP(ctx, tx, db.dialect); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, want := range []struct{ user, blob, options string }{
			{"on", "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ",
				`{"multi_factor_auth_enabled":true,"multi_factor_auth_rules":[["password","totp"],["application_credential"]]}`},
			{"ruled", "MFRGGZDFMZTWQ2LKNNWG23TPOBYXE43U", adminRules},
			{"off", "", "{}"},
		} {
			var blob, options string
			err := db.QueryRow(ctx, "SELECT COALESCE(MAX(c.blob), ''), u.options FROM users u LEFT JOIN credentials c ON c.user_id = u.id AND c.type = 'totp' WHERE u.id = ? GROUP BY u.options", want.user).
				Scan(&blob, &options)
			if err != nil {
				t.Fatal(err)
			}
			if blob != want.blob || options != want.options {
				t.Errorf("%s: credential %q, options %s; want %q, %s", want.user, blob, options, want.blob, want.options)
			}
		}
		var n int
		if err := db.QueryRow(ctx, "SELECT COUNT(*) FROM credentials").Scan(&n); err != nil || n != 2 {
			t.Errorf("%d credentials (%v), want 2", n, err)
		}
		if _, err := db.Exec(ctx, "SELECT totp_secret FROM panel_accounts"); err == nil {
			t.Error("panel_accounts.totp_secret is still there")
		}
	})
}
