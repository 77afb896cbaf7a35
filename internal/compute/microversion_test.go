package compute

import (
	"net/http"
	"testing"

	"nimbus/internal/api"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    Version
		status  int // 0 when no error
	}{
		{"no header is 2.1", nil, Version{Major: 2, Minor: 1}, 0},
		{"new header", map[string]string{"OpenStack-API-Version": "compute 2.47"}, Version{Major: 2, Minor: 47}, 0},
		{"legacy header", map[string]string{"X-OpenStack-Nova-API-Version": "2.37"}, Version{Major: 2, Minor: 37}, 0},
		{"new header wins", map[string]string{"OpenStack-API-Version": "compute 2.60", "X-OpenStack-Nova-API-Version": "2.3"}, Version{Major: 2, Minor: 60}, 0},
		{"other service ignored", map[string]string{"OpenStack-API-Version": "volume 3.10"}, Version{Major: 2, Minor: 1}, 0},
		{"latest", map[string]string{"OpenStack-API-Version": "compute latest"}, MaxVersion, 0},
		{"too new", map[string]string{"OpenStack-API-Version": "compute 2.999"}, Version{}, 406},
		{"too old", map[string]string{"X-OpenStack-Nova-API-Version": "2.0"}, Version{}, 406},
		{"malformed", map[string]string{"X-OpenStack-Nova-API-Version": "two"}, Version{}, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "/v2.1/servers", nil)
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			got, err := microversions.Parse(r)
			if tt.status != 0 {
				if e := api.AsError(err); err == nil || e.Status != tt.status {
					t.Fatalf("err = %v, want status %d", err, tt.status)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Parse = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestProjectIDStripped(t *testing.T) {
	tests := []struct{ in, path, project string }{
		{"/v2.1/servers/detail", "/v2.1/servers/detail", ""},
		{"/v2.1/0123456789abcdef0123456789abcdef/servers", "/v2.1/servers", "0123456789abcdef0123456789abcdef"},
		{"/v2.1/0123456789abcdef0123456789abcdef", "/v2.1/", "0123456789abcdef0123456789abcdef"},
		{"/v2.1/servers/0123456789abcdef0123456789abcdef", "/v2.1/servers/0123456789abcdef0123456789abcdef", ""},
	}
	for _, tt := range tests {
		r, _ := http.NewRequest("GET", tt.in, nil)
		r, err := before(r)
		if err != nil {
			t.Fatal(err)
		}
		if r.URL.Path != tt.path || projectInURL(r.Context()) != tt.project {
			t.Errorf("%s: path %q project %q; want %q %q", tt.in, r.URL.Path, projectInURL(r.Context()), tt.path, tt.project)
		}
	}
}
