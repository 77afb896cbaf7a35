package panel_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestSupportRequestBounds: one project posting 150 long requests at once
// gets its few open ones in and the rest refused in words; another
// customer's urgent request then stays on the operator's first page and in
// the view by customer. On both engines: the bound is counted under a
// per-project lock that PostgreSQL needs.
func TestSupportRequestBounds(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		ctx := context.Background()
		demo := newWeb(t, c)
		demo.login(demoLogin(c))
		token := demo.csrf("/support")
		body := strings.Repeat("Eight H100 GPUs, please. ", 160)[:4000]
		var wg sync.WaitGroup
		work := make(chan int)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					resp, err := demo.hc.PostForm(demo.base+"/support/requests", url.Values{"csrf": {token}, "body": {fmt.Sprintf("%03d %s", i, body[4:])}})
					if err != nil {
						t.Error(err)
						continue
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusSeeOther {
						t.Errorf("request %d: %d, want 303 (sent or refused in words)", i, resp.StatusCode)
					}
				}
			}()
		}
		start := time.Now()
		for i := range 150 {
			work <- i
		}
		close(work)
		wg.Wait()
		t.Logf("150 requests of 4,000 characters answered in %v", time.Since(start))
		flashOf(t, demo)
		project := bilProject(t, c, cloud.DemoUser)
		var stored int
		if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM panel_config_requests WHERE project_id = ?", project).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != 5 {
			t.Fatalf("%d of 150 requests from one project were stored, want 5 (the open bound)", stored)
		}
		if status, _, b := demo.post("/support", "/support/requests", url.Values{"body": {"One more, please, it is urgent."}}, true); status != http.StatusSeeOther {
			t.Fatalf("one more request: %d %s", status, snippet(b))
		}
		if got := flashOf(t, demo); !strings.Contains(got, "open requests") {
			t.Fatalf("a request past the bound says %q", got)
		}

		other := newWeb(t, c)
		other.login(newCustomer(t, c, "acme"))
		urgent := "URGENT: our training server needs two more GPUs by Monday."
		if status, _, b := other.post("/support", "/support/requests", url.Values{"body": {urgent}}, true); status != http.StatusSeeOther {
			t.Fatalf("another customer's request: %d %s", status, snippet(b))
		}
		if got := flashOf(t, other); !strings.Contains(got, "Your request is sent") {
			t.Fatalf("another customer's request says %q", got)
		}
		if _, _, b := other.get("/support"); !strings.Contains(b, urgent) || strings.Contains(b, "H100") {
			t.Fatalf("the customer's own requests, and only theirs, are not shown: %s", snippet(b))
		}

		op := newWeb(t, c)
		op.login(adminLogin(c))
		for _, path := range []string{"/admin/support/requests", "/admin/support/customers", "/admin/trials"} {
			status, _, b := op.get(path)
			if status != http.StatusOK || !strings.Contains(b, "acme") {
				t.Fatalf("the operator's %s lacks the other customer: %d %s", path, status, snippet(b))
			}
		}
		if _, _, b := op.get("/admin/support/requests"); !strings.Contains(b, urgent) {
			t.Fatalf("the urgent request is not on the operator's first page")
		}
		if _, _, b := op.get("/admin/support/customers"); !strings.Contains(b, cloud.DemoProject) {
			t.Fatalf("the view by customer lacks the demo project")
		}
	})
}

var (
	nextLinkRE   = regexp.MustCompile(`<a href="([^"]+)" rel="next"`)
	requestRowRE = regexp.MustCompile(`data-request="([^"]+)"`)
)

// TestSupportQueuePages: the operator's queue pages by marker through every
// request, newest first, whichever project sent them, and filters by state.
func TestSupportQueuePages(t *testing.T) {
	c := startCloud(t)
	ctx := context.Background()
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix()
	// Requests as stored over weeks, more than a bound lets in at once;
	// two share a second, so the marker must break the tie by id.
	want := map[string]bool{}
	add := func(id, project string, at int64) {
		t.Helper()
		if _, err := c.DB.Exec(ctx, `INSERT INTO panel_config_requests (id, project_id, project_name, user_id, user_name, body, created_at)
 VALUES (?, ?, ?, 'u', 'someone@example.com', ?, ?)`, id, project, project+"-name", "Request "+id, at); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	for i := range 150 {
		add(fmt.Sprintf("noisy-%03d", i), "noisy", base+int64(i)*3600)
	}
	add("quiet-000", "quiet", base+3600*10)
	op := newWeb(t, c)
	op.login(adminLogin(c))
	seen := map[string]bool{}
	var order []string
	path := "/admin/support/requests?state=all"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatalf("more than 10 pages for %d requests", len(want))
		}
		status, _, b := op.get(path)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, snippet(b))
		}
		for _, m := range requestRowRE.FindAllStringSubmatch(b, -1) {
			if seen[m[1]] {
				t.Fatalf("%s is on two pages", m[1])
			}
			seen[m[1]] = true
			order = append(order, m[1])
		}
		path = ""
		if m := nextLinkRE.FindStringSubmatch(b); m != nil {
			path = html.UnescapeString(m[1])
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("the pages reached %d of %d requests", len(seen), len(want))
	}
	if order[0] != "noisy-149" || order[len(order)-1] != "noisy-000" {
		t.Fatalf("not newest first: %s … %s", order[0], order[len(order)-1])
	}
	// The view by customer has both, whatever their numbers.
	if _, _, b := op.get("/admin/support/customers?state=all"); !strings.Contains(b, "quiet-name") || !strings.Contains(b, "noisy-name") {
		t.Fatalf("the view by customer: %s", snippet(b))
	}
	// Closed, the quiet request leaves the open queue for the closed one.
	if status, _, b := op.post("/admin/support/requests", "/admin/support/requests/quiet-000/close", url.Values{}, true); status != http.StatusSeeOther {
		t.Fatalf("close: %d %s", status, snippet(b))
	}
	if _, _, b := op.get("/admin/support/requests?state=closed"); !strings.Contains(b, `data-request="quiet-000"`) || strings.Contains(b, "noisy-") {
		t.Fatalf("the closed queue: %s", snippet(b))
	}
	if _, _, b := op.get("/admin/support/requests?project=quiet"); strings.Contains(b, `data-request="quiet-000"`) {
		t.Fatalf("a closed request is in the open queue")
	}
	for _, bad := range []string{"?state=pending", "?marker=nope", "?state=all&marker=" + strings.Repeat("x", 300)} {
		if status, _, _ := op.get("/admin/support/requests" + bad); status != http.StatusBadRequest {
			t.Errorf("GET /admin/support/requests%s: %d, want 400", bad, status)
		}
	}
}

// TestSupportRequestRate: a customer who closes their requests to make
// room is still held to the hourly bound, and closes only their own.
func TestSupportRequestRate(t *testing.T) {
	c := startCloud(t)
	ctx := context.Background()
	demo := newWeb(t, c)
	demo.login(demoLogin(c))
	project := bilProject(t, c, cloud.DemoUser)
	closeAll := func() {
		t.Helper()
		rows, err := c.DB.Query(ctx, "SELECT id FROM panel_config_requests WHERE project_id = ? AND state = 'open'", project)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for rows.Next() {
			var id string
			rows.Scan(&id)
			ids = append(ids, id)
		}
		rows.Close()
		for _, id := range ids {
			if status, _, b := demo.post("/support", "/support/requests/"+id+"/close", url.Values{}, true); status != http.StatusSeeOther {
				t.Fatalf("close %s: %d %s", id, status, snippet(b))
			}
		}
	}
	for i := 0; i < 12; i++ {
		if i > 0 && i%5 == 0 {
			closeAll()
		}
		demo.post("/support", "/support/requests", url.Values{"body": {fmt.Sprintf("Request number %d, please.", i)}}, true)
		got := flashOf(t, demo)
		want := "Your request is sent"
		if i >= 10 {
			want = "in the last hour"
		}
		if !strings.Contains(got, want) {
			t.Fatalf("request %d says %q, want %q", i, got, want)
		}
	}
	// Another customer cannot close the demo project's request, nor see it.
	other := newWeb(t, c)
	other.login(newCustomer(t, c, "acme"))
	var id string
	if err := c.DB.QueryRow(ctx, "SELECT MAX(id) FROM panel_config_requests WHERE project_id = ?", project).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if status, _, _ := other.post("/support", "/support/requests/"+id+"/close", url.Values{}, true); status != http.StatusNotFound {
		t.Fatalf("another customer closing the request: %d, want 404", status)
	}
	if status, _, _ := other.get("/support?marker=" + id); status != http.StatusBadRequest {
		t.Fatalf("another customer's request as a page marker: %d, want 400", status)
	}
}
