package compute

import (
	"encoding/json"
	"net"
	"regexp"
	"strings"

	"github.com/google/uuid"

	"nimbus/internal/api"
)

// schedulerHints are the hints of a create request that placement honours.
//
// Nova keeps a server uuid that names no server in same_host or
// different_host as it is: same_host then matches no host (SameHostFilter:
// NoValidHost) and different_host excludes none (DifferentHostFilter).
type schedulerHints struct {
	Group         string   // server group uuid
	SameHost      []string // server uuids
	DifferentHost []string // server uuids
}

// hintsField is how Nova's messages name the hints object.
const hintsField = "os:scheduler_hints"

// cidrHintRE is the "cidr" hint's pattern (schemas/servers.py _hints).
var cidrHintRE = regexp.MustCompile(`^/[0-9a-f.:]+$`)

// parseSchedulerHints validates the raw "os:scheduler_hints" (or
// "OS-SCH-HNT:scheduler_hints") value as Nova's schema does
// (nova/api/openstack/compute/schemas/servers.py _hints: same_host and
// different_host a uuid string or a list of uuid strings; group a uuid;
// query a string or an object; target_cell a name; different_cell a string
// or a list of strings; build_near_host_ip an IP address; cidr "/<digits>";
// other keys accepted and ignored) and returns 400 errors in Nova's words
// (nova/api/validation/validators.py: "Invalid input for field/attribute
// <last path element>. Value: <value>. <reason>"). An absent value (nil or
// empty raw) is no hints.
func parseSchedulerHints(raw json.RawMessage) (schedulerHints, error) {
	var h schedulerHints
	if len(raw) == 0 {
		return h, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return h, api.SchemaError(hintsField, raw, "%s is not of type 'object'", pyQuote(raw))
	}
	if v, ok := m["group"]; ok {
		s, isStr := jsonString(v)
		if !isStr {
			return h, api.SchemaError("group", v, "%s is not of type 'string'", pyQuote(v))
		}
		if !uuidRE.MatchString(s) {
			return h, api.SchemaError("group", v, "'%s' is not a 'uuid'", s)
		}
		h.Group = canonicalUUID(s)
	}
	var err error
	if v, ok := m["same_host"]; ok {
		if h.SameHost, err = hintServers("same_host", v); err != nil {
			return h, err
		}
	}
	if v, ok := m["different_host"]; ok {
		if h.DifferentHost, err = hintServers("different_host", v); err != nil {
			return h, err
		}
	}
	if v, ok := m["query"]; ok {
		var q any
		_ = json.Unmarshal(v, &q)
		switch q.(type) {
		case string, map[string]any:
		default:
			return h, api.SchemaError("query", v, "%s is not of type 'string', 'object'", pyQuote(v))
		}
	}
	if v, ok := m["target_cell"]; ok {
		s, isStr := jsonString(v)
		if !isStr {
			return h, api.SchemaError("target_cell", v, "%s is not of type 'string'", pyQuote(v))
		}
		if !validName(s) {
			return h, api.SchemaError("target_cell", v, "'%s' does not match '^(?! )[\\x00-\\x7F...]*(?<! )$'", s)
		}
	}
	if v, ok := m["different_cell"]; ok {
		if _, isStr := jsonString(v); !isStr {
			var l []json.RawMessage
			if json.Unmarshal(v, &l) != nil || l == nil {
				return h, api.SchemaError("different_cell", v, "%s is not of type 'string', 'array'", pyQuote(v))
			}
			for _, item := range l {
				if _, isStr := jsonString(item); !isStr {
					return h, api.SchemaError("different_cell", item, "%s is not of type 'string'", pyQuote(item))
				}
			}
		}
	}
	if v, ok := m["build_near_host_ip"]; ok {
		s, isStr := jsonString(v)
		if !isStr {
			return h, api.SchemaError("build_near_host_ip", v, "%s is not of type 'string'", pyQuote(v))
		}
		if net.ParseIP(s) == nil {
			return h, api.SchemaError("build_near_host_ip", v, "'%s' is not valid under any of the given schemas", s)
		}
	}
	if v, ok := m["cidr"]; ok {
		s, isStr := jsonString(v)
		if !isStr {
			return h, api.SchemaError("cidr", v, "%s is not of type 'string'", pyQuote(v))
		}
		if !cidrHintRE.MatchString(s) {
			return h, api.SchemaError("cidr", v, "'%s' does not match '^/[0-9a-f.:]+$'", s)
		}
	}
	return h, nil
}

// maxHintServers bounds same_host and different_host: Nova sets no count,
// and each id is a lookup when the server is placed.
const maxHintServers = 50

// hintServers reads same_host or different_host: one server uuid or a list
// of them. Nova's messages name a bad list item by its index.
func hintServers(field string, raw json.RawMessage) ([]string, error) {
	if s, ok := jsonString(raw); ok {
		if !uuidRE.MatchString(s) {
			return nil, api.SchemaError(field, raw, "'%s' is not a 'uuid'", s)
		}
		return []string{canonicalUUID(s)}, nil
	}
	var l []json.RawMessage
	if err := json.Unmarshal(raw, &l); err != nil || l == nil {
		return nil, api.SchemaError(field, raw, "%s is not of type 'string', 'array'", pyQuote(raw))
	}
	if len(l) > maxHintServers {
		return nil, listTooLong(field, len(l), maxHintServers)
	}
	out := make([]string, 0, len(l))
	for i, item := range l {
		s, ok := jsonString(item)
		if !ok {
			return nil, api.BadRequest("Invalid input for field/attribute %d. Value: %s. %s is not of type 'string'", i, api.PyRepr(item), pyQuote(item))
		}
		if !uuidRE.MatchString(s) {
			return nil, api.BadRequest("Invalid input for field/attribute %d. Value: %s. '%s' is not a 'uuid'", i, s, s)
		}
		out = append(out, canonicalUUID(s))
	}
	return out, nil
}

// canonicalUUID writes a uuid Nova accepts (uuidutils.is_uuid_like: any
// case, dashes optional) the way ids are stored: lower case with dashes.
func canonicalUUID(s string) string {
	if u, err := uuid.Parse(s); err == nil {
		return u.String()
	}
	return s
}

// jsonString reads a JSON string; ok is false for anything else, null
// included (rawString takes null for "").
func jsonString(raw json.RawMessage) (string, bool) {
	if strings.TrimSpace(string(raw)) == "null" {
		return "", false
	}
	return rawString(raw)
}
