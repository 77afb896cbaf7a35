package compute

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/image"
	"nimbus/internal/network"
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

// parseCreate validates a create body as nova's schemas/servers.py does.
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
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, badField("server", raw, fmt.Sprintf("%s is not of type 'object'", raw))
	}
	allowed := []string{"name", "imageRef", "flavorRef", "adminPass", "metadata", "networks", "OS-DCF:diskConfig",
		"accessIPv4", "accessIPv6", "key_name", "user_data", "availability_zone", "block_device_mapping",
		"block_device_mapping_v2", "security_groups", "config_drive", "min_count", "max_count", "return_reservation_id"}
	if !v.AtLeast(57) {
		allowed = append(allowed, "personality")
	}
	if v.AtLeast(19) {
		allowed = append(allowed, "description")
	}
	if v.AtLeast(52) {
		allowed = append(allowed, "tags")
	}
	if v.AtLeast(63) {
		allowed = append(allowed, "trusted_image_certificates")
	}
	if v.AtLeast(74) {
		allowed = append(allowed, "host", "hypervisor_hostname")
	}
	if v.AtLeast(90) {
		allowed = append(allowed, "hostname")
	}
	if err := api.UnknownFields(obj, allowed...); err != nil {
		return nil, err
	}
	req := &createReq{DiskConfig: "MANUAL", Hints: hints}
	required := func(f string) error {
		if _, ok := obj[f]; !ok {
			return badField("server", raw, fmt.Sprintf("'%s' is a required property", f))
		}
		return nil
	}
	if err := required("name"); err != nil {
		return nil, err
	}
	if err := required("flavorRef"); err != nil {
		return nil, err
	}
	if v.AtLeast(37) {
		if err := required("networks"); err != nil {
			return nil, err
		}
	}
	name, err := strField(obj, "name")
	if err != nil {
		return nil, err
	}
	if err := checkName("name", *name); err != nil {
		return nil, err
	}
	req.Name = *name
	var fr any
	_ = json.Unmarshal(obj["flavorRef"], &fr)
	switch f := fr.(type) {
	case string:
		req.FlavorRef = f
	case float64:
		req.FlavorRef = strconv.FormatFloat(f, 'f', -1, 64)
	default:
		return nil, badField("flavorRef", obj["flavorRef"], fmt.Sprintf("%s is not of type 'string', 'integer'", obj["flavorRef"]))
	}
	if req.FlavorRef == "" {
		return nil, badField("flavorRef", obj["flavorRef"], "'' is too short")
	}
	if i := strings.LastIndexByte(req.FlavorRef, '/'); i >= 0 {
		req.FlavorRef = req.FlavorRef[i+1:]
	}
	if p, err := strField(obj, "imageRef"); err != nil {
		return nil, err
	} else if p != nil {
		req.ImageRef = *p
		if i := strings.LastIndexByte(req.ImageRef, '/'); i >= 0 {
			req.ImageRef = req.ImageRef[i+1:]
		}
		if req.ImageRef != "" && !uuidRE.MatchString(req.ImageRef) {
			return nil, api.BadRequest("Invalid input for field/attribute imageRef. Value: %s. '%s' is not a 'uuid'", *p, *p)
		}
	}
	if err := parseBDM(obj, req); err != nil {
		return nil, err
	}
	if req.ImageRef == "" {
		return nil, api.BadRequest("Block Device Mapping is Invalid: Boot sequence for the instance and image/block device mapping combination is not valid.")
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"adminPass", &req.AdminPass}, {"key_name", &req.KeyName}, {"availability_zone", &req.AZ},
		{"accessIPv4", &req.AccessIPv4}, {"accessIPv6", &req.AccessIPv6}, {"OS-DCF:diskConfig", &req.DiskConfig}, {"hostname", &req.Hostname}} {
		p, err := strField(obj, f.name)
		if err != nil {
			return nil, err
		}
		if p != nil {
			*f.dst = *p
		}
	}
	for _, f := range []string{"host", "hypervisor_hostname"} {
		p, err := strField(obj, f)
		if err != nil {
			return nil, err
		}
		if p != nil {
			if *p == "" || len(*p) > 255 {
				return nil, badField(f, obj[f], "is not valid")
			}
			if req.Host != "" && req.Host != *p {
				return nil, api.BadRequest("host and hypervisor_hostname must name the same host")
			}
			req.Host = *p
		}
	}
	if req.DiskConfig != "AUTO" && req.DiskConfig != "MANUAL" {
		return nil, api.BadRequest("Invalid input for field/attribute OS-DCF:diskConfig. Value: %s. '%s' is not one of ['AUTO', 'MANUAL']", req.DiskConfig, req.DiskConfig)
	}
	if _, ok := obj["key_name"]; ok && (req.KeyName == "" || len(req.KeyName) > 255) {
		return nil, badField("key_name", obj["key_name"], "is not valid")
	}
	if _, ok := obj["availability_zone"]; ok && (req.AZ == "" || len(req.AZ) > 255) {
		return nil, badField("availability_zone", obj["availability_zone"], "is not valid")
	}
	if err := checkAccessIPs(&req.AccessIPv4, &req.AccessIPv6); err != nil {
		return nil, err
	}
	if _, ok := obj["hostname"]; ok {
		if err := checkHostname(req.Hostname, v); err != nil {
			return nil, err
		}
	}
	if req.Metadata, err = metadataField(obj, "metadata"); err != nil {
		return nil, err
	}
	if p, err := strField(obj, "user_data"); err != nil {
		return nil, err
	} else if p != nil {
		if len(*p) > 65535 {
			return nil, api.BadRequest("Invalid input for field/attribute user_data. Value: %.20s... is too long", *p)
		}
		if _, err := base64.StdEncoding.DecodeString(*p); err != nil {
			return nil, api.BadRequest("User data needs to be valid base 64.")
		}
		req.UserData = p
	}
	if raw, ok := obj["security_groups"]; ok {
		var sgs []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &sgs); err != nil {
			return nil, badField("security_groups", raw, fmt.Sprintf("%s is not of type 'array'", raw))
		}
		if len(sgs) > maxServerSecurityGroups {
			return nil, listTooLong("security_groups", len(sgs), maxServerSecurityGroups)
		}
		for _, g := range sgs {
			if err := api.UnknownFields(g, "name"); err != nil {
				return nil, err
			}
			n, err := strField(g, "name")
			if err != nil {
				return nil, err
			}
			if n == nil || *n == "" {
				return nil, badField("name", raw, "'' is too short")
			}
			if !slices.Contains(req.SecurityGroups, *n) {
				req.SecurityGroups = append(req.SecurityGroups, *n)
			}
		}
	}
	if raw, ok := obj["config_drive"]; ok {
		var b any
		_ = json.Unmarshal(raw, &b)
		switch t := b.(type) {
		case bool:
			req.ConfigDrive = t
		case string:
			switch strings.ToLower(t) {
			case "true", "1", "yes", "on", "t", "y":
				req.ConfigDrive = true
			case "false", "0", "no", "off", "f", "n", "":
			default:
				return nil, badField("config_drive", raw, "is not a boolean")
			}
		case nil:
		default:
			return nil, badField("config_drive", raw, "is not a boolean")
		}
	}
	if raw, ok := obj["return_reservation_id"]; ok {
		if err := json.Unmarshal(raw, &req.ReturnReservation); err != nil {
			return nil, badField("return_reservation_id", raw, fmt.Sprintf("%s is not of type 'boolean'", raw))
		}
	}
	minC, hasMin, err := countField(obj, "min_count")
	if err != nil {
		return nil, err
	}
	maxC, hasMax, err := countField(obj, "max_count")
	if err != nil {
		return nil, err
	}
	if !hasMin {
		minC = 1
	}
	if !hasMax {
		maxC = minC
	}
	if minC > maxC {
		return nil, api.BadRequest("min_count must be <= max_count")
	}
	if minC > maxCreateCount {
		return nil, api.BadRequest("min_count may be at most %d: no more servers are created in one request.", maxCreateCount)
	}
	maxC = min(maxC, maxCreateCount)
	req.MinCount, req.MaxCount = minC, maxC
	if req.Hostname != "" && maxC > 1 {
		return nil, api.BadRequest("Cannot specify 'hostname' when 'max_count' is greater than 1.")
	}
	if p, err := strField(obj, "description"); err != nil {
		return nil, err
	} else if _, ok := obj["description"]; ok {
		if p != nil && len(*p) > 255 {
			return nil, api.BadRequest("Invalid input for field/attribute description. Value: %s. '%s' is too long", *p, *p)
		}
		req.Description = p
	}
	if raw, ok := obj["tags"]; ok {
		if err := json.Unmarshal(raw, &req.Tags); err != nil {
			return nil, badField("tags", raw, fmt.Sprintf("%s is not of type 'array'", raw))
		}
		if err := checkTags(req.Tags); err != nil {
			return nil, err
		}
	}
	if raw, ok := obj["networks"]; ok {
		if err := parseNetworks(raw, req, v); err != nil {
			return nil, err
		}
	} else {
		req.NetMode = "auto"
	}
	return req, nil
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

// parseBDM accepts an image-to-local boot device in place of imageRef and
// refuses volumes, which Nimbus does not have yet.
func parseBDM(obj map[string]json.RawMessage, req *createReq) error {
	if raw, ok := obj["block_device_mapping"]; ok {
		return badField("block_device_mapping", raw, "legacy block device mappings are not supported")
	}
	raw, ok := obj["block_device_mapping_v2"]
	if !ok {
		return nil
	}
	var bdms []map[string]any
	if err := json.Unmarshal(raw, &bdms); err != nil {
		return badField("block_device_mapping_v2", raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	for _, b := range bdms {
		src, _ := b["source_type"].(string)
		dst, _ := b["destination_type"].(string)
		if src == "volume" || src == "snapshot" || dst == "volume" {
			return api.BadRequest("Block Device Mapping is Invalid: volumes are not supported by this cloud yet.")
		}
		if src == "image" {
			id, _ := b["uuid"].(string)
			if !uuidRE.MatchString(id) {
				return api.BadRequest("Block Device Mapping is Invalid: image uuid %q is not valid.", id)
			}
			if req.ImageRef == "" {
				req.ImageRef = id
			}
		}
	}
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

// handleCreate is POST /servers.
func (s *Service) handleCreate(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	c := api.CallerFrom(ctx)
	req, err := parseCreate(r, v)
	if err != nil {
		return nil, err
	}
	// Look-ups that need no lock happen before the transaction.
	flavor, err := s.getFlavor(ctx, s.db, req.FlavorRef)
	if err != nil {
		return nil, notFoundAs(err, api.BadRequest("Flavor %s could not be found.", req.FlavorRef))
	}
	if ok, err := s.flavorAccessible(ctx, s.db, flavor, c.ProjectID); err != nil {
		return nil, err
	} else if !ok {
		return nil, api.BadRequest("Flavor %s could not be found.", req.FlavorRef)
	}
	if flavor.Disabled {
		return nil, api.BadRequest("Flavor is disabled.")
	}
	img, err := s.images.Get(ctx, c.ProjectID, c.IsAdmin(), req.ImageRef)
	if err != nil {
		return nil, notFoundAs(err, api.BadRequest("Can not find requested image"))
	}
	if img.Status != "active" {
		return nil, api.BadRequest("Image %s is not active.", img.ID)
	}
	if err := imageFits(img, flavor.RAM, flavor.Disk); err != nil {
		return nil, err
	}
	var kp *Keypair
	if req.KeyName != "" {
		if kp, err = s.getKeypair(ctx, s.db, c.UserID, req.KeyName); err != nil {
			return nil, notFoundAs(err, api.BadRequest("Invalid key_name provided."))
		}
	}
	if req.Host != "" && !c.IsAdmin() {
		return nil, api.PolicyForbidden("compute:servers:create:requested_destination")
	}
	if req.AZ != "" || req.Host != "" {
		hosts, err := s.enabledHosts(ctx)
		if err != nil {
			return nil, err
		}
		zones, err := s.hostZones(ctx)
		if err != nil {
			return nil, err
		}
		zoneOK, hostOK := req.AZ == "", req.Host == ""
		for _, h := range hosts {
			zoneOK = zoneOK || zoneIn(h, zones) == req.AZ
			hostOK = hostOK || (h.Name == req.Host && (req.AZ == "" || zoneIn(h, zones) == req.AZ))
		}
		if !zoneOK {
			return nil, api.BadRequest("The requested availability zone is not available")
		}
		if !hostOK {
			return nil, api.BadRequest("Compute host %s could not be found.", req.Host)
		}
	}
	if err := s.networks.CheckSecurityGroups(ctx, c.ProjectID, req.SecurityGroups); err != nil {
		return nil, err
	}
	type resolvedNet struct {
		networkID, portID, fixedIP string
	}
	var nets []resolvedNet
	switch {
	case req.NetMode == "none":
	case req.NetMode == "auto":
		n, err := s.networks.AutoNetwork(ctx, c.ProjectID)
		if err != nil {
			return nil, err
		}
		nets = append(nets, resolvedNet{networkID: n.ID})
	default:
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
	}
	sgs := req.SecurityGroups
	if len(sgs) == 0 {
		sgs = []string{"default"}
	}
	if req.AdminPass == "" {
		req.AdminPass = randomString(12, passChars)
	}
	rid := "r-" + randomString(8, "0123456789abcdefghijklmnopqrstuvwxyz")
	snap := snapOf(flavor)
	publicIP := flavor.ExtraSpecs["nimbus:public_ipv4"] == "true"
	var pinned *string
	if req.AZ != "" {
		pinned = &req.AZ
	}
	if err := s.checkSpend(ctx, c.ProjectID); err != nil {
		return nil, err
	}
	if req.Hints.Group != "" {
		if err := s.checkGroupForCreate(ctx, c.ProjectID, req.Hints.Group, req.MinCount); err != nil {
			return nil, err
		}
	}
	// Placement happens here, in the create: the scheduler reserves hosts
	// for up to max_count servers on its snapshot, and the transaction keeps
	// as many as the quota allows and writes their claims, which the store
	// re-checks. Fewer than min_count placed fails them all, as Nova's
	// NoValidHost does, with nothing held and nothing charged.
	base, rule, err := s.constraints(ctx, placeRequest{zone: req.AZ, host: req.Host, group: req.Hints.Group,
		sameHost: req.Hints.SameHost, differentHost: req.Hints.DifferentHost})
	if err != nil {
		return nil, err
	}
	schedReq := flavorRequest(snap)
	schedReq.Zone, schedReq.OnlyHosts, schedReq.AvoidHosts = base.Zone, base.OnlyHosts, base.AvoidHosts
	// The scheduler reserves no more than the quota allows, read here and
	// checked again in the transaction.
	if req.MaxCount, err = s.quotaRoom(ctx, c.ProjectID, flavor, req.MinCount, req.MaxCount); err != nil {
		return nil, err
	}
	var created []*server
	for attempt := 0; ; attempt++ {
		st, err := s.schedState(ctx)
		if err != nil {
			return nil, err
		}
		claims := reserveBatch(st, schedReq, rule, req.MaxCount)
		if len(claims) < req.MinCount && attempt == 0 {
			// The snapshot may hold what another controller freed.
			releaseAll(st, claims)
			if st, err = s.reloadSched(ctx); err != nil {
				return nil, err
			}
			claims = reserveBatch(st, schedReq, rule, req.MaxCount)
		}
		zones, err := s.zonesOf(ctx, claims)
		if err != nil {
			releaseAll(st, claims)
			return nil, err
		}
		used := 0
		err = s.db.Tx(ctx, func(tx *store.Tx) error {
			created, used = created[:0], 0
			if err := lockProjectQuota(ctx, tx, c.ProjectID); err != nil {
				return err
			}
			quota, err := s.quotaFor(ctx, tx, c.ProjectID)
			if err != nil {
				return err
			}
			if err := checkMetadataCount(quota.MetadataItems, len(req.Metadata)); err != nil {
				return err
			}
			insts, cores, ram, err := s.projectUsage(ctx, tx, c.ProjectID)
			if err != nil {
				return err
			}
			count, err := fitQuota(quota, insts, cores, ram, flavor, req.MinCount, req.MaxCount)
			if err != nil {
				return err
			}
			noHost := min(count, len(claims)) < req.MinCount
			if !noHost {
				count = min(count, len(claims))
				used = count
			}
			now := s.now()
			var build []string
			for i := 0; i < count; i++ {
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
					VMState: vmBuilding, TaskState: taskSpawning, FlavorID: flavor.ID, ImageRef: req.ImageRef,
					ReservationID: rid, LaunchIndex: i, AZ: req.AZ, KeyName: req.KeyName, Hostname: hostname,
					Tags: append([]string{}, req.Tags...), VCPUs: snap.VCPUs, MemoryMB: snap.RAM, DiskGB: snap.diskGB(),
					CreatedAt: now, UpdatedAt: now,
					Doc: serverDoc{Flavor: snap, Metadata: req.Metadata, Description: req.Description,
						AccessIPv4: req.AccessIPv4, AccessIPv6: canonicalIP(req.AccessIPv6), ConfigDrive: req.ConfigDrive,
						DiskConfig: req.DiskConfig, UserData: req.UserData, SecurityGroups: sgs, AdminPass: req.AdminPass,
						PinnedAZ: pinned, RequestedHost: req.Host, OSType: osTypeOf(img), RequestID: api.RequestID(ctx),
						InstanceName: "instance-" + strings.ReplaceAll(id, "-", "")[:8], TaskID: newUUID(),
						Group: req.Hints.Group, SameHost: req.Hints.SameHost, DifferentHost: req.Hints.DifferentHost},
				}
				if kp != nil {
					sv.Doc.PublicKey = kp.PublicKey
				}
				if sv.Doc.OSType == "windows" {
					sv.Doc.Password = encryptPassword(sv.Doc.PublicKey, req.AdminPass)
				}
				if noHost {
					sv.VMState, sv.TaskState = vmError, ""
					sv.Doc.Fault = &faultDoc{Code: 500, Message: errNoValidHost.Error(), Details: errNoValidHost.Error(), Created: now}
				} else {
					sv.Host, sv.AZ = claims[i].Host, zones[claims[i].Host]
				}
				if err := s.insertServer(ctx, tx, sv); err != nil {
					return err
				}
				if req.Hints.Group != "" {
					if err := s.addGroupMember(ctx, tx, req.Hints.Group, id); err != nil {
						return err
					}
				}
				if err := s.recordAction(ctx, tx, id, "create"); err != nil {
					return err
				}
				if noHost {
					if err := s.finishAction(ctx, tx, id, sv.Doc.RequestID, "conductor_schedule_and_build_instances", "", now, errNoValidHost); err != nil {
						return err
					}
					created = append(created, sv)
					continue
				}
				if err := writeClaim(ctx, tx, id, claims[i], now); err != nil {
					return err
				}
				for j, n := range nets {
					portID := n.portID
					if portID != "" {
						if err := s.networks.BindPort(ctx, tx, c.ProjectID, portID, id); err != nil {
							return err
						}
					} else {
						p, err := s.networks.CreateServerPort(ctx, tx, c.ProjectID, n.networkID, id, n.fixedIP, sgs)
						if err != nil {
							return err
						}
						portID = p.ID
					}
					if j == 0 && publicIP {
						if _, err := s.networks.AttachPublicIP(ctx, tx, c.ProjectID, id, portID); err != nil {
							return err
						}
					}
				}
				created = append(created, sv)
				build = append(build, id)
			}
			s.enqueueAfter(tx, build...)
			return nil
		})
		if err == nil {
			releaseAll(st, claims[used:])
			s.keepAll(st, claims[:used])
			break
		}
		releaseAll(st, claims)
		if !errors.Is(err, errClaimConflict) || attempt >= placeAttempts {
			return nil, err
		}
		if _, err := s.reloadSched(ctx); err != nil {
			return nil, err
		}
	}
	if req.ReturnReservation {
		return api.JSON(http.StatusAccepted, map[string]any{"reservation_id": rid}), nil
	}
	first := created[0]
	lk := links(r, "servers/"+first.ID)
	sgView := make([]any, 0, len(sgs))
	for _, g := range sgs {
		sgView = append(sgView, map[string]string{"name": g})
	}
	body := map[string]any{"id": first.ID, "links": lk, "OS-DCF:diskConfig": req.DiskConfig,
		"security_groups": sgView, "adminPass": req.AdminPass}
	return api.JSON(http.StatusAccepted, map[string]any{"server": body}).WithHeader("Location", lk[0]["href"]), nil
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

// maxCreateCount bounds one create request: a client's max_count is cut to
// it before any work, so that no request holds a transaction or the
// scheduler for a number the client chose.
const maxCreateCount = 200

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
