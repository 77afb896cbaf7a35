package console

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// fakeTokens is a token table in memory (compute's, in the store, is
// tested on both engines in cloud_test.go): Consume deletes a token.
type fakeTokens struct {
	mu  sync.Mutex
	m   map[string]driver.ConsoleEndpoint
	n   int
	err error
	// lost are tokens another request spends between Lookup and Consume.
	lost map[string]bool
}

func (f *fakeTokens) Lookup(ctx context.Context, token string) (driver.ConsoleEndpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return driver.ConsoleEndpoint{}, f.err
	}
	ep, ok := f.m[token]
	if !ok {
		return ep, fmt.Errorf("token: %w", store.ErrNotFound)
	}
	return ep, nil
}

func (f *fakeTokens) Consume(ctx context.Context, token string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if _, ok := f.m[token]; !ok || f.lost[token] {
		return fmt.Errorf("token: %w", store.ErrNotFound)
	}
	delete(f.m, token)
	return nil
}

// add makes a new token for ep and returns it.
func (f *fakeTokens) add(ep driver.ConsoleEndpoint) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	tok := fmt.Sprintf("tok%d", f.n)
	if f.m == nil {
		f.m = map[string]driver.ConsoleEndpoint{}
	}
	f.m[tok] = ep
	return tok
}

// FakeEndpoint is a console endpoint as a host's relay is: it reads the
// secret line, then speaks "RFB": it sends the greeting and echoes what
// it reads. A wrong secret closes the connection. Lines are the secret
// lines it read.
type fakeEndpoint struct {
	ln     net.Listener
	secret string

	mu    sync.Mutex
	lines []string
	conns []net.Conn
}

func startEndpoint(t *testing.T, secret string) *fakeEndpoint {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEndpoint{ln: ln, secret: secret}
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			go e.serve(c)
		}
	}()
	return e
}

func (e *fakeEndpoint) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	line = strings.TrimSuffix(line, "\n")
	e.mu.Lock()
	e.lines = append(e.lines, line)
	e.mu.Unlock()
	if line != e.secret {
		return
	}
	io.WriteString(c, "RFB 003.008\n")
	io.Copy(c, br)
}

func (e *fakeEndpoint) endpoint() driver.ConsoleEndpoint {
	a := e.ln.Addr().(*net.TCPAddr)
	return driver.ConsoleEndpoint{Host: a.IP.String(), Port: a.Port, Secret: e.secret}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// wsURL turns an httptest server's URL into its websocket URL.
func wsURL(srv *httptest.Server, path string) string {
	return "ws" + strings.TrimPrefix(srv.URL, "http") + path
}

// readGreeting reads the 12-byte RFB greeting through a websocket.
func readGreeting(t *testing.T, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 12)
	if _, err := io.ReadFull(nc, b); err != nil {
		t.Fatalf("reading the greeting: %v", err)
	}
	if string(b) != "RFB 003.008\n" {
		t.Fatalf("greeting %q", b)
	}
}

func TestProxy(t *testing.T) {
	ep := startEndpoint(t, "the-secret")
	tokens := &fakeTokens{}
	fresh := func() string { return tokens.add(ep.endpoint()) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := New(Config{Tokens: tokens, Context: ctx, Log: quietLog(), Origins: []string{"dashboard.example.com"},
		StaticDir: filepath.Join(t.TempDir(), "none")})
	srv := httptest.NewServer(p)
	defer srv.Close()

	dial := func(path string, opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error) {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		return websocket.Dial(dctx, wsURL(srv, path), opts)
	}

	t.Run("session", func(t *testing.T) {
		c, _, err := dial("/?token="+fresh(), &websocket.DialOptions{Subprotocols: []string{"binary"}})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()
		if c.Subprotocol() != "binary" {
			t.Errorf("subprotocol %q, want binary", c.Subprotocol())
		}
		nc := websocket.NetConn(context.Background(), c, websocket.MessageBinary)
		readGreeting(t, nc)
		// Both ways: what the client sends comes back.
		msg := []byte("RFB 003.008\n\x01")
		if _, err := nc.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(nc, got); err != nil || string(got) != string(msg) {
			t.Fatalf("echo %q, %v", got, err)
		}
		// A text message is not RFB: the proxy ends the session.
		if err := c.Write(context.Background(), websocket.MessageText, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(nc); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the session lives on after a text message")
			}
		}
	})

	t.Run("websockify path, no subprotocol, noVNC origin", func(t *testing.T) {
		hdr := http.Header{"Origin": {srv.URL}}
		c, _, err := dial("/websockify?token="+fresh(), &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()
		readGreeting(t, websocket.NetConn(context.Background(), c, websocket.MessageBinary))
	})

	t.Run("configured origin", func(t *testing.T) {
		hdr := http.Header{"Origin": {"https://dashboard.example.com"}}
		c, _, err := dial("/?token="+fresh(), &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()
		readGreeting(t, websocket.NetConn(context.Background(), c, websocket.MessageBinary))
	})

	t.Run("token cookie", func(t *testing.T) {
		hdr := http.Header{"Cookie": {"token=" + fresh()}}
		c, _, err := dial("/", &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()
		readGreeting(t, websocket.NetConn(context.Background(), c, websocket.MessageBinary))
	})

	refused := func(t *testing.T, path string, hdr http.Header, want int) {
		t.Helper()
		c, resp, err := dial(path, &websocket.DialOptions{HTTPHeader: hdr})
		if err == nil {
			c.CloseNow()
			t.Fatalf("%s: websocket accepted", path)
		}
		if resp == nil || resp.StatusCode != want {
			t.Fatalf("%s: %v %v, want %d", path, resp, err, want)
		}
	}
	t.Run("refused", func(t *testing.T) {
		refused(t, "/?token=bad", nil, http.StatusForbidden)
		refused(t, "/?token=", nil, http.StatusBadRequest)
		refused(t, "/", nil, http.StatusBadRequest)
		tok := fresh()
		refused(t, "/elsewhere?token="+tok, nil, http.StatusNotFound)
		refused(t, "/?token="+tok, http.Header{"Origin": {"https://evil.example.net"}}, http.StatusForbidden)
		// Neither spent the token: it opens a session, once.
		c, _, err := dial("/?token="+tok, nil)
		if err != nil {
			t.Fatalf("after refused requests: %v", err)
		}
		defer c.CloseNow()
		readGreeting(t, websocket.NetConn(context.Background(), c, websocket.MessageBinary))
		refused(t, "/?token="+tok, nil, http.StatusForbidden)
	})

	t.Run("endpoint away", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().(*net.TCPAddr)
		ln.Close()
		tokens.mu.Lock()
		tokens.m["away"] = driver.ConsoleEndpoint{Host: "127.0.0.1", Port: addr.Port, Secret: "x"}
		tokens.mu.Unlock()
		refused(t, "/?token=away", nil, http.StatusBadGateway)
		// The token is left for when the host is back.
		tokens.mu.Lock()
		_, kept := tokens.m["away"]
		tokens.mu.Unlock()
		if !kept {
			t.Error("a console that could not be reached spent its token")
		}
	})

	t.Run("store down", func(t *testing.T) {
		tokens.mu.Lock()
		tokens.err = errors.New("database is down")
		tokens.mu.Unlock()
		defer func() { tokens.mu.Lock(); tokens.err = nil; tokens.mu.Unlock() }()
		refused(t, "/?token=tok1", nil, http.StatusServiceUnavailable)
	})

	t.Run("secret sent", func(t *testing.T) {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		if len(ep.lines) == 0 {
			t.Fatal("the endpoint read no secret line")
		}
		for _, l := range ep.lines {
			if l != "the-secret" {
				t.Errorf("secret line %q", l)
			}
		}
	})

	t.Run("proxy context ends sessions", func(t *testing.T) {
		c, _, err := dial("/?token="+fresh(), nil)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()
		nc := websocket.NetConn(context.Background(), c, websocket.MessageBinary)
		readGreeting(t, nc)
		cancel()
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 16)
		if _, err := nc.Read(buf); err == nil {
			t.Fatal("the session lives on after the proxy's context ended")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the session lives on after the proxy's context ended (read timed out)")
		}
	})
}

func TestStatic(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vnc_lite.html"), []byte("<html>noVNC</html>"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "core"), 0o755)
	os.WriteFile(filepath.Join(dir, "core", "rfb.js"), []byte("export default class RFB {}"), 0o644)
	p := New(Config{Tokens: &fakeTokens{}, StaticDir: dir, Log: quietLog()})
	srv := httptest.NewServer(p)
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (int, string, http.Header) {
		t.Helper()
		resp, err := noRedirect.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	if st, body, _ := get("/vnc_lite.html?path=%3Ftoken%3Dabc"); st != 200 || body != "<html>noVNC</html>" {
		t.Errorf("vnc_lite.html: %d %q", st, body)
	}
	if st, body, h := get("/core/rfb.js"); st != 200 || !strings.Contains(body, "RFB") || !strings.Contains(h.Get("Content-Type"), "javascript") {
		t.Errorf("rfb.js: %d %q %v", st, body, h)
	}
	if st, _, h := get("/"); st != http.StatusFound || h.Get("Location") != "/vnc_lite.html" {
		t.Errorf("/: %d %v", st, h)
	}
	for _, path := range []string{"/core/", "/core", "/missing.html", "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd"} {
		if st, _, _ := get(path); st != 404 {
			t.Errorf("%s: %d, want 404", path, st)
		}
	}
	resp, err := http.Post(srv.URL+"/vnc_lite.html", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}

	// Without noVNC: a 404 that says what to install.
	p2 := New(Config{Tokens: &fakeTokens{}, StaticDir: filepath.Join(dir, "absent"), Log: quietLog()})
	rec := httptest.NewRecorder()
	p2.ServeHTTP(rec, httptest.NewRequest("GET", "/vnc_lite.html", nil))
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), "apt-get install novnc") {
		t.Errorf("without noVNC: %d %q", rec.Code, rec.Body.String())
	}
}

// TestDefaults checks New's defaults.
func TestDefaults(t *testing.T) {
	p := New(Config{Tokens: &fakeTokens{}})
	if p.cfg.StaticDir != DefaultStaticDir || p.cfg.DialTimeout != 10*time.Second || p.cfg.Context == nil || p.log == nil {
		t.Errorf("defaults: %+v", p.cfg)
	}
}

// TestRefusedBeforeDial checks that a request the proxy refuses never
// reaches the console endpoint: the endpoint is a listener this test
// accepts from itself, so a connection the proxy made before answering
// is waiting in its backlog when the answer arrives.
func TestRefusedBeforeDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a := ln.Addr().(*net.TCPAddr)
	tokens := &fakeTokens{m: map[string]driver.ConsoleEndpoint{"good": {Host: a.IP.String(), Port: a.Port, Secret: "s"}}}
	p := New(Config{Tokens: tokens, Log: quietLog(), Origins: []string{"dashboard.example.com"},
		StaticDir: filepath.Join(t.TempDir(), "none")})
	srv := httptest.NewServer(p)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	hostname, _, _ := net.SplitHostPort(host)

	for _, tc := range []struct {
		name, path, origin string
		want               int
	}{
		{"foreign origin", "/?token=good", "https://evil.example.net", http.StatusForbidden},
		{"foreign origin, token cookie", "/", "https://evil.example.net", http.StatusForbidden},
		{"another port of the proxy's host", "/?token=good", "http://" + hostname + ":1", http.StatusForbidden},
		{"the proxy's host and port, another scheme", "/?token=good", "https://" + host, http.StatusForbidden},
		{"opaque origin", "/?token=good", "null", http.StatusForbidden},
		{"origin without a host", "/?token=good", "file:///tmp/x.html", http.StatusForbidden},
		{"unknown token", "/?token=bad", "", http.StatusForbidden},
		{"no token", "/", "", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			if tc.origin != "" {
				hdr.Set("Origin", tc.origin)
			}
			if strings.Contains(tc.name, "cookie") {
				hdr.Set("Cookie", "token=good")
			}
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, resp, err := websocket.Dial(dctx, wsURL(srv, tc.path), &websocket.DialOptions{HTTPHeader: hdr})
			if err == nil {
				c.CloseNow()
				t.Error("websocket accepted")
			} else if resp == nil || resp.StatusCode != tc.want {
				t.Errorf("%v %v, want %d", resp, err, tc.want)
			}
			for {
				ln.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
				rc, err := ln.Accept()
				if err != nil {
					break
				}
				rc.Close()
				t.Error("the proxy connected to the console endpoint for a request it refused")
			}
		})
	}

	// A request that loses the race for its token has dialed (the token
	// was good when it looked) but sends nothing before it hangs up.
	tokens.mu.Lock()
	tokens.m["raced"] = tokens.m["good"]
	tokens.lost = map[string]bool{"raced": true}
	tokens.mu.Unlock()
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, resp, err := websocket.Dial(dctx, wsURL(srv, "/?token=raced"), nil); err == nil {
		c.CloseNow()
		t.Fatal("a token lost to another request opened a session")
	} else if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("lost token: %v %v, want 403", resp, err)
	}
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	rc, err := ln.Accept()
	if err != nil {
		t.Fatalf("the proxy did not dial for a token it found: %v", err)
	}
	defer rc.Close()
	rc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(rc); len(b) != 0 || err != nil {
		t.Fatalf("the endpoint read %q, %v; want nothing and EOF", b, err)
	}
}
