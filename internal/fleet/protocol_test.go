package fleet_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
)

// TestAgentProtocol: the controller names the agent protocol it speaks on
// every answer and serves agents from wire.MinProtocol to wire.Protocol;
// an agent that names none speaks version 1, as agents did before
// versions were named; one too old is told to upgrade (426), one newer
// than its controller that the controllers go first.
func TestAgentProtocol(t *testing.T) {
	c := newController(t, filepath.Join(t.TempDir(), "fleet.db"), fleet.Config{})
	hc := c.srv.Client()
	for _, tc := range []struct {
		header     string // "" sends none
		status     int
		code, says string
	}{
		{"", http.StatusUnauthorized, wire.CodeUnauthorized, ""}, // served: the refusal is the missing credential's
		{strconv.Itoa(wire.Protocol), http.StatusUnauthorized, wire.CodeUnauthorized, ""},
		{strconv.Itoa(wire.MinProtocol - 1), http.StatusUpgradeRequired, wire.CodeUpgrade, "upgrade the agent"},
		{strconv.Itoa(wire.Protocol + 1), http.StatusBadRequest, wire.CodeUpgrade, "upgrade the controllers before the agents"},
		{"one", http.StatusBadRequest, wire.CodeBadRequest, "whole number"},
	} {
		req, _ := http.NewRequest("POST", c.srv.URL+wire.PathHeartbeat, strings.NewReader("{}"))
		if tc.header != "" {
			req.Header.Set(wire.HeaderProtocol, tc.header)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body wire.ErrorBody
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || body.Error.Code != tc.code || !strings.Contains(body.Error.Message, tc.says) {
			t.Errorf("protocol %q: %d %+v, want %d %s saying %q", tc.header, resp.StatusCode, body.Error, tc.status, tc.code, tc.says)
		}
		if resp.Header.Get(wire.HeaderProtocol) != strconv.Itoa(wire.Protocol) || resp.Header.Get(wire.HeaderMinProtocol) != strconv.Itoa(wire.MinProtocol) {
			t.Errorf("protocol %q: the answer names %q..%q", tc.header, resp.Header.Get(wire.HeaderMinProtocol), resp.Header.Get(wire.HeaderProtocol))
		}
	}
}
