package compute

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/image"
	"nimbus/internal/network"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
)

// netReq is one entry of a create's networks list.
type netReq struct {
	UUID    string `json:"uuid"`
	Port    string `json:"port"`
	FixedIP string `json:"fixed_ip"`
	Tag     string `json:"tag"`
}

// createReq is a validated POST /servers body.
type createReq struct {
	Name, ImageRef, FlavorRef string
	AdminPass                 string
	Metadata                  map[string]string
	Nets                      []netReq
	NetMode                   string // "auto", "none" or "" (list)
	DiskConfig                string
	AccessIPv4, AccessIPv6    string
	KeyName                   string
	UserData                  *string
	AZ                        string
	SecurityGroups            []string
	ConfigDrive               bool
	MinCount, MaxCount        int
	ReturnReservation         bool
	Description               *string
	Tags                      []string
	Hostname                  string
	Host                      string // 2.74, admin: the host to boot on
	Hints                     schedulerHints
	// BDMs are block_device_mapping_v2's entries, or the legacy
	// block_device_mapping's (LegacyBDM) (block_devices.go).
	BDMs      []bdmReq
	LegacyBDM bool
}

func isIPv4(s string) bool {
	ip := net.ParseIP(s)
	return ip != nil && ip.To4() != nil && !strings.Contains(s, ":")
}
func isIPv6(s string) bool { ip := net.ParseIP(s); return ip != nil && strings.Contains(s, ":") }

func badField(field string, raw json.RawMessage, why string) error {
	return api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s", field, raw, why)
}

func strField(obj map[string]json.RawMessage, field string) (*string, error) {
	raw, ok := obj[field]
	if !ok {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, badField(field, raw, fmt.Sprintf("%s is not of type 'string'", raw))
	}
	return &s, nil
}

// maxServerNICs bounds the networks one server is created on.
const maxServerNICs = 16

// countField reads min_count/max_count: a positive integer or a numeric string.
func countField(obj map[string]json.RawMessage, field string) (int, bool, error) {
	raw, ok := obj[field]
	if !ok {
		return 0, false, nil
	}
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return 0, false, badField(field, raw, "is not valid")
	}
	switch t := v.(type) {
	case json.Number:
		n = t
	case string:
		n = json.Number(t)
	default:
		return 0, false, badField(field, raw, fmt.Sprintf("%s is not of type 'integer', 'string'", raw))
	}
	i, err := strconv.Atoi(string(n))
	if err != nil {
		return 0, false, badField(field, raw, fmt.Sprintf("%s is not of type 'integer', 'string'", raw))
	}
	if i < 1 {
		return 0, false, badField(field, raw, fmt.Sprintf("%d is less than the minimum of 1", i))
	}
	return i, true, nil
}

func metadataField(obj map[string]json.RawMessage, field string) (map[string]string, error) {
	raw, ok := obj[field]
	if !ok {
		return map[string]string{}, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, badField(field, raw, fmt.Sprintf("%s is not of type 'object'", raw))
	}
	return checkMetadata(field, m)
}

// maxServerSecurityGroups bounds a create's security_groups. Nova sets no
// count; each name is resolved for every port, and five times the default
// security_groups quota (10) leaves room for a project that raised it.
const maxServerSecurityGroups = 50

// checkMetadata is Nova's metadata schema: keys 1–255, string values ≤ 255.
func checkMetadata(field string, m map[string]any) (map[string]string, error) {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if len(k) < 1 || len(k) > 255 {
			return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. Additional properties are not allowed ('%s' was unexpected)", field, k, k)
		}
		sv, ok := v.(string)
		if !ok {
			return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %v. %v is not of type 'string'", k, v, v)
		}
		if len(sv) > 255 {
			return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is too long", k, sv, sv)
		}
		out[k] = sv
	}
	return out, nil
}

// parseCreate validates a create body as nova's schemas/servers.py does:
// the server object through serverFields, then what spans fields.
func parseCreate(r *http.Request, v Version) (*createReq, error) {
	var top map[string]json.RawMessage
	if err := api.DecodeJSON(r, &top); err != nil {
		return nil, err
	}
	if top == nil {
		return nil, api.BadRequest("Malformed request body")
	}
	if err := api.UnknownFields(top, "server", "os:scheduler_hints", "OS-SCH-HNT:scheduler_hints"); err != nil {
		return nil, err
	}
	raw, ok := top["server"]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute server. 'server' is a required property")
	}
	var hints schedulerHints
	for _, k := range []string{"os:scheduler_hints", "OS-SCH-HNT:scheduler_hints"} {
		if h, ok := top[k]; ok {
			var err error
			if hints, err = parseSchedulerHints(h); err != nil {
				return nil, err
			}
		}
	}
	b, err := parseServerBody(opCreate, v, "server", raw)
	if err != nil {
		return nil, err
	}
	req := &b.createReq
	req.Hints = hints
	if err := createCounts(req); err != nil {
		return nil, err
	}
	if err := checkBootSequence(req); err != nil {
		return nil, err
	}
	if req.DiskConfig == "" {
		req.DiskConfig = "MANUAL"
	}
	if req.Metadata == nil {
		req.Metadata = map[string]string{}
	}
	if !b.has("networks") {
		req.NetMode = "auto"
	}
	return req, nil
}

// createCounts defaults and bounds min_count and max_count (0: not given).
func createCounts(req *createReq) error {
	if req.MinCount == 0 {
		req.MinCount = 1
	}
	if req.MaxCount == 0 {
		req.MaxCount = req.MinCount
	}
	if req.MinCount > req.MaxCount {
		return api.BadRequest("min_count must be <= max_count")
	}
	if req.MinCount > MaxCreateCount {
		return api.BadRequest("min_count may be at most %d: no more servers are created in one request.", MaxCreateCount)
	}
	req.MaxCount = min(req.MaxCount, MaxCreateCount)
	if req.Hostname != "" && req.MaxCount > 1 {
		return api.BadRequest("Cannot specify 'hostname' when 'max_count' is greater than 1.")
	}
	return nil
}

func parseNetworks(raw json.RawMessage, req *createReq, v Version) error {
	var str string
	if err := json.Unmarshal(raw, &str); err == nil {
		if !v.AtLeast(37) || (str != "auto" && str != "none") {
			return badField("networks", raw, fmt.Sprintf("'%s' is not one of ['none', 'auto']", str))
		}
		req.NetMode = str
		return nil
	}
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return badField("networks", raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	if len(list) == 0 {
		req.NetMode = "auto"
		return nil
	}
	if len(list) > maxServerNICs {
		// Each is a port made in the create's transaction, for every
		// server of the request.
		return api.Forbidden("Maximum number of ports exceeded: at most %d networks per server.", maxServerNICs)
	}
	for _, item := range list {
		if err := api.UnknownFields(item, "uuid", "port", "fixed_ip", "tag"); err != nil {
			return err
		}
		var n netReq
		for _, f := range []struct {
			name string
			dst  *string
		}{{"uuid", &n.UUID}, {"port", &n.Port}, {"fixed_ip", &n.FixedIP}, {"tag", &n.Tag}} {
			p, err := strField(item, f.name)
			if err != nil {
				return err
			}
			if p != nil {
				*f.dst = *p
			}
		}
		if _, ok := item["uuid"]; ok && (!uuidRE.MatchString(n.UUID) && (v.AtLeast(37) || n.UUID == "")) {
			return api.BadRequest("Invalid input for field/attribute uuid. Value: %s. '%s' is not a 'uuid'", n.UUID, n.UUID)
		}
		if _, ok := item["port"]; ok && !uuidRE.MatchString(n.Port) {
			return api.BadRequest("Invalid input for field/attribute port. Value: %s. '%s' is not a 'uuid'", n.Port, n.Port)
		}
		if n.FixedIP != "" && net.ParseIP(n.FixedIP) == nil {
			return api.BadRequest("Invalid fixed IP address (%s)", n.FixedIP)
		}
		if n.UUID == "" && n.Port == "" {
			return api.BadRequest("Bad networks format: network uuid is not in proper format (%s)", "")
		}
		req.Nets = append(req.Nets, n)
	}
	return nil
}

// checkBDMv2 reads block_device_mapping_v2 (block_devices.go).
func checkBDMv2(b *serverBody, field string, raw json.RawMessage) error {
	if b.has("block_device_mapping") {
		return api.BadRequest("Using different block_device_mapping syntaxes is not allowed in the same request.")
	}
	bdms, err := parseBDMv2(b.v, raw)
	if err != nil {
		return err
	}
	b.BDMs = bdms
	return nil
}

// checkTags is Nova's tag schema: ≤ 50 tags of 1–60 characters without ',' or '/'.
func checkTags(tags []string) error {
	if len(tags) > maxServerTags {
		return api.BadRequest("The number of tags exceeded the per-server limit %d", maxServerTags)
	}
	for _, t := range tags {
		if t == "" || len([]rune(t)) > 60 || strings.ContainsAny(t, ",/") {
			return api.BadRequest("Invalid input for field/attribute tags. Value: %s. '%s' does not match '^[^,/]*$'", t, t)
		}
	}
	return nil
}

const passChars = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"

// randomString is nova/utils.py generate_password (12 chars by default).
func randomString(n int, chars string) string {
	b := make([]byte, n)
	for i := range b {
		k, _ := rand.Int(rand.Reader, big.NewInt(int64(len(chars))))
		b[i] = chars[k.Int64()]
	}
	return string(b)
}

// handleCreate is POST /servers: the create's request read, its plan
// resolved, its servers placed and recorded, and Nova's answer.
func (s *Service) handleCreate(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	req, err := parseCreate(r, VersionFrom(ctx))
	if err != nil {
		return nil, err
	}
	plan, err := s.planCreate(ctx, api.CallerFrom(ctx), req)
	if err != nil {
		return nil, err
	}
	created, err := s.create(ctx, plan)
	if err != nil {
		return nil, err
	}
	if req.ReturnReservation {
		return api.JSON(http.StatusAccepted, map[string]any{"reservation_id": plan.rid}), nil
	}
	first := created[0]
	lk := links(r, "servers/"+first.ID)
	sgView := make([]any, 0, len(plan.sgs))
	for _, g := range plan.sgs {
		sgView = append(sgView, map[string]string{"name": g})
	}
	body := map[string]any{"id": first.ID, "links": lk, "OS-DCF:diskConfig": req.DiskConfig,
		"security_groups": sgView, "adminPass": req.AdminPass}
	return api.JSON(http.StatusAccepted, map[string]any{"server": body}).WithHeader("Location", lk[0]["href"]), nil
}

// planCreate resolves, for caller c, everything req names that needs no
// lock, before any transaction: the flavor, the image, the key pair, the
// zone or host asked for, the security groups and networks, the group.
func (s *Service) planCreate(ctx context.Context, c *api.Caller, req *createReq) (*createPlan, error) {
	flavor, err := s.usableFlavor(ctx, c, req.FlavorRef)
	if err != nil {
		return nil, err
	}
	osType, bootImage, err := s.createImage(ctx, c, req, flavor)
	if err != nil {
		return nil, err
	}
	bootVolume := req.bootVolumeReq() != nil
	var kp *Keypair
	if req.KeyName != "" {
		if kp, err = s.getKeypair(ctx, s.db, c.UserID, req.KeyName); err != nil {
			return nil, notFoundAs(err, api.BadRequest("Invalid key_name provided."))
		}
	}
	if err := s.checkDestination(ctx, c, req.AZ, req.Host); err != nil {
		return nil, err
	}
	if err := s.networks.CheckSecurityGroups(ctx, c.ProjectID, req.SecurityGroups); err != nil {
		return nil, err
	}
	nets, err := s.createNets(ctx, c, req)
	if err != nil {
		return nil, err
	}
	sgs := req.SecurityGroups
	if len(sgs) == 0 {
		sgs = []string{"default"}
	}
	if req.AdminPass == "" {
		req.AdminPass = randomString(12, passChars)
	}
	var pinned *string
	if req.AZ != "" {
		pinned = &req.AZ
	}
	if req.Hints.Group != "" {
		if err := s.checkGroupForCreate(ctx, c.ProjectID, req.Hints.Group, req.MinCount); err != nil {
			return nil, err
		}
	}
	return &createPlan{req: req, caller: c, flavor: flavor, snap: snapOf(flavor), osType: osType, kp: kp, nets: nets,
		sgs: sgs, rid: "r-" + randomString(8, "0123456789abcdefghijklmnopqrstuvwxyz"), pinned: pinned,
		publicIP: flavor.ExtraSpecs["nimbus:public_ipv4"] == "true", requestID: api.RequestID(ctx),
		volumeBDMs: req.volumeBDMs(), bootImage: bootImage,
		// A network-disk flavor boots an image from a volume made of it.
		networkDisk: !bootVolume && s.volumes != nil && flavor.ExtraSpecs["nimbus:disk_type"] == "network"}, nil
}

// usableFlavor is the flavor ref names, if c may use it and it is enabled.
func (s *Service) usableFlavor(ctx context.Context, c *api.Caller, ref string) (*Flavor, error) {
	flavor, err := s.getFlavor(ctx, s.db, ref)
	if err != nil {
		return nil, notFoundAs(err, api.BadRequest("Flavor %s could not be found.", ref))
	}
	if ok, err := s.flavorAccessible(ctx, s.db, flavor, c.ProjectID); err != nil {
		return nil, err
	} else if !ok {
		return nil, api.BadRequest("Flavor %s could not be found.", ref)
	}
	if flavor.Disabled {
		return nil, api.BadRequest("Flavor is disabled.")
	}
	return flavor, nil
}

// createImage checks what req boots against flavor: its image, active and
// fitting, or its block devices' sources. It answers the servers' OS type
// (as far as c sees it) and the image a boot volume is made of; a server
// booted from a volume it was asked for keeps no image (Nova's view shows
// "image": "").
func (s *Service) createImage(ctx context.Context, c *api.Caller, req *createReq, flavor *Flavor) (osType, bootImage string, err error) {
	img, imgErr := s.imageDefinedBDMs(ctx, c, req)
	if bootImage, err = s.checkBDMSources(ctx, c, req); err != nil {
		return "", "", err
	}
	if req.bootVolumeReq() != nil {
		req.ImageRef = ""
	}
	if req.ImageRef != "" {
		if img == nil && imgErr == nil {
			img, imgErr = s.images.Get(ctx, c.ProjectID, c.IsAdmin(), req.ImageRef)
		}
		if imgErr != nil {
			return "", "", notFoundAs(imgErr, api.BadRequest("Can not find requested image"))
		}
		if img.Status != "active" {
			return "", "", api.BadRequest("Image %s is not active.", img.ID)
		}
		if err := imageFits(img, flavor.RAM, flavor.Disk); err != nil {
			return "", "", err
		}
		return osTypeOf(img), bootImage, nil
	}
	if bootImage != "" {
		// The OS of the boot volume's image, as far as the caller sees it.
		if img, err := s.images.Get(ctx, c.ProjectID, c.IsAdmin(), bootImage); err == nil {
			if img.MinRAM > flavor.RAM {
				return "", "", api.BadRequest("Flavor's memory is too small for requested image.")
			}
			return osTypeOf(img), bootImage, nil
		}
	}
	return "", bootImage, nil
}

// checkDestination checks a zone and host asked for: a host only by an
// admin, each among the enabled hosts, the host in the zone.
func (s *Service) checkDestination(ctx context.Context, c *api.Caller, az, host string) error {
	if host != "" && !c.IsAdmin() {
		return api.PolicyForbidden("compute:servers:create:requested_destination")
	}
	if az == "" && host == "" {
		return nil
	}
	hosts, err := s.enabledHosts(ctx)
	if err != nil {
		return err
	}
	zones, err := s.hostZones(ctx)
	if err != nil {
		return err
	}
	zoneOK, hostOK := az == "", host == ""
	for _, h := range hosts {
		zoneOK = zoneOK || zoneIn(h, zones) == az
		hostOK = hostOK || (h.Name == host && (az == "" || zoneIn(h, zones) == az))
	}
	if !zoneOK {
		return api.BadRequest("The requested availability zone is not available")
	}
	if !hostOK {
		return api.BadRequest("Compute host %s could not be found.", host)
	}
	return nil
}

// createNets resolves the networks req asks for, as c sees them: none,
// the project's automatic one, or each network or free port named.
func (s *Service) createNets(ctx context.Context, c *api.Caller, req *createReq) ([]resolvedNet, error) {
	switch req.NetMode {
	case "none":
		return nil, nil
	case "auto":
		n, err := s.networks.AutoNetwork(ctx, c.ProjectID)
		if err != nil {
			return nil, err
		}
		return []resolvedNet{{networkID: n.ID}}, nil
	}
	var nets []resolvedNet
	for _, n := range req.Nets {
		if n.Port != "" {
			p, err := s.networks.GetPort(ctx, c.ProjectID, c.IsAdmin(), n.Port)
			if err != nil {
				return nil, notFoundAs(err, api.BadRequest("Port %s could not be found.", n.Port))
			}
			if p.DeviceID != "" {
				return nil, api.Conflict("Port %s is still in use.", n.Port)
			}
			if req.MaxCount > 1 {
				return nil, api.BadRequest("Multiple instances cannot be created with the same port.")
			}
			nets = append(nets, resolvedNet{networkID: p.NetworkID, portID: p.ID})
			continue
		}
		if _, err := s.networks.GetNetwork(ctx, c.ProjectID, c.IsAdmin(), n.UUID); err != nil {
			return nil, notFoundAs(err, api.BadRequest("Network %s could not be found.", n.UUID))
		}
		if n.FixedIP != "" && req.MaxCount > 1 {
			return nil, api.BadRequest("max_count cannot be greater than 1 if an fixed_ip is specified.")
		}
		nets = append(nets, resolvedNet{networkID: n.UUID, fixedIP: n.FixedIP})
	}
	return nets, nil
}

// create places and records plan's servers: up to max_count of them, no
// more than the quota allows (read here, checked again in the
// transaction) and the project's money pays the first hour of (the
// service is prepaid; the volumes each makes start their charge with it).
// Fewer than min_count placed fails them all, as Nova's NoValidHost does,
// with nothing held and nothing charged.
func (s *Service) create(ctx context.Context, plan *createPlan) ([]*server, error) {
	req, c := plan.req, plan.caller
	var err error
	// A create of an exact count has nothing to cut: the transaction's
	// check alone answers it, one read fewer per create.
	if req.MinCount < req.MaxCount {
		if req.MaxCount, err = s.quotaRoom(ctx, c.ProjectID, plan.flavor, req.MinCount, req.MaxCount); err != nil {
			return nil, err
		}
	}
	bootVolume := req.bootVolumeReq() != nil
	spec := serverSpec(plan.snap, plan.osType, bootVolume)
	spec.SizeGB = req.newVolumesGB()
	if req.MaxCount, err = s.fundsRoom(ctx, c.ProjectID, spec, req.MinCount, req.MaxCount); err != nil {
		return nil, err
	}
	j, err := s.newPlaceJob(ctx, placeRequest{zone: req.AZ, host: req.Host, group: req.Hints.Group,
		sameHost: req.Hints.SameHost, differentHost: req.Hints.DifferentHost, volumeBacked: bootVolume || plan.networkDisk},
		plan.snap, req.MinCount, req.MaxCount)
	if err != nil {
		return nil, err
	}
	var created []*server
	j.recordShort = true
	j.write = func(tx *store.Tx, claims []scheduler.Claim, zones map[string]string) (keys []string, err error) {
		created, keys, err = s.insertCreate(ctx, tx, plan, claims, zones)
		return keys, err
	}
	if err := s.place(ctx, j); err != nil {
		return nil, err
	}
	return created, nil
}

// resolvedNet is one network a create's servers get a port on.
type resolvedNet struct {
	networkID, portID, fixedIP string
}

// createPlan is a create with everything resolved that its transaction
// needs.
type createPlan struct {
	req       *createReq
	caller    *api.Caller
	flavor    *Flavor
	snap      flavorSnap
	osType    string
	kp        *Keypair
	nets      []resolvedNet
	sgs       []string
	rid       string
	pinned    *string
	publicIP  bool
	requestID string
	// volumeBDMs are the volumes to make or use for each server, and
	// networkDisk asks for a root volume of the flavor's disk
	// (block_devices.go).
	volumeBDMs  []bdmReq
	networkDisk bool
	bootImage   string
}

// insertCreate is a create's placing transaction: as many servers as the
// quota allows, each on its claim with its ports, or, when fewer than
// min_count were placed, each in ERROR with Nova's NoValidHost fault. It
// returns the servers and the keys of the claims they keep.
func (s *Service) insertCreate(ctx context.Context, tx *store.Tx, p *createPlan, claims []scheduler.Claim, zones map[string]string) ([]*server, []string, error) {
	c, req := p.caller, p.req
	if err := lockProjectQuota(ctx, tx, c.ProjectID); err != nil {
		return nil, nil, err
	}
	quota, err := s.quotaFor(ctx, tx, c.ProjectID)
	if err != nil {
		return nil, nil, err
	}
	if err := checkMetadataCount(quota.MetadataItems, len(req.Metadata)); err != nil {
		return nil, nil, err
	}
	insts, cores, ram, err := s.projectUsage(ctx, tx, c.ProjectID)
	if err != nil {
		return nil, nil, err
	}
	count, err := fitQuota(quota, insts, cores, ram, p.flavor, req.MinCount, req.MaxCount)
	if err != nil {
		return nil, nil, err
	}
	noHost := min(count, len(claims)) < req.MinCount
	if !noHost {
		count = min(count, len(claims))
	}
	now := s.now()
	var created []*server
	var keys []string
	for i := 0; i < count; i++ {
		sv := p.newServer(i, count, now)
		if noHost {
			sv.VMState, sv.TaskState = vmError, ""
			sv.Doc.Fault = &faultDoc{Code: 500, Message: errNoValidHost.Error(), Details: errNoValidHost.Error(), Created: now}
		} else {
			sv.Host, sv.AZ = claims[i].Host, zones[claims[i].Host]
			if err := s.makeBlockDevices(ctx, tx, p, sv); err != nil {
				return nil, nil, err
			}
		}
		if err := s.insertCreated(ctx, tx, p, sv, now); err != nil {
			return nil, nil, err
		}
		created = append(created, sv)
		if !noHost {
			keys = append(keys, sv.ID)
		}
	}
	if err := s.enqueueAfter(ctx, tx, keys...); err != nil {
		return nil, nil, err
	}
	return created, keys, nil
}

// newServer is the i-th of a create's count servers, not yet placed.
func (p *createPlan) newServer(i, count int, now time.Time) *server {
	req, c, snap := p.req, p.caller, p.snap
	id := newUUID()
	name, hostname := req.Name, req.Hostname
	if count > 1 {
		name = fmt.Sprintf("%s-%d", req.Name, i+1)
	}
	if hostname == "" {
		hostname = sanitizeHostname(name)
	}
	sv := &server{
		ID: id, ProjectID: c.ProjectID, UserID: c.UserID, Name: name,
		VMState: vmBuilding, TaskState: taskSpawning, FlavorID: p.flavor.ID, ImageRef: req.ImageRef,
		ReservationID: p.rid, LaunchIndex: i, AZ: req.AZ, KeyName: req.KeyName, Hostname: hostname,
		Tags: append([]string{}, req.Tags...), VCPUs: snap.VCPUs, MemoryMB: snap.RAM, DiskGB: snap.diskGB(),
		CreatedAt: now, UpdatedAt: now,
		Doc: serverDoc{Flavor: snap, Metadata: req.Metadata, Description: req.Description,
			AccessIPv4: req.AccessIPv4, AccessIPv6: canonicalIP(req.AccessIPv6), ConfigDrive: req.ConfigDrive,
			DiskConfig: req.DiskConfig, UserData: req.UserData, SecurityGroups: p.sgs, AdminPass: req.AdminPass,
			PinnedAZ: p.pinned, RequestedHost: req.Host, OSType: p.osType, RequestID: p.requestID,
			InstanceName: "instance-" + strings.ReplaceAll(id, "-", "")[:8], TaskID: newUUID(),
			Group: req.Hints.Group, SameHost: req.Hints.SameHost, DifferentHost: req.Hints.DifferentHost},
	}
	if p.kp != nil {
		sv.Doc.PublicKey = p.kp.PublicKey
	}
	if p.req.bootVolumeReq() != nil {
		sv.Doc.BootImage = p.bootImage
	}
	if sv.Doc.OSType == "windows" {
		sv.Doc.Password = encryptPassword(sv.Doc.PublicKey, req.AdminPass)
	}
	return sv
}

// insertCreated writes one new server in tx with its group membership and
// create action; a placed server also gets its ports, a failed one its
// action's NoValidHost event.
func (s *Service) insertCreated(ctx context.Context, tx *store.Tx, p *createPlan, sv *server, now time.Time) error {
	if err := s.insertServer(ctx, tx, sv); err != nil {
		return err
	}
	if g := p.req.Hints.Group; g != "" {
		if err := s.addGroupMember(ctx, tx, g, sv.ID); err != nil {
			return err
		}
	}
	if err := s.insertAction(ctx, tx, sv.ID, "create", actionID(ctx)); err != nil {
		return err
	}
	if sv.Host == "" {
		return s.finishAction(ctx, tx, sv.ID, sv.Doc.RequestID, "conductor_schedule_and_build_instances", "", now, errNoValidHost)
	}
	return s.bindNets(ctx, tx, p, sv.ID)
}

// bindNets gives a new server its ports: the requested ones bound, one
// made on each requested network, and a public address on the first when
// the flavor asks for one.
func (s *Service) bindNets(ctx context.Context, tx *store.Tx, p *createPlan, id string) error {
	project := p.caller.ProjectID
	for i, n := range p.nets {
		portID := n.portID
		if portID != "" {
			if err := s.networks.BindPort(ctx, tx, project, portID, id); err != nil {
				return err
			}
		} else {
			port, err := s.networks.CreateServerPort(ctx, tx, project, n.networkID, id, n.fixedIP, p.sgs)
			if err != nil {
				return err
			}
			portID = port.ID
		}
		if i == 0 && p.publicIP {
			if _, err := s.networks.AttachPublicIP(ctx, tx, project, id, portID); err != nil {
				return err
			}
		}
	}
	return nil
}

// quotaRoom is how many servers of flavor the project's quota lets a
// create hold, from least to most.
func (s *Service) quotaRoom(ctx context.Context, project string, f *Flavor, least, most int) (int, error) {
	quota, err := s.quotaFor(ctx, s.db, project)
	if err != nil {
		return 0, err
	}
	insts, cores, ram, err := s.projectUsage(ctx, s.db, project)
	if err != nil {
		return 0, err
	}
	return fitQuota(quota, insts, cores, ram, f, least, most)
}

// MaxCreateCount bounds one create request: a client's max_count is cut to
// it before any work, so that no request holds a transaction or the
// scheduler for a number the client chose.
const MaxCreateCount = 200

// fitQuota returns how many servers of flavor fit the project's quota, up to
// most, or Nova's 403 when fewer than least fit. It is closed form and
// cannot overflow: each resource allows (limit - used) / per-server more.
func fitQuota(q Quota, insts, cores, ram int, f *Flavor, least, most int) (int, error) {
	fit := most
	for _, r := range createLimits(q, insts, cores, ram, f) {
		if r.limit < 0 || r.per <= 0 {
			continue // unlimited, or this flavor uses none of it
		}
		room := 0
		if r.limit > r.used {
			room = (r.limit - r.used) / r.per
		}
		if room < least {
			return 0, api.Forbidden("Quota exceeded for %s: Requested %d, but already used %d of %d %s",
				r.name, satMul(least, r.per), r.used, r.limit, r.name)
		}
		fit = min(fit, room)
	}
	return fit, nil
}

// createLimit is one limit a create counts against.
type createLimit struct {
	name             string
	limit, used, per int
}

func createLimits(q Quota, insts, cores, ram int, f *Flavor) []createLimit {
	return []createLimit{
		{"instances", q.Instances, insts, 1},
		{"cores", q.Cores, cores, f.VCPUs},
		{"ram", q.RAM, ram, f.RAM},
	}
}

// satMul is a*b for non-negative a and b, saturating at math.MaxInt.
func satMul(a, b int) int {
	if a != 0 && b > math.MaxInt/a {
		return math.MaxInt
	}
	return a * b
}

var _ = errors.New
var _ = context.Background
var _ *image.Image
var _ *network.Port
