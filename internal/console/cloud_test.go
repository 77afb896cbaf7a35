package console_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"nimbus/internal/cloud"
	"nimbus/internal/compute"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// rfbEndpoint is a host relay's stand-in: it takes the line secret+"\n"
// and answers RFB's greeting.
func rfbEndpoint(t *testing.T, secret string) (host string, port int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if l, err := br.ReadString('\n'); err != nil || l != secret+"\n" {
					return
				}
				io.WriteString(c, "RFB 003.008\n")
				io.Copy(c, br)
			}()
		}
	}()
	a := ln.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

// call sends a compute request and decodes its answer.
func call(t *testing.T, client *http.Client, c *cloud.Cloud, method, path, tok, mv, body string) (int, map[string]any) {
	t.Helper()
	var hdr []string
	if mv != "" {
		hdr = []string{"OpenStack-API-Version", "compute " + mv}
	}
	resp, raw := testenv.Do(t, client, method, c.ComputeURL+path, tok, body, hdr...)
	var m map[string]any
	if strings.TrimSpace(raw) != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s %s: %q", method, path, raw)
		}
	}
	return resp.StatusCode, m
}

// waitActive polls a server until it is ACTIVE with no task.
func waitActive(t *testing.T, client *http.Client, c *cloud.Cloud, tok, id string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, m := call(t, client, c, "GET", "/servers/"+id, tok, "2.37", "")
		if st != 200 {
			t.Fatalf("GET server: %d %v", st, m)
		}
		sv := m["server"].(map[string]any)
		if sv["status"] == "ACTIVE" && sv["OS-EXT-STS:task_state"] == nil {
			return id
		}
		if sv["status"] == "ERROR" {
			t.Fatalf("server %s: ERROR %v", id, sv["fault"])
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s: %v/%v after %s", id, sv["status"], sv["OS-EXT-STS:task_state"], timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dialConsole opens the console websocket of a URL compute answered, as
// noVNC's vnc_lite.html does: wss://<its host>/<its path parameter>.
func dialConsole(t *testing.T, client *http.Client, consoleURL, origin string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	u, err := url.Parse(consoleURL)
	if err != nil {
		t.Fatal(err)
	}
	if u.Scheme != "https" || u.Path != "/vnc_lite.html" || !strings.HasPrefix(u.Query().Get("path"), "?token=") {
		t.Fatalf("console URL %s: want https://host:port/vnc_lite.html?path=%%3Ftoken%%3D…", consoleURL)
	}
	ws := "wss://" + u.Host + "/" + u.Query().Get("path")
	hdr := http.Header{}
	if origin != "" {
		hdr.Set("Origin", origin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return websocket.Dial(ctx, ws, &websocket.DialOptions{HTTPClient: client, Subprotocols: []string{"binary"}, HTTPHeader: hdr})
}

// TestCloudProxy runs the proxy as the cloud serves it (TLS, its own port,
// compute's token lookup) with tokens put in the store by hand: the fake
// driver has no console to make them.
func TestCloudProxy(t *testing.T) {
	c := testenv.StartCloud(t, "")
	client := testenv.HTTPClient(t, c)
	demo := testenv.Token(t, c, cloud.DemoUser)
	ctx := context.Background()
	var imageID string
	if err := c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&imageID); err != nil {
		t.Fatal(err)
	}
	st, m := call(t, client, c, "POST", "/servers", demo, "2.37",
		`{"server":{"name":"console","imageRef":"`+imageID+`","flavorRef":"2","networks":"none"}}`)
	if st != 202 {
		t.Fatalf("create: %d %v", st, m)
	}
	id := waitActive(t, client, c, demo, m["server"].(map[string]any)["id"].(string), 20*time.Second)
	var computeHost string
	if err := c.DB.QueryRow(ctx, "SELECT host FROM compute_servers WHERE id = ?", id).Scan(&computeHost); err != nil {
		t.Fatal(err)
	}
	host, port := rfbEndpoint(t, "s3cret")
	now := time.Now()
	add := func(tok string, expires time.Time) string {
		h := sha256.Sum256([]byte(tok))
		if _, err := c.DB.Exec(ctx, `INSERT INTO compute_console_tokens (token_hash, server_id, project_id, compute_host,
			console_type, host, port, secret, expires_at, created_at) VALUES (?, ?, 'p', ?, 'novnc', ?, ?, 's3cret', ?, ?)`,
			hex.EncodeToString(h[:]), id, computeHost, host, port, store.FormatTime(expires), store.FormatTime(now)); err != nil {
			t.Fatal(err)
		}
		return c.ConsoleURL + "/vnc_lite.html?" + url.Values{"path": {"?token=" + tok}}.Encode()
	}
	good := add("good-token", now.Add(time.Minute))
	stale := add("stale-token", now.Add(-time.Minute))

	// A foreign origin is refused without spending the token.
	if ws, resp, err := dialConsole(t, client, good, "https://evil.example.net"); err == nil {
		ws.CloseNow()
		t.Fatal("a foreign origin was accepted")
	} else if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("foreign origin: %v %v, want 403", resp, err)
	}
	ws, _, err := dialConsole(t, client, good, c.ConsoleURL)
	if err != nil {
		t.Fatalf("console websocket: %v", err)
	}
	defer ws.CloseNow()
	if ws.Subprotocol() != "binary" {
		t.Errorf("subprotocol %q", ws.Subprotocol())
	}
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 12)
	if _, err := io.ReadFull(nc, b); err != nil || string(b) != "RFB 003.008\n" {
		t.Fatalf("greeting %q, %v", b, err)
	}

	for _, tc := range []struct {
		url, origin string
		want        int
	}{
		{good, c.ConsoleURL, http.StatusForbidden}, // used once already
		{stale, "", http.StatusForbidden},
		{strings.Replace(good, "good-token", "made-up", 1), "", http.StatusForbidden},
	} {
		ws, resp, err := dialConsole(t, client, tc.url, tc.origin)
		if err == nil {
			ws.CloseNow()
			t.Fatalf("%s (origin %q): accepted", tc.url, tc.origin)
		}
		if resp == nil || resp.StatusCode != tc.want {
			t.Fatalf("%s (origin %q): %v %v, want %d", tc.url, tc.origin, resp, err, tc.want)
		}
	}
	// The console port also answers the ops endpoints, as every listener.
	resp, raw := testenv.Do(t, client, "GET", c.ConsoleURL+"/healthz", "", "")
	if resp.StatusCode != 200 {
		t.Errorf("healthz: %d %s", resp.StatusCode, raw)
	}
}

// TestQEMUConsole is the whole way with a real VM: a server of a blank
// disk on the qemu driver (SeaBIOS with nothing to boot is on its screen),
// the console URL from the remote-consoles API, and RFB through the proxy
// and the host's relay, as far as the VM's screen size.
func TestQEMUConsole(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("NIMBUS_REQUIRE_QEMU") == "1" {
				t.Fatalf("%s is not installed and NIMBUS_REQUIRE_QEMU=1", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	ctx := context.Background()
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.Driver = "qemu"
		cfg.QEMU = cloud.QEMUOptions{Accel: "tcg", ReservedCPUs: []int{}, ReservedMemoryMB: -1, AccessHost: "127.0.0.1"}
		cfg.AgentHeartbeat = 2 * time.Second
	})
	client := testenv.HTTPClient(t, c)
	admin := testenv.Token(t, c, cloud.AdminUser)
	demo := testenv.Token(t, c, cloud.DemoUser)

	blank := filepath.Join(t.TempDir(), "blank.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", blank, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	resp, raw := testenv.Do(t, client, "POST", c.ImageURL+"/v2/images", demo,
		`{"name":"blank","disk_format":"qcow2","container_format":"bare"}`)
	if resp.StatusCode != 201 {
		t.Fatalf("image: %d %s", resp.StatusCode, raw)
	}
	var img struct{ ID string }
	json.Unmarshal([]byte(raw), &img)
	data, err := os.ReadFile(blank)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("PUT", c.ImageURL+"/v2/images/"+img.ID+"/file", strings.NewReader(string(data)))
	req.Header.Set("X-Auth-Token", demo)
	req.Header.Set("Content-Type", "application/octet-stream")
	up, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	up.Body.Close()
	if up.StatusCode != 204 {
		t.Fatalf("upload: %d", up.StatusCode)
	}
	st, m := call(t, client, c, "POST", "/flavors", admin, "2.55",
		`{"flavor":{"name":"console","vcpus":1,"ram":128,"disk":1}}`)
	if st != 200 {
		t.Fatalf("flavor: %d %v", st, m)
	}
	flavor := m["flavor"].(map[string]any)["id"].(string)
	if st, m := call(t, client, c, "POST", "/flavors/"+flavor+"/os-extra_specs", admin, "2.55",
		`{"extra_specs":{"hw:cpu_policy":"dedicated","nimbus:disk_type":"local"}}`); st != 200 {
		t.Fatalf("extra specs: %d %v", st, m)
	}
	st, m = call(t, client, c, "POST", "/servers", demo, "2.37",
		`{"server":{"name":"console","imageRef":"`+img.ID+`","flavorRef":"`+flavor+`","networks":"auto"}}`)
	if st != 202 {
		t.Fatalf("create: %d %v", st, m)
	}
	id := waitActive(t, client, c, demo, m["server"].(map[string]any)["id"].(string), 180*time.Second)
	// Delete the server and wait until it is gone, before the cloud closes
	// (which leaves VMs running, as an agent restart does).
	t.Cleanup(func() {
		call(t, client, c, "DELETE", "/servers/"+id, demo, "2.37", "")
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if st, _ := call(t, client, c, "GET", "/servers/"+id, demo, "2.37", ""); st == 404 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("server %s not deleted", id)
	})

	st, m = call(t, client, c, "POST", "/servers/"+id+"/remote-consoles", demo, "2.6",
		`{"remote_console":{"protocol":"vnc","type":"novnc"}}`)
	if st != 200 {
		t.Fatalf("remote-consoles: %d %v", st, m)
	}
	rc := m["remote_console"].(map[string]any)
	if rc["protocol"] != "vnc" || rc["type"] != "novnc" || !strings.HasPrefix(rc["url"].(string), c.ConsoleURL+"/vnc_lite.html?path=%3Ftoken%3D") {
		t.Fatalf("remote_console %v (console URL %s)", rc, c.ConsoleURL)
	}
	consoleURL := rc["url"].(string)
	// The relay started for this console; nothing has connected to it yet.
	var relayPort int
	var created, expires string
	if err := c.DB.QueryRow(ctx, "SELECT port, created_at, expires_at FROM compute_console_tokens WHERE token_hash = ?",
		tokenHash(t, consoleURL)).Scan(&relayPort, &created, &expires); err != nil {
		t.Fatalf("the console token's row: %v", err)
	}
	if ct, et := store.ParseTime(created), store.ParseTime(expires); et.Sub(ct) != compute.ConsoleTokenTTL || compute.ConsoleTokenTTL > 10*time.Minute {
		t.Errorf("the console URL lives %v (from %s to %s), want compute.ConsoleTokenTTL, %v, at most Nova's 10 min",
			et.Sub(ct), created, expires, compute.ConsoleTokenTTL)
	}
	if n := tcpConnsOf(t, relayPort); n != 0 {
		t.Fatalf("%d connections to the relay's port %d before any console request", n, relayPort)
	}
	// A page of another origin is refused, and the proxy never reaches
	// the relay for it: the kernel knows no connection to the relay's
	// port, not even one closed (TIME_WAIT lasts a minute).
	if ws, resp, err := dialConsole(t, client, consoleURL, "https://evil.example.net"); err == nil {
		ws.CloseNow()
		t.Fatal("a foreign origin was accepted")
	} else if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("foreign origin: %v %v, want 403", resp, err)
	}
	if n := tcpConnsOf(t, relayPort); n != 0 {
		t.Fatalf("the proxy connected to the relay (port %d) for a foreign origin: %d sockets", relayPort, n)
	}
	// The refused request did not spend the token: it opens the console.
	ws, _, err := dialConsole(t, client, consoleURL, c.ConsoleURL)
	if err != nil {
		t.Fatalf("console websocket: %v", err)
	}
	defer ws.CloseNow()
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	// RFB 3.8 as a client: version, security None, shared ClientInit; the
	// ServerInit starts with the screen's size.
	greeting := make([]byte, 12)
	if _, err := io.ReadFull(nc, greeting); err != nil || string(greeting) != "RFB 003.008\n" {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	io.WriteString(nc, "RFB 003.008\n")
	sec := make([]byte, 2)
	if _, err := io.ReadFull(nc, sec); err != nil || sec[0] != 1 || sec[1] != 1 {
		t.Fatalf("security types %v, %v", sec, err)
	}
	nc.Write([]byte{1})
	result := make([]byte, 4)
	if _, err := io.ReadFull(nc, result); err != nil || binary.BigEndian.Uint32(result) != 0 {
		t.Fatalf("security result %v, %v", result, err)
	}
	nc.Write([]byte{1})
	init := make([]byte, 4)
	if _, err := io.ReadFull(nc, init); err != nil {
		t.Fatalf("ServerInit: %v", err)
	}
	w, h := binary.BigEndian.Uint16(init[:2]), binary.BigEndian.Uint16(init[2:])
	if w == 0 || h == 0 {
		t.Fatalf("screen %dx%d", w, h)
	}
	t.Logf("the VM's screen through the proxy: %dx%d", w, h)
	// Once only: a second connection with the URL is refused, while the
	// first session goes on.
	if ws, resp, err := dialConsole(t, client, consoleURL, ""); err == nil {
		ws.CloseNow()
		t.Fatal("a console URL opened a second session")
	} else if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("second use: %v %v, want 403", resp, err)
	}
	// The rest of ServerInit (pixel format, name), then a screen update
	// asked and answered.
	rest := make([]byte, 20)
	if _, err := io.ReadFull(nc, rest); err != nil {
		t.Fatalf("ServerInit: %v", err)
	}
	if _, err := io.ReadFull(nc, make([]byte, binary.BigEndian.Uint32(rest[16:]))); err != nil {
		t.Fatalf("ServerInit's name: %v", err)
	}
	nc.Write([]byte{3, 0, 0, 0, 0, 0, 0, 1, 0, 1}) // FramebufferUpdateRequest of one pixel
	typ := make([]byte, 1)
	if _, err := io.ReadFull(nc, typ); err != nil || typ[0] != 0 {
		t.Fatalf("the first session after a refused second one: message %v, %v; want a FramebufferUpdate (0)", typ, err)
	}

	// The 2.1 action gives the same kind of URL.
	st, m = call(t, client, c, "POST", "/servers/"+id+"/action", demo, "2.1", `{"os-getVNCConsole":{"type":"novnc"}}`)
	if st != 200 {
		t.Fatalf("os-getVNCConsole: %d %v", st, m)
	}
	con := m["console"].(map[string]any)
	if con["type"] != "novnc" || !strings.Contains(con["url"].(string), "/vnc_lite.html?path=%3Ftoken%3D") {
		t.Fatalf("console %v", con)
	}
	ws2, _, err := dialConsole(t, client, con["url"].(string), "")
	if err != nil {
		t.Fatalf("second console websocket: %v", err)
	}
	ws2.CloseNow()

	// The panel's server page: its frame opens the console, and so does
	// "open in a new tab" afterwards.
	frame, newTab := panelConsole(t, c, id)
	for _, u := range []string{frame, newTab} {
		ws, _, err := dialConsole(t, client, u, "")
		if err != nil {
			t.Fatalf("the panel's console %s: %v", u, err)
		}
		ws.CloseNow()
	}

	// An expired URL is refused (its expiry moved to the past: the proxy
	// reads the same row when the time has come).
	st, m = call(t, client, c, "POST", "/servers/"+id+"/remote-consoles", demo, "2.6",
		`{"remote_console":{"protocol":"vnc","type":"novnc"}}`)
	if st != 200 {
		t.Fatalf("remote-consoles: %d %v", st, m)
	}
	expired := m["remote_console"].(map[string]any)["url"].(string)
	if _, err := c.DB.Exec(ctx, "UPDATE compute_console_tokens SET expires_at = ? WHERE token_hash = ?",
		store.FormatTime(time.Now().Add(-time.Second)), tokenHash(t, expired)); err != nil {
		t.Fatal(err)
	}
	if ws, resp, err := dialConsole(t, client, expired, ""); err == nil {
		ws.CloseNow()
		t.Fatal("an expired console URL opened a session")
	} else if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("expired: %v %v, want 403", resp, err)
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// panelConsole signs in to the panel as the demo user and returns the
// console URL of server id's page frame, and the one its "open the console
// in a new tab" gives.
func panelConsole(t *testing.T, c *cloud.Cloud, id string) (frame, newTab string) {
	t.Helper()
	hc := testenv.HTTPClient(t, c)
	hc.Jar, _ = cookiejar.New(nil)
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	get := func(path string) string {
		t.Helper()
		resp, err := hc.Get(c.PanelURL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("panel %s: %d", path, resp.StatusCode)
		}
		return string(b)
	}
	m := csrfRE.FindStringSubmatch(get("/login"))
	if m == nil {
		t.Fatal("no form token on the panel's sign-in page")
	}
	resp, err := hc.PostForm(c.PanelURL+"/login", url.Values{"csrf": {m[1]}, "email": {cloud.DemoUser}, "password": {c.Secrets.DemoPassword}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("panel sign-in: %d", resp.StatusCode)
	}
	page := get("/servers/" + id)
	fm := regexp.MustCompile(`<iframe class="console" src="([^"]+)"`).FindStringSubmatch(page)
	action := "/servers/" + id + "/console"
	if fm == nil || !strings.Contains(page, `<form method="post" action="`+action+`" target="_blank"`) {
		t.Fatalf("the server's page has no console frame or no form to open the console in a new tab")
	}
	resp, err = hc.PostForm(c.PanelURL+action, url.Values{"csrf": csrfRE.FindStringSubmatch(page)[1:2]})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST %s: %d", action, resp.StatusCode)
	}
	// The form sends the browser to the console proxy, which the page's
	// policy must let a form's answer lead to.
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "form-action 'self' "+c.ConsoleURL+";") {
		t.Errorf("the panel's policy %q keeps the form's answer from leading to the console %s", csp, c.ConsoleURL)
	}
	return html.UnescapeString(fm[1]), resp.Header.Get("Location")
}

// tokenHash is the stored hash of the token in a console URL.
func tokenHash(t *testing.T, consoleURL string) string {
	t.Helper()
	u, err := url.Parse(consoleURL)
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := strings.CutPrefix(u.Query().Get("path"), "?token=")
	if !ok || tok == "" {
		t.Fatalf("no token in %s", consoleURL)
	}
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// tcpConnsOf counts the TCP sockets of this network namespace, listeners
// aside, with port at either end: open, closing or in TIME_WAIT.
func tcpConnsOf(t *testing.T, port int) int {
	t.Helper()
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] == "0A" { // 0A: LISTEN
				continue
			}
			for _, addr := range fs[1:3] {
				if i := strings.LastIndexByte(addr, ':'); i >= 0 {
					if p, err := strconv.ParseUint(addr[i+1:], 16, 16); err == nil && int(p) == port {
						n++
						break
					}
				}
			}
		}
	}
	return n
}

// TestConsoleTokenOnce races connections with one token through the
// proxies of every controller sharing the database (two on PostgreSQL):
// exactly one gets the console, the others are refused.
func TestConsoleTokenOnce(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		clouds := []*cloud.Cloud{c}
		if strings.HasPrefix(dbURL, "postgres") {
			clouds = append(clouds, testenv.StartCloud(t, dbURL))
		}
		client := testenv.HTTPClient(t, c)
		demo := testenv.Token(t, c, cloud.DemoUser)
		ctx := context.Background()
		var imageID string
		if err := c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&imageID); err != nil {
			t.Fatal(err)
		}
		st, m := call(t, client, c, "POST", "/servers", demo, "2.37",
			`{"server":{"name":"console","imageRef":"`+imageID+`","flavorRef":"2","networks":"none"}}`)
		if st != 202 {
			t.Fatalf("create: %d %v", st, m)
		}
		id := waitActive(t, client, c, demo, m["server"].(map[string]any)["id"].(string), 20*time.Second)
		var computeHost string
		if err := c.DB.QueryRow(ctx, "SELECT host FROM compute_servers WHERE id = ?", id).Scan(&computeHost); err != nil {
			t.Fatal(err)
		}
		host, port := rfbEndpoint(t, "s3cret")
		now := time.Now()
		h := sha256.Sum256([]byte("raced-token"))
		if _, err := c.DB.Exec(ctx, `INSERT INTO compute_console_tokens (token_hash, server_id, project_id, compute_host,
			console_type, host, port, secret, expires_at, created_at) VALUES (?, ?, 'p', ?, 'novnc', ?, ?, 's3cret', ?, ?)`,
			hex.EncodeToString(h[:]), id, computeHost, host, port, store.FormatTime(now.Add(time.Minute)), store.FormatTime(now)); err != nil {
			t.Fatal(err)
		}
		const n = 8
		type result struct {
			ok     bool
			status int
			err    error
		}
		results := make(chan result, n)
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			cl := clouds[i%len(clouds)]
			hc := testenv.HTTPClient(t, cl)
			u := cl.ConsoleURL + "/vnc_lite.html?" + url.Values{"path": {"?token=raced-token"}}.Encode()
			go func() {
				<-start
				ws, resp, err := dialConsole(t, hc, u, "")
				if err != nil {
					r := result{err: err}
					if resp != nil {
						r.status = resp.StatusCode
					}
					results <- r
					return
				}
				defer ws.CloseNow()
				nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
				nc.SetReadDeadline(time.Now().Add(10 * time.Second))
				b := make([]byte, 12)
				_, err = io.ReadFull(nc, b)
				results <- result{ok: err == nil && string(b) == "RFB 003.008\n", err: err}
			}()
		}
		close(start)
		won := 0
		for i := 0; i < n; i++ {
			r := <-results
			switch {
			case r.ok:
				won++
			case r.status != http.StatusForbidden:
				t.Errorf("a losing connection: status %d, %v; want 403", r.status, r.err)
			}
		}
		if won != 1 {
			t.Fatalf("%d of %d connections with one token got the console through %d controller(s), want 1", won, n, len(clouds))
		}
	})
}
