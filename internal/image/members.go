package image

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Member is one project an image is shared with.
type Member struct {
	ImageID, MemberID, Status string
	CreatedAt, UpdatedAt      time.Time
}

var memberStatuses = []string{"pending", "accepted", "rejected"}

func memberView(m *Member) map[string]any {
	return map[string]any{
		"image_id": m.ImageID, "member_id": m.MemberID, "status": m.Status,
		"created_at": isoTime(m.CreatedAt), "updated_at": isoTime(m.UpdatedAt),
		"schema": "/v2/schemas/member",
	}
}

func listMembers(ctx context.Context, q store.Querier, imageID string) ([]*Member, error) {
	rows, err := q.Query(ctx, `SELECT image_id, member, status, created_at, updated_at
		FROM image_members WHERE image_id = ? ORDER BY created_at, member`, imageID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Member
	for rows.Next() {
		var m Member
		var created, updated string
		if err := rows.Scan(&m.ImageID, &m.MemberID, &m.Status, &created, &updated); err != nil {
			return nil, err
		}
		m.CreatedAt, m.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
		out = append(out, &m)
	}
	return out, rows.Err()
}

// memberImage loads the image of a members call and checks it can have
// members (glance/domain ImageMemberFactory: "Only shared images have
// members.").
func (s *Service) memberImage(ctx context.Context, q store.Querier, r *http.Request) (*Image, error) {
	img, err := s.lookup(ctx, q, r)
	if err != nil {
		return nil, err
	}
	if img.Visibility != Shared {
		return nil, api.Forbidden("Only shared images have members.")
	}
	return img, nil
}

// visibleMembers are the memberships the caller may see: all of them for
// the owner and admins, only its own for a member.
func visibleMembers(c *api.Caller, img *Image, all []*Member) []*Member {
	if owns(c, img) {
		return all
	}
	var out []*Member
	for _, m := range all {
		if m.MemberID == c.ProjectID {
			out = append(out, m)
		}
	}
	return out
}

func (s *Service) listMembers(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	img, err := s.memberImage(r.Context(), s.db, r)
	if err != nil {
		return nil, err
	}
	all, err := listMembers(r.Context(), s.db, img.ID)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, m := range visibleMembers(c, img, all) {
		out = append(out, memberView(m))
	}
	return api.JSON(http.StatusOK, map[string]any{"members": out, "schema": "/v2/schemas/members"}), nil
}

func (s *Service) findMember(ctx context.Context, q store.Querier, r *http.Request) (*api.Caller, *Image, *Member, error) {
	c := api.CallerFrom(r.Context())
	img, err := s.memberImage(ctx, q, r)
	if err != nil {
		return nil, nil, nil, err
	}
	all, err := listMembers(ctx, q, img.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	id := r.PathValue("member")
	for _, m := range visibleMembers(c, img, all) {
		if m.MemberID == id {
			return c, img, m, nil
		}
	}
	return nil, nil, nil, api.NotFound("%s not found in the member list of the image %s.", id, img.ID)
}

func (s *Service) showMember(r *http.Request) (*api.Response, error) {
	_, _, m, err := s.findMember(r.Context(), s.db, r)
	if err != nil {
		var e *api.Error
		if errors.As(err, &e) && e.Status == http.StatusForbidden {
			// image_members.py show: Forbidden becomes NotFound so as not
			// to leak information.
			return nil, api.NotFound("%s", e.Message)
		}
		return nil, err
	}
	return api.JSON(http.StatusOK, memberView(m)), nil
}

func (s *Service) createMember(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	raw, err := readJSON(r)
	if err != nil {
		return nil, err
	}
	body, _ := raw.(map[string]any)
	mv, has := body["member"]
	if body == nil || !has {
		return nil, api.BadRequest("Member to be added not specified")
	}
	memberID, ok := mv.(string)
	if !ok {
		return nil, api.BadRequest("Provided object does not match schema 'member': %s is not of type 'string'", jsonText(mv))
	}
	if memberID == "" {
		return nil, api.BadRequest("Member can't be empty")
	}
	if len(memberID) > 255 {
		return nil, api.BadRequest("Provided object does not match schema 'member': '%s' is too long", memberID)
	}
	var out *Member
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		img, err := s.memberImage(r.Context(), tx, r)
		if err != nil {
			return err
		}
		if !owns(c, img) {
			return api.Forbidden("Not allowed to create members for image %s.", img.ID)
		}
		if err := checkMemberCount(r.Context(), tx, img.ID); err != nil {
			return err
		}
		now := time.Now().UTC().Truncate(time.Second)
		out = &Member{ImageID: img.ID, MemberID: memberID, Status: "pending", CreatedAt: now, UpdatedAt: now}
		_, err = tx.Exec(r.Context(), `INSERT INTO image_members (image_id, member, status, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?)`, out.ImageID, out.MemberID, out.Status, store.FormatTime(now), store.FormatTime(now))
		if errors.Is(err, store.ErrConflict) {
			return api.Conflict("Member %s is duplicated for image %s", memberID, img.ID)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, memberView(out)), nil
}

// checkMemberCount refuses one more member past image_member_quota, as
// glance/quota ImageMemberRepoProxy.add does (413 from image_members.create).
func checkMemberCount(ctx context.Context, q store.Querier, imageID string) error {
	var n int
	if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM image_members WHERE image_id = ?", imageID).Scan(&n); err != nil {
		return err
	}
	if n+1 > maxMembers {
		return api.OverLimit("Image member limit exceeded for image %s: The limit has been exceeded on the number of allowed "+
			"image members for this image. Attempted: %d, Maximum: %d:", imageID, n+1, maxMembers)
	}
	return nil
}

func (s *Service) updateMember(r *http.Request) (*api.Response, error) {
	raw, err := readJSON(r)
	if err != nil {
		return nil, err
	}
	body, _ := raw.(map[string]any)
	sv, has := body["status"]
	if body == nil || !has {
		return nil, api.BadRequest("Status not specified")
	}
	status, _ := sv.(string)
	if !slices.Contains(memberStatuses, status) {
		return nil, api.BadRequest("Incorrect request: Invalid status: %v", sv)
	}
	var out *Member
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		c, img, m, err := s.findMember(r.Context(), tx, r)
		if err != nil {
			return err
		}
		// Only the member itself (or an admin) answers a share
		// (glance policy modify_member).
		if !c.IsAdmin() && c.ProjectID != m.MemberID {
			return api.Forbidden("Not allowed to update members for image %s.", img.ID)
		}
		m.Status = status
		m.UpdatedAt = time.Now().UTC().Truncate(time.Second)
		out = m
		_, err = tx.Exec(r.Context(), "UPDATE image_members SET status = ?, updated_at = ? WHERE image_id = ? AND member = ?",
			m.Status, store.FormatTime(m.UpdatedAt), m.ImageID, m.MemberID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, memberView(out)), nil
}

func (s *Service) deleteMember(r *http.Request) (*api.Response, error) {
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		c, img, m, err := s.findMember(r.Context(), tx, r)
		if err != nil {
			return err
		}
		if !owns(c, img) {
			return api.Forbidden("Not allowed to delete members for image %s.", img.ID)
		}
		_, err = tx.Exec(r.Context(), "DELETE FROM image_members WHERE image_id = ? AND member = ?", m.ImageID, m.MemberID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}
