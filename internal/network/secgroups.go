package network

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

var sgFilters = filterableOf(viewKeys((&sgRow{}).view())...)

var ruleFilters = filterableOf(viewKeys((&ruleRow{}).view())...)

func (s *Service) listSGs(r *http.Request) (*api.Response, error) {
	c := caller(r)
	// Listing makes the caller's default group, as neutron's
	// get_security_groups does.
	var have int
	if err := s.db.QueryRow(r.Context(), "SELECT COUNT(*) FROM security_groups WHERE builtin = ?", "default:"+c.ProjectID).Scan(&have); err != nil {
		return nil, err
	}
	if c.ProjectID != "" && have == 0 {
		if err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
			_, err := ensureDefaultSG(r.Context(), tx, c.ProjectID)
			return err
		}); err != nil {
			return nil, err
		}
	}
	where, args := "1 = 1", []any{}
	if !c.IsAdmin() {
		where, args = "project_id = ?", []any{c.ProjectID}
	}
	gs, err := loadSGs(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	items := make([]map[string]any, 0, len(gs))
	for _, g := range gs {
		items = append(items, g.view())
	}
	return render(r, "security_groups", items, sgFilters)
}

func ownedSG(ctx context.Context, q store.Querier, c *api.Caller, id string) (*sgRow, error) {
	gs, err := loadSGs(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(gs) == 0 || (!c.IsAdmin() && gs[0].ProjectID != c.ProjectID) {
		return nil, errSGNotFound(id)
	}
	return gs[0], nil
}

func (s *Service) showSG(r *http.Request) (*api.Response, error) {
	g, err := ownedSG(r.Context(), s.db, caller(r), pathID(r, "id"))
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "security_group", g.view()), nil
}

var sgCreateAttrs = []string{"name", "description", "tenant_id", "project_id", "stateful"}

func (s *Service) prepareSG(r *http.Request, c *api.Caller, b body) (*prepared, error) {
	var err error
	g := &sgRow{ID: newID(), Stateful: true, Tags: []string{}}
	if g.ProjectID, err = projectFor(c, b, "security_group"); err != nil {
		return nil, err
	}
	if g.Name, _, err = b.str("name", 255); err != nil {
		return nil, err
	}
	if g.Description, _, err = b.str("description", 255); err != nil {
		return nil, err
	}
	if v, ok, err := b.boolean("stateful"); err != nil {
		return nil, err
	} else if ok {
		g.Stateful = v
	}
	if g.Name == "default" {
		// neutron/db/securitygroups_db.py create_security_group
		return nil, nerr(409, "SecurityGroupDefaultAlreadyExists", "Default security group already exists.")
	}
	insert := func(tx *store.Tx) error {
		if _, err := ensureDefaultSG(r.Context(), tx, g.ProjectID); err != nil {
			return err
		}
		if err := checkQuota(r.Context(), tx, g.ProjectID, "security_group"); err != nil {
			return err
		}
		t := now()
		g.CreatedAt, g.UpdatedAt = t, t
		if _, err := tx.Exec(r.Context(), `INSERT INTO security_groups (id, name, project_id, description, stateful, tags,
			created_at, updated_at, revision_number) VALUES (?, ?, ?, ?, ?, '[]', ?, ?, 0)`,
			g.ID, g.Name, g.ProjectID, g.Description, b2i(g.Stateful), t, t); err != nil {
			return err
		}
		// A new group allows all egress (securitygroups_db.py
		// create_security_group with default_sg=False).
		for _, eth := range []string{"IPv4", "IPv6"} {
			rl := &ruleRow{ID: newID(), SecurityGroupID: g.ID, ProjectID: g.ProjectID, Direction: "egress", Ethertype: eth}
			if err := insertRule(r.Context(), tx, rl); err != nil {
				return err
			}
			g.Rules = append(g.Rules, rl)
		}
		return nil
	}
	return &prepared{insert: insert, view: g.view}, nil
}

func (s *Service) updateSG(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "security_group", "name", "description", "stateful")
	if err != nil {
		return nil, err
	}
	var g *sgRow
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		var err error
		if g, err = ownedSG(r.Context(), tx, c, pathID(r, "id")); err != nil {
			return err
		}
		if v, ok, err := b.str("name", 255); err != nil {
			return err
		} else if ok && v != g.Name {
			if g.Default {
				return nerr(409, "SecurityGroupCannotUpdateDefault", "Updating default security group not allowed.")
			}
			if v == "default" {
				return nerr(409, "SecurityGroupDefaultAlreadyExists", "Default security group already exists.")
			}
			g.Name = v
		}
		if v, ok, err := b.str("description", 255); err != nil {
			return err
		} else if ok {
			g.Description = v
		}
		if v, ok, err := b.boolean("stateful"); err != nil {
			return err
		} else if ok && v != g.Stateful {
			var n int
			if err := tx.QueryRow(r.Context(), "SELECT COUNT(*) FROM port_security_groups WHERE security_group_id = ?", g.ID).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nerr(409, "SecurityGroupInUse", "Security Group %s in use.", g.ID)
			}
			g.Stateful = v
		}
		g.UpdatedAt = now()
		if err := checkRevision(r, g.Revision); err != nil {
			return err
		}
		g.Revision++
		_, err = tx.Exec(r.Context(), `UPDATE security_groups SET name = ?, description = ?, stateful = ?, updated_at = ?,
			revision_number = ? WHERE id = ?`, g.Name, g.Description, b2i(g.Stateful), g.UpdatedAt, g.Revision, g.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "security_group", g.view()), nil
}

func (s *Service) deleteSG(r *http.Request) (*api.Response, error) {
	c := caller(r)
	err := afterReleases(r.Context(), func() error {
		return s.db.Tx(r.Context(), func(tx *store.Tx) error {
			g, err := ownedSG(r.Context(), tx, c, pathID(r, "id"))
			if err != nil {
				return err
			}
			if g.Default && !c.IsAdmin() {
				return nerr(409, "SecurityGroupCannotRemoveDefault", "Insufficient rights for removing default security group.")
			}
			var n, releasing int
			if err := tx.QueryRow(r.Context(), `SELECT COUNT(*), COALESCE(SUM(p.releasing), 0) FROM port_security_groups psg
			JOIN ports p ON p.id = psg.port_id WHERE psg.security_group_id = ?`, g.ID).Scan(&n, &releasing); err != nil {
				return err
			}
			if n > 0 {
				// neutron/extensions/securitygroup.py SecurityGroupInUse
				return inUse(n, releasing, nerr(409, "SecurityGroupInUse", "Security Group %s in use.", g.ID))
			}
			for _, q := range []string{"DELETE FROM security_group_rules WHERE security_group_id = ? OR remote_group_id = ?"} {
				if _, err := tx.Exec(r.Context(), q, g.ID, g.ID); err != nil {
					return err
				}
			}
			_, err = tx.Exec(r.Context(), "DELETE FROM security_groups WHERE id = ?", g.ID)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}

// ---- rules ----

func (rl *ruleRow) fingerprint() string {
	f := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	i := func(p *int) string {
		if p == nil {
			return ""
		}
		return strconv.Itoa(*p)
	}
	return strings.Join([]string{rl.Direction, rl.Ethertype, f(rl.Protocol), i(rl.PortMin), i(rl.PortMax),
		f(rl.RemoteIPPrefix), f(rl.RemoteGroupID)}, "|")
}

func insertRule(ctx context.Context, q store.Querier, rl *ruleRow) error {
	t := now()
	rl.CreatedAt, rl.UpdatedAt = t, t
	_, err := q.Exec(ctx, `INSERT INTO security_group_rules (id, security_group_id, project_id, direction, ethertype,
		protocol, port_range_min, port_range_max, remote_ip_prefix, remote_group_id, description, fingerprint,
		created_at, updated_at, revision_number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)`,
		rl.ID, rl.SecurityGroupID, rl.ProjectID, rl.Direction, rl.Ethertype, rl.Protocol, rl.PortMin, rl.PortMax,
		rl.RemoteIPPrefix, rl.RemoteGroupID, rl.Description, rl.fingerprint(), t, t)
	return err
}

func (s *Service) visibleRules(ctx context.Context, c *api.Caller, where string, args ...any) ([]*ruleRow, error) {
	if !c.IsAdmin() {
		where = "(" + where + ") AND project_id = ?"
		args = append(args, c.ProjectID)
	}
	rules, err := loadRules(ctx, s.db, where, args...)
	if err != nil || len(rules) == 0 {
		return rules, err
	}
	def := map[string]bool{}
	rows, err := s.db.Query(ctx, "SELECT id FROM security_groups WHERE builtin IS NOT NULL")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		def[id] = true
	}
	for _, r := range rules {
		r.defaultSG = def[r.SecurityGroupID]
	}
	return rules, rows.Err()
}

func (s *Service) listRules(r *http.Request) (*api.Response, error) {
	c := caller(r)
	where, args := "1 = 1", []any{}
	if id := r.URL.Query().Get("security_group_id"); id != "" {
		where, args = "security_group_id = ?", []any{id}
	}
	rules, err := s.visibleRules(r.Context(), c, where, args...)
	if err != nil {
		return nil, err
	}
	items := make([]map[string]any, 0, len(rules))
	for _, rl := range rules {
		items = append(items, rl.view())
	}
	return render(r, "security_group_rules", items, ruleFilters)
}

func (s *Service) showRule(r *http.Request) (*api.Response, error) {
	id := pathID(r, "id")
	rules, err := s.visibleRules(r.Context(), caller(r), "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(rules) == 0 {
		return nil, errRuleNotFound(id)
	}
	return showOne(r, 200, "security_group_rule", rules[0].view()), nil
}

// protocolNumbers are neutron_lib/constants.py IP_PROTOCOL_MAP names.
var protocolNumbers = map[string]int{
	"ah": 51, "dccp": 33, "egp": 8, "esp": 50, "gre": 47, "hopopt": 0, "icmp": 1, "igmp": 2, "ip": 0, "ipip": 4,
	"ipv6-encap": 41, "ipv6-frag": 44, "ipv6-icmp": 58, "icmpv6": 58, "ipv6-nonxt": 59, "ipv6-opts": 60,
	"ipv6-route": 43, "ospf": 89, "pgm": 113, "rsvp": 46, "sctp": 132, "tcp": 6, "udp": 17, "udplite": 136, "vrrp": 112,
}

func ruleErr(format string, args ...any) *api.Error {
	return nerr(400, "HTTPBadRequest", format, args...)
}

var ruleCreateAttrs = []string{"security_group_id", "direction", "ethertype", "protocol",
	"port_range_min", "port_range_max", "remote_ip_prefix", "remote_group_id", "description", "tenant_id",
	"project_id", "remote_address_group_id"}

func (s *Service) prepareRule(r *http.Request, c *api.Caller, b body) (*prepared, error) {
	var err error
	rl := &ruleRow{ID: newID(), Ethertype: "IPv4"}
	if rl.ProjectID, err = projectFor(c, b, "security_group_rule"); err != nil {
		return nil, err
	}
	sgID, ok, err := b.uuidAttr("security_group_id")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ruleErr("Failed to parse request. Required attribute 'security_group_id' not specified")
	}
	rl.SecurityGroupID = sgID
	dir, ok, err := b.str("direction", 16)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ruleErr("Failed to parse request. Required attribute 'direction' not specified")
	}
	if dir != "ingress" && dir != "egress" {
		return nil, ruleErr("Invalid input for direction. Reason: %s is not in valid_values ['ingress', 'egress'].", dir)
	}
	rl.Direction = dir
	if v, ok, err := b.optStr("ethertype"); err != nil {
		return nil, err
	} else if ok && v != nil {
		switch strings.ToLower(*v) {
		case "ipv4":
			rl.Ethertype = "IPv4"
		case "ipv6":
			rl.Ethertype = "IPv6"
		default:
			return nil, nerr(400, "SecurityGroupRuleInvalidEtherType", "Security group rule for ethertype '%s' not supported. Allowed values are ['IPv4', 'IPv6'].", *v)
		}
	}
	if rl.Description, _, err = b.str("description", 255); err != nil {
		return nil, err
	}
	if rl.Protocol, err = ruleProtocol(b); err != nil {
		return nil, err
	}
	if rl.PortMin, _, err = b.integer("port_range_min"); err != nil {
		return nil, err
	}
	if rl.PortMax, _, err = b.integer("port_range_max"); err != nil {
		return nil, err
	}
	for _, v := range []*int{rl.PortMin, rl.PortMax} {
		// neutron/extensions/securitygroup.py convert_validate_port_value,
		// applied to both bounds before the range is looked at.
		if v != nil && (*v < 0 || *v > 65535) {
			return nil, errPortValue(*v)
		}
	}
	if err := checkRulePorts(rl); err != nil {
		return nil, err
	}
	if rl.RemoteIPPrefix, err = rulePrefix(b, rl.Ethertype); err != nil {
		return nil, err
	}
	// Neutron does not check the form of remote_group_id: any unknown value,
	// well-formed or not, is SecurityGroupNotFound (tempest
	// test_create_security_group_rule_with_non_existent_remote_groupid).
	if v, ok, err := b.optStr("remote_group_id"); err != nil {
		return nil, err
	} else if ok && v != nil {
		rl.RemoteGroupID = v
	}
	if v, ok, err := b.optStr("remote_address_group_id"); err != nil {
		return nil, err
	} else if ok && v != nil {
		return nil, nerr(404, "AddressGroupNotFound", "Address group %s could not be found.", *v)
	}
	if rl.RemoteIPPrefix != nil && rl.RemoteGroupID != nil {
		return nil, nerr(400, "SecurityGroupRemoteGroupAndRemoteIpPrefix", "Only remote_ip_prefix or remote_group_id may be provided.")
	}
	insert := func(tx *store.Tx) error { return addRule(r.Context(), tx, c, rl) }
	return &prepared{insert: insert, view: rl.view}, nil
}

// ruleProtocol reads a rule's protocol: a name, a number 0-255 as a
// string or an integer; nil for null, "", "any" or none.
func ruleProtocol(b body) (*string, error) {
	raw, ok := b["protocol"]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	var x any
	_ = json.Unmarshal(raw, &x)
	var proto string
	switch t := x.(type) {
	case string:
		proto = strings.ToLower(t)
	case float64:
		proto = strconv.Itoa(int(t))
	default:
		return nil, nerr(400, "SecurityGroupRuleInvalidProtocol", "Security group rule protocol %s not supported.", string(raw))
	}
	if proto != "" && proto != "any" {
		if n, err := strconv.Atoi(proto); err == nil {
			if n < 0 || n > 255 {
				return nil, nerr(400, "SecurityGroupRuleInvalidProtocol", "Security group rule protocol %s not supported. Only protocol values [None, ah, dccp, egp, esp, gre, icmp, icmpv6, igmp, ipip, ipv6-encap, ipv6-frag, ipv6-icmp, ipv6-nonxt, ipv6-opts, ipv6-route, ospf, pgm, rsvp, sctp, tcp, udp, udplite, vrrp] and integer representations [0 to 255] are supported.", proto)
			}
		} else if _, ok := protocolNumbers[proto]; !ok {
			return nil, nerr(400, "SecurityGroupRuleInvalidProtocol", "Security group rule protocol %s not supported. Only protocol values [None, ah, dccp, egp, esp, gre, icmp, icmpv6, igmp, ipip, ipv6-encap, ipv6-frag, ipv6-icmp, ipv6-nonxt, ipv6-opts, ipv6-route, ospf, pgm, rsvp, sctp, tcp, udp, udplite, vrrp] and integer representations [0 to 255] are supported.", proto)
		}
		return &proto, nil
	}
	return nil, nil
}

// rulePrefix reads a rule's remote_ip_prefix, a CIDR or an address, of
// the rule's ethertype, as Neutron stores it.
func rulePrefix(b body, ethertype string) (*string, error) {
	v, ok, err := b.optStr("remote_ip_prefix")
	if err != nil || !ok || v == nil {
		return nil, err
	}
	p, err := netip.ParsePrefix(*v)
	if err != nil {
		a, err2 := netip.ParseAddr(*v)
		if err2 != nil {
			return nil, ruleErr("Invalid input for remote_ip_prefix. Reason: '%s' is not a valid IP subnet.", *v)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4() != (ethertype == "IPv4") {
		return nil, nerr(400, "SecurityGroupRuleParameterConflict", "Conflicting value ethertype %s for CIDR %s", ethertype, *v)
	}
	ps := p.String()
	return &ps, nil
}

// addRule records rl in tx on a group c may change, within the project's
// quota, unless the group has the same rule (Neutron's 409).
func addRule(ctx context.Context, tx *store.Tx, c *api.Caller, rl *ruleRow) error {
	g, err := ownedSG(ctx, tx, c, rl.SecurityGroupID)
	if err != nil {
		return err
	}
	rl.defaultSG = g.Default
	if !c.IsAdmin() {
		rl.ProjectID = g.ProjectID
	}
	if rl.RemoteGroupID != nil {
		if _, err := ownedSG(ctx, tx, c, *rl.RemoteGroupID); err != nil {
			return err
		}
	}
	if err := checkQuota(ctx, tx, rl.ProjectID, "security_group_rule"); err != nil {
		return err
	}
	fp := rl.fingerprint()
	for _, o := range g.Rules {
		if o.fingerprint() == fp {
			// neutron/extensions/securitygroup.py SecurityGroupRuleExists
			return nerr(409, "SecurityGroupRuleExists", "Security group rule already exists. Rule id is %s.", o.ID)
		}
	}
	if err := insertRule(ctx, tx, rl); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "UPDATE security_groups SET revision_number = revision_number + 1, updated_at = ? WHERE id = ?", now(), g.ID)
	return err
}

func errPortValue(v int) *api.Error {
	return nerr(400, "SecurityGroupInvalidPortValue", "Invalid value for port %d.", v)
}

// checkRulePorts validates port ranges as neutron's _validate_port_range
// (neutron/db/securitygroups_db.py) does: a port protocol needs both bounds,
// neither 0 and min <= max; ICMP's type and code are 0-255 and a code needs
// a type.
func checkRulePorts(rl *ruleRow) error {
	if rl.PortMin == nil && rl.PortMax == nil {
		return nil
	}
	if rl.Protocol == nil {
		return nerr(400, "SecurityGroupProtocolRequiredWithPorts", "Must also specify protocol if port range is given.")
	}
	switch *rl.Protocol {
	case "tcp", "udp", "sctp", "dccp", "udplite", "6", "17", "132", "33", "136":
		if (rl.PortMin != nil && *rl.PortMin == 0) || (rl.PortMax != nil && *rl.PortMax == 0) {
			return errPortValue(0)
		}
		if rl.PortMin == nil || rl.PortMax == nil || *rl.PortMin > *rl.PortMax {
			return nerr(400, "SecurityGroupInvalidPortRange", "For TCP/UDP protocols, port_range_min must be <= port_range_max")
		}
	case "icmp", "icmpv6", "ipv6-icmp", "1", "58":
		for _, f := range []struct {
			v           *int
			field, attr string
		}{{rl.PortMin, "type", "port_range_min"}, {rl.PortMax, "code", "port_range_max"}} {
			if f.v != nil && *f.v > 255 {
				return nerr(400, "SecurityGroupInvalidIcmpValue", "Invalid value for ICMP %s (%s) %d. It must be 0 to 255.", f.field, f.attr, *f.v)
			}
		}
		if rl.PortMin == nil && rl.PortMax != nil {
			return nerr(400, "SecurityGroupMissingIcmpType", "ICMP code (port-range-max) %d is provided but ICMP type (port-range-min) is missing.", *rl.PortMax)
		}
	default:
		return nerr(400, "SecurityGroupInvalidProtocolForPort", "Ports cannot be specified for protocol %s.", *rl.Protocol)
	}
	return nil
}

func (s *Service) deleteRule(r *http.Request) (*api.Response, error) {
	c := caller(r)
	id := pathID(r, "id")
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		rules, err := loadRules(r.Context(), tx, "id = ?", id)
		if err != nil {
			return err
		}
		if len(rules) == 0 || (!c.IsAdmin() && rules[0].ProjectID != c.ProjectID) {
			return errRuleNotFound(id)
		}
		if _, err := tx.Exec(r.Context(), "DELETE FROM security_group_rules WHERE id = ?", id); err != nil {
			return err
		}
		_, err = tx.Exec(r.Context(), "UPDATE security_groups SET revision_number = revision_number + 1, updated_at = ? WHERE id = ?", now(), rules[0].SecurityGroupID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}
