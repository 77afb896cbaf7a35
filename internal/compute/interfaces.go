package compute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/network"
	"nimbus/internal/store"
)

// Nova's os-interface (nova/api/openstack/compute/attach_interfaces.py):
// a server's ports as interface attachments, and NIC hot-plug. An attach
// binds or makes the port in one transaction, then has the driver plug
// the NIC; when the driver fails, the binding is rolled back, so that no
// port stays bound without its NIC. A detach unplugs the NIC first and
// unbinds after, so that no NIC outlives its port's wiring.

// interfaceRoutes are the os-interface endpoints.
func (s *Service) interfaceRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.1/servers/{id}/os-interface", Handler: s.handleInterfaceList},
		{Pattern: "POST /v2.1/servers/{id}/os-interface", Handler: s.handleInterfaceAttach},
		{Pattern: "GET /v2.1/servers/{id}/os-interface/{port}", Handler: s.handleInterfaceShow},
		{Pattern: "DELETE /v2.1/servers/{id}/os-interface/{port}", Handler: s.handleInterfaceDetach},
	}
}

// interfaceView is _translate_interface_attachment_view; the tag, shown
// from 2.70, is null: Nimbus keeps no device tags.
func interfaceView(i network.Interface, v Version) map[string]any {
	ips := make([]map[string]string, 0, len(i.FixedIPs))
	for _, f := range i.FixedIPs {
		ips = append(ips, map[string]string{"subnet_id": f.SubnetID, "ip_address": f.IPAddress})
	}
	out := map[string]any{"net_id": i.NetworkID, "port_id": i.PortID, "mac_addr": i.MAC,
		"port_state": i.Status, "fixed_ips": ips}
	if v.AtLeast(70) {
		out["tag"] = nil
	}
	return out
}

func (s *Service) interfacesOf(ctx context.Context, sv *server) ([]network.Interface, error) {
	return s.networks.ServerInterfaces(ctx, network.ServerRef{ID: sv.ID, ProjectID: sv.ProjectID})
}

func (s *Service) handleInterfaceList(r *http.Request) (*api.Response, error) {
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	ifs, err := s.interfacesOf(r.Context(), sv)
	if err != nil {
		return nil, err
	}
	v := VersionFrom(r.Context())
	out := make([]map[string]any, 0, len(ifs))
	for _, i := range ifs {
		out = append(out, interfaceView(i, v))
	}
	return api.JSON(http.StatusOK, map[string]any{"interfaceAttachments": out}), nil
}

func (s *Service) handleInterfaceShow(r *http.Request) (*api.Response, error) {
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	return s.showInterface(r, sv, r.PathValue("port"))
}

// showInterface answers one attachment: 404 for a port the caller cannot
// see, or one that is not the server's.
func (s *Service) showInterface(r *http.Request, sv *server, portID string) (*api.Response, error) {
	ctx := r.Context()
	ifs, err := s.interfacesOf(ctx, sv)
	if err != nil {
		return nil, err
	}
	k := slices.IndexFunc(ifs, func(i network.Interface) bool { return i.PortID == portID })
	if k < 0 {
		c := api.CallerFrom(ctx)
		if _, err := s.networks.GetPort(ctx, c.ProjectID, c.IsAdmin(), portID); err != nil {
			return nil, notFoundAs(err, api.NotFound("Port id %s could not be found.", portID))
		}
		return nil, api.NotFound("Instance %s does not have a port with id %s", sv.ID, portID)
	}
	return api.JSON(http.StatusOK, map[string]any{"interfaceAttachment": interfaceView(ifs[k], VersionFrom(ctx))}), nil
}

// attachReq is a create body: a port to bind, or a network (with an
// address, perhaps) to make a port on; neither means the project's
// default network.
type attachReq struct {
	NetID, PortID, FixedIP string
}

// parseAttach is Nova's create schema (create_v249 adds tag).
func parseAttach(r *http.Request) (attachReq, error) {
	var req attachReq
	body, err := readOptionalBody(r)
	if err != nil || body == nil {
		return req, err
	}
	if err := api.UnknownFields(body, "interfaceAttachment"); err != nil {
		return req, err
	}
	raw, ok := body["interfaceAttachment"]
	if !ok {
		return req, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return req, badField("interfaceAttachment", raw, fmt.Sprintf("%s is not of type 'object'", raw))
	}
	allowed := []string{"net_id", "port_id", "fixed_ips"}
	if VersionFrom(r.Context()).AtLeast(49) {
		allowed = append(allowed, "tag")
	}
	if err := api.UnknownFields(obj, allowed...); err != nil {
		return req, err
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"net_id", &req.NetID}, {"port_id", &req.PortID}} {
		p, err := strField(obj, f.name)
		if err != nil {
			return req, err
		}
		if p != nil && !uuidRE.MatchString(*p) {
			return req, api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is not a 'uuid'", f.name, *p, *p)
		}
		if p != nil {
			*f.dst = *p
		}
	}
	if raw, ok := obj["fixed_ips"]; ok {
		if req.FixedIP, err = parseFixedIPs(raw); err != nil {
			return req, err
		}
	}
	if tag, err := strField(obj, "tag"); err != nil {
		return req, err
	} else if tag != nil && (*tag == "" || len(*tag) > 60 || strings.ContainsAny(*tag, "/,")) {
		return req, api.BadRequest("Invalid input for field/attribute tag. Value: %s. '%s' does not match '^[^,/]*$'", *tag, *tag)
	}
	if req.NetID != "" && req.PortID != "" {
		return req, api.BadRequest("Must not input both network_id and port_id")
	}
	if req.FixedIP != "" && req.NetID == "" {
		return req, api.BadRequest("Must input network_id when request IP address")
	}
	return req, nil
}

// readOptionalBody decodes a JSON object body; no body at all is nil.
func readOptionalBody(r *http.Request) (map[string]json.RawMessage, error) {
	var raw json.RawMessage
	if r.ContentLength == 0 {
		return nil, nil
	}
	if err := api.DecodeJSON(r, &raw); err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, api.BadRequest("Invalid input for field/attribute body. Value: %s. %s is not of type 'object'", raw, raw)
	}
	return body, nil
}

// parseFixedIPs is the fixed_ips schema: one {"ip_address": <IP>}.
func parseFixedIPs(raw json.RawMessage) (string, error) {
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", badField("fixed_ips", raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	if len(list) != 1 {
		return "", badField("fixed_ips", raw, fmt.Sprintf("%s should have exactly 1 item", raw))
	}
	if err := api.UnknownFields(list[0], "ip_address"); err != nil {
		return "", err
	}
	ip, err := strField(list[0], "ip_address")
	if err != nil {
		return "", err
	}
	if ip == nil {
		return "", badField("fixed_ips", raw, "'ip_address' is a required property")
	}
	if _, err := netip.ParseAddr(*ip); err != nil {
		return "", api.BadRequest("Invalid input for field/attribute ip_address. Value: %s. '%s' is not a 'ip_address'", *ip, *ip)
	}
	return *ip, nil
}

// handleInterfaceAttach is POST /servers/{id}/os-interface: 200 with the
// attachment once the NIC is plugged.
func (s *Service) handleInterfaceAttach(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	req, err := parseAttach(r)
	if err != nil {
		return nil, err
	}
	c := api.CallerFrom(ctx)
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	if err := s.checkAttachTarget(ctx, c, sv, &req); err != nil {
		return nil, err
	}
	started := s.now()
	var portID string
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err = s.visibleServer(ctx, tx, sv.ID, true)
		if err != nil {
			return err
		}
		if err := checkState(sv, "attach_interface", c); err != nil {
			return err
		}
		if portID, err = s.bindInterface(ctx, tx, sv, req); err != nil {
			return err
		}
		return s.recordAction(ctx, tx, sv.ID, "attach_interface")
	})
	if err != nil {
		return nil, err
	}
	if err := s.plugNIC(ctx, sv, portID); err != nil {
		s.log.Warn("compute: interface attach failed", "server", sv.ID, "port", portID, "error", err)
		return nil, s.unbindAfterFailure(ctx, sv, portID, started, err)
	}
	if err := s.finishAction(ctx, s.db, sv.ID, api.RequestID(ctx), "compute_attach_interface", sv.Host, started, nil); err != nil {
		return nil, err
	}
	return s.showInterface(r, sv, portID)
}

// checkAttachTarget resolves and checks what is to be attached, before
// the transaction: the port exists and is free, the network exists (the
// project's default when none is named), the server has room for a NIC.
func (s *Service) checkAttachTarget(ctx context.Context, c *api.Caller, sv *server, req *attachReq) error {
	ifs, err := s.interfacesOf(ctx, sv)
	if err != nil {
		return err
	}
	if len(ifs) >= maxServerNICs {
		return api.Forbidden("Maximum number of ports exceeded")
	}
	switch {
	case req.PortID != "":
		p, err := s.networks.GetPort(ctx, c.ProjectID, c.IsAdmin(), req.PortID)
		if err != nil {
			return notFoundAs(err, api.NotFound("Port id %s could not be found.", req.PortID))
		}
		if p.DeviceID != "" {
			return api.Conflict("Port %s is still in use.", req.PortID)
		}
	case req.NetID != "":
		if _, err := s.networks.GetNetwork(ctx, c.ProjectID, c.IsAdmin(), req.NetID); err != nil {
			return notFoundAs(err, api.NotFound("Network %s could not be found.", req.NetID))
		}
	default:
		n, err := s.networks.AutoNetwork(ctx, sv.ProjectID)
		if err != nil {
			return err
		}
		req.NetID = n.ID
	}
	return nil
}

// bindInterface binds the requested port to sv, or makes one on the
// requested network with the project's default security group, in tx.
func (s *Service) bindInterface(ctx context.Context, tx *store.Tx, sv *server, req attachReq) (string, error) {
	if req.PortID != "" {
		return req.PortID, s.networks.BindPort(ctx, tx, sv.ProjectID, req.PortID, sv.ID)
	}
	p, err := s.networks.CreateServerPort(ctx, tx, sv.ProjectID, req.NetID, sv.ID, req.FixedIP, nil)
	if err != nil {
		return "", err
	}
	return p.ID, nil
}

// hasVM tells whether sv's VM exists on its host, so that a NIC change
// goes to the driver: the states attach and detach allow, with a host.
func hasVM(sv *server) bool {
	return sv.Host != "" && (sv.VMState == vmActive || sv.VMState == vmPaused || sv.VMState == vmStopped)
}

// plugNIC has the driver plug port portID into sv's VM (a stopped VM
// takes it at its next start).
func (s *Service) plugNIC(ctx context.Context, sv *server, portID string) error {
	if !hasVM(sv) {
		return nil
	}
	ports, err := s.networks.ServerPorts(ctx, network.ServerRef{ID: sv.ID, ProjectID: sv.ProjectID})
	if err != nil {
		return err
	}
	k := slices.IndexFunc(ports, func(p network.ServerPort) bool { return p.ID == portID })
	if k < 0 {
		return fmt.Errorf("port %s has no IPv4 address for the hypervisor", portID)
	}
	return retry(ctx, func() error { return s.driver.AttachPort(ctx, sv.ID, driverPort(ports[k])) })
}

// driverPort is a server port as the driver takes it.
func driverPort(p network.ServerPort) driver.Port {
	return driver.Port{ID: p.ID, NetworkID: p.NetworkID, MAC: p.MAC, IP: p.IP,
		CIDR: p.CIDR, Gateway: p.Gateway, DNS: p.DNS, MTU: p.MTU}
}

// unbindAfterFailure undoes an attach whose NIC the driver could not
// plug: the driver takes out whatever it did plug, then the port is
// released (a port made for the attach is deleted). The answer is Nova's
// InterfaceAttachFailed.
func (s *Service) unbindAfterFailure(ctx context.Context, sv *server, portID string, started time.Time, cause error) error {
	// The request's own context may be the reason it failed.
	ctx = context.WithoutCancel(ctx)
	failed := api.Errorf(http.StatusInternalServerError, "Failed to attach network adapter device to %s", sv.ID)
	// A host found down ran nothing: there is no NIC to take out.
	if !errors.Is(cause, driver.ErrHostDown) {
		if err := s.driver.DetachPort(ctx, sv.ID, portID); err != nil && !errors.Is(err, driver.ErrNotFound) {
			// The NIC may still be there: keep the port bound to it
			// rather than leave a NIC with no port; a detach retries.
			s.log.Error("compute: interface attach could not be undone", "server", sv.ID, "port", portID, "error", err)
			return failed
		}
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.networks.ReleasePort(ctx, tx, sv.ID, portID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return s.finishAction(ctx, tx, sv.ID, api.RequestID(ctx), "compute_attach_interface", sv.Host, started, cause)
	})
	if err != nil {
		return err
	}
	return failed
}

// handleInterfaceDetach is DELETE /servers/{id}/os-interface/{port}: 202
// once the NIC is out and the port released.
func (s *Service) handleInterfaceDetach(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	portID := r.PathValue("port")
	started := s.now()
	var sv *server
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if sv, err = s.visibleServer(ctx, tx, r.PathValue("id"), true); err != nil {
			return err
		}
		if err := checkState(sv, "detach_interface", c); err != nil {
			return err
		}
		if err := s.checkAttached(ctx, sv, portID); err != nil {
			return err
		}
		return s.recordAction(ctx, tx, sv.ID, "detach_interface")
	})
	if err != nil {
		return nil, err
	}
	if hasVM(sv) {
		err := retry(ctx, func() error { return s.driver.DetachPort(ctx, sv.ID, portID) })
		if err != nil && !errors.Is(err, driver.ErrNotFound) {
			s.log.Warn("compute: interface detach failed", "server", sv.ID, "port", portID, "error", err)
			if ferr := s.finishAction(ctx, s.db, sv.ID, api.RequestID(ctx), "compute_detach_interface", sv.Host, started, err); ferr != nil {
				return nil, ferr
			}
			return nil, api.Errorf(http.StatusInternalServerError, "Failed to detach network adapter device from %s", sv.ID)
		}
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.networks.ReleasePort(ctx, tx, sv.ID, portID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return s.finishAction(ctx, tx, sv.ID, api.RequestID(ctx), "compute_detach_interface", sv.Host, started, nil)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// checkAttached is Nova's detach_interface check: 404 "Port <id> is not
// attached" for a port that is not one of the server's.
func (s *Service) checkAttached(ctx context.Context, sv *server, portID string) error {
	ifs, err := s.interfacesOf(ctx, sv)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(ifs, func(i network.Interface) bool { return i.PortID == portID }) {
		return api.NotFound("Port %s is not attached", portID)
	}
	return nil
}
