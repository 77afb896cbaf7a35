// Package network is Nimbus's Neutron v2.0: networks, subnets, ports with
// IP address management, security groups with rules, and floating IPs from
// the public pool.
package network

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Network is a network as compute needs it.
type Network struct {
	ID, Name, ProjectID string
	Shared, External    bool
	SubnetIDs           []string
}

// FixedIP is one address of a port.
type FixedIP struct {
	SubnetID  string
	IPAddress string
}

// Port is a port as compute needs it.
type Port struct {
	ID, NetworkID, NetworkName, MACAddress, DeviceID string
	FixedIPs                                         []FixedIP
}

// Address is one entry of a server's Nova "addresses" map.
type Address struct {
	Addr    string
	Version int
	Type    string // "fixed" or "floating"
	MAC     string
}

// Service is the network service.
type Service struct {
	db   *store.DB
	gate SpendGate // asked before a public address is allocated or attached; nil: never
	// servers says whose a server is, before a customer names one as a
	// port's device; nil: no server is anyone's.
	servers ServerOwner
	// projects finds the operator's project, owner of the public network;
	// nil: the network is no project's.
	projects Projects
	dp       dataplane // the data plane's change feed (hoststate.go)
	// provider is the provider network the public subnet follows.
	provider Provider
}

// Projects finds a project's id by name, "" when there is none; identity
// provides it, so network never reads identity's tables.
type Projects interface {
	ProjectID(ctx context.Context, name string) (string, error)
}

// SetProjects connects identity's project lookup.
func (s *Service) SetProjects(p Projects) { s.projects = p }

// ServerOwner tells which project a server belongs to; compute provides it.
// found is false for a server that does not exist or is deleted.
type ServerOwner interface {
	ServerProject(ctx context.Context, id string) (project string, found bool, err error)
}

// SetServerOwner connects compute's answer to whose a server is.
func (s *Service) SetServerOwner(o ServerOwner) { s.servers = o }

// New makes the network service.
func New(db *store.DB) *Service { return &Service{db: db} }

// Names of the networks Nimbus makes itself.
const (
	PublicNetwork  = "public"
	PrivateNetwork = "private"
	PrivateSubnet  = "private-subnet"
	PrivateCIDR    = "10.0.0.0/24"
	PublicCIDR     = "203.0.113.0/24"
)

// Routes is the network API's route table.
func (s *Service) Routes() []api.Route {
	rt := []api.Route{
		{Pattern: "GET /{$}", Handler: s.versions, Public: true},
		{Pattern: "GET /v2.0", Handler: s.resources},
		{Pattern: "GET /v2.0/{$}", Handler: s.resources},
		{Pattern: "GET /v2.0/extensions", Handler: s.listExtensions},
		{Pattern: "GET /v2.0/extensions/{alias}", Handler: s.showExtension},

		{Pattern: "GET /v2.0/networks", Handler: s.listNetworks},
		{Pattern: "POST /v2.0/networks", Handler: s.creator("network", "networks", networkCreateAttrs, s.prepareNetwork)},
		{Pattern: "GET /v2.0/networks/{id}", Handler: s.showNetwork},
		{Pattern: "PUT /v2.0/networks/{id}", Handler: s.updateNetwork},
		{Pattern: "DELETE /v2.0/networks/{id}", Handler: s.deleteNetwork},

		{Pattern: "GET /v2.0/subnets", Handler: s.listSubnets},
		{Pattern: "POST /v2.0/subnets", Handler: s.creator("subnet", "subnets", subnetCreateAttrs, s.prepareSubnet)},
		{Pattern: "GET /v2.0/subnets/{id}", Handler: s.showSubnet},
		{Pattern: "PUT /v2.0/subnets/{id}", Handler: s.updateSubnet},
		{Pattern: "DELETE /v2.0/subnets/{id}", Handler: s.deleteSubnet},

		{Pattern: "GET /v2.0/ports", Handler: s.listPorts},
		{Pattern: "POST /v2.0/ports", Handler: s.creator("port", "ports", portCreateAttrs, s.preparePort)},
		{Pattern: "GET /v2.0/ports/{id}", Handler: s.showPort},
		{Pattern: "PUT /v2.0/ports/{id}", Handler: s.updatePort},
		{Pattern: "DELETE /v2.0/ports/{id}", Handler: s.deletePort},

		{Pattern: "GET /v2.0/security-groups", Handler: s.listSGs},
		{Pattern: "POST /v2.0/security-groups", Handler: s.creator("security_group", "security_groups", sgCreateAttrs, s.prepareSG)},
		{Pattern: "GET /v2.0/security-groups/{id}", Handler: s.showSG},
		{Pattern: "PUT /v2.0/security-groups/{id}", Handler: s.updateSG},
		{Pattern: "DELETE /v2.0/security-groups/{id}", Handler: s.deleteSG},

		{Pattern: "GET /v2.0/security-group-rules", Handler: s.listRules},
		{Pattern: "POST /v2.0/security-group-rules", Handler: s.creator("security_group_rule", "security_group_rules", ruleCreateAttrs, s.prepareRule)},
		{Pattern: "GET /v2.0/security-group-rules/{id}", Handler: s.showRule},
		{Pattern: "DELETE /v2.0/security-group-rules/{id}", Handler: s.deleteRule},

		{Pattern: "GET /v2.0/floatingips", Handler: s.listFIPs},
		{Pattern: "POST /v2.0/floatingips", Handler: s.createFIP},
		{Pattern: "GET /v2.0/floatingips/{id}", Handler: s.showFIP},
		{Pattern: "PUT /v2.0/floatingips/{id}", Handler: s.updateFIP},
		{Pattern: "DELETE /v2.0/floatingips/{id}", Handler: s.deleteFIP},
	}
	for _, coll := range []string{"networks", "subnets", "ports", "security-groups", "floatingips", "routers"} {
		base := "/v2.0/" + coll + "/{id}/tags"
		rt = append(rt,
			api.Route{Pattern: "GET " + base, Handler: s.tagHandler(coll, "list")},
			api.Route{Pattern: "PUT " + base, Handler: s.tagHandler(coll, "replace")},
			api.Route{Pattern: "DELETE " + base, Handler: s.tagHandler(coll, "clear")},
			api.Route{Pattern: "GET " + base + "/{tag}", Handler: s.tagHandler(coll, "check")},
			api.Route{Pattern: "PUT " + base + "/{tag}", Handler: s.tagHandler(coll, "add")},
			api.Route{Pattern: "DELETE " + base + "/{tag}", Handler: s.tagHandler(coll, "remove")},
		)
	}
	rt = append(rt, quotaRoutes(s)...)
	rt = append(rt, routerRoutes(s)...)
	rt = append(rt, poolRoutes(s)...)
	// neutron takes a ".json" format suffix on any path
	// (neutron/api/v2/router.py format suffixes); gophercloud uses it for
	// quota details. A wildcard last segment strips it in pathID.
	for _, r := range rt {
		if !strings.HasSuffix(r.Pattern, "}") && !strings.HasSuffix(r.Pattern, "{$}") && strings.Contains(r.Pattern, "/v2.0/") {
			r.Pattern += ".json"
			rt = append(rt, r)
		}
	}
	return s.notifyWrites(rt)
}

// pathID is a path wildcard without neutron's optional ".json" suffix.
func pathID(r *http.Request, name string) string {
	return strings.TrimSuffix(r.PathValue(name), ".json")
}

// versions is neutron's root document (neutron/api/versions.py).
func (s *Service) versions(r *http.Request) (*api.Response, error) {
	return api.JSON(200, map[string]any{"versions": []any{map[string]any{
		"id": "v2.0", "status": "CURRENT",
		"links": []any{map[string]string{"rel": "self", "href": api.BaseURL(r) + "/v2.0/"}},
	}}}), nil
}

// resources is the v2.0 document listing the collections served
// (neutron/api/v2/router.py and neutron/api/views/versions.py).
func (s *Service) resources(r *http.Request) (*api.Response, error) {
	base := api.BaseURL(r) + "/v2.0/"
	var out []any
	for _, rc := range [][2]string{{"network", "networks"}, {"subnet", "subnets"}, {"port", "ports"},
		{"security_group", "security-groups"}, {"security_group_rule", "security-group-rules"}, {"floatingip", "floatingips"},
		{"router", "routers"}, {"quota", "quotas"}, {"subnetpool", "subnetpools"}} {
		out = append(out, map[string]any{"name": rc[0], "collection": rc[1],
			"links": []any{map[string]string{"rel": "self", "href": base + rc[1]}}})
	}
	return api.JSON(200, map[string]any{"resources": out}), nil
}

type extension struct{ alias, name, desc string }

// extensions are the API extensions this service really implements.
var extensions = []extension{
	{"allowed-address-pairs", "Allowed Address Pairs", "Provides allowed address pairs"},
	{"default-subnetpools", "Default Subnetpools", "Provides ability to mark and use a subnetpool as the default."},
	{"extraroute", "Neutron Extra Route", "Extra routes configuration for L3 router"},
	{"extraroute-atomic", "Atomically add/remove extra routes",
		"Edit extra routes of a router on server side by atomically adding/removing extra routes"},
	{"binding", "Port Binding", "Expose port bindings of a virtual port to external application"},
	{"external-net", "Neutron external network", "Adds external network attribute to network resource."},
	{"filter-validation", "Filter parameters validation", "Provides validation on filter parameters."},
	{"fip-port-details", "Floating IP Port Details Extension", "Add port_details attribute to Floating IP resource"},
	{"ip-substring-filtering", "IP address substring filtering", "Provides IP address substring filtering when listing ports"},
	{"net-mtu", "Network MTU", "Provides MTU attribute for a network resource."},
	{"net-mtu-writable", "Network MTU (writable)", "Provides a writable MTU attribute for a network resource."},
	{"pagination", "Pagination support", "Extension that indicates that pagination is enabled."},
	{"port-security", "Port Security", "Provides port security"},
	{"quotas", "Quota management support", "Expose functions for quotas management per project"},
	{"quota_details", "Quota details management support", "Expose functions for quotas usage statistics per project"},
	{"project-id", "project_id field enabled", "Extension that indicates that project_id field is enabled."},
	{"provider", "Provider Network", "Expose mapping of virtual networks to physical networks"}, // hoststate.go
	{"router", "Neutron L3 Router", "Router abstraction for basic L3 forwarding between L2 Neutron networks and access to external networks via a NAT gateway."},
	{"ext-gw-mode", "Neutron L3 Configurable external gateway mode", "Extension of the router abstraction for specifying whether SNAT should occur on the external gateway"},
	{"security-group", "security-group", "The security groups extension."},
	{"security-groups-rules-belongs-to-default-sg", "Security group rule belongs to the project's default security group",
		"Flag to determine if the security group rule belongs to the project's default security group"},
	{"sorting", "Sorting support", "Extension that indicates that sorting is enabled."},
	{"standard-attr-description", "standard-attr-description", "Extension to add descriptions to standard attributes"},
	{"standard-attr-revisions", "Resource revision numbers", "This extension will display the revision number of neutron resources."},
	{"standard-attr-tag", "Tag support for resources with standard attribute: subnet, trunk, network_segment_range, router, network, policy, subnetpool, port, security_group, floatingip",
		"Enables to set tag on resources with standard attribute."},
	{"standard-attr-timestamp", "Resource timestamps", "Adds created_at and updated_at fields to all Neutron resources that have Neutron standard attributes."},
	{"stateful-security-group", "Stateful security group", "Indicates if the security group is stateful or not"},
	{"subnet_allocation", "Subnet Allocation", "Enables allocation of subnets from a subnet pool"},
	{"l2_adjacency", "L2 Adjacency", "Display L2 Adjacency for Neutron Networks."},
}

func (e extension) view() map[string]any {
	return map[string]any{"alias": e.alias, "name": e.name, "description": e.desc,
		"updated": "2013-01-01T10:00:00-00:00", "links": []any{}}
}

func (s *Service) listExtensions(r *http.Request) (*api.Response, error) {
	out := make([]any, 0, len(extensions))
	for _, e := range extensions {
		out = append(out, e.view())
	}
	return api.JSON(200, map[string]any{"extensions": out}), nil
}

func (s *Service) showExtension(r *http.Request) (*api.Response, error) {
	alias := r.PathValue("alias")
	for _, e := range extensions {
		if e.alias == alias {
			return api.JSON(200, map[string]any{"extension": e.view()}), nil
		}
	}
	return nil, nerr(404, "HTTPNotFound", "Extension with alias %s does not exist", alias)
}

// ---- Contract for compute and the cloud assembly ----

// Bootstrap makes the shared public network and its pool once.
func (s *Service) Bootstrap(ctx context.Context) error {
	owner, err := s.operatorProject(ctx)
	if err != nil {
		return err
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		n := &netRow{ID: newID(), Name: PublicNetwork, ProjectID: owner, AdminStateUp: true, External: true,
			IsDefault: true, PortSecurity: true, MTU: 1450}
		made, err := insertNet(ctx, tx, n, "public")
		if err != nil {
			return err
		}
		if !made {
			subs, err := loadSubnets(ctx, tx, "network_id = (SELECT id FROM networks WHERE builtin = 'public')")
			if err != nil || len(subs) == 0 {
				return err
			}
			return followProvider(ctx, tx, subs[0], s.provider)
		}
		cidr, gw, pools, err := s.provider.subnet()
		if err != nil {
			return err
		}
		sub := &subnetRow{ID: newID(), NetworkID: n.ID, Name: "public-subnet", ProjectID: owner, CIDR: cidr,
			IPVersion: 4, Gateway: &gw, Pools: pools, EnableDHCP: false}
		return insertSubnet(ctx, tx, sub)
	})
}

// operatorProject is the id of identity's "admin" project, "" when there
// is none (or no identity).
func (s *Service) operatorProject(ctx context.Context) (string, error) {
	if s.projects == nil {
		return "", nil
	}
	return s.projects.ProjectID(ctx, "admin")
}

// EnsureDefaults gives a project its default network, subnet and "default"
// security group if it has none; it is idempotent.
func (s *Service) EnsureDefaults(ctx context.Context, projectID string) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := ensureDefaults(ctx, tx, projectID)
		return err
	})
}

// ProjectCreated makes a new project's defaults in the transaction that
// makes the project (identity.ProjectHook), so the operator guide's promise of a
// "private" network and a "default" group holds from its first request.
func (s *Service) ProjectCreated(ctx context.Context, tx *store.Tx, projectID string) error {
	_, err := ensureDefaults(ctx, tx, projectID)
	return err
}

// ensureDefaults makes the project's "default" security group and
// "private" network if missing and returns the network's id.
func ensureDefaults(ctx context.Context, q store.Querier, projectID string) (string, error) {
	if _, err := ensureDefaultSG(ctx, q, projectID); err != nil {
		return "", err
	}
	return ensurePrivateNet(ctx, q, projectID)
}

// ensurePrivateNet makes the project's "private" network and subnet once;
// the builtin key makes a concurrent second insert a no-op.
func ensurePrivateNet(ctx context.Context, q store.Querier, projectID string) (string, error) {
	key := "private:" + projectID
	var id string
	err := q.QueryRow(ctx, "SELECT id FROM networks WHERE builtin = ?", key).Scan(&id)
	if err == nil {
		return id, nil
	}
	if !store.IsNoRows(err) {
		return "", err
	}
	n := &netRow{ID: newID(), Name: PrivateNetwork, ProjectID: projectID, AdminStateUp: true, PortSecurity: true, MTU: 1450}
	made, err := insertNet(ctx, q, n, key)
	if err != nil {
		return "", err
	}
	if !made {
		err := q.QueryRow(ctx, "SELECT id FROM networks WHERE builtin = ?", key).Scan(&id)
		return id, err
	}
	gw := "10.0.0.1"
	sub := &subnetRow{ID: newID(), NetworkID: n.ID, Name: PrivateSubnet, ProjectID: projectID, CIDR: PrivateCIDR,
		IPVersion: 4, Gateway: &gw, Pools: []pool{{"10.0.0.2", "10.0.0.254"}}, EnableDHCP: true}
	return n.ID, insertSubnet(ctx, q, sub)
}

// ensureDefaultSG makes the project's "default" security group with
// neutron's default rules (neutron/db/securitygroups_db.py
// _ensure_default_security_group): egress to anywhere and ingress from
// members of the group, for IPv4 and IPv6.
func ensureDefaultSG(ctx context.Context, q store.Querier, projectID string) (string, error) {
	key := "default:" + projectID
	var id string
	err := q.QueryRow(ctx, "SELECT id FROM security_groups WHERE builtin = ?", key).Scan(&id)
	if err == nil {
		return id, nil
	}
	if !store.IsNoRows(err) {
		return "", err
	}
	id = newID()
	t := now()
	res, err := q.Exec(ctx, `INSERT INTO security_groups (id, name, project_id, description, stateful, builtin, tags,
		created_at, updated_at, revision_number) VALUES (?, 'default', ?, 'Default security group', 1, ?, '[]', ?, ?, 0)
		ON CONFLICT DO NOTHING`, id, projectID, key, t, t)
	if err != nil {
		return "", err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		err := q.QueryRow(ctx, "SELECT id FROM security_groups WHERE builtin = ?", key).Scan(&id)
		return id, err
	}
	for _, eth := range []string{"IPv4", "IPv6"} {
		if err := insertRule(ctx, q, &ruleRow{ID: newID(), SecurityGroupID: id, ProjectID: projectID, Direction: "egress", Ethertype: eth}); err != nil {
			return "", err
		}
		rg := id
		if err := insertRule(ctx, q, &ruleRow{ID: newID(), SecurityGroupID: id, ProjectID: projectID, Direction: "ingress", Ethertype: eth, RemoteGroupID: &rg}); err != nil {
			return "", err
		}
	}
	return id, nil
}

func toNetwork(n *netRow) *Network {
	return &Network{ID: n.ID, Name: n.Name, ProjectID: n.ProjectID, Shared: n.Shared, External: n.External,
		SubnetIDs: append([]string(nil), n.Subnets...)}
}

// GetNetwork returns a network the project may see (its own, shared, or
// external such as "public"), or store.ErrNotFound. Compute should refuse
// an external network that is not shared (Network.External), as Nova's
// _check_external_network_attach does; CreateServerPort refuses it too.
func (s *Service) GetNetwork(ctx context.Context, projectID string, admin bool, id string) (*Network, error) {
	n, err := getNet(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	if !admin && n.ProjectID != projectID && !n.Shared && !n.External {
		return nil, store.ErrNotFound
	}
	return toNetwork(n), nil
}

// AutoNetwork is the network a server gets for networks "auto" or none: the
// project's default network, made if missing.
func (s *Service) AutoNetwork(ctx context.Context, projectID string) (*Network, error) {
	var id string
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		id, err = ensureDefaults(ctx, tx, projectID)
		return err
	})
	if err != nil {
		return nil, err
	}
	n, err := getNet(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	return toNetwork(n), nil
}

// CheckSecurityGroups checks that each name (or id) is a security group of
// the project; an unknown one is an *api.Error 400.
func (s *Service) CheckSecurityGroups(ctx context.Context, projectID string, names []string) error {
	for _, name := range names {
		if name == "default" {
			continue
		}
		var n int
		if err := s.db.QueryRow(ctx, "SELECT COUNT(*) FROM security_groups WHERE project_id = ? AND (id = ? OR name = ?)",
			projectID, name, name).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			// nova/network/security_group_api.py validate_name
			return api.BadRequest("Security group %s not found for project %s.", name, projectID)
		}
	}
	return nil
}

// resolveSGs turns security group names or ids of a project into ids,
// making "default" when needed.
func resolveSGs(ctx context.Context, q store.Querier, projectID string, names []string) ([]string, error) {
	if len(names) == 0 {
		names = []string{"default"}
	}
	var out []string
	seen := map[string]bool{}
	for _, name := range names {
		var id string
		err := q.QueryRow(ctx, "SELECT id FROM security_groups WHERE project_id = ? AND (id = ? OR name = ?) ORDER BY created_at LIMIT 1",
			projectID, name, name).Scan(&id)
		if store.IsNoRows(err) && name == "default" {
			id, err = ensureDefaultSG(ctx, q, projectID)
		}
		if store.IsNoRows(err) {
			return nil, api.BadRequest("Security group %s not found for project %s.", name, projectID)
		}
		if err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

func (s *Service) toPort(ctx context.Context, q store.Querier, p *portRow) (*Port, error) {
	var name string
	if err := q.QueryRow(ctx, "SELECT name FROM networks WHERE id = ?", p.NetworkID).Scan(&name); err != nil {
		return nil, err
	}
	return &Port{ID: p.ID, NetworkID: p.NetworkID, NetworkName: name, MACAddress: p.MAC, DeviceID: p.DeviceID,
		FixedIPs: append([]FixedIP(nil), p.FixedIPs...)}, nil
}

// GetPort returns a port of the project, or store.ErrNotFound.
func (s *Service) GetPort(ctx context.Context, projectID string, admin bool, id string) (*Port, error) {
	p, err := getPortRow(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	if !admin && p.ProjectID != projectID {
		return nil, store.ErrNotFound
	}
	return s.toPort(ctx, s.db, p)
}

// CreateServerPort makes a port on networkID for a server in tx, with an
// address from the network's subnet (fixedIP if given) and the named
// security groups ("default" when none).
func (s *Service) CreateServerPort(ctx context.Context, tx *store.Tx, projectID, networkID, serverID, fixedIP string, securityGroups []string) (*Port, error) {
	// The network's row alone: a create makes a port per server, and
	// getNet's list of subnets is not needed here.
	n, err := scanNet(tx.QueryRow(ctx, "SELECT "+netCols+" FROM networks WHERE id = ?", networkID))
	if store.IsNoRows(err) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if n.External && !n.Shared && n.ProjectID != projectID {
		// nova/network/neutron.py _check_external_network_attach
		return nil, api.Forbidden("It is not allowed to create an interface on external network %s", n.ID)
	}
	sgs, err := resolveSGs(ctx, tx, projectID, securityGroups)
	if err != nil {
		return nil, err
	}
	reqs, err := serverIPRequest(ctx, tx, n, projectID, fixedIP)
	if err != nil {
		return nil, err
	}
	p := &portRow{ID: newID(), NetworkID: n.ID, ProjectID: projectID, Status: "ACTIVE", DeviceID: serverID,
		DeviceOwner: "compute:nova", BoundBy: bindCompute, BoundDevice: serverID, VNIC: "normal", AdminStateUp: true,
		PortSecurity: n.PortSecurity, ServerOwned: true, SecurityGroups: sgs}
	if !p.PortSecurity {
		p.SecurityGroups = []string{}
	}
	if err := insertPort(ctx, tx, p, reqs, ""); err != nil {
		return nil, err
	}
	s.changedAfterCommit(tx) // hoststate.go
	return &Port{ID: p.ID, NetworkID: p.NetworkID, NetworkName: n.Name, MACAddress: p.MAC, DeviceID: p.DeviceID,
		FixedIPs: append([]FixedIP(nil), p.FixedIPs...)}, nil
}

// serverIPRequest is the fixed_ips request for a server's fixed_ip (nil
// for none). Only the network's owner may pick an address, as for the port
// API (create_port:fixed_ips, checkNetOwnerAttrs); compute runs as an admin
// here, so the rule is applied for the server's project. No one gets a
// subnet's gateway: it belongs to the router interface.
func serverIPRequest(ctx context.Context, q store.Querier, n *netRow, projectID, fixedIP string) ([]ipRequest, error) {
	if fixedIP == "" {
		return nil, nil
	}
	if n.ProjectID != projectID {
		return nil, policyDenied("create_port:fixed_ips")
	}
	subs, err := loadSubnets(ctx, q, "network_id = ?", n.ID)
	if err != nil {
		return nil, err
	}
	if ip, err := netip.ParseAddr(fixedIP); err == nil {
		for _, sub := range subs {
			if sub.Gateway != nil && *sub.Gateway == ip.String() {
				// nova/exception.py FixedIpInvalid
				return nil, api.BadRequest("Fixed IP address %s is invalid.", fixedIP)
			}
		}
	}
	return []ipRequest{{IPAddress: fixedIP}}, nil
}

// BindPort attaches an existing port of the server's project to a server
// in tx; a server's ports are only those of its own project, as Nova lists
// them by tenant_id and device_id.
func (s *Service) BindPort(ctx context.Context, tx *store.Tx, projectID, portID, serverID string) error {
	p, err := getPortRow(ctx, tx, portID)
	if err != nil {
		return err
	}
	if p.ProjectID != projectID {
		// nova/exception.py PortNotUsable
		return api.BadRequest("Port %s not usable for instance %s.", portID, serverID)
	}
	if (p.DeviceID != "" && p.DeviceID != serverID) || (p.BoundBy != "" && p.BoundDevice != serverID) {
		// nova/exception.py PortInUse
		return nerr(409, "PortInUse", "Port %s is still in use.", portID)
	}
	s.changedAfterCommit(tx) // hoststate.go
	_, err = tx.Exec(ctx, `UPDATE ports SET device_id = ?, device_owner = 'compute:nova', bound_by = ?, bound_device = ?, releasing = 0,
		status = 'ACTIVE', updated_at = ?, revision_number = revision_number + 1 WHERE id = ?`,
		serverID, bindCompute, serverID, now(), portID)
	return err
}

// AttachPublicIP gives a server's port a floating IP from the public pool, in tx.
func (s *Service) AttachPublicIP(ctx context.Context, tx *store.Tx, projectID, serverID, portID string) (string, error) {
	p, err := getPortRow(ctx, tx, portID)
	if err != nil {
		return "", err
	}
	pub, err := loadNets(ctx, tx, "builtin = 'public'")
	if err != nil {
		return "", err
	}
	if len(pub) == 0 {
		return "", nerr(409, "ExternalNetworkNotFound", "The public network does not exist.")
	}
	f := &fipRow{ID: newID(), ProjectID: projectID, NetworkID: pub[0].ID, ServerID: &serverID}
	s.changedAfterCommit(tx) // hoststate.go
	if err := allocFIP(ctx, tx, f, ""); err != nil {
		var e *api.Error
		if errors.As(err, &e) && e.Type == "IpAddressGenerationFailure" {
			return "", nerr(409, "IpAddressGenerationFailure", "No more public IP addresses are available in the pool of network %s.", PublicNetwork)
		}
		return "", err
	}
	if fixed := firstV4(p.FixedIPs); fixed != "" {
		f.PortID, f.FixedIP = &p.ID, &fixed
		if err := ensurePublicPath(ctx, tx, projectID, v4Subnet(p.FixedIPs), pub[0].ID); err != nil {
			return "", err
		}
	}
	if err := insertFIP(ctx, tx, f); err != nil {
		return "", err
	}
	return f.Address, nil
}

// v4Subnet is the subnet of firstV4's address.
func v4Subnet(ips []FixedIP) string {
	for _, f := range ips {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && a.Is4() {
			return f.SubnetID
		}
	}
	return ""
}

func firstV4(ips []FixedIP) string {
	for _, f := range ips {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && a.Is4() {
			return f.IPAddress
		}
	}
	return ""
}

// ReleaseServer, in tx, deletes the ports made for a server, unbinds ports
// the user brought, and releases the public IPs given with its flavor.
func (s *Service) ReleaseServer(ctx context.Context, tx *store.Tx, serverID string) error {
	s.changedAfterCommit(tx) // hoststate.go
	fips, err := loadFIPs(ctx, tx, "server_id = ?", serverID)
	if err != nil {
		return err
	}
	for _, f := range fips {
		if err := deleteFIP(ctx, tx, f.ID); err != nil {
			return err
		}
	}
	ports, err := loadPorts(ctx, tx, "bound_device = ? AND bound_by = ?", serverID, bindCompute)
	if err != nil {
		return err
	}
	t := now()
	for _, p := range ports {
		if _, err := tx.Exec(ctx, `UPDATE floatingips SET port_id = NULL, fixed_ip_address = NULL, updated_at = ?,
			revision_number = revision_number + 1 WHERE port_id = ?`, t, p.ID); err != nil {
			return err
		}
		if p.ServerOwned {
			if err := deletePortRow(ctx, tx, p.ID); err != nil {
				return err
			}
			continue
		}
		if _, err := tx.Exec(ctx, `UPDATE ports SET device_id = '', device_owner = '', bound_by = '', bound_device = '', releasing = 0,
			status = 'DOWN', updated_at = ?, revision_number = revision_number + 1 WHERE id = ?`, t, p.ID); err != nil {
			return err
		}
	}
	return nil
}

// ServerRef names a server and its project.
type ServerRef struct{ ID, ProjectID string }

// Addresses returns, for each server, Nova's addresses map: network name to
// addresses, fixed before floating. A server's ports are those compute
// bound to it in the server's own project.
func (s *Service) Addresses(ctx context.Context, servers []ServerRef) (map[string]map[string][]Address, error) {
	out := make(map[string]map[string][]Address, len(servers))
	projectOf := make(map[string]string, len(servers))
	ids := make([]any, 0, len(servers))
	for _, sv := range servers {
		if sv.ID != "" {
			projectOf[sv.ID] = sv.ProjectID
			ids = append(ids, sv.ID)
		}
	}
	err := inChunks(ids, func(chunk []any) error {
		// One query per chunk: the ports of the servers with their network
		// name, fixed addresses and floating addresses, in port order.
		rows, err := s.db.Query(ctx, `SELECT p.bound_device, p.project_id, p.id, p.mac_address, n.name, a.ip_address,
				f.floating_ip_address
			FROM ports p JOIN networks n ON n.id = p.network_id
			LEFT JOIN ip_allocations a ON a.owner_id = p.id
			LEFT JOIN floatingips f ON f.port_id = p.id AND f.fixed_ip_address = a.ip_address
			WHERE p.bound_by = ? AND p.bound_device IN (`+marks(len(chunk))+`)
			ORDER BY p.bound_device, p.created_at, p.id, a.seq`, append([]any{bindCompute}, chunk...)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		type portAddrs struct {
			server, net string
			fixed, fl   []Address
		}
		var order []*portAddrs
		byPort := map[string]*portAddrs{}
		for rows.Next() {
			var dev, project, pid, mac, nname string
			var ip, fip *string
			if err := rows.Scan(&dev, &project, &pid, &mac, &nname, &ip, &fip); err != nil {
				return err
			}
			if project != projectOf[dev] {
				continue
			}
			pa := byPort[pid]
			if pa == nil {
				pa = &portAddrs{server: dev, net: nname}
				byPort[pid] = pa
				order = append(order, pa)
			}
			if ip != nil {
				pa.fixed = append(pa.fixed, Address{Addr: *ip, Version: ipVersion(*ip), Type: "fixed", MAC: mac})
			}
			if fip != nil {
				pa.fl = append(pa.fl, Address{Addr: *fip, Version: ipVersion(*fip), Type: "floating", MAC: mac})
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, pa := range order {
			m := out[pa.server]
			if m == nil {
				m = map[string][]Address{}
				out[pa.server] = m
			}
			m[pa.net] = append(append(m[pa.net], pa.fixed...), pa.fl...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func ipVersion(s string) int {
	if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
		return 6
	}
	return 4
}

// ServerPort is one port of a server as a hypervisor needs it: its MAC,
// its first IPv4 address and that address's subnet.
type ServerPort struct {
	ID, NetworkID, MAC, IP, CIDR, Gateway string
	DNS                                   []string
	MTU                                   int
}

// ServerPorts returns a server's ports, those compute bound to it in its
// project, in the order they were made (the first is the primary one), each
// with its first IPv4 fixed address. Every spawn asks: bound_by is written
// into the query, as SQLite re-prepares a statement on each run when a
// parameter is compared with a partial index's column (ports_dhcp_network's
// bound_by), about half this query's cost.
func (s *Service) ServerPorts(ctx context.Context, sv ServerRef) ([]ServerPort, error) {
	rows, err := s.db.Query(ctx, `SELECT p.id, p.network_id, p.mac_address, n.mtu, a.ip_address, sn.cidr,
			COALESCE(sn.gateway_ip, ''), sn.dns_nameservers
		FROM ports p JOIN networks n ON n.id = p.network_id
		LEFT JOIN ip_allocations a ON a.owner_id = p.id
		LEFT JOIN subnets sn ON sn.id = a.subnet_id AND sn.ip_version = 4
		WHERE p.bound_by = '`+bindCompute+`' AND p.bound_device = ? AND p.project_id = ?
		ORDER BY p.created_at, p.id, a.seq`, sv.ID, sv.ProjectID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ServerPort
	seen := map[string]bool{}
	for rows.Next() {
		var p ServerPort
		var ip, cidr, dns *string
		var gw string
		if err := rows.Scan(&p.ID, &p.NetworkID, &p.MAC, &p.MTU, &ip, &cidr, &gw, &dns); err != nil {
			return nil, err
		}
		if seen[p.ID] {
			continue // a later address of a port already taken
		}
		if ip != nil && cidr != nil {
			p.IP, p.CIDR, p.Gateway = *ip, *cidr, gw
			if dns != nil {
				if err := store.FromJSON(*dns, &p.DNS); err != nil {
					return nil, err
				}
			}
		} else if cidr == nil && ip != nil {
			continue // an IPv6 address: wait for the port's IPv4 one
		}
		seen[p.ID] = true
		out = append(out, p)
	}
	return out, rows.Err()
}
