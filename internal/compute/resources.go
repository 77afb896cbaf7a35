package compute

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// resourceRoutes are flavors, key pairs, limits, quotas, availability zones,
// hypervisors and services.
func (s *Service) resourceRoutes() []api.Route {
	admin := func(pattern string, h api.HandlerFunc, policy string) api.Route {
		return api.Route{Pattern: pattern, Handler: h, AdminOnly: true, Policy: policy}
	}
	user := func(pattern string, h api.HandlerFunc) api.Route {
		return api.Route{Pattern: pattern, Handler: h}
	}
	return []api.Route{
		// nova/api/openstack/compute/flavors.py, flavor_manage.py
		user("GET /v2.1/flavors", s.listFlavors),
		user("GET /v2.1/flavors/detail", s.listFlavorsDetail),
		user("GET /v2.1/flavors/{id}", s.showFlavor),
		admin("POST /v2.1/flavors", s.createFlavor, "os_compute_api:os-flavor-manage:create"),
		admin("PUT /v2.1/flavors/{id}", s.updateFlavor, "os_compute_api:os-flavor-manage:update"),
		admin("DELETE /v2.1/flavors/{id}", s.deleteFlavor, "os_compute_api:os-flavor-manage:delete"),
		// flavors_extraspecs.py
		user("GET /v2.1/flavors/{id}/os-extra_specs", s.listExtraSpecs),
		admin("POST /v2.1/flavors/{id}/os-extra_specs", s.createExtraSpecs, "os_compute_api:os-flavor-extra-specs:create"),
		user("GET /v2.1/flavors/{id}/os-extra_specs/{key}", s.showExtraSpec),
		admin("PUT /v2.1/flavors/{id}/os-extra_specs/{key}", s.updateExtraSpec, "os_compute_api:os-flavor-extra-specs:update"),
		admin("DELETE /v2.1/flavors/{id}/os-extra_specs/{key}", s.deleteExtraSpec, "os_compute_api:os-flavor-extra-specs:delete"),
		// flavor_access.py
		admin("GET /v2.1/flavors/{id}/os-flavor-access", s.listFlavorAccess, "os_compute_api:os-flavor-access"),
		// Admin only; the handler names the policy of the action asked for.
		user("POST /v2.1/flavors/{id}/action", s.flavorAction),
		// keypairs.py
		user("GET /v2.1/os-keypairs", s.listKeypairs),
		user("POST /v2.1/os-keypairs", s.createKeypair),
		user("GET /v2.1/os-keypairs/{name}", s.showKeypair),
		user("DELETE /v2.1/os-keypairs/{name}", s.deleteKeypair),
		// quota_sets.py
		user("GET /v2.1/os-quota-sets/{project}", s.showQuotaSet),
		user("GET /v2.1/os-quota-sets/{project}/detail", s.showQuotaSetDetail),
		user("GET /v2.1/os-quota-sets/{project}/defaults", s.showQuotaDefaults),
		admin("PUT /v2.1/os-quota-sets/{project}", s.updateQuotaSet, "os_compute_api:os-quota-sets:update"),
		admin("DELETE /v2.1/os-quota-sets/{project}", s.deleteQuotaSet, "os_compute_api:os-quota-sets:delete"),
		// limits.py
		user("GET /v2.1/limits", s.showLimits),
		// availability_zone.py
		user("GET /v2.1/os-availability-zone", s.listAZs),
		admin("GET /v2.1/os-availability-zone/detail", s.listAZsDetail, "os_compute_api:os-availability-zone:detail"),
		// hypervisors.py
		admin("GET /v2.1/os-hypervisors", s.listHypervisors, "os_compute_api:os-hypervisors:list"),
		admin("GET /v2.1/os-hypervisors/detail", s.listHypervisorsDetail, "os_compute_api:os-hypervisors:list-detail"),
		admin("GET /v2.1/os-hypervisors/statistics", s.hypervisorStatistics, "os_compute_api:os-hypervisors:statistics"),
		admin("GET /v2.1/os-hypervisors/{id}", s.showHypervisor, "os_compute_api:os-hypervisors:show"),
		admin("GET /v2.1/os-hypervisors/{id}/uptime", s.hypervisorUptime, "os_compute_api:os-hypervisors:uptime"),
		admin("GET /v2.1/os-hypervisors/{id}/search", s.searchHypervisors, "os_compute_api:os-hypervisors:search"),
		admin("GET /v2.1/os-hypervisors/{id}/servers", s.hypervisorServers, "os_compute_api:os-hypervisors:servers"),
		// services.py
		admin("GET /v2.1/os-services", s.listServices, "os_compute_api:os-services:list"),
		admin("PUT /v2.1/os-services/{id}", s.updateService, "os_compute_api:os-services:update"),
		admin("DELETE /v2.1/os-services/{id}", s.deleteService, "os_compute_api:os-services:delete"),
	}
}

// Bootstrap registers the default flavors and the compute services of the
// fleet. It is idempotent: each default flavor is added once, so flavors an
// operator changed or deleted stay as they are; a deleted compute service
// comes back, as nova-compute re-registers when it starts.
func (s *Service) Bootstrap(ctx context.Context) error {
	// Controllers sharing one PostgreSQL database may bootstrap at once;
	// the loser of an insert race retries and then finds the rows there.
	retry := func(f func() error) error {
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			if err = f(); !errors.Is(err, store.ErrConflict) {
				return err
			}
		}
		return err
	}
	if err := retry(func() error { return s.ensureDefaultFlavors(ctx) }); err != nil {
		return err
	}
	return retry(func() error { return s.ensureServices(ctx, true) })
}

// resMaxLimit is Nova's [api]max_limit.
const resMaxLimit = 1000

// resLinks are the self and bookmark links of a resource, repeating the
// project id when the client put one in the URL (nova/api/openstack/common.py
// ViewBuilder._get_links).
func resLinks(r *http.Request, coll, id string) []map[string]string {
	base := api.BaseURL(r)
	p := ""
	if pid := projectInURL(r.Context()); pid != "" {
		p = "/" + pid
	}
	esc := url.PathEscape(id)
	return []map[string]string{
		{"rel": "self", "href": base + "/v2.1" + p + "/" + coll + "/" + esc},
		{"rel": "bookmark", "href": base + p + "/" + coll + "/" + esc},
	}
}

// resNextLink is the "next" link of a full page: the request's URL with the
// marker set to the last item (common.py _get_next_link).
func resNextLink(r *http.Request, marker string) []map[string]string {
	q := r.URL.Query()
	q.Set("marker", marker)
	p := ""
	if pid := projectInURL(r.Context()); pid != "" {
		p = "/" + pid
	}
	path := strings.TrimPrefix(r.URL.Path, "/v2.1")
	return []map[string]string{{"rel": "next", "href": api.BaseURL(r) + "/v2.1" + p + path + "?" + q.Encode()}}
}

// resPage reads limit and marker as common.get_limit_and_marker does.
func resPage(r *http.Request) (limit int, marker string, err error) {
	limit = resMaxLimit
	q := r.URL.Query()
	if v, ok := q["limit"]; ok {
		n, perr := strconv.Atoi(v[0])
		if perr != nil {
			return 0, "", api.BadRequest("limit param must be an integer")
		}
		if n < 0 {
			return 0, "", api.BadRequest("limit param must be positive")
		}
		limit = min(n, resMaxLimit)
	}
	return limit, q.Get("marker"), nil
}

// listTooLong is the 400 for a request list past its bound, in the shape
// of Nova's schema errors but naming the count rather than echoing the list.
func listTooLong(field string, n, limit int) error {
	return api.BadRequest("Invalid input for field/attribute %s. The list has %d items, more than the %d allowed.", field, n, limit)
}

// decodeWrapped decodes a request body that must be {"<key>": {...}} with no
// other top-level key, returning the inner object's fields.
func decodeWrapped(r *http.Request, key string) (map[string]json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := api.DecodeJSON(r, &top); err != nil {
		return nil, err
	}
	if top == nil {
		return nil, api.BadRequest("Invalid input for field/attribute body. Value: None. None is not of type 'object'")
	}
	raw, ok := top[key]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is a required property", key, pyMap(top), key)
	}
	if err := api.UnknownFields(top, key); err != nil {
		return nil, err
	}
	var inner map[string]json.RawMessage
	if err := json.Unmarshal(raw, &inner); err != nil || inner == nil {
		return nil, api.SchemaError(key, json.RawMessage(raw), "%s is not of type 'object'", api.PyRepr(raw))
	}
	return inner, nil
}

func pyMap(m map[string]json.RawMessage) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// rawString reads a string field; ok is false when the value is not a
// string.
func rawString(raw json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// rawInt reads Nova's integer-or-digit-string parameters
// (parameter_types.flavor_param_*, non_negative_integer).
func rawInt(field string, raw json.RawMessage, minimum int) (int, error) {
	var n json.Number
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, api.SchemaError(field, raw, "%s is not of type 'integer', 'string'", api.PyRepr(raw))
	}
	switch t := v.(type) {
	case json.Number:
		n = t
	case string:
		if t == "" || strings.TrimLeft(t, "0123456789") != "" {
			return 0, api.SchemaError(field, raw, "%s does not match '^[0-9]+$'", t)
		}
		n = json.Number(t)
	default:
		return 0, api.SchemaError(field, raw, "%s is not of type 'integer', 'string'", api.PyRepr(raw))
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return 0, api.SchemaError(field, raw, "%s is not of type 'integer', 'string'", api.PyRepr(raw))
	}
	if i < int64(minimum) {
		return 0, api.SchemaError(field, raw, "%s is less than the minimum of %d", n, minimum)
	}
	if i > 2147483647 {
		return 0, api.SchemaError(field, raw, "%s is greater than the maximum of 2147483647", n)
	}
	return int(i), nil
}

// rawBool reads parameter_types.boolean: a JSON boolean or one of the
// strings Nova accepts for it.
func rawBool(field string, raw json.RawMessage) (bool, error) {
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return b, nil
	}
	if s, ok := rawString(raw); ok {
		if v, ok := api.ParseBool(s); ok {
			return v, nil
		}
	}
	return false, api.SchemaError(field, raw, "%s is not one of [True, 'True', 'TRUE', 'true', '1', 'ON', 'On', 'on', 'YES', 'Yes', 'yes', 'y', 't', False, 'False', 'FALSE', 'false', '0', 'OFF', 'Off', 'off', 'NO', 'No', 'no', 'n', 'f']", api.PyRepr(raw))
}

// callerAdmin reports whether the request's caller is an admin.
func callerAdmin(r *http.Request) bool { return api.CallerFrom(r.Context()).IsAdmin() }

// nextIntID returns one more than the largest value of an integer id column,
// for tables whose ids Nova shows as small integers.
func nextIntID(ctx context.Context, q store.Querier, table, column string) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, "SELECT COALESCE(MAX("+column+"), 0) FROM "+table).Scan(&n)
	return n + 1, err
}

// strictQuery rejects query parameters outside allowed from 2.75, where
// Nova's query schemas stopped allowing additional properties.
func strictQuery(r *http.Request, allowed ...string) error {
	if !VersionFrom(r.Context()).AtLeast(75) {
		return nil
	}
	q := r.URL.Query()
	for k := range q {
		if !slices.Contains(allowed, k) {
			return api.BadRequest("Invalid input for query parameters %s. Value: %s. Additional properties are not allowed ('%s' was unexpected)", k, q.Get(k), k)
		}
	}
	return nil
}

// validText reports whether s can be stored as text (see api.ValidText).
func validText(s string) bool { return api.ValidText(s) }
