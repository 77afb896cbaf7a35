package api

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// Version is a microversion, Major.Minor.
type Version struct{ Major, Minor int }

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Less orders versions.
func (v Version) Less(o Version) bool {
	return v.Major < o.Major || (v.Major == o.Major && v.Minor < o.Minor)
}

// AtLeast reports whether v is minor or later within its major version: a
// negotiated version always has its service's major.
func (v Version) AtLeast(minor int) bool { return v.Minor >= minor }

// Microversions is one service's microversion negotiation and optional
// project id in the URL (nova/api/openstack/api_version_request.py,
// cinder/api/openstack/api_version_request.py: the same rules, another
// header name and range).
type Microversions struct {
	// Types are the service types read from OpenStack-API-Version; the first
	// is echoed ("compute", or "volume" with the alias "block-storage").
	Types []string
	// Legacy is the service's own header, such as X-OpenStack-Nova-API-Version.
	Legacy string
	// EchoLegacy also answers in Legacy, and varies on it, as Nova does.
	EchoLegacy bool
	Min, Max   Version
	// Root is the versioned path ("/v2.1"): requests under it carry a
	// microversion, and a project id after it is removed.
	Root string
	// Project matches a path with a project id: group 1 is the id, group 2
	// the rest. Nil when the service takes none.
	Project *regexp.Regexp
	// NotProject keeps a resource name that looks like an id from being
	// taken for a project id.
	NotProject func(seg string) bool
	// Mismatch is the error for a URL project id that is not the caller's.
	Mismatch func(url, caller string) error
}

type versionKey struct{}
type projectInURLKey struct{}

// VersionFrom returns the microversion the request of ctx negotiated, or
// def when it has none (a request outside the versioned root, or one whose
// version did not parse).
func VersionFrom(ctx context.Context, def Version) Version {
	if v, ok := ctx.Value(versionKey{}).(Version); ok {
		return v
	}
	return def
}

// ProjectInURL is the project id the client put in the URL ("" if none),
// which links repeat (nova/api/openstack/common.py _get_project_id).
func ProjectInURL(ctx context.Context) string {
	p, _ := ctx.Value(projectInURLKey{}).(string)
	return p
}

var versionRE = regexp.MustCompile(`^([1-9]\d*)\.([1-9]\d*|0)$`)

// Parse reads OpenStack-API-Version ("<type> X.Y", the last of the
// service's wins) and then the legacy header. No header means Min, "latest"
// Max; a malformed version is 400, one out of range 406.
func (m *Microversions) Parse(r *http.Request) (Version, error) {
	raw := m.rawVersion(r)
	if raw == "" {
		return m.Min, nil
	}
	if strings.EqualFold(raw, "latest") {
		return m.Max, nil
	}
	g := versionRE.FindStringSubmatch(raw)
	if g == nil {
		return Version{}, BadRequest("API Version String %s is of invalid format. Must be of format MajorNum.MinorNum.", raw)
	}
	maj, err1 := strconv.Atoi(g[1])
	mi, err2 := strconv.Atoi(g[2])
	v := Version{maj, mi}
	if err1 != nil || err2 != nil || v.Less(m.Min) || m.Max.Less(v) {
		return Version{}, Errorf(http.StatusNotAcceptable,
			"Version %s is not supported by the API. Minimum is %s and maximum is %s.", raw, m.Min, m.Max)
	}
	return v, nil
}

func (m *Microversions) rawVersion(r *http.Request) string {
	raw := ""
	for _, h := range r.Header.Values("OpenStack-API-Version") {
		for _, part := range strings.Split(h, ",") {
			f := strings.Fields(part)
			if len(f) == 2 && m.isType(f[0]) {
				raw = f[1]
			}
		}
	}
	if raw == "" && m.Legacy != "" {
		raw = strings.TrimSpace(r.Header.Get(m.Legacy))
	}
	return raw
}

func (m *Microversions) isType(s string) bool {
	for _, t := range m.Types {
		if strings.EqualFold(s, t) {
			return true
		}
	}
	return false
}

// Before is a Service.Before hook: it removes an optional project id after
// the root (a ServeMux cannot route both forms, api-facts §7), keeping it
// for links and CheckProject, and negotiates the microversion.
func (m *Microversions) Before(r *http.Request) (*http.Request, error) {
	r = m.stripProject(r)
	if !strings.HasPrefix(r.URL.Path, m.Root) {
		return r, nil
	}
	v, err := m.Parse(r)
	if err != nil {
		return r, err
	}
	return r.WithContext(context.WithValue(r.Context(), versionKey{}, v)), nil
}

func (m *Microversions) stripProject(r *http.Request) *http.Request {
	if m.Project == nil {
		return r
	}
	g := m.Project.FindStringSubmatch(r.URL.Path)
	if g == nil || (m.NotProject != nil && m.NotProject(g[1])) {
		return r
	}
	r = r.Clone(context.WithValue(r.Context(), projectInURLKey{}, g[1]))
	r.URL.Path = m.Root + g[2]
	if g[2] == "" {
		r.URL.Path = m.Root + "/"
	}
	r.URL.RawPath = ""
	return r
}

// Echo adds the version headers the service sends on every answer under
// its root. A request whose version did not parse echoes Min, as Nova does.
func (m *Microversions) Echo(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, m.Root) {
		return
	}
	v := VersionFrom(r.Context(), m.Min)
	h := w.Header()
	h.Set("OpenStack-API-Version", m.Types[0]+" "+v.String())
	if !m.EchoLegacy {
		h.Set("Vary", "OpenStack-API-Version")
		return
	}
	h.Set(m.Legacy, v.String())
	h["Vary"] = []string{"OpenStack-API-Version", m.Legacy}
}

// CheckProject is a Service.AfterAuth hook: a URL project id that is not
// the caller's is refused, for non-admins, as both services' project_id
// checks do.
func (m *Microversions) CheckProject(r *http.Request) error {
	p := ProjectInURL(r.Context())
	c := CallerFrom(r.Context())
	if p == "" || c == nil || c.IsAdmin() {
		return nil
	}
	if !strings.EqualFold(strings.ReplaceAll(p, "-", ""), strings.ReplaceAll(c.ProjectID, "-", "")) {
		return m.Mismatch(p, c.ProjectID)
	}
	return nil
}
