package compute

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"nimbus/internal/api"
)

// Version is a compute API microversion, 2.N.
type Version struct{ Major, Minor int }

// MinVersion and MaxVersion bound the microversions Nimbus serves. MaxVersion
// is raised only when every change up to it is served
// (nova/api/openstack/compute/rest_api_version_history.rst).
var (
	MinVersion = Version{2, 1}
	MaxVersion = Version{2, 96}
)

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// AtLeast reports whether v is 2.minor or later.
func (v Version) AtLeast(minor int) bool { return v.Major > 2 || (v.Major == 2 && v.Minor >= minor) }

func (v Version) less(o Version) bool {
	return v.Major < o.Major || (v.Major == o.Major && v.Minor < o.Minor)
}

type versionKey struct{}
type projectInURLKey struct{}

// VersionFrom returns the microversion of the request ctx belongs to.
func VersionFrom(ctx context.Context) Version {
	if v, ok := ctx.Value(versionKey{}).(Version); ok {
		return v
	}
	return MinVersion
}

// projectInURL returns the project id segment the client put in the URL,
// so that self links repeat it (nova/api/openstack/common.py _get_project_id).
func projectInURL(ctx context.Context) string {
	p, _ := ctx.Value(projectInURLKey{}).(string)
	return p
}

var versionRE = regexp.MustCompile(`^([1-9]\d*)\.([1-9]\d*|0)$`)

// parseVersion reads the microversion headers: OpenStack-API-Version
// ("compute 2.X") first, then the legacy X-OpenStack-Nova-API-Version. No
// header means 2.1; "latest" means MaxVersion.
func parseVersion(r *http.Request) (Version, error) {
	raw := ""
	for _, h := range r.Header.Values("OpenStack-API-Version") {
		for _, part := range strings.Split(h, ",") {
			f := strings.Fields(part)
			if len(f) == 2 && strings.EqualFold(f[0], "compute") {
				raw = f[1]
			}
		}
	}
	if raw == "" {
		raw = strings.TrimSpace(r.Header.Get("X-OpenStack-Nova-API-Version"))
	}
	if raw == "" {
		return MinVersion, nil
	}
	if strings.EqualFold(raw, "latest") {
		return MaxVersion, nil
	}
	m := versionRE.FindStringSubmatch(raw)
	if m == nil {
		return Version{}, api.BadRequest("API Version String %s is of invalid format. Must be of format MajorNum.MinorNum.", raw)
	}
	maj, _ := strconv.Atoi(m[1])
	min, _ := strconv.Atoi(m[2])
	v := Version{maj, min}
	if v.less(MinVersion) || MaxVersion.less(v) {
		return Version{}, &api.Error{Status: http.StatusNotAcceptable, Message: fmt.Sprintf(
			"Version %s is not supported by the API. Minimum is %s and maximum is %s.", v, MinVersion, MaxVersion)}
	}
	return v, nil
}

var projectSegment = regexp.MustCompile(`^/v2(?:\.1)?/([0-9a-fA-F]{32}|[0-9a-fA-F-]{36})(/.*)?$`)

// before runs ahead of routing: it removes an optional project id after
// /v2.1 (ServeMux cannot route both forms, api-facts §7), checks that it is
// the caller's, and parses the microversion.
func before(r *http.Request) (*http.Request, error) {
	ctx := r.Context()
	if m := projectSegment.FindStringSubmatch(r.URL.Path); m != nil && !isCollection(m[1]) {
		ctx = context.WithValue(ctx, projectInURLKey{}, m[1])
		r = r.Clone(ctx)
		r.URL.Path = "/v2.1" + m[2]
		if m[2] == "" {
			r.URL.Path = "/v2.1/"
		}
		r.URL.RawPath = ""
	}
	if strings.HasPrefix(r.URL.Path, "/v2.1") {
		v, err := parseVersion(r)
		if err != nil {
			return r, err
		}
		r = r.WithContext(context.WithValue(r.Context(), versionKey{}, v))
	}
	return r, nil
}

// isCollection keeps a resource name that happens to be hex (none does
// today) from being taken for a project id.
func isCollection(seg string) bool { return seg == "servers" || seg == "flavors" }

// decorate adds the microversion echo Nova sends on every /v2.1 answer.
func decorate(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	if rid := api.RequestID(r.Context()); rid != "" {
		h.Set("X-Compute-Request-Id", rid)
	}
	if !strings.HasPrefix(r.URL.Path, "/v2.1") {
		return
	}
	// A request whose version did not parse carries none, so this is 2.1
	// for its error answer, as Nova echoes.
	v := VersionFrom(r.Context())
	h.Set("OpenStack-API-Version", "compute "+v.String())
	h.Set("X-OpenStack-Nova-API-Version", v.String())
	h["Vary"] = []string{"OpenStack-API-Version", "X-OpenStack-Nova-API-Version"}
}

// checkProjectInURL rejects a URL project id that is not the caller's, as
// Nova's project_id check does for non-admins.
func checkProjectInURL(r *http.Request) error {
	p := projectInURL(r.Context())
	c := api.CallerFrom(r.Context())
	if p == "" || c == nil || c.IsAdmin() {
		return nil
	}
	if !strings.EqualFold(strings.ReplaceAll(p, "-", ""), strings.ReplaceAll(c.ProjectID, "-", "")) {
		return api.BadRequest("Malformed request URL: URL's project_id '%s' doesn't match Context's project_id '%s'", p, c.ProjectID)
	}
	return nil
}
