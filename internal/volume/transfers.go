package volume

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Volume transfers (cinder/api/contrib/volume_transfer.py,
// cinder/api/v3/volume_transfer.py, cinder/transfer/api.py): a project
// offers an available volume, which waits in awaiting-transfer until
// another project accepts it with the transfer's id and auth key, or the
// offer is deleted. The accept moves the volume, and its snapshots unless
// the transfer was made with no_snapshots (3.55), to the accepting
// project in one transaction: their rows, the quota usage both projects
// count from them, and their usage periods (metering), so the volume's
// hours are the new project's from the accept on.

// StatusAwaitingTransfer is a volume offered for transfer.
const StatusAwaitingTransfer = "awaiting-transfer"

// Cinder's volume_transfer_salt_length and volume_transfer_key_length.
const (
	transferSaltLen = 8
	transferKeyLen  = 16
)

// transferRow is one row of volume_transfers.
type transferRow struct {
	ID, VolumeID               string
	Name                       *string
	Salt, Hash                 string
	NoSnapshots                bool
	SourceProject, DestProject string
	Accepted                   bool
	CreatedAt, UpdatedAt       time.Time
	// AuthKey is the key, known only to the create that made it.
	AuthKey string
}

const transferColumns = `id, volume_id, name, salt, crypt_hash, no_snapshots, source_project_id, destination_project_id,
	accepted, created_at, updated_at`

func scanTransfer(sc interface{ Scan(...any) error }) (*transferRow, error) {
	t := &transferRow{}
	var noSnap, accepted int
	var created, updated string
	if err := sc.Scan(&t.ID, &t.VolumeID, &t.Name, &t.Salt, &t.Hash, &noSnap, &t.SourceProject, &t.DestProject,
		&accepted, &created, &updated); err != nil {
		return nil, err
	}
	t.NoSnapshots, t.Accepted = noSnap != 0, accepted != 0
	t.CreatedAt, t.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
	return t, nil
}

func errTransferNotFound(id string) *api.Error {
	return api.NotFound("Transfer %s could not be found.", id)
}

// getTransfer is a transfer not yet accepted or deleted.
func getTransfer(ctx context.Context, q store.Querier, id string) (*transferRow, error) {
	t, err := scanTransfer(q.QueryRow(ctx, "SELECT "+transferColumns+" FROM volume_transfers WHERE id = ? AND deleted = 0", id))
	if store.IsNoRows(err) {
		return nil, errTransferNotFound(id)
	}
	return t, err
}

// ownedTransfer is a transfer the caller may see (cinder/db transfer_get):
// one of its project's volumes, or any for an admin; anything else is 404.
func ownedTransfer(ctx context.Context, q store.Querier, c *api.Caller, id string) (*transferRow, error) {
	t, err := getTransfer(ctx, q, id)
	if err == nil && !c.IsAdmin() && t.SourceProject != c.ProjectID {
		return nil, errTransferNotFound(id)
	}
	return t, err
}

// randomHex is n random hexadecimal digits (transfer/api.py
// _get_random_string: characters anyone can type).
func randomHex(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b)[:n]
}

// transferHash is the salted hash of an auth key that is kept instead of
// the key (Cinder's _get_crypt_hash, an HMAC keyed by the salt; SHA-256
// here).
func transferHash(salt, key string) string {
	m := hmac.New(sha256.New, []byte(salt))
	m.Write([]byte(key))
	return hex.EncodeToString(m.Sum(nil))
}

// ---- Views (cinder/api/views/transfers.py) ----

func transferLinks(r *http.Request, id string) []map[string]string {
	return links(r, "os-volume-transfer", id)
}

// transferSummary is the list and accept view.
func transferSummary(r *http.Request, t *transferRow) map[string]any {
	return map[string]any{"id": t.ID, "volume_id": t.VolumeID, "name": t.Name, "links": transferLinks(r, t.ID)}
}

// transferDetail is the show and detailed list view, with no_snapshots
// from 3.55 and the history fields from 3.57; create adds the auth key.
func transferDetail(r *http.Request, t *transferRow) map[string]any {
	out := map[string]any{"id": t.ID, "created_at": cinderTime(t.CreatedAt), "name": t.Name, "volume_id": t.VolumeID,
		"links": transferLinks(r, t.ID)}
	mv := minor(r)
	if mv >= 55 {
		out["no_snapshots"] = t.NoSnapshots
	}
	if mv >= 57 {
		out["source_project_id"] = t.SourceProject
		out["destination_project_id"] = nullID(t.DestProject)
		out["accepted"] = t.Accepted
	}
	return out
}

// ---- Create ----

// createTransfer is POST /os-volume-transfer and /volume-transfers: 202
// with the transfer and, this once, its auth key; the volume goes to
// awaiting-transfer.
func (s *Service) createTransfer(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	b, err := inner(outer, "transfer")
	if err != nil {
		return nil, err
	}
	allowed := []string{"volume_id", "name"}
	if minor(r) >= 55 {
		allowed = append(allowed, "no_snapshots")
	}
	if err := api.UnknownFields(b, allowed...); err != nil {
		return nil, err
	}
	raw, ok := b["volume_id"]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute transfer. Value: %s. 'volume_id' is a required property", outer["transfer"])
	}
	var volID string
	if err := json.Unmarshal(raw, &volID); err != nil || !uuidRE.MatchString(volID) {
		return nil, api.BadRequest("Invalid input for field/attribute volume_id. Value: %s. %s is not a 'uuid'", raw, raw)
	}
	name, err := b.optString("name", 255)
	if err != nil {
		return nil, err
	}
	if name != nil {
		n := strings.TrimSpace(*name)
		name = &n
	}
	noSnaps, _, err := b.boolean("no_snapshots")
	if err != nil {
		return nil, err
	}
	var t *transferRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, volID)
		if err != nil {
			return err
		}
		if v.Status != StatusAvailable {
			// cinder/transfer/api.py API.create
			return invalidVolume("status must be available")
		}
		if !noSnaps {
			snaps, err := loadSnaps(ctx, tx, "s.volume_id = ? ORDER BY s.created_at, s.id", v.ID)
			if err != nil {
				return err
			}
			for _, sn := range snaps {
				if sn.Status != SnapAvailable {
					return invalidSnapshot("snapshot: %s status must be available", sn.ID)
				}
			}
		}
		now := s.now()
		t = &transferRow{ID: newID(), VolumeID: v.ID, Name: name, Salt: randomHex(transferSaltLen), NoSnapshots: noSnaps,
			SourceProject: v.ProjectID, CreatedAt: now, UpdatedAt: now, AuthKey: randomHex(transferKeyLen)}
		t.Hash = transferHash(t.Salt, t.AuthKey)
		ok, err := s.setStatus(ctx, tx, v, StatusAwaitingTransfer, "", StatusAvailable)
		if err != nil {
			return err
		}
		if !ok {
			return invalidVolume("status must be available")
		}
		_, err = tx.Exec(ctx, `INSERT INTO volume_transfers (id, volume_id, name, salt, crypt_hash, no_snapshots,
			source_project_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			t.ID, t.VolumeID, t.Name, t.Salt, t.Hash, b2i(t.NoSnapshots), t.SourceProject,
			store.FormatTime(now), store.FormatTime(now))
		return err
	})
	if err != nil {
		return nil, err
	}
	out := transferDetail(r, t)
	out["auth_key"] = t.AuthKey
	return api.JSON(http.StatusAccepted, map[string]any{"transfer": out}), nil
}

// ---- Show, list, delete ----

func (s *Service) showTransfer(r *http.Request) (*api.Response, error) {
	t, err := ownedTransfer(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"transfer": transferDetail(r, t)}), nil
}

// transferSortColumns are the sort keys of a transfer list (3.59).
var transferSortColumns = map[string]string{
	"id": "id", "name": "COALESCE(name, '')", "display_name": "COALESCE(name, '')", "volume_id": "volume_id",
	"created_at": "created_at", "updated_at": "updated_at",
}

// listTransfers is GET /os-volume-transfer[/detail]: the caller's
// project's pending transfers, every project's for an admin who asks with
// all_tenants. limit and offset page the list; from 3.59 marker and sort
// too (SUPPORT_TRANSFER_PAGINATION), the order before being created_at
// then id, ascending.
func (s *Service) listTransfers(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		ctx := r.Context()
		c := caller(r)
		q := r.URL.Query()
		limit, offset, err := pageSize(q)
		if err != nil {
			return nil, err
		}
		var page api.Page
		page.Add("deleted = 0")
		if !(c.IsAdmin() && q.Has("all_tenants")) {
			page.Add("source_project_id = ?", c.ProjectID)
		}
		page.Keys = api.Keyset{{Col: "created_at"}, {Col: "id"}}
		if minor(r) >= 59 {
			if page.Keys, err = sortParams(q, transferSortColumns, "id"); err != nil {
				return nil, err
			}
			if m := q.Get("marker"); m != "" {
				if err := pastMarker(ctx, s.db, &page, "volume_transfers", "id", m); err != nil {
					return nil, err
				}
			}
		}
		page.Limit = offset + limit
		rows, err := s.db.Query(ctx, "SELECT "+transferColumns+" FROM volume_transfers "+page.SQL(), page.Args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		items := []map[string]any{}
		var last string
		for i := 0; rows.Next(); i++ {
			t, err := scanTransfer(rows)
			if err != nil {
				return nil, err
			}
			if i < offset {
				continue
			}
			last = t.ID
			if detail {
				items = append(items, transferDetail(r, t))
			} else {
				items = append(items, transferSummary(r, t))
			}
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		out := map[string]any{"transfers": items}
		if fullPage(len(items), limit) {
			out["transfers_links"] = nextLink(r, q, listPath("/os-volume-transfer", detail), limit, last)
		}
		return api.JSON(http.StatusOK, out), nil
	}
}

// deleteTransfer is DELETE /os-volume-transfer/{id}: the offer is
// withdrawn and the volume is available again; 202.
func (s *Service) deleteTransfer(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := ownedTransfer(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		return s.cancelTransfers(ctx, tx, t.VolumeID)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// cancelTransfers withdraws, in tx, the pending transfers of volume volID
// and makes the volume available again if it was awaiting one (cinder/db
// transfer_destroy).
func (s *Service) cancelTransfers(ctx context.Context, tx *store.Tx, volID string) error {
	if n, err := dropTransfers(ctx, tx, volID, s.now()); err != nil || n == 0 {
		return err
	}
	v, err := getVol(ctx, tx, volID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	_, err = s.setStatus(ctx, tx, v, StatusAvailable, "", StatusAwaitingTransfer)
	return err
}

// dropTransfers marks, in tx, the pending transfers of volume volID
// deleted: withdrawn, or of a volume an admin force-deletes.
func dropTransfers(ctx context.Context, tx *store.Tx, volID string, now time.Time) (int64, error) {
	at := store.FormatTime(now)
	res, err := tx.Exec(ctx, "UPDATE volume_transfers SET deleted = 1, deleted_at = ?, updated_at = ? WHERE volume_id = ? AND deleted = 0",
		at, at, volID)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// ---- Accept ----

// acceptTransfer is POST /os-volume-transfer/{id}/accept: any project
// holding the id and the auth key takes the volume. The accepting
// project's quotas must hold the volume (and the snapshots that come
// with it), or nothing changes (413). 202 with the summary view.
func (s *Service) acceptTransfer(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	id := r.PathValue("id")
	b, err := decodeBody(r, "accept")
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "auth_key"); err != nil {
		return nil, err
	}
	raw, ok := b["auth_key"]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute accept. 'auth_key' is a required property")
	}
	var key string
	if err := json.Unmarshal(raw, &key); err != nil {
		return nil, api.BadRequest("Invalid input for field/attribute auth_key. Value: %s. %s is not of type 'string'", raw, raw)
	}
	var t *transferRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		// Any project may accept: the transfer is looked up as an admin
		// would (context.elevated()).
		if t, err = getTransfer(ctx, tx, id); err != nil {
			return err
		}
		if !hmac.Equal([]byte(transferHash(t.Salt, key)), []byte(t.Hash)) {
			// cinder/exception.py InvalidAuthKey
			return api.BadRequest("Invalid auth key: Attempt to transfer %s with invalid auth key.", id)
		}
		v, err := getVol(ctx, tx, t.VolumeID)
		if errors.Is(err, store.ErrNotFound) {
			return errVolumeNotFound(t.VolumeID)
		} else if err != nil {
			return err
		}
		if v.Status != StatusAwaitingTransfer {
			// cinder/db/sqlalchemy/api.py transfer_accept
			return invalidVolume("Transfer %s: Volume id %s expected in awaiting-transfer state.", t.ID, v.ID)
		}
		var snaps []*snapRow
		if !t.NoSnapshots {
			if snaps, err = loadSnaps(ctx, tx, "s.volume_id = ? ORDER BY s.created_at, s.id", v.ID); err != nil {
				return err
			}
		}
		if v.ProjectID != c.ProjectID {
			if err := s.reserveTransfer(ctx, tx, c.ProjectID, v, snaps); err != nil {
				return err
			}
		}
		now := s.now()
		at := store.FormatTime(now)
		// The flavor of a server of the giver no longer pays for any of it.
		delete(v.AdminMetadata, FlavorDiskKey)
		res, err := tx.Exec(ctx, `UPDATE volumes SET project_id = ?, user_id = ?, status = ?, admin_metadata = ?, updated_at = ?
			WHERE id = ? AND status = ?`, c.ProjectID, c.UserID, StatusAvailable, store.JSON(v.AdminMetadata), at, v.ID, StatusAwaitingTransfer)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return invalidVolume("Transfer %s: Volume id %s expected in awaiting-transfer state.", t.ID, v.ID)
		}
		v.ProjectID, v.UserID, v.Status, v.UpdatedAt = c.ProjectID, c.UserID, StatusAvailable, now
		if err := s.meter(ctx, tx, v, now); err != nil {
			return err
		}
		for _, sn := range snaps {
			if _, err := tx.Exec(ctx, "UPDATE volume_snapshots SET project_id = ?, user_id = ?, updated_at = ? WHERE id = ?",
				c.ProjectID, c.UserID, at, sn.ID); err != nil {
				return err
			}
			sn.ProjectID, sn.UserID = c.ProjectID, c.UserID
			if err := meterSnap(ctx, tx, sn, now); err != nil {
				return err
			}
		}
		res, err = tx.Exec(ctx, `UPDATE volume_transfers SET deleted = 1, accepted = 1, destination_project_id = ?,
			deleted_at = ?, updated_at = ? WHERE id = ? AND deleted = 0`, c.ProjectID, at, at, t.ID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errTransferNotFound(t.ID)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusAccepted, map[string]any{"transfer": transferSummary(r, t)}), nil
}

// reserveTransfer checks, in tx, that project may take v and snaps
// (transfer/api.py accept): per_volume_gigabytes, volumes, gigabytes and
// the volume type's volumes_ and gigabytes_ for the volume, then for each
// snapshot snapshots, snapshots_<type> and gigabytes, with Cinder's 413s.
// The giver's usage falls by itself: usage is counted from the rows.
func (s *Service) reserveTransfer(ctx context.Context, tx *store.Tx, project string, v *volRow, snaps []*snapRow) error {
	if err := s.reserve(ctx, tx, project, 1, v.Size, v.Size); err != nil {
		return err
	}
	if v.TypeID != "" {
		ts, err := loadTypes(ctx, tx, "id = ?", v.TypeID)
		if err != nil {
			return err
		}
		if len(ts) == 1 {
			if err := s.reserveType(ctx, tx, project, ts[0], 1, v.Size); err != nil {
				return err
			}
		}
	}
	if len(snaps) == 0 {
		return nil
	}
	lim, err := quotaOf(ctx, tx, project)
	if err != nil {
		return err
	}
	var total, ofType int64
	if err := tx.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(CASE WHEN volume_type_id = ? THEN 1 ELSE 0 END), 0)
		FROM volume_snapshots WHERE project_id = ?`, v.TypeID, project).Scan(&total, &ofType); err != nil {
		return err
	}
	_, usedGB, err := usage(ctx, tx, project)
	if err != nil {
		return err
	}
	usedGB += v.Size // the volume's, reserved above
	for i, sn := range snaps {
		for _, k := range []struct {
			name string
			used int64
		}{{"snapshots", total}, {"snapshots_" + v.TypeName, ofType}} {
			if l, ok := lim[k.name]; ok && l >= 0 && k.used+int64(i)+1 > l {
				// cinder/exception.py SnapshotLimitExceeded
				return api.OverLimit("Maximum number of snapshots allowed (%d) exceeded for quota '%s'.", l, k.name)
			}
		}
		if l := lim["gigabytes"]; l >= 0 && usedGB+sn.Size > l {
			// cinder/exception.py VolumeSizeExceedsAvailableQuota
			return api.OverLimit("Requested volume or snapshot exceeds allowed gigabytes quota. Requested %dG, quota is %dG and %dG has been consumed.",
				sn.Size, l, usedGB)
		}
		usedGB += sn.Size
	}
	return nil
}
