// Package console is Nimbus's noVNC console proxy, Nova's nova-novncproxy:
// a browser running noVNC opens a websocket to it with a console token
// (made by compute's remote-consoles API), and the proxy pipes the
// websocket's binary messages to the server's VNC console on its host.
//
// The way in: the URL compute answers is
// https://<public host>:<console port>/vnc_lite.html?path=%3Ftoken%3D<token>;
// noVNC's page (served here from /usr/share/novnc, Debian's novnc package)
// opens wss://<same host:port>/?token=<token>. Nothing reaches the console
// before the request has shown it may: the proxy checks the origin
// (below), then looks the token up (Tokens; unknown, spent or expired:
// 403), and only then dials the endpoint — the host agent's console relay
// (internal/driver/qemu) —, spends the token (Tokens.Consume: one session
// per URL, whichever controller's proxy is asked), sends the endpoint's
// secret line and accepts the websocket (subprotocol "binary" when
// offered, as noVNC does). A host that is away is a 502 that leaves the
// token for another try. The connection from the proxy to the relay is
// plain TCP on the hosts' network, as Nova's proxy-to-compute VNC is by
// default: the relay's secret keeps others out, not eavesdroppers.
//
// Origins: a browser sends the page's origin with the websocket request.
// The proxy's own origin (the request's scheme, host and port: noVNC
// served by this proxy, the normal case) is allowed, other origins only
// when Config.Origins names them, so that another site (or another port
// of the same host) cannot open consoles with a token it got hold of in
// a user's browser. Clients that send no Origin (not browsers) are
// allowed, as Nova's proxy allows them: the token is what authorises.
package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// Tokens are the console tokens. Lookup says where a token leads without
// spending it; Consume spends it, atomically in the store the tokens live
// in, so that of requests racing with one token exactly one gets nil.
// Both return an error wrapping store.ErrNotFound for a token that is
// unknown, spent, expired or otherwise no longer valid.
type Tokens interface {
	Lookup(ctx context.Context, token string) (driver.ConsoleEndpoint, error)
	Consume(ctx context.Context, token string) error
}

// DefaultStaticDir is where Debian's novnc package installs noVNC.
const DefaultStaticDir = "/usr/share/novnc"

// Config sets a proxy up.
type Config struct {
	Tokens Tokens
	// Origins are origin patterns allowed besides the proxy's own
	// origin: host[:port] patterns (path.Match, e.g. "*.example.com"),
	// or scheme://host[:port] ones to pin the scheme too.
	Origins []string
	// StaticDir holds noVNC's files (default DefaultStaticDir); without
	// it pages are 404 with a hint and only the websocket works.
	StaticDir string
	// Context ends every session when it is done (the cloud's run
	// context: http.Server.Shutdown does not end hijacked connections).
	Context context.Context
	// DialTimeout bounds reaching a console endpoint (default 10 s).
	DialTimeout time.Duration
	Log         *slog.Logger
}

// Proxy is the console proxy's HTTP handler.
type Proxy struct {
	cfg Config
	log *slog.Logger
}

// New makes a proxy.
func New(cfg Config) *Proxy {
	if cfg.StaticDir == "" {
		cfg.StaticDir = DefaultStaticDir
	}
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Proxy{cfg: cfg, log: cfg.Log}
}

// ServeHTTP serves the websocket at / and /websockify (noVNC's default
// path), and noVNC's files from StaticDir.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if isWebsocket(r) {
		if r.URL.Path != "/" && r.URL.Path != "/websockify" {
			http.Error(w, "no websocket here: the console websocket is /?token=<token>", http.StatusNotFound)
			return
		}
		p.serveWebsocket(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	p.serveStatic(w, r)
}

// isWebsocket reports whether r asks for a websocket upgrade.
func isWebsocket(r *http.Request) bool {
	return headerHas(r.Header, "Connection", "upgrade") && headerHas(r.Header, "Upgrade", "websocket")
}

func headerHas(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// token is the request's console token: the token query parameter, else
// a token cookie (noVNC's older convention, which Nova's proxy also reads).
func token(r *http.Request) string {
	if t := r.URL.Query().Get("token"); t != "" {
		return t
	}
	if c, err := r.Cookie("token"); err == nil {
		return c.Value
	}
	return ""
}

func (p *Proxy) serveWebsocket(w http.ResponseWriter, r *http.Request) {
	if err := checkOrigin(r, p.cfg.Origins); err != nil {
		p.log.Warn("console: websocket refused", "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"), "error", err)
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	tok := token(r)
	if tok == "" {
		http.Error(w, "no console token: open the URL that \"openstack console url show\" gives", http.StatusBadRequest)
		return
	}
	ep, err := p.cfg.Tokens.Lookup(r.Context(), tok)
	if p.tokenRefused(w, err) {
		return
	}
	// Reach the console before spending the token and upgrading, so that
	// a host that is away is an HTTP error the client can show, and the
	// URL works once the host is back.
	addr := net.JoinHostPort(ep.Host, strconv.Itoa(ep.Port))
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	rfb, err := d.DialContext(r.Context(), "tcp", addr)
	if err != nil {
		p.log.Warn("console: cannot reach the console", "endpoint", addr, "error", err)
		http.Error(w, "the server's console cannot be reached", http.StatusBadGateway)
		return
	}
	defer rfb.Close()
	// The secret goes only to the one request that spent the token.
	if p.tokenRefused(w, p.cfg.Tokens.Consume(r.Context(), tok)) {
		return
	}
	if _, err := io.WriteString(rfb, ep.Secret+"\n"); err != nil {
		p.log.Warn("console: cannot reach the console", "endpoint", addr, "error", err)
		http.Error(w, "the server's console cannot be reached", http.StatusBadGateway)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{"binary"},
		// checkOrigin has decided on the origin, by the same rule and
		// the scheme besides.
		InsecureSkipVerify: true,
	})
	if err != nil {
		// Accept has answered (400 for a bad handshake).
		p.log.Warn("console: websocket refused", "remote", r.RemoteAddr, "error", err)
		return
	}
	// The session's context is the proxy's, not the request's: the
	// request's is not to be relied on after the hijack.
	ctx, cancel := context.WithCancel(p.cfg.Context)
	defer cancel()
	start := time.Now()
	p.log.Info("console: session opened", "remote", r.RemoteAddr, "endpoint", addr)
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	up, down := pipe(nc, rfb)
	p.log.Info("console: session closed", "remote", r.RemoteAddr, "endpoint", addr,
		"seconds", int(time.Since(start).Seconds()), "bytes_to_console", up, "bytes_from_console", down)
}

// tokenRefused answers a token the store refuses (403 for one that is
// not valid, 503 when it cannot tell) and reports whether it did.
func (p *Proxy) tokenRefused(w http.ResponseWriter, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, store.ErrNotFound):
		http.Error(w, "The console token is invalid or has expired (a console URL opens one session: ask for a new one).", http.StatusForbidden)
	default:
		p.log.Error("console: token lookup", "error", err)
		http.Error(w, "the console token could not be checked", http.StatusServiceUnavailable)
	}
	return true
}

// checkOrigin refuses a websocket request a browser sent from a page of
// another origin than the proxy's own and the allowed ones. No Origin is
// a client that is not a browser; "null" (a sandboxed or file: page) and
// an origin without a host are refused. The proxy's own origin is the
// request's host and port with its scheme (https behind TLS).
func checkOrigin(r *http.Request, allowed []string) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("the origin %q is not a web page's", origin)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if u.Scheme == scheme && strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	for _, pat := range allowed {
		target := u.Host
		if strings.Contains(pat, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(strings.ToLower(pat), strings.ToLower(target)); err == nil && ok {
			return nil
		}
	}
	return fmt.Errorf("the origin %q may not open consoles here", origin)
}

// pipe copies ws to rfb and rfb to ws until either ends, then closes
// both; it returns the bytes each way.
func pipe(ws, rfb net.Conn) (up, down int64) {
	type res struct {
		up bool
		n  int64
	}
	done := make(chan res, 2)
	go func() {
		n, _ := io.Copy(rfb, ws)
		done <- res{true, n}
	}()
	go func() {
		n, _ := io.Copy(ws, rfb)
		done <- res{false, n}
	}()
	for i := 0; i < 2; i++ {
		r := <-done
		if r.up {
			up = r.n
		} else {
			down = r.n
		}
		if i == 0 {
			ws.Close()
			rfb.Close()
		}
	}
	return up, down
}

// serveStatic serves noVNC's files, never a directory listing.
func (p *Proxy) serveStatic(w http.ResponseWriter, r *http.Request) {
	dir := p.cfg.StaticDir
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		http.Error(w, fmt.Sprintf("noVNC is not installed on this controller (no %s; apt-get install novnc). "+
			"Any noVNC client can use the websocket: wss://<this host:port>/?token=<token>.", dir), http.StatusNotFound)
		return
	}
	name := path.Clean("/" + r.URL.Path)
	if name == "/" {
		http.Redirect(w, r, "/vnc_lite.html", http.StatusFound)
		return
	}
	if fi, err := os.Stat(dir + name); err != nil || fi.IsDir() {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// The page's URL holds the console token: keep it out of Referer.
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.ServeFile(w, r, dir+name)
}
