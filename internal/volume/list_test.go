package volume_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/testenv"
)

// TestVolumeListPages walks GET /volumes page by page under sort orders
// with ties and a volume without a name, with filters SQL applies and the
// metadata filter it does not: together the pages are the unpaged list,
// in its order, each volume once.
func TestVolumeListPages(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		for _, spec := range []string{`"name":"b","size":1,"metadata":{"k":"v"}`, `"name":"a","size":2`, `"size":1`,
			`"name":"B","size":3,"metadata":{"k":"v"}`, `"name":"ab","size":1`, `"name":"a","size":2,"metadata":{"k":"v"}`} {
			m := e.want(t, 202, "POST", "/v3/volumes", e.demoTok, `{"volume":{`+spec+`}}`)
			waitStatus(t, e.demo, m["volume"].(map[string]any)["id"].(string), "available")
		}
		queries := []string{"", "sort=name:asc", "sort=size:desc,name:asc", "sort_key=name&sort_dir=asc",
			"sort=display_name:desc,created_at:asc", "metadata={'k':'v'}", "metadata={'k':'v'}&sort=name", "name~=a",
			"sort=name:asc&offset=1"}
		for _, query := range queries {
			for _, path := range []string{"/v3/volumes", "/v3/" + e.demoProj + "/volumes/detail"} {
				t.Run(query+path, func(t *testing.T) {
					want := volumeIDs(e.want(t, 200, "GET", path+"?"+query, e.demoTok, "", "OpenStack-API-Version", "volume 3.45"))
					var got []string
					q := query + "&limit=2&with_count=true"
					for pages := 0; pages < 10; pages++ {
						m := e.want(t, 200, "GET", path+"?"+q, e.demoTok, "", "OpenStack-API-Version", "volume 3.45")
						got = append(got, volumeIDs(m)...)
						if m["count"] == nil {
							t.Errorf("no count")
						}
						links, _ := m["volumes_links"].([]any)
						// Cinder links a page to the next one exactly when
						// it is full, even when nothing follows.
						if full := len(volumeIDs(m)) == 2; full != (len(links) > 0) {
							t.Errorf("a page of %d volumes (limit 2) with links %v", len(volumeIDs(m)), links)
						}
						if len(links) == 0 {
							break
						}
						href := links[0].(map[string]any)["href"].(string)
						if !strings.Contains(href, path+"?") {
							t.Fatalf("next link %s is not to %s", href, path)
						}
						q = href[strings.Index(href, "?")+1:]
						if v, _ := url.ParseQuery(q); v.Has("offset") {
							t.Fatalf("next link %s keeps the offset", href)
						}
					}
					if !slices.Equal(got, want) {
						t.Errorf("pages gave %v, want %v", got, want)
					}
				})
			}
		}
	})
}

func volumeIDs(m map[string]any) []string {
	var ids []string
	for _, v := range m["volumes"].([]any) {
		ids = append(ids, v.(map[string]any)["id"].(string))
	}
	return ids
}

// TestVolumeListFilters checks what each filter keeps and the answers to
// bad parameters.
func TestVolumeListFilters(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ids := map[string]string{}
		for _, spec := range []string{`"name":"web","size":1,"metadata":{"k":"v"}`, `"name":"Web2","size":2`, `"size":1`} {
			m := e.want(t, 202, "POST", "/v3/volumes", e.demoTok, `{"volume":{`+spec+`}}`)
			v := m["volume"].(map[string]any)
			name, _ := v["name"].(string)
			ids[name] = v["id"].(string)
			waitStatus(t, e.demo, ids[name], "available")
		}
		tests := []struct {
			query, mv string
			status    int
			want      []string // names, in order
			message   string
		}{
			{"name=web", "3.0", 200, []string{"web"}, ""},
			{"name~=eb", "3.34", 200, []string{"Web2", "web"}, ""},
			{"name~=EB", "3.34", 200, nil, ""}, // case matters on both engines
			{"name~=eb", "3.33", 200, []string{"", "Web2", "web"}, ""},
			{"metadata={'k':'v'}", "3.0", 200, []string{"web"}, ""},
			{"bootable=false&sort=size:asc,name:asc", "3.0", 200, []string{"", "web", "Web2"}, ""},
			{"created_at=gt:2000-01-01T00:00:00&sort=name:asc", "3.60", 200, []string{"", "Web2", "web"}, ""},
			{"created_at=lt:2000-01-01T00:00:00", "3.60", 200, nil, ""},
			{"created_at=eq:2000-01-01T00:00:00.0000001Z", "3.60", 200, nil, ""},
			{"updated_at=neq:2000-01-01T00:00:00.0000001Z&sort=name:asc", "3.60", 200, []string{"", "Web2", "web"}, ""},
			{"marker=nope", "3.0", 404, nil, "Marker nope could not be found."},
			{"marker=" + ids["Web2"] + "&name=web", "3.0", 404, nil, "Marker " + ids["Web2"] + " could not be found."},
			{"limit=x", "3.0", 400, nil, "Invalid input received: limit must be an integer."},
			{"offset=-1", "3.0", 400, nil, "Invalid input received: offset must be >= 0"},
			{"sort=bogus", "3.0", 400, nil, "Invalid input received: Invalid sort key bogus"},
			{"bootable=maybe", "3.0", 400, nil, "Invalid input received: Invalid value 'maybe' for bootable: must be a boolean."},
			{"created_at=bad:2000-01-01", "3.60", 400, nil, "Invalid bad operator"},
		}
		for _, tt := range tests {
			t.Run(tt.query+"@"+tt.mv, func(t *testing.T) {
				resp, m := e.do(t, "GET", "/v3/volumes?"+tt.query, e.demoTok, "", "OpenStack-API-Version", "volume "+tt.mv)
				if resp.StatusCode != tt.status {
					t.Fatalf("status %d, want %d: %v", resp.StatusCode, tt.status, m)
				}
				if tt.message != "" {
					for _, f := range m {
						if got := f.(map[string]any)["message"]; got != tt.message {
							t.Errorf("message %q, want %q", got, tt.message)
						}
					}
					return
				}
				var got []string
				for _, v := range m["volumes"].([]any) {
					name, _ := v.(map[string]any)["name"].(string)
					got = append(got, name)
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("got %q, want %q", got, tt.want)
				}
			})
		}
	})
}
