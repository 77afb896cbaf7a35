package panel_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
	"golang.org/x/crypto/ssh"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// slowFake makes the fake driver slow enough that a server is seen
// building, stopping and starting (a spawn takes three delays).
func slowFake(d time.Duration) testenv.Options {
	return func(cfg *cloud.Config) { cfg.FakeDelay = d }
}

// srvImage is the id of the image named name.
func srvImage(t testing.TB, c *cloud.Cloud, name string) string {
	t.Helper()
	var id string
	if err := c.DB.QueryRow(context.Background(), "SELECT id FROM images WHERE name = ?", name).Scan(&id); err != nil {
		t.Fatalf("no image %s: %v", name, err)
	}
	return id
}

// srvCreate creates a server through the API as pc's user and returns its
// id; opts may add a key name.
func srvCreate(t testing.TB, sc *gophercloud.ServiceClient, opts servers.CreateOptsBuilder) string {
	t.Helper()
	s, err := servers.Create(context.Background(), sc, opts, nil).Extract()
	if err != nil {
		t.Fatalf("create server: %v", err)
	}
	return s.ID
}

func srvWait(t testing.TB, sc *gophercloud.ServiceClient, id, status string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := servers.WaitForStatus(ctx, sc, id, status); err != nil {
		t.Fatalf("server %s to %s: %v", id, status, err)
	}
}

// waitJS waits until the expression is true on the page, across the
// page's own reloads.
func waitJS(b *browser, what, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.t.Fatalf("%s: %s never held (at %s)", what, expr, b.location())
}

// statusIs waits for the server page to show a status starting with want
// and no task, so that the page will not reload itself again.
func statusIs(b *browser, want string) {
	b.t.Helper()
	waitJS(b, "status "+want, fmt.Sprintf(`(() => { const e = document.querySelector("[data-server]");
		return document.readyState === "complete" && !!e && e.dataset.status.startsWith(%q) && e.dataset.task === "" })()`, want))
}

// srvClick clicks the button or link at sel and waits for the next page.
func srvClick(b *browser, what, sel string) {
	b.t.Helper()
	b.navigate(what, chromedp.Click(chromedp.CSS(sel)))
}

// TestServersBrowser: the demo customer creates servers through the API
// and, in the panel, sees one go ACTIVE in the list without a reload,
// reads its SSH command from /access, and stops, starts, shelves,
// unshelves and deletes it with the buttons; a name with a script in it
// is shown as text.
func TestServersBrowser(t *testing.T) {
	c := startCloud(t, slowFake(time.Second))
	pc := testenv.Provider(t, c, cloud.DemoUser)
	sc := testenv.Compute(t, pc, "2.96")
	img := srvImage(t, c, "Debian 12")
	const evil = `<script>alert(1)</script>`
	xss := srvCreate(t, sc, servers.CreateOpts{Name: evil, ImageRef: img, FlavorRef: "d1.2g.local", Networks: "auto"})

	b := newBrowser(t, c)
	b.login(demoLogin(c))
	id := srvCreate(t, sc, servers.CreateOpts{Name: "web-1", ImageRef: img, FlavorRef: "d1.2g.local", Networks: "auto"})
	b.open("/servers")
	cell := fmt.Sprintf(`tr[data-id=%q] .status`, id)
	if got := b.text(cell); !strings.HasPrefix(got, "BUILD") {
		t.Fatalf("a new server's status reads %q, want BUILD", got)
	}
	get(b, "mark the page", chromedp.Evaluate[bool](`window.samePage = true`))
	waitJS(b, "live ACTIVE", fmt.Sprintf(`document.querySelector(%q).textContent === "ACTIVE"`, cell))
	if !get(b, "same page", chromedp.Evaluate[bool](`window.samePage === true`)) {
		t.Fatal("the list reloaded to show ACTIVE")
	}
	row := b.text(fmt.Sprintf(`tr[data-id=%q]`, id))
	for _, want := range []string{"web-1", "1 vCPU", "2 GB RAM", "20 GB local disk", "RUB"} {
		if !strings.Contains(row, want) {
			t.Errorf("the row %q does not show %q", row, want)
		}
	}
	// The script in a name is text: shown, never run, no element added.
	if got := b.text(fmt.Sprintf(`tr[data-id=%q] th a`, xss)); got != evil {
		t.Errorf("the evil name reads %q", got)
	}
	if n := get(b, "inline scripts", chromedp.Evaluate[int](`document.querySelectorAll("script:not([src])").length`)); n != 0 {
		t.Errorf("%d inline script elements on the list", n)
	}
	b.axe()
	b.shot("servers")

	srvClick(b, "open web-1", fmt.Sprintf(`a[href="/servers/%s"]`, id))
	var access struct {
		Access []struct {
			Host, User string
			Port       int
		}
	}
	srvAPI(t, c, pc, "/servers/"+id+"/access", &access)
	if len(access.Access) == 0 {
		t.Fatal("the API gives no access for an ACTIVE server")
	}
	a := access.Access[0]
	want := "ssh " + a.User + "@" + a.Host
	if a.Port != 22 {
		want = fmt.Sprintf("ssh -p %d %s@%s", a.Port, a.User, a.Host)
	}
	if got := b.text(".login-cmd"); got != want {
		t.Errorf("the page's SSH command is %q, the API's %q", got, want)
	}
	b.axe()
	b.shot("server")

	for _, step := range []struct{ button, want string }{
		{"stop", "SHUTOFF"}, {"start", "ACTIVE"}, {"shelve", "SHELVED"}, {"unshelve", "ACTIVE"},
	} {
		srvClick(b, step.button, fmt.Sprintf(`form[action="/servers/%s/%s"] button`, id, step.button))
		statusIs(b, step.want)
	}
	b.do("tick", chromedp.Click(chromedp.CSS("#delete-confirm")))
	get(b, "accept the confirmation", chromedp.Evaluate[bool](`window.confirm = () => true; true`))
	srvClick(b, "delete", fmt.Sprintf(`form[action="/servers/%s/delete"] button`, id))
	if loc := b.location(); loc != "/servers" {
		t.Fatalf("after delete the browser is at %s", loc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := servers.WaitForStatus(ctx, sc, id, "DELETED"); err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		t.Fatalf("the server was not deleted: %v", err)
	}

	// The evil name on its own page: a title and a heading of text.
	b.open("/servers/" + xss)
	if got := b.text("h1"); got != evil {
		t.Errorf("the evil name's heading reads %q", got)
	}
	if n := get(b, "inline scripts", chromedp.Evaluate[int](`document.querySelectorAll("script:not([src])").length`)); n != 0 {
		t.Errorf("%d inline script elements on the server's page", n)
	}
}

// srvAPI reads a compute path as pc's user.
func srvAPI(t testing.TB, c *cloud.Cloud, pc *gophercloud.ProviderClient, path string, out any) {
	t.Helper()
	resp, body := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+path, pc.Token(), "", "OpenStack-API-Version", "compute 2.96")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	if err := json.Unmarshal([]byte(body), out); err != nil {
		t.Fatal(err)
	}
}

// srvQuote is billing's hourly price of a d2.4g.local server of osType,
// in major units.
func srvQuote(t testing.TB, c *cloud.Cloud, osType string) string {
	t.Helper()
	body := `{"quote":{"flavor":"d2.4g.local","os_type":"` + osType + `"}}`
	resp, got := testenv.Do(t, testenv.HTTPClient(t, c), "POST", c.BillingURL+"/v1/quotes", testenv.Token(t, c, cloud.DemoUser), body)
	testenv.MustStatus(t, resp, got, http.StatusOK)
	var q struct {
		Quote struct {
			HourlyEach int64 `json:"hourly_each"`
		}
	}
	if err := json.Unmarshal([]byte(got), &q); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d.%02d", q.Quote.HourlyEach/100, q.Quote.HourlyEach%100)
}

// srvCost charges the next hours and checks that the list shows what
// billing's usage says the server cost.
func srvCost(t *testing.T, c *cloud.Cloud, w *web, id string) {
	t.Helper()
	now := time.Now().UTC()
	if _, err := c.Billing.ChargeUntil(context.Background(), now.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	var project string
	if err := c.DB.QueryRow(context.Background(), "SELECT id FROM projects WHERE name = ?", cloud.DemoProject).Scan(&project); err != nil {
		t.Fatal(err)
	}
	us, err := c.Billing.Usage(context.Background(), project, time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, u := range us {
		if u.ResourceID == id {
			want += u.Amount
		}
	}
	if want == 0 {
		t.Log("the hours charged fall in next month: the cost is not checked")
		return
	}
	_, _, body := w.get("/servers")
	row := regexp.MustCompile(`<tr data-id="` + id + `">.*?</tr>`).FindString(body)
	if cost := fmt.Sprintf(">%d.%02d RUB", want/100, want%100); !strings.Contains(row, cost) {
		t.Errorf("the row %s does not show the cost %s", row, cost)
	}
}

// TestServersOtherCustomer: another customer's server is the API's 404 on
// its page, its delete confirmation and every action, and stays as it was.
func TestServersOtherCustomer(t *testing.T) {
	c := startCloud(t)
	admin := testenv.Provider(t, c, cloud.AdminUser)
	idc, err := openstack.NewIdentityV3(admin, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	proj, err := projects.Create(ctx, idc, projects.CreateOpts{Name: "acme", DomainID: "default"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	user, err := users.Create(ctx, idc, users.CreateOpts{Name: "acme-owner", Password: "acme-secret-1", DomainID: "default", DefaultProjectID: proj.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	var member string
	pages, err := roles.List(idc, roles.ListOpts{Name: "member"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs, _ := roles.ExtractRoles(pages)
	if len(rs) == 0 {
		t.Fatal("no member role")
	}
	member = rs[0].ID
	if err := roles.Assign(ctx, idc, member, roles.AssignOpts{UserID: user.ID, ProjectID: proj.ID}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	acme := testenv.Compute(t, testenv.ProviderAs(t, c, "acme-owner", "acme-secret-1", "acme"), "2.96")
	id := srvCreate(t, acme, servers.CreateOpts{Name: "acme-db", ImageRef: srvImage(t, c, "Debian 12"), FlavorRef: "d1.2g.local", Networks: "auto"})
	srvWait(t, acme, id, "ACTIVE")

	w := newWeb(t, c)
	w.login(demoLogin(c))
	page := "/servers/" + id
	if status, _, body := w.get(page); status != http.StatusNotFound || strings.Contains(body, "acme-db") {
		t.Errorf("GET %s: %d %s", page, status, snippet(body))
	}
	if status, _, _ := w.get(page + "/delete"); status != http.StatusNotFound {
		t.Errorf("GET %s/delete: %d", page, status)
	}
	for _, tc := range []struct {
		action string
		form   url.Values
	}{
		{"stop", url.Values{}}, {"start", url.Values{}}, {"reboot", url.Values{"type": {"HARD"}}},
		{"shelve", url.Values{}}, {"rebuild", url.Values{"image": {srvImage(t, c, "Debian 12")}}},
		{"resize", url.Values{"flavor": {"d2.4g.local"}}}, {"delete", url.Values{"confirm": {"yes"}}},
		{"console", url.Values{}},
	} {
		t.Run(tc.action, func(t *testing.T) {
			status, loc, body := w.post("/servers", page+"/"+tc.action, tc.form, true)
			if status != http.StatusNotFound {
				t.Errorf("POST %s/%s: %d %q %s", page, tc.action, status, loc, snippet(body))
			}
		})
	}
	if _, _, body := w.get("/servers"); strings.Contains(body, "acme-db") {
		t.Error("the other customer's server is in the list")
	}
	got, err := servers.Get(ctx, acme, id).Extract()
	if err != nil || got.Status != "ACTIVE" || got.TaskState != "" {
		t.Fatalf("the other customer's server after the attempts: %+v %v", got, err)
	}
}

// TestServersWindowsPassword: the administrator password of a Windows
// server, encrypted to its key pair, decrypts in the browser with the
// private key pasted in each format ssh-keygen and openssl write, and a
// wrong key says so.
func TestServersWindowsPassword(t *testing.T) {
	c := startCloud(t)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := ssh.NewPublicKey(&key.PublicKey)
	sc := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.96")
	if _, err := keypairs.Create(context.Background(), sc, keypairs.CreateOpts{Name: "win", PublicKey: string(ssh.MarshalAuthorizedKey(pub))}).Extract(); err != nil {
		t.Fatal(err)
	}
	const pass = "Str0ng-Admin-Pa55"
	id := srvCreate(t, sc, keypairs.CreateOptsExt{KeyName: "win", CreateOptsBuilder: servers.CreateOpts{
		Name: "win-1", ImageRef: srvImage(t, c, "Windows Server 2022"), FlavorRef: "d2.4g.local", Networks: "auto", AdminPass: pass}})
	srvWait(t, sc, id, "ACTIVE")

	pkcs8, _ := x509.MarshalPKCS8PrivateKey(key)
	openssh, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, c)
	b.login(demoLogin(c))
	b.open("/servers/" + id)
	b.axe()
	// The price is the Windows one, licence included.
	if got, win, linux := b.text(".facts"), srvQuote(t, c, "windows"), srvQuote(t, c, ""); win == linux || !strings.Contains(got, win) {
		t.Errorf("the page's facts %q do not show the Windows price %s (Linux: %s)", got, win, linux)
	}
	for _, tc := range []struct {
		name, pem, want string
	}{
		{"PKCS #1", string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})), pass},
		{"PKCS #8", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})), pass},
		{"OpenSSH", string(pem.EncodeToMemory(openssh)), pass},
		{"another key", string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(other)})), "This key does not decrypt the password"},
		{"not a key", "hello", "This is not an RSA private key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.do("paste and reveal", chromedp.SetValue(chromedp.CSS("#pw-key"), tc.pem), chromedp.Click(chromedp.CSS("#pw-reveal")))
			waitJS(b, "revealed", `document.getElementById("pw-out").textContent !== ""`)
			if got := b.text("#pw-out"); !strings.HasPrefix(got, tc.want) {
				t.Errorf("the page reveals %q, want %q", got, tc.want)
			}
			get(b, "clear", chromedp.Evaluate[bool](`document.getElementById("pw-out").textContent = ""; true`))
		})
	}
}

// TestServersActions: the action forms over HTTP — each does the Nova
// action; a refused one goes back to the page with the API's own message;
// a form's mistake, a delete without its tick, an unknown action and a
// form without its token are refused.
func TestServersActions(t *testing.T) {
	c := startCloud(t)
	pc := testenv.Provider(t, c, cloud.DemoUser)
	sc := testenv.Compute(t, pc, "2.96")
	id := srvCreate(t, sc, servers.CreateOpts{Name: "act-1", ImageRef: srvImage(t, c, "Debian 12"), FlavorRef: "d1.2g.local", Networks: "auto"})
	srvWait(t, sc, id, "ACTIVE")
	// What the API says to a start of a running server.
	resp, body := testenv.Do(t, testenv.HTTPClient(t, c), "POST", c.ComputeURL+"/servers/"+id+"/action", pc.Token(), `{"os-start":null}`)
	var refusal struct {
		Conflict struct{ Message string } `json:"conflictingRequest"`
	}
	if err := json.Unmarshal([]byte(body), &refusal); resp.StatusCode != http.StatusConflict || err != nil || refusal.Conflict.Message == "" {
		t.Fatalf("the API's start of a running server: %d %s", resp.StatusCode, body)
	}
	w := newWeb(t, c)
	w.login(demoLogin(c))
	srvCost(t, c, w, id)
	page := "/servers/" + id
	for _, tc := range []struct {
		name, action string
		form         url.Values
		wantLoc      string // "" for the server's page
		wantFlash    string // the page's message after
		wantStatus   string // the server's then
		wantFlavor   string
	}{
		{"refused start", "start", url.Values{}, "", refusal.Conflict.Message, "ACTIVE", ""},
		{"bad reboot", "reboot", url.Values{"type": {"gentle"}}, "", "Choose a soft or a hard reboot.", "ACTIVE", ""},
		{"hard reboot", "reboot", url.Values{"type": {"HARD"}}, "", "Rebooting the server.", "ACTIVE", ""},
		{"rebuild", "rebuild", url.Values{"image": {srvImage(t, c, "Ubuntu 24.04")}}, "", "Rebuilding the server.", "ACTIVE", ""},
		{"resize", "resize", url.Values{"flavor": {"d2.4g.local"}}, "", "Resizing the server", "VERIFY_RESIZE", "d2.4g.local"},
		{"confirm resize", "confirm-resize", url.Values{}, "", "The new size is confirmed.", "ACTIVE", "d2.4g.local"},
		{"delete without the tick", "delete", url.Values{}, page + "/delete", "", "ACTIVE", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, loc, body := w.post(page, page+"/"+tc.action, tc.form, true)
			want := tc.wantLoc
			if want == "" {
				want = page
			}
			if status != http.StatusSeeOther || loc != want {
				t.Fatalf("POST %s: %d %q %s", tc.action, status, loc, snippet(body))
			}
			if tc.wantStatus != "" {
				srvWait(t, sc, id, tc.wantStatus)
			}
			_, _, after := w.get(loc)
			if !strings.Contains(after, template.HTMLEscapeString(tc.wantFlash)) {
				t.Errorf("after %s the page does not say %q", tc.action, tc.wantFlash)
			}
			if tc.wantFlavor != "" {
				s, err := servers.Get(context.Background(), sc, id).Extract()
				if err != nil || s.Flavor["original_name"] != tc.wantFlavor {
					t.Errorf("flavor after %s: %v %v", tc.action, s.Flavor, err)
				}
			}
		})
	}
	// The page of the running server: its stop button, its console's last
	// lines, and the actions done, from the API's history.
	status, _, body := w.get(page)
	if status != http.StatusOK {
		t.Fatalf("the server's page: %d", status)
	}
	for _, want := range []string{`action="` + page + `/stop"`, "act-1 login:", "<td>reboot</td>", "<td>rebuild</td>", "<td>resize</td>", "<td>confirmResize</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("the server's page has no %s", want)
		}
	}
	if status, _, _ := w.post(page, page+"/explode", url.Values{}, true); status != http.StatusNotFound {
		t.Errorf("an unknown action: %d, want 404", status)
	}
	if status, _, _ := w.post(page, page+"/stop", url.Values{}, false); status != http.StatusForbidden {
		t.Errorf("a form without its token: %d, want 403", status)
	}
	// A console in a new tab asks the API for a URL as the user; the fake
	// driver has none, which the page then says (the qemu driver's way is
	// in internal/console's TestQEMUConsole).
	if status, _, _ := w.post(page, page+"/console", url.Values{}, false); status != http.StatusForbidden {
		t.Errorf("the console form without its token: %d, want 403", status)
	}
	if status, loc, body := w.post(page, page+"/console", url.Values{}, true); status != http.StatusSeeOther || loc != page {
		t.Errorf("the console form: %d %q %s", status, loc, snippet(body))
	} else if _, _, after := w.get(loc); !strings.Contains(after, `<p class="flash bad" role="alert">Unavailable console type novnc.</p>`) {
		t.Errorf("after the console form the page does not say why there is none")
	}
	status, loc, _ := w.post(page+"/delete", page+"/delete", url.Values{"confirm": {"yes"}}, true)
	if status != http.StatusSeeOther || loc != "/servers" {
		t.Fatalf("delete: %d %q", status, loc)
	}
}
