package compute

import (
	"context"
	"errors"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/network"
	"nimbus/internal/store"
)

// handleAccess is GET /servers/{id}/access, a Nimbus extension (so that
// Nova's server record keeps its exact schema): how the server's owner
// logs in, a list of {protocol, host, port, user}. A server that runs on
// no host (building, shelved, failed) has none yet. On a bridged host
// (real networks) a server with a public address — a floating IP, as a
// nimbus:public_ipv4 flavor's is — is reached there first; the driver's
// entries follow.
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
	public, err := s.publicAccess(ctx, sv)
	if err != nil {
		return nil, err
	}
	acc = append(public, acc...)
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

// publicAccess is SSH, or RDP for Windows, at sv's public IPv4 address
// when its host wires real networks; none in user-mode networking, where
// a floating IP reaches nothing.
func (s *Service) publicAccess(ctx context.Context, sv *server) ([]driver.Access, error) {
	hosts, err := s.fleet(ctx)
	if err != nil {
		return nil, err
	}
	if hosts[sv.Host].NetworkMode != "bridged" {
		return nil, nil
	}
	addrs, err := s.networks.Addresses(ctx, []network.ServerRef{{ID: sv.ID, ProjectID: sv.ProjectID}})
	if err != nil {
		return nil, err
	}
	ip := publicAddress(addrs[sv.ID], 4)
	if ip == "" {
		return nil, nil
	}
	if sv.Doc.OSType == "windows" {
		return []driver.Access{{Protocol: "rdp", Host: ip, Port: 3389}}, nil
	}
	return []driver.Access{{Protocol: "ssh", Host: ip, Port: 22}}, nil
}
