package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"time"
)

// goMigrations are the migrations that SQL shared by both engines cannot
// say (they rewrite JSON documents), by name in the same sequence as the
// SQL files. Like those, once landed they are never edited.
var goMigrations = map[string]func(context.Context, *sql.Tx, Dialect) error{
	"0017_compute_system_metadata": moveShelveMetadata,
	"0050_volume_source_image":     fillSourceImage,
	"0056_flavor_address_billing":  endFlavorAddressPeriods,
	"0061_identity_panel_totp":     movePanelTOTP,
}

// shelveKeys are the keys shelve once kept in a server's user metadata.
var shelveKeys = []string{"shelved_image_id", "shelved_at", "shelved_host"}

// moveShelveMetadata takes shelve's bookkeeping out of every server's user
// metadata, where a customer could write it, into the document's system
// field "shelved". It is kept only for a server that is shelved and whose
// image its own project owns: any other value was written by a customer.
func moveShelveMetadata(ctx context.Context, tx *sql.Tx, d Dialect) error {
	rows, err := tx.QueryContext(ctx, "SELECT id, project_id, vm_state, doc FROM compute_servers WHERE deleted = 0")
	if err != nil {
		return err
	}
	type row struct{ id, project, state, doc string }
	var todo []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.project, &r.state, &r.doc); err != nil {
			rows.Close()
			return err
		}
		todo = append(todo, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range todo {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(r.doc), &doc); err != nil {
			return err
		}
		var meta map[string]string
		if raw, ok := doc["metadata"]; ok {
			if err := json.Unmarshal(raw, &meta); err != nil {
				return err
			}
		}
		found := false
		for _, k := range shelveKeys {
			if _, ok := meta[k]; ok {
				found = true
			}
		}
		if !found {
			continue
		}
		if r.state == "shelved" || r.state == "shelved_offloaded" {
			state, err := shelveStateOf(ctx, tx, d, r.project, meta)
			if err != nil {
				return err
			}
			if state != nil {
				if doc["shelved"], err = json.Marshal(state); err != nil {
					return err
				}
			}
		}
		for _, k := range shelveKeys {
			delete(meta, k)
		}
		raw, err := json.Marshal(meta)
		if err != nil {
			return err
		}
		doc["metadata"] = raw
		out, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, rebind(d, "UPDATE compute_servers SET doc = ? WHERE id = ?"), string(out), r.id); err != nil {
			return err
		}
	}
	return nil
}

// shelveStateOf is the system record for a shelved server's old metadata,
// or nil when its image is not its project's own.
func shelveStateOf(ctx context.Context, tx *sql.Tx, d Dialect, project string, meta map[string]string) (map[string]any, error) {
	state := map[string]any{"host": meta["shelved_host"]}
	if t, err := time.Parse("2006-01-02T15:04:05.000000", meta["shelved_at"]); err == nil {
		state["at"] = t.UTC()
	}
	if id := meta["shelved_image_id"]; id != "" {
		var owner string
		err := tx.QueryRowContext(ctx, rebind(d, "SELECT owner FROM images WHERE id = ?"), id).Scan(&owner)
		if err != nil && err != sql.ErrNoRows {
			return nil, err
		}
		if owner != project {
			return nil, nil
		}
		state["image_id"] = id
	}
	return state, nil
}

// fillSourceImage gives every volume and snapshot made before 0049 its
// source_image_id from its image metadata's image_id, which then only the
// service wrote (os-set_image_metadata, which lets owners write it, came
// with 0049).
func fillSourceImage(ctx context.Context, tx *sql.Tx, d Dialect) error {
	for _, table := range []string{"volumes", "volume_snapshots"} {
		rows, err := tx.QueryContext(ctx, "SELECT id, image_metadata FROM "+table+" WHERE source_image_id = ''")
		if err != nil {
			return err
		}
		ids := map[string]string{}
		for rows.Next() {
			var id, raw string
			if err := rows.Scan(&id, &raw); err != nil {
				rows.Close()
				return err
			}
			var meta map[string]string
			if json.Unmarshal([]byte(raw), &meta) == nil && meta["image_id"] != "" {
				ids[id] = meta["image_id"]
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for id, img := range ids {
			if _, err := tx.ExecContext(ctx, rebind(d, "UPDATE "+table+" SET source_image_id = ? WHERE id = ?"), img, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// endFlavorAddressPeriods ends, as of now, the usage periods of the public
// addresses given with a server's flavor while the server is billed: the
// server's price includes them, and until 0056 they were charged again
// on their own. A shelved server's address keeps its period (it pays on
// its own while the server does not).
func endFlavorAddressPeriods(ctx context.Context, tx *sql.Tx, d Dialect) error {
	now := FormatTime(time.Now())
	_, err := tx.ExecContext(ctx, rebind(d, `UPDATE metering_periods SET ended_at = ?, changed_at = ?
 WHERE kind = 'public_ipv4' AND ended_at = '' AND resource_id IN (
  SELECT f.id FROM floatingips f JOIN compute_servers s ON s.id = f.server_id
  WHERE s.deleted = 0 AND s.host <> '' AND s.vm_state NOT IN ('shelved', 'shelved_offloaded'))`), now, now)
	return err
}

// panelTOTPRules are the MFA rules the panel's two-factor sign-in means
// (identity.PanelTOTPRules, written here as they were when this landed).
var panelTOTPRules = [][]string{{"password", "totp"}, {"application_credential"}}

// movePanelTOTP moves the panel's own two-factor secrets into identity:
// each becomes a Keystone TOTP credential of its user, and the user gets
// the MFA rules, unless it has rules already, so that it stays protected
// on the panel and becomes so on the API. Then the panel's column goes,
// so no secret stays where only one front end reads it, and a controller
// still running the old code fails closed instead of letting a password
// alone sign in.
func movePanelTOTP(ctx context.Context, tx *sql.Tx, d Dialect) error {
	rows, err := tx.QueryContext(ctx, `SELECT a.user_id, a.totp_secret, u.options FROM panel_accounts a
		JOIN users u ON u.id = a.user_id WHERE a.totp_secret <> ''`)
	if err != nil {
		return err
	}
	type row struct{ user, secret, options string }
	var todo []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.user, &r.secret, &r.options); err != nil {
			rows.Close()
			return err
		}
		todo = append(todo, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	now := time.Now().UTC().Format(TimeFormat)
	for _, r := range todo {
		id := make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, rebind(d, `INSERT INTO credentials (id, user_id, project_id, type, blob, created_at)
			VALUES (?, ?, '', 'totp', ?, ?)`), hex.EncodeToString(id), r.user, r.secret, now); err != nil {
			return err
		}
		opts := map[string]json.RawMessage{}
		if err := json.Unmarshal([]byte(r.options), &opts); err != nil {
			return err
		}
		if _, has := opts["multi_factor_auth_rules"]; has {
			continue
		}
		opts["multi_factor_auth_rules"], _ = json.Marshal(panelTOTPRules)
		opts["multi_factor_auth_enabled"] = json.RawMessage("true")
		raw, err := json.Marshal(opts)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, rebind(d, "UPDATE users SET options = ? WHERE id = ?"), string(raw), r.user); err != nil {
			return err
		}
	}
	_, err = tx.ExecContext(ctx, "ALTER TABLE panel_accounts DROP COLUMN totp_secret")
	return err
}
