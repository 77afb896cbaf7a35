package network

import (
	"cmp"
	"context"
	"database/sql"
	"math"
	"net/http"
	"net/netip"
	"slices"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Subnet pools (Neutron's subnet_allocation and default-subnetpools
// extensions): prefixes a project carves subnets from, by size
// (prefixlen) or by CIDR. A pool's allocations are the CIDRs of the
// subnets that name it, so deleting a subnet frees its prefix.

// spRow is a row of the subnetpools table.
type spRow struct {
	ID, Name, ProjectID, Description string
	IPVersion                        int
	Prefixes                         []string
	DefaultLen, MinLen, MaxLen       int
	Quota                            *int
	Shared, IsDefault                bool
	Tags                             []string
	CreatedAt, UpdatedAt             string
	Revision                         int64
}

func loadPools(ctx context.Context, q store.Querier, where string, args ...any) ([]*spRow, error) {
	rows, err := q.Query(ctx, `SELECT id, name, project_id, description, ip_version, prefixes, default_prefixlen,
		min_prefixlen, max_prefixlen, default_quota, shared, is_default, tags, created_at, updated_at, revision_number
		FROM subnetpools WHERE `+where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*spRow
	for rows.Next() {
		var sp spRow
		var prefixes, tags string
		var quota sql.NullInt64
		var shared, def int
		if err := rows.Scan(&sp.ID, &sp.Name, &sp.ProjectID, &sp.Description, &sp.IPVersion, &prefixes, &sp.DefaultLen,
			&sp.MinLen, &sp.MaxLen, &quota, &shared, &def, &tags, &sp.CreatedAt, &sp.UpdatedAt, &sp.Revision); err != nil {
			return nil, err
		}
		if err := store.FromJSON(prefixes, &sp.Prefixes); err != nil {
			return nil, err
		}
		if quota.Valid {
			n := int(quota.Int64)
			sp.Quota = &n
		}
		sp.Shared, sp.IsDefault, sp.Tags = shared == 1, def == 1, tagsOf(tags)
		out = append(out, &sp)
	}
	return out, rows.Err()
}

func (sp *spRow) view() map[string]any {
	return map[string]any{
		"id": sp.ID, "name": sp.Name, "project_id": sp.ProjectID, "tenant_id": sp.ProjectID,
		"description": sp.Description, "ip_version": sp.IPVersion, "prefixes": sp.Prefixes,
		"default_prefixlen": sp.DefaultLen, "min_prefixlen": sp.MinLen, "max_prefixlen": sp.MaxLen,
		"default_quota": sp.Quota, "shared": sp.Shared, "is_default": sp.IsDefault, "address_scope_id": nil,
		"tags": sp.Tags, "created_at": neutronTime(sp.CreatedAt), "updated_at": neutronTime(sp.UpdatedAt),
		"revision_number": sp.Revision,
	}
}

var poolFilters = filterableOf(viewKeys((&spRow{}).view())...)

func errPoolNotFound(id string) *api.Error {
	return nerr(404, "SubnetPoolNotFound", "Subnet pool %s could not be found.", id)
}

// visiblePools is the SQL condition for the pools a project sees: its own
// and shared ones (neutron/conf/policies/subnetpool.py get_subnetpool).
const visiblePools = "(project_id = ? OR shared = 1)"

// visiblePool loads a pool the caller may see, or SubnetPoolNotFound.
func visiblePool(ctx context.Context, q store.Querier, c *api.Caller, id string) (*spRow, error) {
	l, err := loadPools(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 || (!c.IsAdmin() && l[0].ProjectID != c.ProjectID && !l[0].Shared) {
		return nil, errPoolNotFound(id)
	}
	return l[0], nil
}

// ownedPool loads a pool the caller may change: a project sees a shared
// pool but only its owner or an admin changes it.
func ownedPool(ctx context.Context, q store.Querier, c *api.Caller, id, action string) (*spRow, error) {
	sp, err := visiblePool(ctx, q, c, id)
	if err == nil && !c.IsAdmin() && sp.ProjectID != c.ProjectID {
		return nil, policyDenied(action + "_subnetpool")
	}
	return sp, err
}

func poolRoutes(s *Service) []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.0/subnetpools", Handler: s.listPools},
		{Pattern: "POST /v2.0/subnetpools", Handler: s.creator("subnetpool", "subnetpools", poolCreateAttrs, s.preparePool)},
		{Pattern: "GET /v2.0/subnetpools/{id}", Handler: s.showPool},
		{Pattern: "PUT /v2.0/subnetpools/{id}", Handler: s.updatePool},
		{Pattern: "DELETE /v2.0/subnetpools/{id}", Handler: s.deletePool},
	}
}

func (s *Service) listPools(r *http.Request) (*api.Response, error) {
	c := caller(r)
	where, args := "1 = 1", []any{}
	if !c.IsAdmin() {
		where, args = visiblePools, []any{c.ProjectID}
	}
	l, err := loadPools(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	items := make([]map[string]any, 0, len(l))
	for _, sp := range l {
		items = append(items, sp.view())
	}
	return render(r, "subnetpools", items, poolFilters)
}

func (s *Service) showPool(r *http.Request) (*api.Response, error) {
	sp, err := visiblePool(r.Context(), s.db, caller(r), pathID(r, "id"))
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "subnetpool", sp.view()), nil
}

var poolCreateAttrs = []string{"name", "description", "prefixes", "default_prefixlen", "min_prefixlen", "max_prefixlen",
	"default_quota", "shared", "is_default", "address_scope_id", "tenant_id", "project_id"}

// poolAttrs applies the writable pool attributes of b to sp; prefixes, the
// IP version and the bounds are checked afterwards by checkPool.
func poolAttrs(c *api.Caller, b body, sp *spRow, action string) error {
	if v, ok, err := b.str("name", 255); err != nil {
		return err
	} else if ok {
		if v == "" {
			return nerr(400, "HTTPBadRequest", "Invalid input for name. Reason: '' Blank strings are not permitted.")
		}
		sp.Name = v
	}
	if v, ok, err := b.str("description", 255); err != nil {
		return err
	} else if ok {
		sp.Description = v
	}
	for k, dst := range map[string]*int{"default_prefixlen": &sp.DefaultLen, "min_prefixlen": &sp.MinLen, "max_prefixlen": &sp.MaxLen} {
		if v, ok, err := nonNegative(b, k); err != nil {
			return err
		} else if ok {
			*dst = v
		}
	}
	if v, ok, err := nonNegative(b, "default_quota"); err != nil {
		return err
	} else if ok {
		sp.Quota = &v
	}
	if v, ok, err := b.boolean("is_default"); err != nil {
		return err
	} else if ok && v != sp.IsDefault {
		if !c.IsAdmin() {
			return policyDenied(action + "_subnetpool:is_default")
		}
		sp.IsDefault = v
	}
	// Address scopes are not served: only "none" is a valid scope.
	if v, _, err := b.optUUID("address_scope_id"); err != nil {
		return err
	} else if v != nil {
		return nerr(404, "AddressScopeNotFound", "Address scope %s could not be found.", *v)
	}
	return nil
}

// nonNegative reads neutron's convert_to_int + type:non_negative attribute.
func nonNegative(b body, k string) (int, bool, error) {
	if b.isNull(k) {
		return 0, true, invalid(k, b[k], "'None' is not an integer")
	}
	v, ok, err := b.integer(k)
	if err != nil || !ok {
		return 0, ok, err
	}
	if *v < 0 {
		return 0, true, nerr(400, "HTTPBadRequest", "Invalid input for %s. Reason: '%d' should be non-negative.", k, *v)
	}
	return *v, true, nil
}

// readPrefixes reads a prefixes attribute (type:subnet_list) and returns
// it compacted; the IP version is that of the first prefix.
func readPrefixes(b body) ([]netip.Prefix, error) {
	l, _, err := b.strList("prefixes")
	if err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, nerr(400, "EmptySubnetPoolPrefixList", "Empty subnet pool prefix list.")
	}
	seen := map[string]bool{}
	var ps []netip.Prefix
	for _, s := range l {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, nerr(400, "HTTPBadRequest", "Invalid input for prefixes. Reason: '%s' is not a valid IP subnet.", s)
		}
		if p.Addr().Is4() && p.Masked() != p {
			return nil, nerr(400, "HTTPBadRequest", "Invalid input for prefixes. Reason: '%s' isn't a recognized IP subnet cidr, '%s' is recommended.", s, p.Masked())
		}
		if seen[s] {
			return nil, nerr(400, "HTTPBadRequest", "Invalid input for prefixes. Reason: Duplicate items in the list: '%s'.", s)
		}
		seen[s] = true
		if len(ps) > 0 && ps[0].Addr().Is4() != p.Addr().Is4() {
			return nil, nerr(400, "PrefixVersionMismatch", "Cannot mix IPv4 and IPv6 prefixes in a subnet pool.")
		}
		ps = append(ps, p.Masked())
	}
	return compact(ps), nil
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func parsePrefixes(l []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range l {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// checkBounds is neutron's SubnetPoolHelper validation of the prefix
// length bounds (neutron/ipam/subnet_alloc.py).
func checkBounds(sp *spRow) error {
	bounds := func(typ string, n int, base string, m int) error {
		return nerr(400, "IllegalSubnetPoolPrefixBounds", "Illegal prefix bounds: %s=%d, %s=%d.", typ, n, base, m)
	}
	maxBits := 32
	if sp.IPVersion == 6 {
		maxBits = 128
	}
	switch {
	case sp.MinLen > sp.MaxLen:
		return bounds("min_prefixlen", sp.MinLen, "max_prefixlen", sp.MaxLen)
	case sp.MaxLen > maxBits:
		return bounds("max_prefixlen", sp.MaxLen, "ip_version_max", maxBits)
	case sp.DefaultLen < sp.MinLen:
		return bounds("default_prefixlen", sp.DefaultLen, "min_prefixlen", sp.MinLen)
	case sp.DefaultLen > sp.MaxLen:
		return bounds("default_prefixlen", sp.DefaultLen, "max_prefixlen", sp.MaxLen)
	}
	return nil
}

// checkOneDefault refuses a second default pool of an IP version
// (db_base_plugin_v2.py _check_default_subnetpool_exists).
func checkOneDefault(ctx context.Context, q store.Querier, sp *spRow) error {
	if !sp.IsDefault {
		return nil
	}
	var n int
	if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM subnetpools WHERE is_default = 1 AND ip_version = ? AND id <> ?",
		sp.IPVersion, sp.ID).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return badInput("A default subnetpool for this IP family has already been set. Only one default may exist per IP family")
	}
	return nil
}

func (s *Service) preparePool(r *http.Request, c *api.Caller, b body) (*prepared, error) {
	var err error
	sp := &spRow{ID: newID(), Tags: []string{}}
	if sp.ProjectID, err = projectFor(c, b, "subnetpool"); err != nil {
		return nil, err
	}
	for _, k := range []string{"name", "prefixes"} {
		if !b.has(k) {
			return nil, nerr(400, "HTTPBadRequest", "Failed to parse request. Required attribute '%s' not specified", k)
		}
	}
	ps, err := readPrefixes(b)
	if err != nil {
		return nil, err
	}
	sp.Prefixes, sp.IPVersion = prefixStrings(ps), 4
	sp.MinLen, sp.MaxLen = 8, 32
	if ps[0].Addr().Is6() {
		sp.IPVersion, sp.MinLen, sp.MaxLen = 6, 64, 128
	}
	// default_prefixlen defaults to the minimum as given or defaulted.
	sp.DefaultLen = -1
	if sp.Shared, _, err = b.boolean("shared"); err != nil {
		return nil, err
	}
	if sp.Shared && !c.IsAdmin() {
		return nil, policyDenied("create_subnetpool:shared")
	}
	if err := poolAttrs(c, b, sp, "create"); err != nil {
		return nil, err
	}
	if sp.DefaultLen < 0 {
		sp.DefaultLen = sp.MinLen
	}
	if err := checkBounds(sp); err != nil {
		return nil, err
	}
	insert := func(tx *store.Tx) error {
		if err := checkOneDefault(r.Context(), tx, sp); err != nil {
			return err
		}
		t := now()
		sp.CreatedAt, sp.UpdatedAt = t, t
		_, err := tx.Exec(r.Context(), `INSERT INTO subnetpools (id, name, project_id, description, ip_version, prefixes,
			default_prefixlen, min_prefixlen, max_prefixlen, default_quota, shared, is_default, tags, created_at, updated_at,
			revision_number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '[]', ?, ?, 0)`,
			sp.ID, sp.Name, sp.ProjectID, sp.Description, sp.IPVersion, store.JSON(sp.Prefixes), sp.DefaultLen, sp.MinLen,
			sp.MaxLen, sp.Quota, b2i(sp.Shared), b2i(sp.IsDefault), t, t)
		return err
	}
	return &prepared{insert: insert, view: sp.view}, nil
}

func (s *Service) updatePool(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "subnetpool", "name", "description", "prefixes", "default_prefixlen", "min_prefixlen",
		"max_prefixlen", "default_quota", "is_default", "address_scope_id", "shared", "ip_version")
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"shared", "ip_version"} {
		if b.has(k) {
			return nil, nerr(400, "HTTPBadRequest", "Cannot update read-only attribute %s", k)
		}
	}
	var sp *spRow
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		if sp, err = ownedPool(r.Context(), tx, c, pathID(r, "id"), "update"); err != nil {
			return err
		}
		if b.has("prefixes") {
			ps, err := readPrefixes(b)
			if err != nil {
				return err
			}
			if ps[0].Addr().Is4() != (sp.IPVersion == 4) {
				return nerr(400, "PrefixVersionMismatch", "Cannot mix IPv4 and IPv6 prefixes in a subnet pool.")
			}
			// Prefixes only grow (db_base_plugin_v2.py _update_subnetpool_dict).
			merged := compact(append(slices.Clone(ps), parsePrefixes(sp.Prefixes)...))
			if !slices.Equal(merged, ps) {
				return nerr(400, "IllegalSubnetPoolPrefixUpdate", "Illegal update to prefixes: Existing prefixes must be a subset of the new prefixes.")
			}
			sp.Prefixes = prefixStrings(ps)
		}
		if err := poolAttrs(c, b, sp, "update"); err != nil {
			return err
		}
		if err := checkBounds(sp); err != nil {
			return err
		}
		if err := checkOneDefault(r.Context(), tx, sp); err != nil {
			return err
		}
		sp.UpdatedAt = now()
		if err := checkRevision(r, sp.Revision); err != nil {
			return err
		}
		sp.Revision++
		_, err = tx.Exec(r.Context(), `UPDATE subnetpools SET name = ?, description = ?, prefixes = ?, default_prefixlen = ?,
			min_prefixlen = ?, max_prefixlen = ?, default_quota = ?, is_default = ?, updated_at = ?, revision_number = ?
			WHERE id = ?`, sp.Name, sp.Description, store.JSON(sp.Prefixes), sp.DefaultLen, sp.MinLen, sp.MaxLen, sp.Quota,
			b2i(sp.IsDefault), sp.UpdatedAt, sp.Revision, sp.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "subnetpool", sp.view()), nil
}

func (s *Service) deletePool(r *http.Request) (*api.Response, error) {
	c := caller(r)
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		sp, err := ownedPool(r.Context(), tx, c, pathID(r, "id"), "delete")
		if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(r.Context(), "SELECT COUNT(*) FROM subnets WHERE subnetpool_id = ?", sp.ID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nerr(400, "SubnetPoolDeleteError", "Unable to delete subnet pool: Subnet pool has existing allocations.")
		}
		_, err = tx.Exec(r.Context(), "DELETE FROM subnetpools WHERE id = ?", sp.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}

// ---- allocation ----

// poolRequest is what a subnet create asks of a pool: a CIDR, or a size.
type poolRequest struct {
	PoolID         *string // subnetpool_id as given
	UseDefault     bool    // use_default_subnetpool
	CIDR           *netip.Prefix
	PrefixLen      *int
	IPVersion      int
	HasAllocations bool // allocation_pools given
}

func subnetsBad(format string, args ...any) *api.Error {
	return nerr(400, "BadRequest", "Bad subnets request: "+format+".", args...)
}

// resolvePool finds the pool a subnet comes from, nil for none
// (db_base_plugin_v2.py _get_subnetpool_id and create_subnet).
func resolvePool(ctx context.Context, q store.Querier, c *api.Caller, projectID string, rq *poolRequest) (*spRow, error) {
	if rq.UseDefault && rq.PoolID != nil {
		return nil, subnetsBad("subnetpool_id and use_default_subnetpool cannot both be specified")
	}
	var sp *spRow
	switch {
	case rq.PoolID != nil:
		var err error
		if sp, err = visiblePool(ctx, q, c, *rq.PoolID); err != nil {
			return nil, err
		}
	case rq.UseDefault:
		l, err := loadPools(ctx, q, "is_default = 1 AND ip_version = ? AND "+visiblePools, rq.IPVersion, projectID)
		if err != nil {
			return nil, err
		}
		if len(l) == 0 {
			return nil, subnetsBad("No default subnetpool found for IPv%d", rq.IPVersion)
		}
		sp = l[0]
	default:
		return nil, nil // a plain subnet, checked before
	}
	if rq.CIDR != nil && rq.PrefixLen != nil {
		return nil, subnetsBad("cidr and prefixlen must not be supplied together")
	}
	if rq.CIDR == nil && rq.HasAllocations {
		return nil, subnetsBad("allocation_pools allowed only for specific subnet requests")
	}
	if rq.IPVersion != sp.IPVersion {
		return nil, subnetsBad("Cannot allocate IPv%d subnet from IPv%d subnet pool", rq.IPVersion, sp.IPVersion)
	}
	return sp, nil
}

// allocate carves a subnet for projectID out of sp: rq's CIDR when given,
// else the first free block of rq's prefix length (the pool's default when
// none), taken from the smallest free range that holds it, as neutron's
// SubnetAllocator does (neutron/ipam/subnet_alloc.py).
func allocate(ctx context.Context, q store.Querier, sp *spRow, projectID string, rq *poolRequest) (netip.Prefix, error) {
	n := sp.DefaultLen
	if rq.CIDR != nil {
		n = rq.CIDR.Bits()
	} else if rq.PrefixLen != nil {
		n = *rq.PrefixLen
	}
	if n > sp.MaxLen {
		return netip.Prefix{}, nerr(400, "MaxPrefixSubnetAllocationError", "Unable to allocate subnet with prefix length %d, maximum allowed prefix is %d.", n, sp.MaxLen)
	}
	if n < sp.MinLen {
		return netip.Prefix{}, nerr(400, "MinPrefixSubnetAllocationError", "Unable to allocate subnet with prefix length %d, minimum allowed prefix is %d.", n, sp.MinLen)
	}
	// The pool row is written first so that two allocations from one pool
	// serialise (neutron's _lock_subnetpool).
	if _, err := q.Exec(ctx, "UPDATE subnetpools SET revision_number = revision_number WHERE id = ?", sp.ID); err != nil {
		return netip.Prefix{}, err
	}
	used, err := poolAllocations(ctx, q, sp.ID, "")
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := checkPoolQuota(ctx, q, sp, projectID, n); err != nil {
		return netip.Prefix{}, err
	}
	free := difference(parsePrefixes(sp.Prefixes), used)
	if rq.CIDR != nil {
		for _, f := range free {
			if f.Bits() <= rq.CIDR.Bits() && f.Contains(rq.CIDR.Addr()) {
				return *rq.CIDR, nil
			}
		}
		return netip.Prefix{}, nerr(409, "SubnetAllocationError", "Failed to allocate subnet: Cannot allocate requested subnet from the available set of prefixes.")
	}
	slices.SortStableFunc(free, func(a, b netip.Prefix) int { return cmp.Compare(b.Bits(), a.Bits()) })
	for _, f := range free {
		if n >= f.Bits() {
			return netip.PrefixFrom(f.Addr(), n), nil
		}
	}
	return netip.Prefix{}, nerr(409, "SubnetAllocationError", "Failed to allocate subnet: Insufficient prefix space to allocate subnet size /%d.", n)
}

// poolAllocations are the CIDRs of a pool's subnets, of one project when
// projectID is set.
func poolAllocations(ctx context.Context, q store.Querier, poolID, projectID string) ([]netip.Prefix, error) {
	where, args := "subnetpool_id = ?", []any{poolID}
	if projectID != "" {
		where, args = where+" AND project_id = ?", append(args, projectID)
	}
	subs, err := loadSubnets(ctx, q, where, args...)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, s := range subs {
		if p, err := netip.ParsePrefix(s.CIDR); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// checkPoolQuota applies the pool's default_quota, counted in /32s for
// IPv4 and /64s for IPv6 (subnet_alloc.py _check_subnetpool_tenant_quota).
func checkPoolQuota(ctx context.Context, q store.Querier, sp *spRow, projectID string, prefixLen int) error {
	if sp.Quota == nil || *sp.Quota == 0 {
		return nil
	}
	unit := 32
	if sp.IPVersion == 6 {
		unit = 64
	}
	mine, err := poolAllocations(ctx, q, sp.ID, projectID)
	if err != nil {
		return err
	}
	used := 0.0
	for _, p := range mine {
		used += math.Pow(2, float64(unit-p.Bits()))
	}
	if used+math.Pow(2, float64(unit-prefixLen)) > float64(*sp.Quota) {
		return nerr(409, "SubnetPoolQuotaExceeded", "Per-tenant subnet pool prefix quota exceeded.")
	}
	return nil
}

// setSubnetPool records that a subnet was carved from a pool.
func setSubnetPool(ctx context.Context, q store.Querier, subnetID, poolID string) error {
	_, err := q.Exec(ctx, "UPDATE subnets SET subnetpool_id = ? WHERE id = ?", poolID, subnetID)
	return err
}

// withSubnetPools fills the subnetpool_id of subnet views from the store.
func withSubnetPools(ctx context.Context, q store.Querier, views []map[string]any) error {
	ids := make([]any, 0, len(views))
	byID := make(map[string]map[string]any, len(views))
	for _, v := range views {
		id, _ := v["id"].(string)
		ids, byID[id] = append(ids, id), v
	}
	return inChunks(ids, func(chunk []any) error {
		rows, err := q.Query(ctx, "SELECT id, subnetpool_id FROM subnets WHERE subnetpool_id IS NOT NULL AND id IN ("+
			api.Placeholders(len(chunk))+")", chunk...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, pool string
			if err := rows.Scan(&id, &pool); err != nil {
				return err
			}
			byID[id]["subnetpool_id"] = pool
		}
		return rows.Err()
	})
}

// ---- prefix sets ----

// span is an inclusive address range.
type span struct{ lo, hi netip.Addr }

func spanOf(p netip.Prefix) span { return span{p.Masked().Addr(), lastAddr(p)} }

// merged sorts ranges and joins those that overlap or touch.
func merged(ss []span) []span {
	slices.SortFunc(ss, func(a, b span) int { return a.lo.Compare(b.lo) })
	var out []span
	for _, s := range ss {
		if k := len(out); k > 0 {
			last := &out[k-1]
			if next := last.hi.Next(); !next.IsValid() || s.lo.Compare(next) <= 0 {
				if s.hi.Compare(last.hi) > 0 {
					last.hi = s.hi
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// cidrs is the fewest prefixes that cover a range exactly.
func (s span) cidrs() []netip.Prefix {
	var out []netip.Prefix
	lo := s.lo
	for lo.IsValid() && lo.Compare(s.hi) <= 0 {
		var p netip.Prefix
		for bits := 0; bits <= lo.BitLen(); bits++ {
			c := netip.PrefixFrom(lo, bits)
			if c.Masked().Addr() == lo && lastAddr(c).Compare(s.hi) <= 0 {
				p = c
				break
			}
		}
		out = append(out, p)
		lo = lastAddr(p).Next()
	}
	return out
}

// compact is netaddr's IPSet compaction: the fewest prefixes covering the
// same addresses, in address order.
func compact(ps []netip.Prefix) []netip.Prefix {
	ss := make([]span, 0, len(ps))
	for _, p := range ps {
		ss = append(ss, spanOf(p))
	}
	var out []netip.Prefix
	for _, s := range merged(ss) {
		out = append(out, s.cidrs()...)
	}
	return out
}

// difference is the prefixes of have not in any of minus, compacted.
func difference(have, minus []netip.Prefix) []netip.Prefix {
	var ss []span
	for _, p := range have {
		ss = append(ss, spanOf(p))
	}
	ss = merged(ss)
	for _, m := range minus {
		ms := spanOf(m)
		var next []span
		for _, s := range ss {
			if ms.hi.Compare(s.lo) < 0 || ms.lo.Compare(s.hi) > 0 {
				next = append(next, s)
				continue
			}
			if ms.lo.Compare(s.lo) > 0 {
				next = append(next, span{s.lo, ms.lo.Prev()})
			}
			if ms.hi.Compare(s.hi) < 0 {
				next = append(next, span{ms.hi.Next(), s.hi})
			}
		}
		ss = next
	}
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, s.cidrs()...)
	}
	return out
}

// poolRequestOf reads the pool attributes of a subnet create request.
func poolRequestOf(b body, version int) (*poolRequest, error) {
	rq := &poolRequest{IPVersion: version, HasAllocations: b.has("allocation_pools") && !b.isNull("allocation_pools")}
	var err error
	if rq.PoolID, _, err = b.optUUID("subnetpool_id"); err != nil {
		return nil, err
	}
	if rq.UseDefault, _, err = b.boolean("use_default_subnetpool"); err != nil {
		return nil, err
	}
	if b.has("prefixlen") {
		n, _, err := nonNegative(b, "prefixlen")
		if err != nil {
			return nil, err
		}
		rq.PrefixLen = &n
	}
	return rq, nil
}
