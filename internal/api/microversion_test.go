package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"testing"

	"nimbus/internal/api"
)

// nova and cinder are the two services' negotiations as they configure them.
var (
	nova = &api.Microversions{
		Types: []string{"compute"}, Legacy: "X-OpenStack-Nova-API-Version", EchoLegacy: true,
		Min: api.Version{Major: 2, Minor: 1}, Max: api.Version{Major: 2, Minor: 96}, Root: "/v2.1",
		Project:    regexp.MustCompile(`^/v2(?:\.1)?/([0-9a-fA-F]{32}|[0-9a-fA-F-]{36})(/.*)?$`),
		NotProject: func(s string) bool { return s == "servers" },
		Mismatch:   func(u, c string) error { return api.BadRequest("mismatch %s %s", u, c) },
	}
	cinder = &api.Microversions{
		Types: []string{"volume", "block-storage"}, Legacy: "X-OpenStack-Volume-API-Version",
		Min: api.Version{Major: 3, Minor: 0}, Max: api.Version{Major: 3, Minor: 60}, Root: "/v3",
		Project:  regexp.MustCompile(`^/v3/([0-9a-fA-F]{32})(/.*)?$`),
		Mismatch: func(string, string) error { return api.BadRequest("Malformed request url") },
	}
)

func TestMicroversionParse(t *testing.T) {
	tests := []struct {
		name    string
		m       *api.Microversions
		headers [][2]string
		want    api.Version
		status  int
		message string
	}{
		{"nova: none is the minimum", nova, nil, api.Version{Major: 2, Minor: 1}, 0, ""},
		{"nova: new header", nova, [][2]string{{"OpenStack-API-Version", "compute 2.47"}}, api.Version{Major: 2, Minor: 47}, 0, ""},
		{"nova: legacy header", nova, [][2]string{{"X-OpenStack-Nova-API-Version", "2.37"}}, api.Version{Major: 2, Minor: 37}, 0, ""},
		{"nova: new header wins", nova, [][2]string{{"OpenStack-API-Version", "compute 2.60"}, {"X-OpenStack-Nova-API-Version", "2.3"}}, api.Version{Major: 2, Minor: 60}, 0, ""},
		{"nova: another service's is ignored", nova, [][2]string{{"OpenStack-API-Version", "volume 3.10"}}, api.Version{Major: 2, Minor: 1}, 0, ""},
		{"nova: list of services", nova, [][2]string{{"OpenStack-API-Version", "volume 3.10, COMPUTE 2.5"}}, api.Version{Major: 2, Minor: 5}, 0, ""},
		{"nova: latest", nova, [][2]string{{"OpenStack-API-Version", "compute latest"}}, api.Version{Major: 2, Minor: 96}, 0, ""},
		{"nova: too new", nova, [][2]string{{"OpenStack-API-Version", "compute 2.999"}}, api.Version{}, 406,
			"Version 2.999 is not supported by the API. Minimum is 2.1 and maximum is 2.96."},
		{"nova: too old", nova, [][2]string{{"X-OpenStack-Nova-API-Version", "2.0"}}, api.Version{}, 406,
			"Version 2.0 is not supported by the API. Minimum is 2.1 and maximum is 2.96."},
		{"nova: other major", nova, [][2]string{{"X-OpenStack-Nova-API-Version", "3.1"}}, api.Version{}, 406,
			"Version 3.1 is not supported by the API. Minimum is 2.1 and maximum is 2.96."},
		{"nova: malformed", nova, [][2]string{{"X-OpenStack-Nova-API-Version", "two"}}, api.Version{}, 400,
			"API Version String two is of invalid format. Must be of format MajorNum.MinorNum."},
		{"nova: leading zero", nova, [][2]string{{"X-OpenStack-Nova-API-Version", "2.01"}}, api.Version{}, 400,
			"API Version String 2.01 is of invalid format. Must be of format MajorNum.MinorNum."},
		{"cinder: none is 3.0", cinder, nil, api.Version{Major: 3, Minor: 0}, 0, ""},
		{"cinder: block-storage alias", cinder, [][2]string{{"OpenStack-API-Version", "block-storage 3.45"}}, api.Version{Major: 3, Minor: 45}, 0, ""},
		{"cinder: legacy header", cinder, [][2]string{{"X-OpenStack-Volume-API-Version", "3.12"}}, api.Version{Major: 3, Minor: 12}, 0, ""},
		{"cinder: compute's is ignored", cinder, [][2]string{{"OpenStack-API-Version", "compute 2.5"}}, api.Version{Major: 3, Minor: 0}, 0, ""},
		{"cinder: out of range", cinder, [][2]string{{"OpenStack-API-Version", "volume 3.61"}}, api.Version{}, 406,
			"Version 3.61 is not supported by the API. Minimum is 3.0 and maximum is 3.60."},
		{"cinder: major 2", cinder, [][2]string{{"OpenStack-API-Version", "volume 2.0"}}, api.Version{}, 406,
			"Version 2.0 is not supported by the API. Minimum is 3.0 and maximum is 3.60."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/x", nil)
			for _, h := range tt.headers {
				r.Header.Add(h[0], h[1])
			}
			got, err := tt.m.Parse(r)
			if tt.status != 0 {
				e := api.AsError(err)
				if err == nil || e.Status != tt.status || e.Message != tt.message {
					t.Fatalf("err = %v, want %d %q", err, tt.status, tt.message)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Parse = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestMicroversionBefore(t *testing.T) {
	const p = "0123456789abcdef0123456789abcdef"
	tests := []struct {
		name          string
		m             *api.Microversions
		in            string
		path, project string
		version       api.Version
	}{
		{"no project", nova, "/v2.1/servers/detail", "/v2.1/servers/detail", "", api.Version{Major: 2, Minor: 1}},
		{"project removed", nova, "/v2.1/" + p + "/servers", "/v2.1/servers", p, api.Version{Major: 2, Minor: 1}},
		{"project alone", nova, "/v2.1/" + p, "/v2.1/", p, api.Version{Major: 2, Minor: 1}},
		{"v2 with a project is v2.1", nova, "/v2/" + p + "/flavors", "/v2.1/flavors", p, api.Version{Major: 2, Minor: 1}},
		{"an id after a collection stays", nova, "/v2.1/servers/" + p, "/v2.1/servers/" + p, "", api.Version{Major: 2, Minor: 1}},
		{"outside the root: no version", nova, "/", "/", "", api.Version{Major: 9}},
		{"cinder project removed", cinder, "/v3/" + p + "/volumes/detail", "/v3/volumes/detail", p, api.Version{Major: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := tt.m.Before(httptest.NewRequest("GET", tt.in, nil))
			if err != nil {
				t.Fatal(err)
			}
			if r.URL.Path != tt.path || api.ProjectInURL(r.Context()) != tt.project {
				t.Errorf("path %q project %q; want %q %q", r.URL.Path, api.ProjectInURL(r.Context()), tt.path, tt.project)
			}
			if v := api.VersionFrom(r.Context(), api.Version{Major: 9}); v != tt.version {
				t.Errorf("version %v, want %v", v, tt.version)
			}
		})
	}
}

func TestMicroversionEcho(t *testing.T) {
	tests := []struct {
		name  string
		m     *api.Microversions
		path  string
		mv    string
		want  map[string][]string
		unset []string
	}{
		{"nova echoes both headers", nova, "/v2.1/servers", "compute 2.50", map[string][]string{
			"Openstack-Api-Version":        {"compute 2.50"},
			"X-Openstack-Nova-Api-Version": {"2.50"},
			"Vary":                         {"OpenStack-API-Version", "X-OpenStack-Nova-API-Version"},
		}, nil},
		{"cinder echoes one", cinder, "/v3/volumes", "volume 3.45", map[string][]string{
			"Openstack-Api-Version": {"volume 3.45"},
			"Vary":                  {"OpenStack-API-Version"},
		}, []string{"X-Openstack-Volume-Api-Version"}},
		{"nothing outside the root", cinder, "/", "", nil, []string{"Openstack-Api-Version", "Vary"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", tt.path, nil)
			if tt.mv != "" {
				r.Header.Set("OpenStack-API-Version", tt.mv)
			}
			r, err := tt.m.Before(r)
			if err != nil {
				t.Fatal(err)
			}
			w := httptest.NewRecorder()
			tt.m.Echo(w, r)
			for k, v := range tt.want {
				if !slices.Equal(w.Header()[k], v) {
					t.Errorf("%s = %q, want %q", k, w.Header()[k], v)
				}
			}
			for _, k := range tt.unset {
				if _, ok := w.Header()[k]; ok {
					t.Errorf("%s set: %q", k, w.Header()[k])
				}
			}
		})
	}
}

func TestMicroversionCheckProject(t *testing.T) {
	const p = "0123456789abcdef0123456789abcdef"
	tests := []struct {
		name   string
		caller *api.Caller
		err    string
	}{
		{"own project", &api.Caller{ProjectID: p}, ""},
		{"own project, dashed", &api.Caller{ProjectID: "01234567-89ab-cdef-0123-456789abcdef"}, ""},
		{"another project", &api.Caller{ProjectID: "ffff"}, "400: Malformed request url"},
		{"an admin may name any", &api.Caller{ProjectID: "ffff", Roles: []string{"admin"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := cinder.Before(httptest.NewRequest("GET", "/v3/"+p+"/volumes", nil))
			r = r.WithContext(api.WithCaller(r.Context(), tt.caller))
			err := cinder.CheckProject(r)
			if (err == nil && tt.err != "") || (err != nil && err.Error() != tt.err) {
				t.Errorf("CheckProject = %v, want %q", err, tt.err)
			}
		})
	}
	r := (&http.Request{}).WithContext(context.Background())
	if cinder.CheckProject(r) != nil {
		t.Error("a request without a project in its URL was refused")
	}
}
