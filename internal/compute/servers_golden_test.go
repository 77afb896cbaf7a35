package compute_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"nimbus/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// normalise replaces what changes from run to run (ids, times, hosts,
// ports, hashes) by placeholders and pretty-prints the body.
func normalise(t *testing.T, e *env, body []byte) []byte {
	t.Helper()
	s := string(body)
	s = strings.ReplaceAll(s, e.c.ComputeURL[:strings.LastIndex(e.c.ComputeURL, "/v2.1")], "https://HOST")
	for _, r := range []struct{ re, with string }{
		{`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`, "UUID"},
		{`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z?`, "TIME"},
		{`"[0-9a-f]{56}"`, `"HOSTID"`},
		{`"[0-9a-f]{32}"`, `"PROJECT"`},
		{`r-[0-9a-z]{8}`, "r-RESERVATION"},
		{`instance-[0-9a-f]{8}`, "instance-NAME"},
		{`fake-(gpu-)?host-\d+`, "HOST"},
		{`"addr":"[^"]*"`, `"addr":"ADDR"`},
		{`"OS-EXT-IPS-MAC:mac_addr":"[^"]*"`, `"OS-EXT-IPS-MAC:mac_addr":"MAC"`},
		{`"(private|default|[a-z0-9-]*net[a-z0-9-]*)":\[`, `"NETWORK":[`},
	} {
		s = regexp.MustCompile(r.re).ReplaceAllString(s, r.with)
	}
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("normalised body is not JSON: %v", err)
	}
	out, _ := json.MarshalIndent(v, "", "  ")
	return append(out, '\n')
}

// TestServerShowGolden compares GET /servers/{id} (as admin, ACTIVE) per
// microversion with testdata/server_show_<mv>.golden; -update rewrites them.
func TestServerShowGolden(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.admin, "2.96", `,"metadata":{"role":"web"},"description":"golden","tags":["a"]`)
		e.wait(id, e.admin, "ACTIVE")
		for _, mv := range []string{"2.1", "2.47", "2.73", "2.96"} {
			resp, raw := testenv.Do(t, e.client, "GET", e.c.ComputeURL+"/servers/"+id, e.admin, "", "OpenStack-API-Version", "compute "+mv)
			testenv.MustStatus(t, resp, raw, 200)
			got := normalise(t, e, []byte(raw))
			path := filepath.Join("testdata", "server_show_"+mv+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("GET /servers/{id} at %s differs from %s:\n%s", mv, path, got)
			}
		}
	})
}
