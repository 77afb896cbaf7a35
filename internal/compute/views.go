package compute

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sort"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/network"
	"nimbus/internal/volume"
)

// isoTime is Nova's created/updated format (nova/utils.py isotime).
func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05Z") }

// usgTime is Nova's launched_at/terminated_at and usage format: no zone.
func usgTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000") }

func usgTimePtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return usgTime(*t)
}

// hostID is nova/utils.py generate_hostid: sha224(project_id + host).
func hostID(projectID, host string) string {
	if host == "" {
		return ""
	}
	h := sha256.Sum224([]byte(projectID + host))
	return hex.EncodeToString(h[:])
}

// links builds self and bookmark links for a resource path such as
// "servers/ID", keeping a project id the client put in the URL
// (nova/api/openstack/common.py ViewBuilder._get_links).
func links(r *http.Request, path string) []map[string]string {
	base := api.BaseURL(r)
	p := ""
	if pid := projectInURL(r.Context()); pid != "" {
		p = "/" + pid
	}
	return []map[string]string{
		{"rel": "self", "href": base + "/v2.1" + p + "/" + path},
		{"rel": "bookmark", "href": base + p + "/" + path},
	}
}

func bookmark(r *http.Request, path string) []map[string]string {
	return links(r, path)[1:]
}

func strOrNil(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// viewCtx is what rendering a page of servers needs once per request.
type viewCtx struct {
	r         *http.Request
	v         Version
	admin     bool
	addresses map[string]map[string][]network.Address
	hostState map[string]string
	// volumes are the servers' volume attachments, read in one call.
	volumes map[string][]volume.Attachment
	// groupsOf gives a server's server groups (server_groups, 2.71).
	groupsOf func(serverID string) []string
}

func (s *Service) newViewCtx(r *http.Request, svs []*server) (*viewCtx, error) {
	vc := &viewCtx{r: r, v: VersionFrom(r.Context()), admin: api.CallerFrom(r.Context()).IsAdmin()}
	ids := make([]network.ServerRef, 0, len(svs))
	for _, sv := range svs {
		if sv.VMState != vmBuilding {
			ids = append(ids, network.ServerRef{ID: sv.ID, ProjectID: sv.ProjectID})
		}
	}
	vc.addresses = map[string]map[string][]network.Address{}
	if len(ids) > 0 {
		a, err := s.networks.Addresses(r.Context(), ids)
		if err != nil {
			s.log.Warn("addresses unavailable", "error", err)
		} else {
			vc.addresses = a
		}
	}
	if vc.admin && vc.v.AtLeast(16) {
		vc.hostState = s.hostStates(r.Context())
	}
	if vols, err := s.volumesAttached(r.Context(), svs); err != nil {
		s.log.Warn("volume attachments unavailable", "error", err)
	} else {
		vc.volumes = vols
	}
	if vc.v.AtLeast(71) {
		ctx := r.Context()
		vc.groupsOf = func(serverID string) []string {
			ids, err := s.serverGroupsOf(ctx, s.db, serverID)
			if err != nil {
				s.log.Warn("server groups unavailable", "error", err)
				return []string{}
			}
			return ids
		}
	}
	return vc, nil
}

// hostStates gives Nova's host_status per host with a compute service
// (nova/compute/api.py get_instance_host_status): DOWN when the service is
// forced down, MAINTENANCE when it is disabled, UNKNOWN when it is not up
// (its host stopped reporting: it may well still run the server), else UP.
func (s *Service) hostStates(ctx context.Context) map[string]string {
	out := map[string]string{}
	hosts, err := s.fleet(ctx)
	if err != nil {
		return out
	}
	svcs, err := loadServices(ctx, s.db)
	if err != nil {
		return out
	}
	for _, sv := range svcs {
		if sv.Binary != binCompute {
			continue
		}
		switch {
		case sv.ForcedDown:
			out[sv.Host] = "DOWN"
		case sv.Disabled:
			out[sv.Host] = "MAINTENANCE"
		case !serviceUp(sv, hosts):
			out[sv.Host] = "UNKNOWN"
		default:
			out[sv.Host] = "UP"
		}
	}
	return out
}

// publicAddress is a server's public address of an IP version (its
// floating address, on the network that sorts first), which Nova's
// accessIPv4/accessIPv6 show unless the customer set them, so that
// `openstack server show` says where the server is reached.
func publicAddress(m map[string][]network.Address, version int) string {
	nets := make([]string, 0, len(m))
	for n := range m {
		nets = append(nets, n)
	}
	sort.Strings(nets)
	for _, n := range nets {
		for _, a := range m[n] {
			if a.Type == "floating" && a.Version == version {
				return a.Addr
			}
		}
	}
	return ""
}

func addressesView(m map[string][]network.Address) map[string]any {
	out := map[string]any{}
	for net, addrs := range m {
		l := make([]any, 0, len(addrs))
		for _, a := range addrs {
			l = append(l, obj{{"OS-EXT-IPS-MAC:mac_addr", a.MAC}, {"version", a.Version}, {"addr", a.Addr}, {"OS-EXT-IPS:type", a.Type}})
		}
		out[net] = l
	}
	return out
}

// progressStatuses are those for which Nova shows progress.
var progressStatuses = map[string]bool{"ACTIVE": true, "BUILD": true, "REBUILD": true, "RESIZE": true, "VERIFY_RESIZE": true, "MIGRATING": true}

// serverView is nova/api/openstack/compute/views/servers.py show for the
// request's microversion; withGroups adds server_groups (2.71, show only).
func (vc *viewCtx) serverView(sv *server, withGroups bool) obj {
	r, v := vc.r, vc.v
	status := statusOf(sv.VMState, sv.TaskState)
	d := &sv.Doc
	m := make(obj, 0, 56)
	m = append(m, kv{"id", sv.ID}, kv{"name", sv.Name}, kv{"status", status}, kv{"tenant_id", sv.ProjectID},
		kv{"user_id", sv.UserID}, kv{"metadata", d.Metadata}, kv{"hostId", hostID(sv.ProjectID, sv.Host)})
	if sv.ImageRef == "" {
		m.set("image", "")
	} else {
		m.set("image", obj{{"id", sv.ImageRef}, {"links", bookmark(r, "images/"+sv.ImageRef)}})
	}
	m.set("flavor", flavorRefView(r, v, sv))
	m = append(m, kv{"created", isoTime(sv.CreatedAt)}, kv{"updated", isoTime(sv.UpdatedAt)})
	if sv.VMState == vmBuilding {
		m.set("addresses", obj{})
	} else {
		m.set("addresses", addressesView(vc.addresses[sv.ID]))
	}
	access4, access6 := d.AccessIPv4, d.AccessIPv6
	if access4 == "" {
		access4 = publicAddress(vc.addresses[sv.ID], 4)
	}
	if access6 == "" {
		access6 = publicAddress(vc.addresses[sv.ID], 6)
	}
	m = append(m, kv{"accessIPv4", access4}, kv{"accessIPv6", access6}, kv{"links", links(r, "servers/"+sv.ID)},
		kv{"OS-DCF:diskConfig", d.DiskConfig})
	if progressStatuses[status] {
		m.set("progress", 0)
	}
	cd := ""
	if d.ConfigDrive {
		cd = "True"
	}
	m = append(m, kv{"OS-EXT-AZ:availability_zone", sv.AZ}, kv{"config_drive", cd}, kv{"key_name", strOrNil(sv.KeyName)},
		kv{"OS-SRV-USG:launched_at", usgTimePtr(sv.LaunchedAt)}, kv{"OS-SRV-USG:terminated_at", usgTimePtr(sv.TerminatedAt)})
	if (status == "ERROR" || status == "DELETED") && d.Fault != nil {
		f := obj{{"code", d.Fault.Code}, {"created", isoTime(d.Fault.Created)}, {"message", d.Fault.Message}}
		if d.Fault.Details != "" && (vc.admin || d.Fault.Code != 500) {
			f.set("details", d.Fault.Details)
		}
		m.set("fault", f)
	}
	if len(d.SecurityGroups) > 0 {
		sgs := make([]any, 0, len(d.SecurityGroups))
		for _, g := range d.SecurityGroups {
			sgs = append(sgs, obj{{"name", g}})
		}
		m.set("security_groups", sgs)
	}
	if vc.admin {
		vc.setServerAttrs(&m, sv)
	}
	if v.AtLeast(90) {
		m.set("OS-EXT-SRV-ATTR:hostname", sv.Hostname)
	}
	m = append(m, kv{"OS-EXT-STS:task_state", strOrNil(sv.TaskState)}, kv{"OS-EXT-STS:vm_state", sv.VMState},
		kv{"OS-EXT-STS:power_state", sv.Power}, kv{"os-extended-volumes:volumes_attached", volumesAttachedView(vc.volumes[sv.ID], v)})
	if v.AtLeast(9) {
		m.set("locked", sv.Locked)
	}
	if v.AtLeast(16) && vc.admin {
		hs := ""
		if sv.Host != "" {
			hs = vc.hostState[sv.Host]
			if hs == "" {
				hs = "UNKNOWN"
			}
		}
		m.set("host_status", hs)
	}
	if v.AtLeast(19) {
		m.set("description", d.Description)
	}
	if v.AtLeast(26) {
		m.set("tags", sv.Tags)
	}
	if v.AtLeast(63) {
		m.set("trusted_image_certificates", nil)
	}
	if v.AtLeast(71) && withGroups {
		groups := []string{}
		if vc.groupsOf != nil {
			groups = vc.groupsOf(sv.ID)
		}
		m.set("server_groups", groups)
	}
	if v.AtLeast(73) {
		m.set("locked_reason", d.LockedReason)
	}
	if v.AtLeast(96) {
		m.set("pinned_availability_zone", d.PinnedAZ)
	}
	return m
}

// setServerAttrs sets the OS-EXT-SRV-ATTR attributes an admin sees.
func (vc *viewCtx) setServerAttrs(m *obj, sv *server) {
	d := &sv.Doc
	var host any
	if sv.Host != "" {
		host = sv.Host
	}
	m.set("OS-EXT-SRV-ATTR:host", host)
	m.set("OS-EXT-SRV-ATTR:hypervisor_hostname", host)
	m.set("OS-EXT-SRV-ATTR:instance_name", "")
	if sv.Host != "" || sv.LaunchedAt != nil {
		m.set("OS-EXT-SRV-ATTR:instance_name", d.InstanceName)
	}
	if vc.v.AtLeast(3) {
		m.set("OS-EXT-SRV-ATTR:reservation_id", sv.ReservationID)
		m.set("OS-EXT-SRV-ATTR:launch_index", sv.LaunchIndex)
		m.set("OS-EXT-SRV-ATTR:hostname", sv.Hostname)
		m.set("OS-EXT-SRV-ATTR:kernel_id", "")
		m.set("OS-EXT-SRV-ATTR:ramdisk_id", "")
		m.set("OS-EXT-SRV-ATTR:root_device_name", nil)
		if sv.LaunchedAt != nil {
			m.set("OS-EXT-SRV-ATTR:root_device_name", "/dev/sda")
		}
		m.set("OS-EXT-SRV-ATTR:user_data", d.UserData)
	}
}

// flavorRefView is a server's flavor: embedded from 2.47, a link before.
func flavorRefView(r *http.Request, v Version, sv *server) obj {
	f := sv.Doc.Flavor
	if v.AtLeast(47) {
		es := f.ExtraSpecs
		if es == nil {
			es = map[string]string{}
		}
		return obj{{"vcpus", f.VCPUs}, {"ram", f.RAM}, {"disk", f.Disk},
			{"ephemeral", f.Ephemeral}, {"swap", f.Swap}, {"original_name", f.Name}, {"extra_specs", es}}
	}
	return obj{{"id", sv.FlavorID}, {"links", bookmark(r, "flavors/"+sv.FlavorID)}}
}

// updateView is the body PUT /servers/{id} and rebuild answer. Before 2.75
// Nova leaves out the extended attributes and gives bare addresses
// (servers.py update/_action_rebuild: show_all_attributes from 2.75), but a
// rebuild shows key_name from 2.54 and user_data from 2.57; Tempest's
// response schemas reject anything more or less.
func (vc *viewCtx) updateView(sv *server, rebuild bool) obj {
	m := vc.serverView(sv, true)
	if rebuild && vc.v.AtLeast(57) {
		m.set("user_data", sv.Doc.UserData)
	}
	if vc.v.AtLeast(75) {
		return m
	}
	keepKey := rebuild && vc.v.AtLeast(54)
	out := make(obj, 0, len(m))
	for _, e := range m {
		switch {
		case strings.HasPrefix(e.k, "OS-EXT-AZ:"), strings.HasPrefix(e.k, "OS-SRV-USG:"),
			strings.HasPrefix(e.k, "OS-EXT-STS:"), strings.HasPrefix(e.k, "OS-EXT-SRV-ATTR:"),
			e.k == "config_drive", e.k == "key_name" && !keepKey, e.k == "security_groups",
			e.k == "os-extended-volumes:volumes_attached", e.k == "host_status":
			continue
		case e.k == "addresses" && sv.VMState != vmBuilding:
			e.v = briefAddresses(vc.addresses[sv.ID])
		}
		out = append(out, e)
	}
	return out
}

// briefAddresses is the addresses map without the OS-EXT-IPS extensions.
func briefAddresses(m map[string][]network.Address) map[string]any {
	out := map[string]any{}
	for net, addrs := range m {
		l := make([]any, 0, len(addrs))
		for _, a := range addrs {
			l = append(l, obj{{"version", a.Version}, {"addr", a.Addr}})
		}
		out[net] = l
	}
	return out
}

// ipsView is GET /servers/{id}/ips: the addresses by network, without the
// OS-EXT-IPS extensions (nova/api/openstack/compute/ips.py).
func ipsView(m map[string][]network.Address) map[string]any {
	return briefAddresses(m)
}
