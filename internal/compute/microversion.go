package compute

import (
	"context"
	"net/http"
	"regexp"

	"nimbus/internal/api"
)

// Version is a compute API microversion, 2.N.
type Version = api.Version

// MinVersion and MaxVersion bound the microversions Nimbus serves. MaxVersion
// is raised only when every change up to it is served
// (nova/api/openstack/compute/rest_api_version_history.rst).
var (
	MinVersion = Version{Major: 2, Minor: 1}
	MaxVersion = Version{Major: 2, Minor: 96}
)

// microversions is Nova's negotiation: "OpenStack-API-Version: compute 2.X"
// or the legacy X-OpenStack-Nova-API-Version, both echoed; a project id may
// follow /v2 or /v2.1.
var microversions = &api.Microversions{
	Types:      []string{"compute"},
	Legacy:     "X-OpenStack-Nova-API-Version",
	EchoLegacy: true,
	Min:        MinVersion,
	Max:        MaxVersion,
	Root:       "/v2.1",
	Project:    regexp.MustCompile(`^/v2(?:\.1)?/([0-9a-fA-F]{32}|[0-9a-fA-F-]{36})(/.*)?$`),
	NotProject: isCollection,
	Mismatch: func(url, caller string) error {
		return api.BadRequest("Malformed request URL: URL's project_id '%s' doesn't match Context's project_id '%s'", url, caller)
	},
}

// VersionFrom returns the microversion of the request ctx belongs to.
func VersionFrom(ctx context.Context) Version { return api.VersionFrom(ctx, MinVersion) }

// projectInURL returns the project id segment the client put in the URL,
// so that self links repeat it (nova/api/openstack/common.py _get_project_id).
func projectInURL(ctx context.Context) string { return api.ProjectInURL(ctx) }

// before runs ahead of routing: the project id and the microversion.
func before(r *http.Request) (*http.Request, error) { return microversions.Before(r) }

// isCollection keeps a resource name that happens to be hex (none does
// today) from being taken for a project id.
func isCollection(seg string) bool { return seg == "servers" || seg == "flavors" }

// decorate adds the request id and the microversion echo Nova sends on
// every /v2.1 answer.
func decorate(w http.ResponseWriter, r *http.Request) {
	if rid := api.RequestID(r.Context()); rid != "" {
		w.Header().Set("X-Compute-Request-Id", rid)
	}
	microversions.Echo(w, r)
}

// checkProjectInURL rejects a URL project id that is not the caller's, as
// Nova's project_id check does for non-admins.
func checkProjectInURL(r *http.Request) error { return microversions.CheckProject(r) }
