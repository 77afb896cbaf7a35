package api_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/api"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// pagingRow is one row of the table the keyset pages walk.
type pagingRow struct {
	id, name string
	size     int
}

// TestKeysetWalksEveryOrder pages through a table with ties in every
// column, on both engines, and checks that the pages together are the
// whole table in order, each row once, whatever the keys and directions.
func TestKeysetWalksEveryOrder(t *testing.T) {
	var rows []pagingRow
	for i := 0; i < 23; i++ {
		rows = append(rows, pagingRow{fmt.Sprintf("id-%02d", (i*7)%23), []string{"b", "a", "B", "ab"}[i%4], i % 3})
	}
	orders := []struct {
		name string
		keys api.Keyset
	}{
		{"id asc", api.Keyset{{Col: "id"}}},
		{"name asc, id desc", api.Keyset{{Col: "name"}, {Col: "id", Desc: true}}},
		{"size desc, name asc, id asc", api.Keyset{{Col: "size", Desc: true}, {Col: "name"}, {Col: "id"}}},
		{"name desc, size asc, id desc", api.Keyset{{Col: "name", Desc: true}, {Col: "size"}, {Col: "id", Desc: true}}},
	}
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(ctx, "CREATE TABLE paging_t (id TEXT PRIMARY KEY, name TEXT NOT NULL, size INTEGER NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if _, err := db.Exec(ctx, "INSERT INTO paging_t (id, name, size) VALUES (?, ?, ?)", r.id, r.name, r.size); err != nil {
				t.Fatal(err)
			}
		}
		for _, o := range orders {
			for _, limit := range []int{1, 4, 23, 30} {
				t.Run(fmt.Sprintf("%s/limit %d", o.name, limit), func(t *testing.T) {
					got := walk(t, db, o.keys, limit)
					if want := sortedIDs(rows, o.keys); !slices.Equal(got, want) {
						t.Errorf("pages gave %v\nwant %v", got, want)
					}
				})
			}
		}
	})
}

// walk reads every page of the table in keys' order, limit rows at a time.
func walk(t *testing.T, db *store.DB, keys api.Keyset, limit int) []string {
	ctx := context.Background()
	var out []string
	marker := ""
	for pages := 0; pages < 40; pages++ {
		p := api.Page{Keys: keys, Limit: limit}
		p.Add("size >= ?", 0)
		if marker != "" {
			vals, err := keys.MarkerValues(ctx, db, "paging_t", "id = ?", marker)
			if err != nil {
				t.Fatal(err)
			}
			p.AfterMarker(vals)
		}
		rs, err := db.Query(ctx, "SELECT id FROM paging_t "+p.SQL(), p.Args...)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rs.Next() {
			if err := rs.Scan(&marker); err != nil {
				t.Fatal(err)
			}
			out, n = append(out, marker), n+1
		}
		rs.Close()
		if n < limit {
			return out
		}
	}
	t.Fatal("paging did not end")
	return nil
}

func sortedIDs(rows []pagingRow, keys api.Keyset) []string {
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b pagingRow) int {
		for _, k := range keys {
			c := 0
			switch k.Col {
			case "id":
				c = strings.Compare(a.id, b.id)
			case "name":
				c = strings.Compare(a.name, b.name)
			case "size":
				c = a.size - b.size
			}
			if k.Desc {
				c = -c
			}
			if c != 0 {
				return c
			}
		}
		return 0
	})
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	return ids
}

func TestMarkerValuesNotFound(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(ctx, "CREATE TABLE paging_m (id TEXT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		_, err = api.Keyset{{Col: "id"}}.MarkerValues(ctx, db, "paging_m", "id = ?", "nope")
		if err != store.ErrNotFound {
			t.Fatalf("err = %v, want store.ErrNotFound", err)
		}
	})
}

func TestPageSQL(t *testing.T) {
	tests := []struct {
		name string
		page api.Page
		want string
	}{
		{"no filter, no limit", api.Page{Keys: api.Keyset{{Col: "id"}}, Limit: -1}, "ORDER BY id ASC"},
		{"filters and limit", api.Page{Where: []string{"a = ?", "b = ?"}, Keys: api.Keyset{{Col: "t", Desc: true}, {Col: "id", Desc: true}}, Limit: 5},
			"WHERE a = ? AND b = ? ORDER BY t DESC, id DESC LIMIT 5"},
		{"limit 0 is an empty page", api.Page{Keys: api.Keyset{{Col: "id"}}}, "ORDER BY id ASC LIMIT 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.page.SQL(); got != tt.want {
				t.Errorf("SQL() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestKeysetAfter(t *testing.T) {
	cond, args := api.Keyset{{Col: "a", Desc: true}, {Col: "id"}}.After([]any{"x", "y"})
	if want := "((a < ?) OR (a = ? AND id > ?))"; cond != want {
		t.Errorf("cond = %q, want %q", cond, want)
	}
	if !slices.Equal(args, []any{"x", "x", "y"}) {
		t.Errorf("args = %v", args)
	}
}

func TestNextQuery(t *testing.T) {
	q := url.Values{"marker": {"old"}, "offset": {"3"}, "name": {"a b"}, "sort": {"x:asc", "y"}}
	tests := []struct {
		name string
		set  map[string]string
		drop []string
		want string
	}{
		{"replaces the marker, keeps the rest sorted", map[string]string{"marker": "m", "limit": "2"}, nil,
			"limit=2&marker=m&name=a+b&offset=3&sort=x%3Aasc&sort=y"},
		{"drops", map[string]string{"marker": "m"}, []string{"offset", "sort"}, "marker=m&name=a+b"},
		{"no query", nil, []string{"marker", "offset", "name", "sort"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := api.NextQuery(q, tt.set, tt.drop...); got != tt.want {
				t.Errorf("NextQuery = %q, want %q", got, tt.want)
			}
		})
	}
	if q.Get("marker") != "old" {
		t.Error("NextQuery changed the request's query")
	}
}
