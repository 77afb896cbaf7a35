package volume

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"nimbus/internal/api"
)

// What an operator's tools ask of the storage backend (admin): Cinder's
// os-hosts (cinder/api/contrib/hosts.py), the scheduler's pools
// (scheduler_stats.py get_pools) and the backend's capabilities
// (cinder/api/contrib/capabilities.py). Nimbus has
// one backend, the cloud's (file or rbd), and one pool in it, named as
// volumes show their host (volumeHost).

const (
	backendHost = volumeHostName + "@" + DefaultType // cinder-volume's host
	vendorName  = "Nimbus"
	driverVer   = "1.0.0"
)

// backendFacts are the backend's protocol and its capacity in GiB, as
// numbers or Cinder's "unknown" when the backend does not say.
func (s *Service) backendFacts() (protocol string, total, free any) {
	if _, ok := s.backend.(*rbdBackend); ok {
		return "ceph", "unknown", "unknown"
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dataDir, &st); err != nil {
		return "nbd", "unknown", "unknown"
	}
	gib := func(blocks uint64) float64 {
		return float64(int64(blocks)*st.Bsize>>20) / 1024
	}
	return "nbd", gib(st.Blocks), gib(st.Bavail)
}

// backendCapabilities are what the backend reports of itself, which a
// volume type's extra specs may ask for (Cinder's CapabilitiesFilter).
func (s *Service) backendCapabilities() map[string]string {
	protocol, _, _ := s.backendFacts()
	return map[string]string{"volume_backend_name": DefaultType, "pool_name": DefaultType, "vendor_name": vendorName,
		"driver_version": driverVer, "storage_protocol": protocol, "QoS_support": "True",
		"thin_provisioning_support": "True", "thick_provisioning_support": "False", "multiattach": "False"}
}

// backendFits reports whether the backend has what a type's extra specs
// ask (cinder/scheduler/filters/capabilities_filter.py): an unscoped or
// "capabilities:" key the backend reports must match its value, with
// Cinder's "<is>", "<in>", "<or>" and "s==" operators or as a plain
// string. Keys of another scope, and unscoped ones the backend does not
// report, are left to the features that read them.
func (s *Service) backendFits(specs map[string]string) bool {
	caps := s.backendCapabilities()
	for k, want := range specs {
		k = strings.TrimPrefix(k, "capabilities:")
		have, ok := caps[k]
		if !ok {
			continue
		}
		if !specMatches(have, want) {
			return false
		}
	}
	return true
}

// specMatches is cinder/scheduler/filters/extra_specs_ops.py match for
// the operators a string capability takes.
func specMatches(have, want string) bool {
	words := strings.Fields(want)
	if len(words) == 0 {
		return have == want
	}
	switch words[0] {
	case "<is>":
		return len(words) == 2 && strings.EqualFold(have, words[1])
	case "<in>":
		return len(words) == 2 && strings.Contains(have, words[1])
	case "s==":
		return len(words) == 2 && have == words[1]
	case "<or>":
		for i := 1; i < len(words); i += 2 {
			if words[i] == have {
				return true
			}
		}
		return false
	}
	return have == want
}

// holdings are what some volumes and snapshots take: counts and GiB.
type holdings struct{ vols, volGB, snaps, snapGB int64 }

func (h *holdings) add(o holdings) {
	h.vols, h.volGB, h.snaps, h.snapGB = h.vols+o.vols, h.volGB+o.volGB, h.snaps+o.snaps, h.snapGB+o.snapGB
}

// holdingsByProject are each project's holdings, read in one grouped
// query per table, and the projects that have volumes, sorted.
func (s *Service) holdingsByProject(ctx context.Context) (map[string]holdings, []string, error) {
	out := map[string]holdings{}
	var projects []string
	for _, table := range []string{"volumes", "volume_snapshots"} {
		rows, err := s.db.Query(ctx, "SELECT project_id, COUNT(*), COALESCE(SUM(size), 0) FROM "+table+
			" GROUP BY project_id ORDER BY project_id")
		if err != nil {
			return nil, nil, err
		}
		for rows.Next() {
			var p string
			var n, gb int64
			if err := rows.Scan(&p, &n, &gb); err != nil {
				rows.Close()
				return nil, nil, err
			}
			h := out[p]
			if table == "volumes" {
				h.vols, h.volGB = n, gb
				projects = append(projects, p)
			} else {
				h.snaps, h.snapGB = n, gb
			}
			out[p] = h
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, err
		}
	}
	return out, projects, nil
}

// listHosts is GET /os-hosts: the hosts of the volume service's parts.
func (s *Service) listHosts(r *http.Request) (*api.Response, error) {
	now := cinderTime(s.now())
	out := []any{}
	for _, sv := range volumeServices {
		out = append(out, map[string]any{"host_name": sv.host, "service": sv.binary, "zone": AvailabilityZone,
			"service-status": "available", "service-state": "enabled", "last-update": now})
	}
	return api.JSON(http.StatusOK, map[string]any{"hosts": out}), nil
}

// showHost is GET /os-hosts/{host}: the volumes and snapshots of a
// cinder-volume host, in total and per project.
func (s *Service) showHost(r *http.Request) (*api.Response, error) {
	host := r.PathValue("host")
	if host != backendHost {
		return nil, api.NotFound("Host not found")
	}
	by, projects, err := s.holdingsByProject(r.Context())
	if err != nil {
		return nil, err
	}
	resource := func(project string, h holdings) map[string]any {
		return map[string]any{"resource": map[string]string{"host": host, "project": project,
			"volume_count": strconv.FormatInt(h.vols, 10), "total_volume_gb": strconv.FormatInt(h.volGB, 10),
			"snapshot_count": strconv.FormatInt(h.snaps, 10), "total_snapshot_gb": strconv.FormatInt(h.snapGB, 10)}}
	}
	var total holdings
	for _, h := range by {
		total.add(h)
	}
	out := []any{resource("(total)", total)}
	for _, p := range projects {
		out = append(out, resource(p, by[p]))
	}
	return api.JSON(http.StatusOK, map[string]any{"host": out}), nil
}

// getPools is GET /scheduler-stats/get_pools: the one pool, with its
// capabilities when detail is true.
func (s *Service) getPools(r *http.Request) (*api.Response, error) {
	pool := map[string]any{"name": volumeHost}
	if d, ok := api.ParseBool(r.URL.Query().Get("detail")); ok && d {
		var volGB int64
		if err := s.db.QueryRow(r.Context(), "SELECT COALESCE(SUM(size), 0) FROM volumes").Scan(&volGB); err != nil {
			return nil, err
		}
		protocol, total, free := s.backendFacts()
		now := cinderTime(s.now())
		pool["capabilities"] = map[string]any{
			"pool_name": DefaultType, "volume_backend_name": DefaultType, "vendor_name": vendorName,
			"driver_version": driverVer, "storage_protocol": protocol, "QoS_support": true,
			"total_capacity_gb": total, "free_capacity_gb": free, "allocated_capacity_gb": volGB,
			"reserved_percentage": 0, "thin_provisioning_support": true, "thick_provisioning_support": false,
			"multiattach": false, "timestamp": now, "updated": now,
		}
	}
	return api.JSON(http.StatusOK, map[string]any{"pools": []any{pool}}), nil
}

// showCapabilities is GET /capabilities/{host}: the backend's, named as
// cinder-volume's host or as its pool.
func (s *Service) showCapabilities(r *http.Request) (*api.Response, error) {
	host := r.PathValue("host")
	if h, _, _ := strings.Cut(host, "#"); h != backendHost {
		return nil, api.NotFound("Service %s could not be found.", host)
	}
	protocol, _, _ := s.backendFacts()
	prop := func(typ, title, desc string) map[string]string {
		return map[string]string{"type": typ, "title": title, "description": desc}
	}
	return api.JSON(http.StatusOK, map[string]any{
		"namespace": "OS::Storage::Capabilities::" + backendHost, "vendor_name": vendorName,
		"volume_backend_name": DefaultType, "pool_name": DefaultType, "driver_version": driverVer,
		"storage_protocol": protocol, "display_name": nil, "description": nil, "visibility": nil,
		"replication_targets": []any{},
		"properties": map[string]any{
			"thin_provisioning": prop("boolean", "Thin Provisioning", "Sets thin provisioning."),
			"compression":       prop("boolean", "Compression", "Enables compression."),
			"qos":               prop("boolean", "QoS", "Enables QoS."),
			"replication":       prop("boolean", "Replication", "Enables replication."),
		},
	}), nil
}
