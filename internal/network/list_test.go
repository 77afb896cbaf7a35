package network_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/testenv"
)

// TestListPagesInSQL walks network and port lists page by page, forward
// along next links and back along previous ones, under filters and sort
// keys read in SQL and ones answered from the views (status, tags,
// page_reverse): together the pages are the unpaged list in its order.
func TestListPagesInSQL(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		var nets []string
		for i, spec := range []string{`"name":"b"`, `"name":"a","admin_state_up":false`, `"name":"B"`, `"name":"a"`, `"name":"ab"`} {
			code, m := e.do(t, "POST", "/v2.0/networks", e.demoTok, `{"network":{`+spec+`}}`)
			if code != 201 {
				t.Fatalf("create network: %d %v", code, m)
			}
			nets = append(nets, m["network"].(map[string]any)["id"].(string))
			code, m = e.do(t, "POST", "/v2.0/ports", e.demoTok, fmt.Sprintf(`{"port":{"network_id":%q,%s}}`, nets[i%2], spec))
			if code != 201 {
				t.Fatalf("create port: %d %v", code, m)
			}
		}
		queries := []string{"", "sort_key=name&sort_dir=asc", "sort_key=name&sort_key=admin_state_up&sort_dir=desc",
			"admin_state_up=true&sort_key=name", "name=a&name=ab", "tenant_id=" + e.demoProject + "&sort_key=id&sort_dir=desc",
			"status=ACTIVE&status=DOWN&sort_key=name", "sort_key=status&sort_key=name&sort_dir=asc&sort_dir=asc"}
		for _, coll := range []string{"networks", "ports"} {
			for _, query := range queries {
				t.Run(coll+"?"+query, func(t *testing.T) {
					_, m := e.do(t, "GET", "/v2.0/"+coll+"?"+query, e.demoTok, "")
					want := ids(m[coll])
					var got []string
					next := "/v2.0/" + coll + "?" + query + "&limit=2"
					var lastPage string
					for pages := 0; next != "" && pages < 10; pages++ {
						code, m := e.do(t, "GET", next, e.demoTok, "")
						if code != 200 {
							t.Fatalf("%s: %d %v", next, code, m)
						}
						got = append(got, ids(m[coll])...)
						lastPage, next = next, link(m[coll+"_links"], "next")
					}
					if !slices.Equal(got, want) {
						t.Fatalf("forward pages gave %v, want %v", got, want)
					}
					// Back from the last page along previous links.
					_, m = e.do(t, "GET", lastPage, e.demoTok, "")
					back := ids(m[coll])
					for prev, pages := link(m[coll+"_links"], "previous"), 0; prev != "" && pages < 10; pages++ {
						_, m = e.do(t, "GET", prev, e.demoTok, "")
						back = append(ids(m[coll]), back...)
						prev = link(m[coll+"_links"], "previous")
					}
					if !slices.Equal(back, want) {
						t.Errorf("backward pages gave %v, want %v", back, want)
					}
				})
			}
		}
		for _, tt := range []struct {
			path    string
			status  int
			message string
		}{
			{"/v2.0/networks?marker=nope", 404, "Marker nope could not be found."},
			{"/v2.0/networks?marker=" + nets[0] + "&name=a", 404, "Marker " + nets[0] + " could not be found."},
			{"/v2.0/ports?limit=x", 400, "Limit must be an integer 0 or greater and not 'x'"},
			{"/v2.0/ports?sort_key=bogus", 400, "bogus is an invalid attribute for sort_keys"},
			{"/v2.0/networks?sort_key=name&sort_dir=up", 400, "Invalid input for sort_dir. Reason: 'up' is not a valid value. Valid values are ['asc', 'desc']."},
			{"/v2.0/networks?bogus=1", 400, "[bogus] is invalid attribute for filtering"},
		} {
			code, m := e.do(t, "GET", tt.path, e.demoTok, "")
			if code != tt.status || m["NeutronError"].(map[string]any)["message"] != tt.message {
				t.Errorf("%s: %d %v, want %d %q", tt.path, code, m, tt.status, tt.message)
			}
		}
	})
}

func ids(items any) []string {
	var out []string
	for _, it := range items.([]any) {
		out = append(out, it.(map[string]any)["id"].(string))
	}
	return out
}

// link is the path and query of the links' rel link, "" without one.
func link(links any, rel string) string {
	l, _ := links.([]any)
	for _, x := range l {
		if x.(map[string]any)["rel"] == rel {
			href := x.(map[string]any)["href"].(string)
			return href[strings.Index(href, "/v2.0/"):]
		}
	}
	return ""
}
