package compute

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// Remote consoles (nova/api/openstack/compute/remote_consoles.py): a
// server's owner (or an admin) asks for a console and gets the URL of the
// console proxy (internal/console, Nova's nova-novncproxy) with a token in
// it. The token is random; only its SHA-256 is stored, with where the
// proxy reaches the server's VNC console (the driver's ConsoleEndpoint),
// for ConsoleTokenTTL, and it opens one session: the proxy spends it
// (ConsoleTokens.Consume, a row deleted) before it lets the browser in.
// Only VNC with noVNC is served; Nova's other console protocols are its
// ConsoleTypeUnavailable.

// ConsoleTokenTTL is how long a console URL may wait to be opened (Nova's
// [consoleauth] token_ttl, 600 s there, where a token opens any number of
// sessions until then). A URL here opens one session, so the time only
// bounds a URL nobody opened: the panel's frame opens its own within a
// second, and two minutes leave a person time to paste what "openstack
// console url show" printed into a browser, while a URL left in a
// terminal's scrollback, a shell history or a log is dead soon after. A
// session opened in time lasts as long as it is used.
const ConsoleTokenTTL = 2 * time.Minute

// consoleDriverTimeout bounds the wait for the host's agent.
const consoleDriverTimeout = 30 * time.Second

func (s *Service) consoleRoutes() []api.Route {
	return []api.Route{
		{Pattern: "POST /v2.1/servers/{id}/remote-consoles", Handler: s.handleRemoteConsole},
	}
}

// handleRemoteConsole is POST /servers/{id}/remote-consoles (2.6+):
// {"remote_console": {"protocol": "vnc", "type": "novnc"}} → 200
// {"remote_console": {"protocol", "type", "url"}}.
func (s *Service) handleRemoteConsole(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	if !v.AtLeast(6) {
		return nil, api.NotFound("The resource could not be found.")
	}
	body, err := decodeWrapped(r, "remote_console")
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(body, "protocol", "type"); err != nil {
		return nil, err
	}
	protocols := []string{"vnc", "spice", "rdp", "serial"}
	types := []string{"novnc", "xvpvnc", "rdp-html5", "spice-html5", "serial"}
	if v.AtLeast(8) {
		protocols = append(protocols, "mks")
		types = append(types, "webmks")
	}
	for _, f := range []string{"protocol", "type"} {
		if _, ok := body[f]; !ok {
			return nil, api.SchemaError("remote_console", body, "'%s' is a required property", f)
		}
	}
	protocol, err := enumField(body, "protocol", protocols)
	if err != nil {
		return nil, err
	}
	typ, err := enumField(body, "type", types)
	if err != nil {
		return nil, err
	}
	sv, err := s.consoleServer(ctx, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if protocol != "vnc" {
		return nil, api.BadRequest("Unavailable console type %s.", typ)
	}
	u, err := s.vncConsole(ctx, sv, typ)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"remote_console": map[string]any{
		"protocol": protocol, "type": typ, "url": u}}), nil
}

// legacyConsoles are the console actions of 2.1–2.5, with the types their
// schemas allow; only os-getVNCConsole's novnc is served.
var legacyConsoles = map[string][]string{
	"os-getVNCConsole":    {"novnc", "xvpvnc"},
	"os-getSPICEConsole":  {"spice-html5"},
	"os-getRDPConsole":    {"rdp-html5"},
	"os-getSerialConsole": {"serial"},
}

// actGetConsole is the action os-getVNCConsole (and its SPICE, RDP and
// serial siblings), 2.1–2.5: {"os-getVNCConsole": {"type": "novnc"}} →
// 200 {"console": {"type", "url"}}. From 2.6 Nova no longer has them (404).
func (s *Service) actGetConsole(r *http.Request, name string, arg json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	if VersionFrom(ctx).AtLeast(6) {
		return nil, api.NotFound("The resource could not be found.")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(arg, &obj); err != nil || obj == nil {
		return nil, badField(name, arg, fmt.Sprintf("%s is not of type 'object'", api.PyRepr(arg)))
	}
	if err := api.UnknownFields(obj, "type"); err != nil {
		return nil, err
	}
	if _, ok := obj["type"]; !ok {
		return nil, api.SchemaError(name, obj, "'type' is a required property")
	}
	typ, err := enumField(obj, "type", legacyConsoles[name])
	if err != nil {
		return nil, err
	}
	sv, err := s.consoleServer(ctx, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if name != "os-getVNCConsole" {
		return nil, api.BadRequest("Unavailable console type %s.", typ)
	}
	u, err := s.vncConsole(ctx, sv, typ)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"console": map[string]any{"type": typ, "url": u}}), nil
}

// enumField reads a string field that must be one of allowed, with Nova's
// schema messages.
func enumField(obj map[string]json.RawMessage, field string, allowed []string) (string, error) {
	raw := obj[field]
	v, ok := rawString(raw)
	if !ok {
		return "", api.SchemaError(field, raw, "%s is not of type 'string'", api.PyRepr(raw))
	}
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	return "", api.SchemaError(field, raw, "'%s' is not one of ['%s']", v, strings.Join(allowed, "', '"))
}

// consoleServer loads the server a console is asked of: the caller's own
// (any for an admin), and ACTIVE on a host (else Nova's InstanceNotReady).
func (s *Service) consoleServer(ctx context.Context, id string) (*server, error) {
	sv, err := s.visibleServer(ctx, s.db, id, false)
	if err != nil {
		return nil, err
	}
	if sv.VMState != vmActive || sv.Host == "" {
		return nil, api.Conflict("Instance %s is not ready", sv.ID)
	}
	return sv, nil
}

// vncConsole asks the driver where sv's VNC console is, stores a token for
// it and returns the noVNC URL (Nova's novncproxy_base_url with the token
// in noVNC's path parameter, as Nova's ConsoleAuthToken.access_url).
func (s *Service) vncConsole(ctx context.Context, sv *server, typ string) (string, error) {
	if typ != "novnc" {
		return "", api.BadRequest("Invalid console type %s", typ)
	}
	if s.consoleURL == "" {
		// No console proxy runs.
		return "", api.BadRequest("Unavailable console type %s.", typ)
	}
	dctx, cancel := context.WithTimeout(ctx, consoleDriverTimeout)
	ep, err := s.driver.Console(dctx, sv.ID)
	cancel()
	switch {
	case errors.Is(err, driver.ErrNoConsole):
		return "", api.BadRequest("Unavailable console type %s.", typ)
	case errors.Is(err, driver.ErrHostDown), errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return "", api.Conflict("Compute service of %s is unavailable at this time.", sv.Host)
	case err != nil:
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		// Compute has it ACTIVE and its host does not run it (yet, or any
		// more): the state is in flux.
		s.log.Warn("console: the driver has no console for the server", "server", sv.ID, "host", sv.Host, "error", err)
		return "", api.Conflict("Instance %s is not ready", sv.ID)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := base64.RawURLEncoding.EncodeToString(b)
	now := s.now()
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := tx.Exec(ctx, "DELETE FROM compute_console_tokens WHERE expires_at < ?", store.FormatTime(now)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO compute_console_tokens (token_hash, server_id, project_id, compute_host, console_type,
			host, port, secret, expires_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			consoleTokenHash(tok), sv.ID, sv.ProjectID, sv.Host, typ, ep.Host, ep.Port, ep.Secret,
			store.FormatTime(now.Add(ConsoleTokenTTL)), store.FormatTime(now))
		return err
	})
	if err != nil {
		return "", err
	}
	return s.consoleURL + "/vnc_lite.html?" + url.Values{"path": {"?token=" + tok}}.Encode(), nil
}

func consoleTokenHash(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// ConsoleTokens is the console proxy's view of the tokens (it implements
// console.Tokens).
type ConsoleTokens struct{ s *Service }

// ConsoleTokens gives the console proxy its token lookup.
func (s *Service) ConsoleTokens() ConsoleTokens { return ConsoleTokens{s} }

// errNoToken is a console token that is unknown, spent or expired, or
// whose server was deleted or moved to another host since.
var errNoToken = fmt.Errorf("console token: %w", store.ErrNotFound)

// liveToken is the condition on a row of compute_console_tokens t that
// it still opens a console: fresh, and its server alive on the host it
// was made for. Its arguments are the token's hash and the time now.
const liveToken = `t.token_hash = ? AND t.expires_at > ? AND EXISTS (SELECT 1 FROM compute_servers sv
	WHERE sv.id = t.server_id AND sv.deleted = 0 AND sv.host = t.compute_host)`

// Lookup returns where a console token leads, or an error wrapping
// store.ErrNotFound (errNoToken). It does not spend the token.
func (t ConsoleTokens) Lookup(ctx context.Context, token string) (driver.ConsoleEndpoint, error) {
	var ep driver.ConsoleEndpoint
	if token == "" {
		return ep, errNoToken
	}
	err := t.s.db.QueryRow(ctx, `SELECT t.host, t.port, t.secret FROM compute_console_tokens t WHERE `+liveToken,
		consoleTokenHash(token), store.FormatTime(t.s.now())).Scan(&ep.Host, &ep.Port, &ep.Secret)
	if store.IsNoRows(err) {
		return ep, errNoToken
	}
	return ep, err
}

// Consume spends a token that Lookup found, so that it opens no other
// session: its row goes in one statement, and of connections racing with
// one token, through one controller or several sharing the database,
// only the one whose delete removed the row gets nil; the others, and a
// token that expired or lost its server meanwhile, get errNoToken.
func (t ConsoleTokens) Consume(ctx context.Context, token string) error {
	if token == "" {
		return errNoToken
	}
	res, err := t.s.db.Exec(ctx, `DELETE FROM compute_console_tokens WHERE token_hash IN (
		SELECT t.token_hash FROM compute_console_tokens t WHERE `+liveToken+`)`,
		consoleTokenHash(token), store.FormatTime(t.s.now()))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != 1 {
		return errNoToken
	}
	return nil
}
