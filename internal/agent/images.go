package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
)

// imageStore is the driver's way to the image service: through the agent
// API, with the agent's credential, streamed both ways.
type imageStore struct{ c *client }

var _ driver.ImageStore = imageStore{}

// Open reads image id's data from the controller.
func (s imageStore) Open(ctx context.Context, id string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.c.base+wire.PathImages+url.PathEscape(id), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.do(req)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", id, err)
	}
	return resp.Body, nil
}

var _ driver.DirectImages = imageStore{}

// Direct asks the controller where the host reads image id's data itself
// (nil: through Open).
func (s imageStore) Direct(ctx context.Context, id string) (*driver.ImageDirect, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.c.base+wire.PathImages+url.PathEscape(id)+"?"+wire.QueryDirect, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.do(req)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNoContent {
		return nil, nil
	}
	var d driver.ImageDirect
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&d); err != nil {
		return nil, fmt.Errorf("image %s: where to read it: %w", id, err)
	}
	return &d, nil
}

// Upload stores r as image id's data (a snapshot the controller waits for).
func (s imageStore) Upload(ctx context.Context, id, diskFormat string, r io.Reader) error {
	u := s.c.base + wire.PathImages + url.PathEscape(id)
	if diskFormat != "" {
		u += "?disk_format=" + url.QueryEscape(diskFormat)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, io.NopCloser(r))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := s.do(req)
	if err != nil {
		return fmt.Errorf("image %s: %w", id, err)
	}
	resp.Body.Close()
	return nil
}

// do sends req with the agent's credential; an answer other than 2xx is
// an error carrying the controller's message.
func (s imageStore) do(req *http.Request) (*http.Response, error) {
	req.Header.Set("Authorization", "Bearer "+s.c.cred)
	resp, err := s.c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return nil, responseError(resp.StatusCode, data)
}
