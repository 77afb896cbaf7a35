package compute

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"regexp"
	"strings"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// serverRoutes are the server endpoints and actions.
func (s *Service) serverRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.1/servers", Handler: s.handleList(false)},
		{Pattern: "GET /v2.1/servers/detail", Handler: s.handleList(true)},
		{Pattern: "POST /v2.1/servers", Handler: s.handleCreate},
		{Pattern: "GET /v2.1/servers/{id}", Handler: s.handleShow},
		{Pattern: "PUT /v2.1/servers/{id}", Handler: s.handleUpdate},
		{Pattern: "DELETE /v2.1/servers/{id}", Handler: s.handleDelete},
		{Pattern: "POST /v2.1/servers/{id}/action", Handler: s.handleAction},
		{Pattern: "GET /v2.1/servers/{id}/ips", Handler: s.handleIPs},
		{Pattern: "GET /v2.1/servers/{id}/ips/{network}", Handler: s.handleIPs},
		{Pattern: "GET /v2.1/servers/{id}/metadata", Handler: s.handleMetaList},
		{Pattern: "POST /v2.1/servers/{id}/metadata", Handler: s.handleMetaSet(false)},
		{Pattern: "PUT /v2.1/servers/{id}/metadata", Handler: s.handleMetaSet(true)},
		{Pattern: "GET /v2.1/servers/{id}/metadata/{key}", Handler: s.handleMetaGet},
		{Pattern: "PUT /v2.1/servers/{id}/metadata/{key}", Handler: s.handleMetaPut},
		{Pattern: "DELETE /v2.1/servers/{id}/metadata/{key}", Handler: s.handleMetaDelete},
		{Pattern: "GET /v2.1/servers/{id}/tags", Handler: s.handleTagList},
		{Pattern: "PUT /v2.1/servers/{id}/tags", Handler: s.handleTagReplace},
		{Pattern: "DELETE /v2.1/servers/{id}/tags", Handler: s.handleTagDeleteAll},
		{Pattern: "GET /v2.1/servers/{id}/tags/{tag}", Handler: s.handleTagCheck},
		{Pattern: "PUT /v2.1/servers/{id}/tags/{tag}", Handler: s.handleTagAdd},
		{Pattern: "DELETE /v2.1/servers/{id}/tags/{tag}", Handler: s.handleTagDelete},
		{Pattern: "GET /v2.1/servers/{id}/topology", Handler: s.handleTopology},
		{Pattern: "GET /v2.1/servers/{id}/access", Handler: s.handleAccess},
		{Pattern: "GET /v2.1/servers/{id}/os-server-password", Handler: s.handleGetPassword},
		{Pattern: "DELETE /v2.1/servers/{id}/os-server-password", Handler: s.handleClearPassword},
		{Pattern: "GET /v2.1/servers/{id}/os-instance-actions", Handler: s.handleListActions},
		{Pattern: "GET /v2.1/servers/{id}/os-instance-actions/{rid}", Handler: s.handleShowAction},
		{Pattern: "GET /v2.1/os-simple-tenant-usage", Handler: s.handleUsageList, AdminOnly: true,
			Policy: "os_compute_api:os-simple-tenant-usage:list"},
		{Pattern: "GET /v2.1/os-simple-tenant-usage/{project}", Handler: s.handleUsageShow},
	}
}

func newUUID() string { return uuid.NewString() }

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

func (s *Service) handleShow(r *http.Request) (*api.Response, error) {
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	vc, err := s.newViewCtx(r, []*server{sv})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"server": vc.serverView(sv, true)}), nil
}

// handleUpdate is PUT /servers/{id} (schemas/servers.py update*).
func (s *Service) handleUpdate(r *http.Request) (*api.Response, error) {
	v := VersionFrom(r.Context())
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if err := api.UnknownFields(body, "server"); err != nil {
		return nil, err
	}
	raw, ok := body["server"]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute server. 'server' is a required property")
	}
	var obj map[string]json.RawMessage
	if err := api.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, api.BadRequest("Invalid input for field/attribute server. Value: %s. %s is not of type 'object'", raw, raw)
	}
	allowed := []string{"name", "accessIPv4", "accessIPv6", "OS-DCF:diskConfig"}
	if v.AtLeast(19) {
		allowed = append(allowed, "description")
	}
	if v.AtLeast(90) {
		allowed = append(allowed, "hostname")
	}
	if err := api.UnknownFields(obj, allowed...); err != nil {
		return nil, err
	}
	var in struct {
		Name        *string `json:"name"`
		AccessIPv4  *string `json:"accessIPv4"`
		AccessIPv6  *string `json:"accessIPv6"`
		DiskConfig  *string `json:"OS-DCF:diskConfig"`
		Description *string `json:"description"`
		Hostname    *string `json:"hostname"`
	}
	if err := api.Unmarshal(raw, &in); err != nil {
		return nil, err
	}
	_, hasDesc := obj["description"]
	if in.Name != nil {
		if err := checkName("name", *in.Name); err != nil {
			return nil, err
		}
	}
	if err := checkAccessIPs(in.AccessIPv4, in.AccessIPv6); err != nil {
		return nil, err
	}
	if in.DiskConfig != nil && *in.DiskConfig != "AUTO" && *in.DiskConfig != "MANUAL" {
		return nil, api.BadRequest("Invalid input for field/attribute OS-DCF:diskConfig. Value: %s. '%s' is not one of ['AUTO', 'MANUAL']", *in.DiskConfig, *in.DiskConfig)
	}
	if in.Description != nil && len(*in.Description) > 255 {
		return nil, api.BadRequest("Invalid input for field/attribute description. Value: %s. '%s' is too long", *in.Description, *in.Description)
	}
	if in.Hostname != nil {
		if err := checkHostname(*in.Hostname, v); err != nil {
			return nil, err
		}
	}
	var sv *server
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		var err error
		if sv, err = s.visibleServer(r.Context(), tx, r.PathValue("id"), true); err != nil {
			return err
		}
		if in.Name != nil {
			sv.Name = *in.Name
		}
		if in.AccessIPv4 != nil {
			sv.Doc.AccessIPv4 = *in.AccessIPv4
		}
		if in.AccessIPv6 != nil {
			sv.Doc.AccessIPv6 = canonicalIP(*in.AccessIPv6)
		}
		if in.DiskConfig != nil {
			sv.Doc.DiskConfig = *in.DiskConfig
		}
		if hasDesc {
			sv.Doc.Description = in.Description
		}
		if in.Hostname != nil {
			sv.Hostname = *in.Hostname
		}
		return s.saveServer(r.Context(), tx, sv)
	})
	if err != nil {
		return nil, err
	}
	vc, err := s.newViewCtx(r, []*server{sv})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"server": vc.updateView(sv, false)}), nil
}

// handleDelete is DELETE /servers/{id}: it marks the intent and lets the
// reconcile loop destroy the VM and free what the server held.
func (s *Service) handleDelete(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		sv, err := s.visibleServer(r.Context(), tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if err := checkState(sv, "delete", c); err != nil {
			return err
		}
		if sv.TaskState == taskDeleting {
			return nil
		}
		sv.TaskState = taskDeleting
		sv.Doc.RequestID = api.RequestID(r.Context())
		sv.Doc.TaskID = newUUID()
		if err := s.recordAction(r.Context(), tx, sv.ID, "delete"); err != nil {
			return err
		}
		if err := s.saveServer(r.Context(), tx, sv); err != nil {
			return err
		}
		if err := s.networks.ServerDeleting(r.Context(), tx, sv.ID); err != nil {
			return err
		}
		return s.enqueueAfter(r.Context(), tx, sv.ID)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// checkName is Nova's name schema: 1–255 characters, not only spaces, no
// leading or trailing space.
func checkName(field, name string) error {
	if name == "" || len([]rune(name)) > 255 || strings.TrimSpace(name) == "" ||
		strings.TrimSpace(name) != name {
		return api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' does not match '^(?! )[\\x00-\\x7F...]*(?<! )$'", field, name, name)
	}
	return nil
}

var hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$`)
var fqdnRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?$`)

// checkHostname is the 2.90 hostname schema (FQDNs from 2.94).
func checkHostname(h string, v Version) error {
	max, re := 63, hostnameRE
	if v.AtLeast(94) {
		max, re = 255, fqdnRE
	}
	if h == "" || len(h) > max || !re.MatchString(h) {
		return api.BadRequest("Invalid input for field/attribute hostname. Value: %s. '%s' does not match the hostname format", h, h)
	}
	return nil
}

func checkAccessIPs(v4, v6 *string) error {
	if v4 != nil && *v4 != "" && !isIPv4(*v4) {
		return api.BadRequest("Invalid input for field/attribute accessIPv4. Value: %s. '%s' is not a 'ipv4'", *v4, *v4)
	}
	if v6 != nil && *v6 != "" && !isIPv6(*v6) {
		return api.BadRequest("Invalid input for field/attribute accessIPv6. Value: %s. '%s' is not a 'ipv6'", *v6, *v6)
	}
	return nil
}

// sanitizeHostname is nova/utils.py sanitize_hostname.
func sanitizeHostname(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r == ' ' || r == '_':
			b.WriteByte('-')
		case (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' || r == '.':
			b.WriteRune(r)
		}
	}
	h := strings.Trim(b.String(), ".-")
	if len(h) > 63 {
		h = strings.Trim(h[:63], ".-")
	}
	if h == "" {
		h = "server"
	}
	return h
}

// notFoundAs maps store.ErrNotFound to err and passes other errors on.
func notFoundAs(e error, err error) error {
	if errors.Is(e, store.ErrNotFound) {
		return err
	}
	return e
}

// enqueueAfter owns the work of servers ids, whose intent tx writes:
// their leases are taken in tx where free (reconcile then needs no
// statement to take them), and the reconcile loop is woken after commit.
func (s *Service) enqueueAfter(ctx context.Context, tx *store.Tx, ids ...string) error {
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = serverLease(id)
	}
	taken, err := s.leases.TakeFree(ctx, tx, names...)
	if err != nil {
		return err
	}
	tx.AfterCommit(func() {
		for _, name := range taken {
			s.owned.Store(strings.TrimPrefix(name, serverLease("")), true)
		}
		for _, id := range ids {
			s.enqueue(id)
		}
	})
	return nil
}

var _ = context.Background

// handleIPs is GET /servers/{id}/ips and /ips/{network}
// (nova/api/openstack/compute/ips.py): the server's addresses by network,
// 404 for a network the server is not on.
func (s *Service) handleIPs(r *http.Request) (*api.Response, error) {
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	vc, err := s.newViewCtx(r, []*server{sv})
	if err != nil {
		return nil, err
	}
	addrs := ipsView(vc.addresses[sv.ID])
	if sv.VMState == vmBuilding {
		addrs = map[string]any{}
	}
	net := r.PathValue("network")
	if net == "" {
		return api.JSON(http.StatusOK, map[string]any{"addresses": addrs}), nil
	}
	l, ok := addrs[net]
	if !ok {
		return nil, api.NotFound("Instance is not a member of specified network")
	}
	return api.JSON(http.StatusOK, map[string]any{net: l}), nil
}

// canonicalIP writes an address the way Nova stores it (netaddr's compact
// form, e.g. 0:0:0:0:0:babe:220.12.22.2 becomes ::babe:dc0c:1602); anything
// that does not parse is kept as given.
func canonicalIP(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.String()
	}
	return s
}
