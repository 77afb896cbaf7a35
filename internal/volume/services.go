package volume

import (
	"net/http"
	"strings"

	"nimbus/internal/api"
)

// Cinder's os-services (cinder/api/contrib/services.py): the volume
// service's parts as an operator's tools see them. Nimbus runs all three
// inside the controller, so they are up whenever this API answers, and
// are not switched off one by one.

// volumeHostName is the host the volume service's parts run on, and
// volumeHost the backend host volumes show (os-vol-host-attr:host,
// host@backend#pool).
const (
	volumeHostName = "nimbus"
	volumeHost     = volumeHostName + "@network#network"
)

// volumeServices are the binaries and the hosts Cinder would name them by.
var volumeServices = []struct{ binary, host string }{
	{"cinder-scheduler", volumeHostName},
	{"cinder-volume", volumeHostName + "@network"},
	{"cinder-backup", volumeHostName},
}

// listServices is GET /os-services (admin), filtered by host (its part
// before '@' matches too) and binary.
func (s *Service) listServices(r *http.Request) (*api.Response, error) {
	q := r.URL.Query()
	now := cinderTime(s.now())
	out := []any{}
	for _, sv := range volumeServices {
		if h := q.Get("host"); h != "" && h != sv.host && h != strings.SplitN(sv.host, "@", 2)[0] {
			continue
		}
		if b := q.Get("binary"); b != "" && b != sv.binary {
			continue
		}
		m := map[string]any{"binary": sv.binary, "host": sv.host, "zone": AvailabilityZone, "status": "enabled",
			"state": "up", "updated_at": now, "disabled_reason": nil}
		if sv.binary == "cinder-volume" {
			m["frozen"], m["replication_status"], m["active_backend_id"] = false, "disabled", nil
			if minor(r) >= 49 {
				m["backend_state"] = "up"
			}
		}
		out = append(out, m)
	}
	return api.JSON(200, map[string]any{"services": out}), nil
}

// updateService is PUT /os-services/{action} (admin): enable, disable and
// disable-log-reason name a service by host and binary (404 for one this
// cloud has not); freeze and thaw a backend host (400 for an unknown
// one). None applies to parts that run inside the controller: 400.
func (s *Service) updateService(r *http.Request) (*api.Response, error) {
	var b body
	if err := api.DecodeJSON(r, &b); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, api.BadRequest("Malformed request body")
	}
	host, err := b.optString("host", 255)
	if err != nil {
		return nil, err
	}
	action := r.PathValue("action")
	switch action {
	case "freeze", "thaw":
		if host == nil || (*host != volumeHostName+"@network" && *host != volumeHostName) {
			return nil, api.BadRequest("Host %s could not be found.", deref(host))
		}
		return nil, api.BadRequest("Invalid input received: Backend %s has no replication to %s.", *host, action)
	case "enable", "disable", "disable-log-reason":
	default:
		return nil, api.NotFound("Unknown action")
	}
	binary, err := b.optString("binary", 255)
	if err != nil {
		return nil, err
	}
	if host == nil || binary == nil {
		return nil, api.BadRequest("Missing required element 'host' or 'binary' in request body.")
	}
	if action == "disable-log-reason" {
		reason, err := b.optString("disabled_reason", 255)
		if err != nil {
			return nil, err
		}
		if reason == nil || strings.TrimSpace(*reason) == "" {
			return nil, api.BadRequest("Disabled reason contains invalid characters or is too long")
		}
	}
	for _, sv := range volumeServices {
		if sv.binary == *binary && sv.host == *host {
			return nil, api.BadRequest("Service %s on host %s runs inside the Nimbus controller and cannot be %sd on its own.",
				*binary, *host, strings.TrimSuffix(action, "-log-reason"))
		}
	}
	return nil, api.NotFound("Service %s could not be found.", *binary)
}
