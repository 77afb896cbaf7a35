package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"nimbus/internal/fleet/wire"
	"nimbus/internal/netstate"
)

// client speaks the agent API to one controller.
type client struct {
	base string
	http *http.Client
	cred string
}

// newClient makes a client for the controller at base that trusts the CA in
// caFile (the system's roots when empty).
func newClient(base, caFile string) (*client, error) {
	u := strings.TrimRight(base, "/")
	if !strings.HasPrefix(u, "https://") {
		return nil, fmt.Errorf("agent: controller URL %q must start with https://", base)
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("agent: CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("agent: no certificate in %s", caFile)
		}
		tlsCfg.RootCAs = pool
	}
	tr := &http.Transport{
		TLSClientConfig:     tlsCfg,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	// No overall client timeout: long-polls set their own deadlines.
	return &client{base: u, http: &http.Client{Transport: &protocolTransport{base: tr}}}, nil
}

// protocolTransport names the agent protocol this build speaks on every
// request, and warns once when the controller speaks a newer one: the
// controllers were upgraded, and this agent should follow before their
// next release stops serving its protocol.
type protocolTransport struct {
	base   http.RoundTripper
	warned atomic.Bool
}

func (t *protocolTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(wire.HeaderProtocol, strconv.Itoa(wire.Protocol))
	resp, err := t.base.RoundTrip(r)
	if err == nil {
		if n, perr := strconv.Atoi(resp.Header.Get(wire.HeaderProtocol)); perr == nil && n > wire.Protocol && t.warned.CompareAndSwap(false, true) {
			slog.Warn("agent: the controller speaks a newer agent protocol: upgrade this agent",
				"agent_protocol", wire.Protocol, "controller_protocol", n, "controller_min", resp.Header.Get(wire.HeaderMinProtocol))
		}
	}
	return resp, err
}

// statusError is a response the controller refused.
type statusError struct {
	status int
	code   string
	msg    string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("controller answered %d %s: %s", e.status, e.code, e.msg)
}

// responseError is the error a refusal's body names, or its first bytes
// when the body is not the agent API's error.
func responseError(status int, data []byte) error {
	var eb wire.ErrorBody
	if json.Unmarshal(data, &eb) != nil || eb.Error.Code == "" {
		eb.Error = wire.Error{Code: "unknown", Message: strings.TrimSpace(string(data[:min(len(data), 200)]))}
	}
	return &statusError{status: status, code: eb.Error.Code, msg: eb.Error.Message}
}

// maxResponse bounds what the agent reads from a controller.
const maxResponse = 64 << 20

// do sends one JSON request and decodes the JSON answer into out. A
// response it cannot read is an error, never a panic.
func (c *client) do(ctx context.Context, method, path string, timeout time.Duration, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.cred != "" {
		req.Header.Set("Authorization", "Bearer "+c.cred)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("reading the controller's answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		return responseError(resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("the controller's answer to %s is not what the agent expects: %w", path, err)
	}
	return nil
}

// netState long-polls for the host's network state newer than req.After.
func (c *client) netState(ctx context.Context, req wire.NetStateRequest, timeout time.Duration) (*netstate.Host, error) {
	var st netstate.Host
	if err := c.do(ctx, "POST", wire.PathNetState, timeout, req, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// metadata relays one guest's metadata request.
func (c *client) metadata(ctx context.Context, req wire.MetadataRequest, timeout time.Duration) (wire.MetadataResponse, error) {
	var resp wire.MetadataResponse
	err := c.do(ctx, "POST", wire.PathMetadata, timeout, req, &resp)
	return resp, err
}
