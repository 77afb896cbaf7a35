package compute

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/driver"
)

// hypervisor is one compute node: its nova-compute service, the driver's
// host and what its servers use.
type hypervisor struct {
	svc   *serviceRow
	host  driver.Host
	known bool // the driver still lists the host
	usage HostUsage
}

func (h *hypervisor) up() bool { return h.known && h.host.Up && !h.svc.ForcedDown }

// servicesAndHosts is every compute service, made first for hosts that
// have none, and the fleet's hosts by name.
func (s *Service) servicesAndHosts(ctx context.Context) ([]*serviceRow, map[string]driver.Host, error) {
	if err := s.ensureServices(ctx, false); err != nil {
		return nil, nil, err
	}
	svcs, err := loadServices(ctx, s.db)
	if err != nil {
		return nil, nil, err
	}
	hosts, err := s.fleet(ctx)
	return svcs, hosts, err
}

// hypervisors loads every compute node, by id.
func (s *Service) hypervisors(ctx context.Context) ([]*hypervisor, error) {
	svcs, hosts, err := s.servicesAndHosts(ctx)
	if err != nil {
		return nil, err
	}
	usage, err := s.hostUsage(ctx, s.db)
	if err != nil {
		return nil, err
	}
	var out []*hypervisor
	for _, sv := range svcs {
		if sv.Binary != binCompute {
			continue
		}
		h, ok := hosts[sv.Host]
		if !ok {
			h = driver.Host{Name: sv.Host, Hypervisor: "fake"}
		}
		out = append(out, &hypervisor{svc: sv, host: h, known: ok, usage: usage[sv.Host]})
	}
	slices.SortFunc(out, func(a, b *hypervisor) int { return int(a.svc.NodeID - b.svc.NodeID) })
	return out, nil
}

// cpuInfo describes a host's CPU as libvirt reports it.
func cpuInfo(vcpus int) map[string]any {
	sockets, threads := 1, 1
	if vcpus >= 2 && vcpus%2 == 0 {
		sockets = 2
	}
	if (vcpus/sockets)%2 == 0 && vcpus >= 4 {
		threads = 2
	}
	cores := max(vcpus/(sockets*threads), 1)
	return map[string]any{
		"arch": "x86_64", "model": "EPYC-Milan", "vendor": "AMD",
		"features": []string{"avx2", "sse4.2", "aes", "pdpe1gb", "svm"},
		"topology": map[string]int{"cores": cores, "threads": threads, "sockets": sockets},
	}
}

// uptimeString is what `uptime` prints, which Nova passes through.
func uptimeString(since int64, now time.Time) string {
	d := now.Sub(time.Unix(since, 0))
	if d < 0 {
		d = 0
	}
	days := int(d.Hours()) / 24
	hm := fmt.Sprintf("%d:%02d", int(d.Hours())%24, int(d.Minutes())%60)
	return fmt.Sprintf(" %s up %d days, %s,  1 user,  load average: 0.00, 0.00, 0.00", now.UTC().Format("15:04:05"), days, hm)
}

type serverRef struct{ name, uuid string }

// hypervisorView is hypervisors.py _view_hypervisor for the microversion.
func (s *Service) hypervisorView(r *http.Request, h *hypervisor, detail bool, servers []serverRef, withServers bool) map[string]any {
	v := VersionFrom(r.Context())
	m := map[string]any{
		"hypervisor_hostname": h.host.Name,
		"state":               map[bool]string{true: "up", false: "down"}[h.up()],
		"status":              map[bool]string{true: "disabled", false: "enabled"}[h.svc.Disabled],
	}
	svc := map[string]any{"host": h.svc.Host, "disabled_reason": h.svc.Reason}
	if v.AtLeast(53) {
		m["id"] = h.svc.NodeUUID
		svc["id"] = h.svc.UUID
	} else {
		m["id"] = h.svc.NodeID
		svc["id"] = h.svc.ID
	}
	if detail {
		m["hypervisor_type"] = h.host.Hypervisor
		m["hypervisor_version"] = h.host.Version
		m["host_ip"] = h.host.IP
		m["service"] = svc
		if v.AtLeast(88) {
			if h.up() && h.host.UptimeSince > 0 {
				m["uptime"] = uptimeString(h.host.UptimeSince, s.now())
			} else {
				m["uptime"] = nil
			}
		} else {
			u := h.usage
			m["vcpus"] = h.host.VCPUs
			m["memory_mb"] = h.host.MemoryMB
			m["local_gb"] = h.host.DiskGB
			m["vcpus_used"] = u.VCPUs
			m["memory_mb_used"] = u.MemoryMB
			m["local_gb_used"] = u.DiskGB
			m["free_ram_mb"] = h.host.MemoryMB - u.MemoryMB
			m["free_disk_gb"] = h.host.DiskGB - u.DiskGB
			m["current_workload"] = 0
			m["running_vms"] = u.Servers
			m["disk_available_least"] = h.host.DiskGB - u.DiskGB
			info := cpuInfo(h.host.VCPUs)
			// cpu_info is a JSON string before 2.28 (hypervisors.py).
			if v.AtLeast(28) {
				m["cpu_info"] = info
			} else {
				b, _ := json.Marshal(info)
				m["cpu_info"] = string(b)
			}
		}
	}
	if withServers || len(servers) > 0 {
		list := make([]map[string]string, 0, len(servers))
		for _, sv := range servers {
			list = append(list, map[string]string{"name": sv.name, "uuid": sv.uuid})
		}
		if len(list) > 0 || v.AtLeast(75) {
			m["servers"] = list
		}
	}
	return m
}

// hostServers lists the servers placed on a host.
func (s *Service) hostServers(ctx context.Context, host string) ([]serverRef, error) {
	rows, err := s.db.Query(ctx, "SELECT id, name FROM compute_servers WHERE host = ? AND deleted = 0 ORDER BY created_at, id", host)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []serverRef
	for rows.Next() {
		var sr serverRef
		if err := rows.Scan(&sr.uuid, &sr.name); err != nil {
			return nil, err
		}
		out = append(out, sr)
	}
	return out, rows.Err()
}

func (s *Service) listHypervisors(r *http.Request) (*api.Response, error) {
	return s.hypervisorList(r, false)
}

func (s *Service) listHypervisorsDetail(r *http.Request) (*api.Response, error) {
	return s.hypervisorList(r, true)
}

// withServersParam reads ?with_servers (2.53).
func withServersParam(r *http.Request) (bool, error) {
	raw, ok := r.URL.Query()["with_servers"]
	if !ok || !VersionFrom(r.Context()).AtLeast(53) {
		return false, nil
	}
	b, ok := api.ParseBool(raw[0])
	if !ok {
		return false, api.BadRequest("Invalid input for query parameters with_servers. Value: %s. '%s' is not one of ['True', 'true', '1', 'yes', 'False', 'false', '0', 'no']", raw[0], raw[0])
	}
	return b, nil
}

// hypervisorList is index and detail with the 2.33 paging and the 2.53
// hostname pattern and with_servers.
func (s *Service) hypervisorList(r *http.Request, detail bool) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	q := r.URL.Query()
	if v.AtLeast(53) {
		for k := range q {
			if !slices.Contains([]string{"limit", "marker", "hypervisor_hostname_pattern", "with_servers"}, k) {
				return nil, api.BadRequest("Invalid input for query parameters %s. Value: %s. Additional properties are not allowed ('%s' was unexpected)", k, q.Get(k), k)
			}
		}
	}
	withServers, err := withServersParam(r)
	if err != nil {
		return nil, err
	}
	pattern := ""
	if v.AtLeast(53) {
		pattern = q.Get("hypervisor_hostname_pattern")
		if pattern != "" && (q.Has("limit") || q.Has("marker")) {
			return nil, api.BadRequest("Paging over hypervisors with the hypervisor_hostname_pattern query parameter is not supported.")
		}
	}
	limit, marker := resMaxLimit, ""
	if v.AtLeast(33) {
		if limit, marker, err = resPage(r); err != nil {
			return nil, err
		}
	}
	all, err := s.hypervisors(ctx)
	if err != nil {
		return nil, err
	}
	if pattern != "" {
		all = slices.DeleteFunc(all, func(h *hypervisor) bool { return !strings.Contains(h.host.Name, pattern) })
		if len(all) == 0 {
			return nil, api.NotFound("No hypervisor matching '%s' could be found.", pattern)
		}
	}
	if marker != "" {
		i := slices.IndexFunc(all, func(h *hypervisor) bool { return hypervisorIDString(v, h) == marker })
		if i < 0 {
			return nil, api.BadRequest("marker [%s] not found", marker)
		}
		all = all[i+1:]
	}
	if len(all) > limit {
		all = all[:limit]
	}
	out := []any{}
	for _, h := range all {
		var servers []serverRef
		if withServers {
			if servers, err = s.hostServers(ctx, h.svc.Host); err != nil {
				return nil, err
			}
		}
		out = append(out, s.hypervisorView(r, h, detail, servers, withServers))
	}
	body := map[string]any{"hypervisors": out}
	if v.AtLeast(33) && q.Has("limit") && limit > 0 && len(all) == limit {
		body["hypervisors_links"] = resNextLink(r, hypervisorIDString(v, all[len(all)-1]))
	}
	return api.JSON(http.StatusOK, body), nil
}

func hypervisorIDString(v Version, h *hypervisor) string {
	if v.AtLeast(53) {
		return h.svc.NodeUUID
	}
	return strconv.FormatInt(h.svc.NodeID, 10)
}

// findHypervisor resolves {id}: an integer before 2.53, a UUID from 2.53.
func (s *Service) findHypervisor(r *http.Request) (*hypervisor, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	id := r.PathValue("id")
	notFound := api.NotFound("Hypervisor with ID '%s' could not be found.", id)
	if v.AtLeast(53) {
		if _, err := uuid.Parse(id); err != nil {
			return nil, api.BadRequest("Invalid uuid %s", id)
		}
	} else if _, err := strconv.ParseInt(id, 10, 64); err != nil {
		return nil, notFound
	}
	all, err := s.hypervisors(ctx)
	if err != nil {
		return nil, err
	}
	for _, h := range all {
		if hypervisorIDString(v, h) == id {
			return h, nil
		}
	}
	return nil, notFound
}

func (s *Service) showHypervisor(r *http.Request) (*api.Response, error) {
	withServers, err := withServersParam(r)
	if err != nil {
		return nil, err
	}
	h, err := s.findHypervisor(r)
	if err != nil {
		return nil, err
	}
	var servers []serverRef
	if withServers {
		if servers, err = s.hostServers(r.Context(), h.svc.Host); err != nil {
			return nil, err
		}
	}
	return api.JSON(http.StatusOK, map[string]any{"hypervisor": s.hypervisorView(r, h, true, servers, withServers)}), nil
}

// hypervisorUptime is GET /os-hypervisors/{id}/uptime, gone at 2.88.
func (s *Service) hypervisorUptime(r *http.Request) (*api.Response, error) {
	if VersionFrom(r.Context()).AtLeast(88) {
		return nil, api.NotFound("The resource could not be found.")
	}
	h, err := s.findHypervisor(r)
	if err != nil {
		return nil, err
	}
	if !h.up() {
		return nil, api.BadRequest("Compute service of %s is unavailable at this time.", h.svc.Host)
	}
	m := s.hypervisorView(r, h, false, nil, false)
	m["uptime"] = uptimeString(h.host.UptimeSince, s.now())
	return api.JSON(http.StatusOK, map[string]any{"hypervisor": m}), nil
}

// searchHypervisors and hypervisorServers are the pre-2.53 pattern
// searches: /os-hypervisors/{pattern}/search and /servers.
func (s *Service) searchHypervisors(r *http.Request) (*api.Response, error) {
	return s.hypervisorSearch(r, false)
}

func (s *Service) hypervisorServers(r *http.Request) (*api.Response, error) {
	return s.hypervisorSearch(r, true)
}

func (s *Service) hypervisorSearch(r *http.Request, withServers bool) (*api.Response, error) {
	ctx := r.Context()
	if VersionFrom(ctx).AtLeast(53) {
		return nil, api.NotFound("The resource could not be found.")
	}
	pattern := r.PathValue("id")
	all, err := s.hypervisors(ctx)
	if err != nil {
		return nil, err
	}
	out := []any{}
	for _, h := range all {
		if !strings.Contains(h.host.Name, pattern) {
			continue
		}
		var servers []serverRef
		if withServers {
			if servers, err = s.hostServers(ctx, h.svc.Host); err != nil {
				return nil, err
			}
		}
		out = append(out, s.hypervisorView(r, h, false, servers, false))
	}
	if len(out) == 0 {
		return nil, api.NotFound("No hypervisor matching '%s' could be found.", pattern)
	}
	return api.JSON(http.StatusOK, map[string]any{"hypervisors": out}), nil
}

// hypervisorStatistics sums the compute nodes (gone at 2.88).
func (s *Service) hypervisorStatistics(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if VersionFrom(ctx).AtLeast(88) {
		return nil, api.NotFound("The resource could not be found.")
	}
	all, err := s.hypervisors(ctx)
	if err != nil {
		return nil, err
	}
	st := map[string]int{"count": 0, "vcpus": 0, "memory_mb": 0, "local_gb": 0, "vcpus_used": 0, "memory_mb_used": 0,
		"local_gb_used": 0, "free_ram_mb": 0, "free_disk_gb": 0, "current_workload": 0, "running_vms": 0,
		"disk_available_least": 0}
	for _, h := range all {
		u := h.usage
		st["count"]++
		st["vcpus"] += h.host.VCPUs
		st["memory_mb"] += h.host.MemoryMB
		st["local_gb"] += h.host.DiskGB
		st["vcpus_used"] += u.VCPUs
		st["memory_mb_used"] += u.MemoryMB
		st["local_gb_used"] += u.DiskGB
		st["free_ram_mb"] += h.host.MemoryMB - u.MemoryMB
		st["free_disk_gb"] += h.host.DiskGB - u.DiskGB
		st["disk_available_least"] += h.host.DiskGB - u.DiskGB
		st["running_vms"] += u.Servers
	}
	return api.JSON(http.StatusOK, map[string]any{"hypervisor_statistics": st}), nil
}
