package compute_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// fault checks a Nova fault: status and a part of its message.
func (e *env) fault(want int, msgPart, method, path, tok, mv, body string) {
	e.t.Helper()
	st, m, _ := e.do(method, path, tok, mv, body)
	if st != want {
		e.t.Fatalf("%s %s %s (mv %q): status %d, want %d: %v", method, path, body, mv, st, want, m)
	}
	if len(m) != 1 {
		e.t.Fatalf("%s %s: not a Nova fault: %v", method, path, m)
	}
	for _, v := range m {
		f, _ := v.(map[string]any)
		msg, _ := f["message"].(string)
		if f == nil || f["code"] != float64(want) || !strings.Contains(msg, msgPart) {
			e.t.Fatalf("%s %s %s: fault %v, want message containing %q", method, path, body, m, msgPart)
		}
	}
}

// TestRemoteConsoles checks the console APIs with the fake driver, whose
// servers have no graphical console: everything up to the driver, and its
// ErrNoConsole as Nova's ConsoleTypeUnavailable.
func TestRemoteConsoles(t *testing.T) {
	e := newEnv(t, "")
	id := e.create(e.demo, "2.37", "")
	e.wait(id, e.demo, "ACTIVE")
	rc := "/servers/" + id + "/remote-consoles"
	vnc := `{"remote_console":{"protocol":"vnc","type":"novnc"}}`

	// Before 2.6 there is no remote-consoles API.
	e.fault(404, "could not be found", "POST", rc, e.demo, "2.5", vnc)
	e.fault(404, "could not be found", "POST", rc, e.demo, "", vnc)

	// The driver has no console.
	for _, mv := range []string{"2.6", "2.96"} {
		e.fault(400, "Unavailable console type novnc.", "POST", rc, e.demo, mv, vnc)
	}
	// Other protocols are unavailable; unknown ones fail the schema.
	for _, c := range []struct{ mv, body, msg string }{
		{"2.6", `{"remote_console":{"protocol":"spice","type":"spice-html5"}}`, "Unavailable console type spice-html5."},
		{"2.6", `{"remote_console":{"protocol":"rdp","type":"rdp-html5"}}`, "Unavailable console type rdp-html5."},
		{"2.6", `{"remote_console":{"protocol":"serial","type":"serial"}}`, "Unavailable console type serial."},
		{"2.8", `{"remote_console":{"protocol":"mks","type":"webmks"}}`, "Unavailable console type webmks."},
		{"2.6", `{"remote_console":{"protocol":"mks","type":"webmks"}}`, "'mks' is not one of ['vnc', 'spice', 'rdp', 'serial']"},
		{"2.6", `{"remote_console":{"protocol":"telnet","type":"novnc"}}`, "Invalid input for field/attribute protocol. Value: telnet."},
		{"2.6", `{"remote_console":{"protocol":"vnc","type":"vnc"}}`, "'vnc' is not one of"},
		{"2.6", `{"remote_console":{"protocol":"vnc","type":"xvpvnc"}}`, "Invalid console type xvpvnc"},
		{"2.6", `{"remote_console":{"protocol":"vnc"}}`, "'type' is a required property"},
		{"2.6", `{"remote_console":{"protocol":1,"type":"novnc"}}`, "1 is not of type 'string'"},
		{"2.6", `{"remote_console":{"protocol":"vnc","type":"novnc","x":1}}`, "Additional properties are not allowed"},
		{"2.6", `{"console":{}}`, "'remote_console' is a required property"},
	} {
		e.fault(400, c.msg, "POST", rc, e.demo, c.mv, c.body)
	}

	// The 2.1–2.5 actions.
	e.fault(400, "Unavailable console type novnc.", "POST", "/servers/"+id+"/action", e.demo, "2.1", `{"os-getVNCConsole":{"type":"novnc"}}`)
	e.fault(400, "Unavailable console type novnc.", "POST", "/servers/"+id+"/action", e.demo, "", `{"os-getVNCConsole":{"type":"novnc"}}`)
	e.fault(400, "Unavailable console type spice-html5.", "POST", "/servers/"+id+"/action", e.demo, "2.5", `{"os-getSPICEConsole":{"type":"spice-html5"}}`)
	e.fault(400, "Unavailable console type serial.", "POST", "/servers/"+id+"/action", e.demo, "2.1", `{"os-getSerialConsole":{"type":"serial"}}`)
	e.fault(400, "Invalid console type xvpvnc", "POST", "/servers/"+id+"/action", e.demo, "2.1", `{"os-getVNCConsole":{"type":"xvpvnc"}}`)
	e.fault(400, "'spice-html5' is not one of ['novnc', 'xvpvnc']", "POST", "/servers/"+id+"/action", e.demo, "2.1", `{"os-getVNCConsole":{"type":"spice-html5"}}`)
	e.fault(400, "'type' is a required property", "POST", "/servers/"+id+"/action", e.demo, "2.1", `{"os-getVNCConsole":{}}`)
	e.fault(400, "is not of type 'object'", "POST", "/servers/"+id+"/action", e.demo, "2.1", `{"os-getVNCConsole":"novnc"}`)
	e.fault(404, "could not be found", "POST", "/servers/"+id+"/action", e.demo, "2.6", `{"os-getVNCConsole":{"type":"novnc"}}`)

	// Owner only: another project's server is not found; an admin sees it.
	adminID := e.create(e.admin, "2.37", "")
	e.wait(adminID, e.admin, "ACTIVE")
	e.fault(404, "Instance "+adminID+" could not be found.", "POST", "/servers/"+adminID+"/remote-consoles", e.demo, "2.6", vnc)
	e.fault(404, "could not be found", "POST", "/servers/"+adminID+"/action", e.demo, "2.1", `{"os-getVNCConsole":{"type":"novnc"}}`)
	e.fault(400, "Unavailable console type novnc.", "POST", rc, e.admin, "2.6", vnc)
	e.fault(404, "could not be found", "POST", "/servers/00000000-0000-0000-0000-000000000000/remote-consoles", e.demo, "2.6", vnc)

	// Not ACTIVE: Nova's InstanceNotReady.
	e.action(id, e.demo, "2.6", `{"os-stop":null}`, 202)
	e.wait(id, e.demo, "SHUTOFF")
	e.fault(409, "Instance "+id+" is not ready", "POST", rc, e.demo, "2.6", vnc)
	e.fault(409, "Instance "+id+" is not ready", "POST", "/servers/"+id+"/action", e.demo, "2.1", `{"os-getVNCConsole":{"type":"novnc"}}`)
}

// TestConsoleTokenLookup checks the proxy's token lookup on both engines:
// a token works while it is fresh and its server lives on the host it was
// made for.
func TestConsoleTokenLookup(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		id := e.create(e.demo, "2.37", "")
		e.wait(id, e.demo, "ACTIVE")
		var computeHost string
		if err := e.c.DB.QueryRow(ctx, "SELECT host FROM compute_servers WHERE id = ?", id).Scan(&computeHost); err != nil {
			t.Fatal(err)
		}
		tokens := e.c.Compute.ConsoleTokens()
		now := time.Now()
		add := func(tok, computeHost string, expires time.Time) {
			t.Helper()
			if _, err := e.c.DB.Exec(ctx, `INSERT INTO compute_console_tokens (token_hash, server_id, project_id, compute_host,
				console_type, host, port, secret, expires_at, created_at) VALUES (?, ?, 'p', ?, 'novnc', '192.0.2.7', 5901, 's3cret', ?, ?)`,
				hashToken(tok), id, computeHost, store.FormatTime(expires), store.FormatTime(now)); err != nil {
				t.Fatal(err)
			}
		}
		add("fresh", computeHost, now.Add(time.Minute))
		add("stale", computeHost, now.Add(-time.Second))
		add("moved", "elsewhere", now.Add(time.Minute))
		ep, err := tokens.Lookup(ctx, "fresh")
		if err != nil || ep.Host != "192.0.2.7" || ep.Port != 5901 || ep.Secret != "s3cret" {
			t.Fatalf("Lookup(fresh) = %+v, %v", ep, err)
		}
		for _, tok := range []string{"stale", "moved", "unknown", ""} {
			if _, err := tokens.Lookup(ctx, tok); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Lookup(%q): %v, want not found", tok, err)
			}
			if err := tokens.Consume(ctx, tok); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Consume(%q): %v, want not found", tok, err)
			}
		}
		// One use: of requests racing to spend a token, one wins; after
		// it the token finds nothing.
		add("raced", computeHost, now.Add(time.Minute))
		const n = 16
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			go func() { errs <- tokens.Consume(ctx, "raced") }()
		}
		won := 0
		for i := 0; i < n; i++ {
			switch err := <-errs; {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrNotFound):
				t.Errorf("Consume racing: %v", err)
			}
		}
		if won != 1 {
			t.Fatalf("%d of %d racing Consume calls spent one token, want 1", won, n)
		}
		if _, err := tokens.Lookup(ctx, "raced"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Lookup of a spent token: %v, want not found", err)
		}
		e.must(204, "DELETE", "/servers/"+id, e.demo, "2.6", "")
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := tokens.Lookup(ctx, "fresh")
			if errors.Is(err, store.ErrNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Lookup after delete: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func hashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}
