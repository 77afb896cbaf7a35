package volume

import (
	"context"
	"net/http"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// User messages (cinder/message, the /messages API from 3.3): what a
// customer can read of why an asynchronous operation on their volume
// failed, as Cinder's event ids and texts (message_field.py). They are
// kept messageTTL.

const (
	messagesMinor = 3
	messageTTL    = 30 * 24 * time.Hour // Cinder's message_ttl
)

// A message's action and detail: Cinder's ids and texts.
type msgPart struct{ id, text string }

var (
	actionSchedule  = msgPart{"001", "schedule allocate volume"}
	actionUpload    = msgPart{"003", "copy volume to image"}
	actionFromImage = msgPart{"005", "copy image to volume"}
	actionExtend    = msgPart{"007", "extend volume"}

	detailUnknown   = msgPart{"001", "An unknown error occurred."}
	detailNoBackend = msgPart{"003", "Could not find any available weighted backend."}
	detailUpload    = msgPart{"004", "Failed to upload volume to image at backend."}
	detailExtend    = msgPart{"010", "Volume Driver failed to extend volume."}
)

// addMessage records, in q, an error message about volume volumeID of
// project for its owner. requestID is the request that caused the work,
// or "" for work the service does on its own (a new id is made).
func (s *Service) addMessage(ctx context.Context, q store.Querier, project, requestID, volumeID string, action, detail msgPart) error {
	if requestID == "" {
		requestID = "req-" + newID()
	}
	now := s.now()
	if _, err := q.Exec(ctx, "DELETE FROM volume_messages WHERE expires_at <= ?", store.FormatTime(now)); err != nil {
		return err
	}
	_, err := q.Exec(ctx, `INSERT INTO volume_messages (id, project_id, request_id, resource_type, resource_uuid, event_id,
		message_level, user_message, created_at, expires_at) VALUES (?, ?, ?, 'VOLUME', ?, ?, 'ERROR', ?, ?, ?)`,
		newID(), project, requestID, volumeID, "VOLUME_VOLUME_"+action.id+"_"+detail.id, action.text+":"+detail.text,
		store.FormatTime(now), store.FormatTime(now.Add(messageTTL)))
	return err
}

type msgRow struct {
	ID, ProjectID, RequestID, ResourceType, ResourceUUID, EventID, Level, Text string
	CreatedAt, ExpiresAt                                                       time.Time
}

const msgColumns = "id, project_id, request_id, resource_type, resource_uuid, event_id, message_level, user_message, created_at, expires_at"

// loadMessages are the unexpired messages where says, oldest first.
func (s *Service) loadMessages(ctx context.Context, where string, args ...any) ([]msgRow, error) {
	rows, err := s.db.Query(ctx, "SELECT "+msgColumns+" FROM volume_messages WHERE expires_at > ? AND "+where+
		" ORDER BY created_at, id", append([]any{store.FormatTime(s.now())}, args...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []msgRow
	for rows.Next() {
		var m msgRow
		var created, expires string
		if err := rows.Scan(&m.ID, &m.ProjectID, &m.RequestID, &m.ResourceType, &m.ResourceUUID, &m.EventID, &m.Level,
			&m.Text, &created, &expires); err != nil {
			return nil, err
		}
		m.CreatedAt, m.ExpiresAt = store.ParseTime(created), store.ParseTime(expires)
		out = append(out, m)
	}
	return out, rows.Err()
}

// messageView is cinder/api/v3/views/messages.py detail.
func messageView(r *http.Request, m msgRow) map[string]any {
	return map[string]any{"id": m.ID, "request_id": m.RequestID, "resource_type": m.ResourceType,
		"resource_uuid": m.ResourceUUID, "event_id": m.EventID, "message_level": m.Level, "user_message": m.Text,
		"created_at": cinderTime(m.CreatedAt), "guaranteed_until": cinderTime(m.ExpiresAt),
		"links": links(r, "messages", m.ID)}
}

// ownMessages is the where clause of the messages the caller sees: their
// project's, or any for an admin.
func ownMessages(r *http.Request) (string, []any) {
	if c := caller(r); !c.IsAdmin() {
		return "project_id = ?", []any{c.ProjectID}
	}
	return "1 = 1", nil
}

// listMessages is GET /messages.
func (s *Service) listMessages(r *http.Request) (*api.Response, error) {
	if minor(r) < messagesMinor {
		return nil, errNoVersion(r)
	}
	where, args := ownMessages(r)
	ms, err := s.loadMessages(r.Context(), where, args...)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, len(ms))
	for _, m := range ms {
		out = append(out, messageView(r, m))
	}
	return api.JSON(http.StatusOK, map[string]any{"messages": out}), nil
}

// ownMessage is message id if the caller sees it; Cinder's 404 otherwise.
func (s *Service) ownMessage(r *http.Request) (msgRow, error) {
	where, args := ownMessages(r)
	ms, err := s.loadMessages(r.Context(), "id = ? AND "+where, append([]any{r.PathValue("id")}, args...)...)
	if err != nil {
		return msgRow{}, err
	}
	if len(ms) == 0 {
		return msgRow{}, api.NotFound("Message %s could not be found.", r.PathValue("id"))
	}
	return ms[0], nil
}

// showMessage is GET /messages/{id}.
func (s *Service) showMessage(r *http.Request) (*api.Response, error) {
	if minor(r) < messagesMinor {
		return nil, errNoVersion(r)
	}
	m, err := s.ownMessage(r)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"message": messageView(r, m)}), nil
}

// deleteMessage is DELETE /messages/{id}, 204.
func (s *Service) deleteMessage(r *http.Request) (*api.Response, error) {
	if minor(r) < messagesMinor {
		return nil, errNoVersion(r)
	}
	m, err := s.ownMessage(r)
	if err != nil {
		return nil, err
	}
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		_, err := tx.Exec(r.Context(), "DELETE FROM volume_messages WHERE id = ?", m.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}
