package compute_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/testenv"
)

// TestServerListPages walks GET /servers page by page under several sort
// orders: together the pages are the unpaged list, in its order, each
// server once, and each full page links to the next.
func TestServerListPages(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		for _, name := range []string{"b", "a", "B", "a", "ab"} {
			e.create(e.demo, "", `,"name":"`+name+`"`)
		}
		orders := []struct{ name, query string }{
			{"default", ""},
			{"name asc", "sort_key=display_name&sort_dir=asc"},
			{"name desc then created asc", "sort_key=display_name&sort_key=created_at&sort_dir=desc&sort_dir=asc"},
			{"uuid", "sort_key=uuid&sort_dir=asc"},
			{"name filter", "name=^a"},
		}
		for _, o := range orders {
			for _, path := range []string{"/servers", "/servers/detail"} {
				t.Run(o.name+path, func(t *testing.T) {
					want := serverIDs(e.must(200, "GET", path+"?"+o.query, e.demo, "", ""))
					var got []string
					q := o.query + "&limit=2"
					for pages := 0; pages < 10; pages++ {
						m := e.must(200, "GET", path+"?"+q, e.demo, "", "")
						got = append(got, serverIDs(m)...)
						links, _ := m["servers_links"].([]any)
						if len(links) == 0 {
							break
						}
						href := links[0].(map[string]any)["href"].(string)
						q = href[strings.Index(href, "?")+1:]
						if v, _ := url.ParseQuery(q); v.Get("limit") != "2" {
							t.Fatalf("next link %s lost the limit", href)
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

func serverIDs(m map[string]any) []string {
	var ids []string
	for _, s := range m["servers"].([]any) {
		ids = append(ids, s.(map[string]any)["id"].(string))
	}
	return ids
}

// TestServerListQueryErrors: each bad query parameter is the client's
// error, never a 500, on both engines.
func TestServerListQueryErrors(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		e.create(e.demo, "", "")
		tests := []struct {
			query, mv string
			status    int
			message   string
		}{
			{"limit=x", "", 400, "limit param must be an integer"},
			{"limit=-1", "", 400, "limit param must be positive"},
			{"marker=nope", "", 400, "marker [nope] not found"},
			{"sort_key=bogus", "", 400, "Invalid input for query parameters sort_key. Value: bogus."},
			{"sort_dir=up", "", 400, "Invalid input for query parameters sort_dir. Value: up. 'up' is not one of ['asc', 'desc']"},
			{"locked=maybe", "2.73", 400, "Unrecognized value 'maybe', acceptable values are: '0', '1', 'f', 'false', 'n', 'no', 'off', 'on', 't', 'true', 'y', 'yes'"},
			{"power_state=x", "2.83", 400, "Invalid input for query parameters power_state. Value: x."},
			// Larger than any power state: no server has it (PostgreSQL
			// refused the value for its INTEGER column, a 500).
			{"power_state=99999999999", "2.83", 200, ""},
			{"changes-since=bad", "", 400, "Invalid input for query parameters changes-since. Value: bad. 'bad' is not a 'date-time'"},
			{"status=bogus", "2.38", 400, "Invalid status value"},
		}
		for _, tt := range tests {
			t.Run(tt.query, func(t *testing.T) {
				st, m, _ := e.do("GET", "/servers?"+tt.query, e.demo, tt.mv, "")
				if st != tt.status {
					t.Fatalf("status %d, want %d: %v", st, tt.status, m)
				}
				if tt.status == 200 {
					if n := len(m["servers"].([]any)); n != 0 {
						t.Errorf("%d servers, want none", n)
					}
					return
				}
				if got := m["badRequest"].(map[string]any)["message"]; got != tt.message {
					t.Errorf("message %q, want %q", got, tt.message)
				}
			})
		}
	})
}
