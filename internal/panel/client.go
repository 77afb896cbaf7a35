package panel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Services names the APIs the panel calls, by catalog type.
const (
	Identity = "identity"
	Compute  = "compute"
	Image    = "image"
	Network  = "network"
	Volume   = "volume"
	Billing  = "billing"
)

// ComputeMicroversion is the Nova microversion the panel speaks: the
// newest, so every field (server tags, descriptions, hostnames) is there.
const ComputeMicroversion = "2.96"

// VolumeMicroversion is the Cinder microversion the panel speaks.
const VolumeMicroversion = "3.60"

// Client calls the OpenStack and billing APIs as one user, with that
// user's token: the panel's every read and action goes through the same
// handlers and policies as the CLI's.
type Client struct {
	hc    *http.Client
	urls  map[string]string
	token string
}

// APIError is an API's error answer, with the message it gave.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// StatusOf is the HTTP status an error carries (500 when none).
func StatusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return http.StatusInternalServerError
}

// Get reads path of service into out.
func (c *Client) Get(ctx context.Context, service, path string, out any) error {
	return c.Do(ctx, http.MethodGet, service, path, nil, out)
}

// Post sends in and reads the answer into out (either may be nil).
func (c *Client) Post(ctx context.Context, service, path string, in, out any) error {
	return c.Do(ctx, http.MethodPost, service, path, in, out)
}

// Delete deletes path.
func (c *Client) Delete(ctx context.Context, service, path string) error {
	return c.Do(ctx, http.MethodDelete, service, path, nil, nil)
}

// Do makes one call. A 4xx or 5xx answer is an *APIError with the
// message the API gave, whatever the service's error shape.
func (c *Client) Do(ctx context.Context, method, service, path string, in, out any) error {
	resp, err := c.Raw(ctx, method, service, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("panel: %s %s %s: %w", service, method, path, err)
	}
	return nil
}

// Raw makes one call and returns the answer for the caller to read when
// its status is below 400.
func (c *Client) Raw(ctx context.Context, method, service, path string, in any) (*http.Response, error) {
	base, ok := c.urls[service]
	if !ok {
		return nil, fmt.Errorf("panel: no %s service", service)
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("X-Auth-Token", c.token)
	}
	switch service {
	case Compute:
		req.Header.Set("OpenStack-API-Version", "compute "+ComputeMicroversion)
	case Volume:
		req.Header.Set("OpenStack-API-Version", "volume "+VolumeMicroversion)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, &APIError{Status: resp.StatusCode, Message: errorMessage(b, resp.Status)}
	}
	return resp, nil
}

// errorMessage finds the message in any OpenStack error body: Nova's
// {"badRequest": {"message": …}}, Keystone's {"error": {"message": …}},
// Neutron's {"NeutronError": {"message": …}}, Cinder's, billing's, or
// Glance's plain text.
func errorMessage(body []byte, status string) string {
	var v any
	if json.Unmarshal(body, &v) == nil {
		if m := findMessage(v, 0); m != "" {
			return m
		}
	}
	s := strings.TrimSpace(string(body))
	if s == "" || strings.HasPrefix(s, "<") || len(s) > 300 {
		return status
	}
	// Glance and webob send "404 Not Found\n\nThe resource could not …".
	if i := strings.LastIndex(s, "\n\n"); i >= 0 {
		s = strings.TrimSpace(s[i:])
	}
	return s
}

func findMessage(v any, depth int) string {
	if depth > 3 {
		return ""
	}
	switch t := v.(type) {
	case map[string]any:
		for _, k := range []string{"message", "detail", "title"} {
			if s, ok := t[k].(string); ok && s != "" {
				return s
			}
		}
		for _, sub := range t {
			if m := findMessage(sub, depth+1); m != "" {
				return m
			}
		}
	case []any:
		for _, sub := range t {
			if m := findMessage(sub, depth+1); m != "" {
				return m
			}
		}
	}
	return ""
}

// RevokeOwn revokes the client's own token (Keystone's DELETE
// /v3/auth/tokens with the token as its own subject).
func (c *Client) RevokeOwn(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.urls[Identity]+"/auth/tokens", nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Auth-Token", c.token)
	req.Header.Set("X-Subject-Token", c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// parallel runs API calls at once, as a page's independent reads are, and
// answers the first one's error in the calls' order.
func parallel(calls ...func() error) error {
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, f := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f() }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
