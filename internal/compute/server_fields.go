package compute

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"nimbus/internal/api"
)

// The fields of a server create (POST /servers) and rebuild (the rebuild
// action) body, as nova/api/openstack/compute/schemas/servers.py has them:
// one row per field says which microversions each operation accepts it in,
// whether it is required or may be null, and how it is checked and stored.
// Both operations run their body through the same rows, so the same bad
// field gets the same answer from both.

// serverOp is the operation a server body is for.
type serverOp int

const (
	opCreate serverOp = iota
	opRebuild
)

// accepts is when an operation takes a field: at microversions 2.since ≤ v
// < 2.until (until 0: no end), required from 2.need (0: never), and whether
// null is allowed, meaning "none".
type accepts struct {
	since, until, need int
	null               bool
}

func (a *accepts) takes(v Version) bool {
	return a != nil && v.AtLeast(a.since) && (a.until == 0 || !v.AtLeast(a.until))
}

func (a *accepts) required(v Version) bool {
	return a.takes(v) && a.need > 0 && v.AtLeast(a.need)
}

// The common accepts: mvAll at every microversion, mvNeed required at
// every one, mvFrom(n) from 2.n on, mvBefore(n) before 2.n.
var (
	mvAll  = &accepts{}
	mvNeed = &accepts{need: 1}
)

func mvFrom(minor int) *accepts   { return &accepts{since: minor} }
func mvBefore(minor int) *accepts { return &accepts{until: minor} }

// serverField is one field of a server body. check sees the field's value
// when it is not null, validates it and stores it in b.
type serverField struct {
	name            string
	create, rebuild *accepts
	check           func(b *serverBody, field string, raw json.RawMessage) error
}

func (f *serverField) in(op serverOp) *accepts {
	if op == opRebuild {
		return f.rebuild
	}
	return f.create
}

// serverFields is in the order the fields are checked: the first bad one
// is the answer.
var serverFields = []serverField{
	{"name", mvNeed, mvAll, textField(nameValid, func(b *serverBody, s string) { b.Name = s })},
	{"flavorRef", mvNeed, nil, checkFlavorRef},
	{"imageRef", mvAll, mvNeed, checkImageRef},
	{"block_device_mapping", mvAll, nil, checkLegacyBDM},
	{"block_device_mapping_v2", mvAll, nil, checkBDMv2},
	{"adminPass", mvAll, mvAll, textField(nil, func(b *serverBody, s string) { b.AdminPass = s })},
	{"key_name", mvAll, &accepts{since: 54, null: true}, textField(lengthValid(1, 255), func(b *serverBody, s string) { b.KeyName = s })},
	{"availability_zone", mvAll, nil, textField(lengthValid(1, 255), func(b *serverBody, s string) { b.AZ = s })},
	{"accessIPv4", mvAll, mvAll, textField(ipValid(isIPv4, "ipv4"), func(b *serverBody, s string) { b.AccessIPv4 = s })},
	{"accessIPv6", mvAll, mvAll, textField(ipValid(isIPv6, "ipv6"), func(b *serverBody, s string) { b.AccessIPv6 = s })},
	{"OS-DCF:diskConfig", mvAll, mvAll, textField(enumValid("AUTO", "MANUAL"), func(b *serverBody, s string) { b.DiskConfig = s })},
	{"hostname", mvFrom(90), mvFrom(90), textField(hostnameValid, func(b *serverBody, s string) { b.Hostname = s })},
	{"host", mvFrom(74), nil, textField(hostValid, func(b *serverBody, s string) { b.Host = s })},
	{"hypervisor_hostname", mvFrom(74), nil, textField(hostValid, func(b *serverBody, s string) { b.Host = s })},
	{"metadata", mvAll, mvAll, checkMetadataField},
	{"user_data", mvAll, &accepts{since: 57, null: true}, textField(userDataValid, func(b *serverBody, s string) { b.UserData = &s })},
	{"security_groups", mvAll, nil, checkSecurityGroups},
	{"config_drive", mvAll, nil, boolField(func(b *serverBody, v bool) { b.ConfigDrive = v })},
	{"return_reservation_id", mvAll, nil, checkReturnReservation},
	{"min_count", mvAll, nil, countInto(func(b *serverBody) *int { return &b.MinCount })},
	{"max_count", mvAll, nil, countInto(func(b *serverBody) *int { return &b.MaxCount })},
	{"description", &accepts{since: 19, null: true}, &accepts{since: 19, null: true},
		textField(maxLengthValid(255), func(b *serverBody, s string) { b.Description = &s })},
	{"tags", mvFrom(52), nil, checkTagsField},
	{"networks", &accepts{need: 37}, nil, func(b *serverBody, _ string, raw json.RawMessage) error {
		return parseNetworks(raw, &b.createReq, b.v)
	}},
	{"preserve_ephemeral", nil, mvAll, boolField(func(*serverBody, bool) {})},
	// Accepted and ignored: Nimbus injects no files and checks no certificates.
	{"personality", mvBefore(57), mvBefore(57), ignored},
	{"trusted_image_certificates", mvFrom(63), mvFrom(63), ignored},
}

// serverBody is a create or rebuild body after the table: createReq's
// fields, and which fields the body carried.
type serverBody struct {
	createReq
	op   serverOp
	v    Version
	sent map[string]json.RawMessage
}

// has says whether the body carried field (null included).
func (b *serverBody) has(field string) bool {
	_, ok := b.sent[field]
	return ok
}

// parseServerBody runs raw, the object named what ("server" or "rebuild"),
// through serverFields for op at microversion v.
func parseServerBody(op serverOp, v Version, what string, raw json.RawMessage) (*serverBody, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, badField(what, raw, fmt.Sprintf("%s is not of type 'object'", raw))
	}
	var allowed []string
	for i := range serverFields {
		if serverFields[i].in(op).takes(v) {
			allowed = append(allowed, serverFields[i].name)
		}
	}
	if err := api.UnknownFields(obj, allowed...); err != nil {
		return nil, err
	}
	for i := range serverFields {
		f := &serverFields[i]
		if _, ok := obj[f.name]; !ok && f.in(op).required(v) {
			return nil, badField(what, raw, fmt.Sprintf("'%s' is a required property", f.name))
		}
	}
	b := &serverBody{op: op, v: v, sent: obj}
	for i := range serverFields {
		f := &serverFields[i]
		val, ok := obj[f.name]
		if !ok || (f.in(op).null && string(val) == "null") {
			continue
		}
		if err := f.check(b, f.name, val); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// textField is a string field's check: valid (nil: any string) judges
// the value and set stores it. null is not a string.
func textField(valid func(b *serverBody, field, s string, raw json.RawMessage) error, set func(b *serverBody, s string)) func(*serverBody, string, json.RawMessage) error {
	return func(b *serverBody, field string, raw json.RawMessage) error {
		var s string
		if string(raw) == "null" {
			return badField(field, json.RawMessage("None"), "None is not of type 'string'")
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return badField(field, raw, fmt.Sprintf("%s is not of type 'string'", raw))
		}
		if valid != nil {
			if err := valid(b, field, s, raw); err != nil {
				return err
			}
		}
		set(b, s)
		return nil
	}
}

func nameValid(_ *serverBody, field, s string, _ json.RawMessage) error { return checkName(field, s) }

func hostnameValid(b *serverBody, _, s string, _ json.RawMessage) error {
	return checkHostname(s, b.v)
}

// lengthValid is a name-like field's 1–255 characters.
func lengthValid(lo, hi int) func(*serverBody, string, string, json.RawMessage) error {
	return func(_ *serverBody, field, s string, raw json.RawMessage) error {
		if len(s) < lo || len(s) > hi {
			return badField(field, raw, "is not valid")
		}
		return nil
	}
}

func maxLengthValid(hi int) func(*serverBody, string, string, json.RawMessage) error {
	return func(_ *serverBody, field, s string, _ json.RawMessage) error {
		if len(s) > hi {
			return api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is too long", field, s, s)
		}
		return nil
	}
}

// ipValid is an access address: empty, or an address of the family.
func ipValid(is func(string) bool, format string) func(*serverBody, string, string, json.RawMessage) error {
	return func(_ *serverBody, field, s string, _ json.RawMessage) error {
		if s != "" && !is(s) {
			return api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is not a '%s'", field, s, s, format)
		}
		return nil
	}
}

func enumValid(values ...string) func(*serverBody, string, string, json.RawMessage) error {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = "'" + v + "'"
	}
	return func(_ *serverBody, field, s string, _ json.RawMessage) error {
		if !slices.Contains(values, s) {
			return api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is not one of [%s]",
				field, s, s, strings.Join(quoted, ", "))
		}
		return nil
	}
}

// userDataValid is Nova's user_data: base64 of at most 65535 characters.
// The answer quotes only the start of a value that long.
func userDataValid(_ *serverBody, field, s string, _ json.RawMessage) error {
	if len(s) > 65535 {
		return api.BadRequest("Invalid input for field/attribute %s. Value: %.20s... is too long", field, s)
	}
	if _, err := base64.StdEncoding.DecodeString(s); err != nil {
		return api.BadRequest("User data needs to be valid base 64.")
	}
	return nil
}

// hostValid is 2.74's host or hypervisor_hostname: both name one host.
func hostValid(b *serverBody, field, s string, raw json.RawMessage) error {
	if err := lengthValid(1, 255)(b, field, s, raw); err != nil {
		return err
	}
	if b.Host != "" && b.Host != s {
		return api.BadRequest("host and hypervisor_hostname must name the same host")
	}
	return nil
}

// checkImageRef takes an image's id or href. Create may leave it empty
// to boot from block_device_mapping_v2; rebuild names an image.
func checkImageRef(b *serverBody, field string, raw json.RawMessage) error {
	var href string
	if err := textField(nil, func(_ *serverBody, s string) { href = s })(b, field, raw); err != nil {
		return err
	}
	id := href[strings.LastIndexByte(href, '/')+1:]
	if (id != "" || b.op == opRebuild) && !uuidRE.MatchString(id) {
		return api.BadRequest("Invalid input for field/attribute imageRef. Value: %s. '%s' is not a 'uuid'", href, href)
	}
	b.ImageRef = id
	return nil
}

// checkFlavorRef takes a flavor's id (a string or an integer) or href.
func checkFlavorRef(b *serverBody, field string, raw json.RawMessage) error {
	var fr any
	_ = json.Unmarshal(raw, &fr)
	switch f := fr.(type) {
	case string:
		b.FlavorRef = f
	case float64:
		b.FlavorRef = strconv.FormatFloat(f, 'f', -1, 64)
	default:
		return badField(field, raw, fmt.Sprintf("%s is not of type 'string', 'integer'", raw))
	}
	if b.FlavorRef == "" {
		return badField(field, raw, "'' is too short")
	}
	b.FlavorRef = b.FlavorRef[strings.LastIndexByte(b.FlavorRef, '/')+1:]
	return nil
}

func checkMetadataField(b *serverBody, field string, _ json.RawMessage) error {
	var err error
	b.Metadata, err = metadataField(b.sent, field)
	return err
}

func checkTagsField(b *serverBody, field string, raw json.RawMessage) error {
	if err := json.Unmarshal(raw, &b.Tags); err != nil {
		return badField(field, raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	return checkTags(b.Tags)
}

func checkReturnReservation(b *serverBody, field string, raw json.RawMessage) error {
	if err := json.Unmarshal(raw, &b.ReturnReservation); err != nil {
		return badField(field, raw, fmt.Sprintf("%s is not of type 'boolean'", raw))
	}
	return nil
}

// checkSecurityGroups takes [{"name": ...}], each name once.
func checkSecurityGroups(b *serverBody, field string, raw json.RawMessage) error {
	var sgs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &sgs); err != nil {
		return badField(field, raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	if len(sgs) > maxServerSecurityGroups {
		return listTooLong(field, len(sgs), maxServerSecurityGroups)
	}
	for _, g := range sgs {
		if err := api.UnknownFields(g, "name"); err != nil {
			return err
		}
		n, err := strField(g, "name")
		if err != nil {
			return err
		}
		if n == nil || *n == "" {
			return badField("name", raw, "'' is too short")
		}
		if !slices.Contains(b.SecurityGroups, *n) {
			b.SecurityGroups = append(b.SecurityGroups, *n)
		}
	}
	return nil
}

// boolField is a boolean that may be spelt as a string ("yes", "0", …), as
// oslo's bool_from_string reads it; null is false.
func boolField(set func(b *serverBody, v bool)) func(*serverBody, string, json.RawMessage) error {
	return func(b *serverBody, field string, raw json.RawMessage) error {
		var v any
		_ = json.Unmarshal(raw, &v)
		switch t := v.(type) {
		case bool:
			set(b, t)
		case string:
			switch strings.ToLower(t) {
			case "true", "1", "yes", "on", "t", "y":
				set(b, true)
			case "false", "0", "no", "off", "f", "n", "":
			default:
				return badField(field, raw, "is not a boolean")
			}
		case nil:
		default:
			return badField(field, raw, "is not a boolean")
		}
		return nil
	}
}

// countInto reads min_count or max_count into the int dst gives.
func countInto(dst func(b *serverBody) *int) func(*serverBody, string, json.RawMessage) error {
	return func(b *serverBody, field string, _ json.RawMessage) error {
		n, _, err := countField(b.sent, field)
		*dst(b) = n
		return err
	}
}

func ignored(*serverBody, string, json.RawMessage) error { return nil }
