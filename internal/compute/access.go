package compute

import (
	"errors"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// handleAccess is GET /servers/{id}/access, a Nimbus extension (so that
// Nova's server record keeps its exact schema): how the server's owner
// logs in, a list of {protocol, host, port, user}. A server that runs on
// no host (building, shelved, failed) has none yet.
func (s *Service) handleAccess(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	if sv.Host == "" || sv.VMState == vmBuilding || sv.VMState == vmShelvedOffloaded {
		return api.JSON(http.StatusOK, map[string]any{"access": out}), nil
	}
	acc, err := s.driver.Access(ctx, sv.ID)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		acc = nil
	case errors.Is(err, driver.ErrHostDown):
		return nil, api.Conflict("Compute service of %s is unavailable at this time.", sv.Host)
	case err != nil:
		return nil, err
	}
	user := s.loginUser(r, sv)
	for _, a := range acc {
		u := a.User
		if u == "" {
			u = user
		}
		out = append(out, map[string]any{"protocol": a.Protocol, "host": a.Host, "port": a.Port, "user": u})
	}
	return api.JSON(http.StatusOK, map[string]any{"access": out}), nil
}

// loginUser is who logs in to sv: its image's login_user, else root on
// Linux and Administrator on Windows.
func (s *Service) loginUser(r *http.Request, sv *server) string {
	if sv.ImageRef != "" {
		img, err := s.images.Get(r.Context(), sv.ProjectID, false, sv.ImageRef)
		if err == nil && img.Properties["login_user"] != "" {
			return img.Properties["login_user"]
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("access: image lookup failed", "server", sv.ID, "error", err)
		}
	}
	if sv.Doc.OSType == "windows" {
		return "Administrator"
	}
	return "root"
}
