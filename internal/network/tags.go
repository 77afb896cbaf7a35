package network

import (
	"net/http"
	"slices"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// tagTables maps a collection of the tag API (neutron/extensions/tagging.py)
// to its table and its not-found error.
var tagTables = map[string]struct {
	table    string
	resource string
	notFound func(string) *api.Error
}{
	"networks":        {"networks", "network", errNetworkNotFound},
	"subnets":         {"subnets", "subnet", errSubnetNotFound},
	"ports":           {"ports", "port", errPortNotFound},
	"security-groups": {"security_groups", "security_group", errSGNotFound},
	"floatingips":     {"floatingips", "floatingip", errFIPNotFound},
	"routers":         {"routers", "router", errRouterNotFound},
}

// MaxTagLength is neutron's tag length limit (neutron/extensions/tagging.py MAX_TAG_LEN).
const MaxTagLength = 255

// MaxTags bounds the tags of one resource. Neutron sets no count, so this
// is Nova's per-server tag limit ("the per-server limit 50").
const MaxTags = 50

func errTooManyTags(n int) *api.Error {
	return nerr(400, "HTTPBadRequest", "Invalid input for tags. Reason: Number of tags %d exceeds the limit %d.", n, MaxTags)
}

func validTag(t string) error {
	if t == "" || len(t) > MaxTagLength || strings.Contains(t, ",") {
		return nerr(400, "HTTPBadRequest", "Invalid input for tags. Reason: '%s' is not a valid tag.", t)
	}
	return nil
}

// decodeTags reads a replace's {"tags": [...]}: valid tags, each once,
// at most MaxTags.
func decodeTags(r *http.Request) ([]string, error) {
	var in struct {
		Tags *[]string `json:"tags"`
	}
	if err := api.DecodeJSON(r, &in); err != nil {
		return nil, nerr(400, "HTTPBadRequest", "%s", api.AsError(err).Message)
	}
	if in.Tags == nil {
		return nil, nerr(400, "HTTPBadRequest", "Invalid input for tags. Reason: 'tags' is required.")
	}
	var tags []string
	seen := make(map[string]bool, len(*in.Tags))
	for _, t := range *in.Tags {
		if err := validTag(t); err != nil {
			return nil, err
		}
		if !seen[t] {
			seen[t] = true
			tags = append(tags, t)
		}
	}
	if len(tags) > MaxTags {
		return nil, errTooManyTags(len(tags))
	}
	return tags, nil
}

// tagHandler serves one operation of the tag API on a collection.
func (s *Service) tagHandler(coll, op string) api.HandlerFunc {
	tt := tagTables[coll]
	return func(r *http.Request) (*api.Response, error) {
		c := caller(r)
		id, tag := pathID(r, "id"), r.PathValue("tag")
		var newTags []string
		if op == "replace" {
			var err error
			if newTags, err = decodeTags(r); err != nil {
				return nil, err
			}
		}
		if op == "add" {
			if err := validTag(tag); err != nil {
				return nil, err
			}
		}
		var tags []string
		err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
			var project, raw string
			shared := 0
			q := "SELECT project_id, tags, 0 FROM " + tt.table + " WHERE id = ?"
			if tt.table == "networks" {
				q = "SELECT project_id, tags, CASE WHEN shared = 1 OR external = 1 THEN 1 ELSE 0 END FROM networks WHERE id = ?"
			}
			err := tx.QueryRow(r.Context(), q, id).Scan(&project, &raw, &shared)
			if store.IsNoRows(err) {
				return tt.notFound(id)
			}
			if err != nil {
				return err
			}
			owner := c.IsAdmin() || project == c.ProjectID
			readOnly := op == "list" || op == "check"
			if !owner && !(readOnly && shared == 1) {
				if shared == 1 {
					return policyDenied("update_" + tt.resource + ":tags")
				}
				return tt.notFound(id)
			}
			tags = tagsOf(raw)
			switch op {
			case "list":
				return nil
			case "check":
				if !slices.Contains(tags, tag) {
					return nerr(404, "TagNotFound", "Tag %s could not be found for %s %s.", tag, tt.resource, id)
				}
				return nil
			case "remove":
				if !slices.Contains(tags, tag) {
					return nerr(404, "TagNotFound", "Tag %s could not be found for %s %s.", tag, tt.resource, id)
				}
				tags = slices.DeleteFunc(tags, func(x string) bool { return x == tag })
			case "add":
				if slices.Contains(tags, tag) {
					return nil
				}
				if len(tags) >= MaxTags {
					return errTooManyTags(len(tags) + 1)
				}
				tags = append(tags, tag)
			case "replace":
				tags = newTags
			case "clear":
				tags = []string{}
			}
			if tags == nil {
				tags = []string{}
			}
			_, err = tx.Exec(r.Context(), "UPDATE "+tt.table+" SET tags = ?, updated_at = ?, revision_number = revision_number + 1 WHERE id = ?",
				store.JSON(tags), now(), id)
			return err
		})
		if err != nil {
			return nil, err
		}
		switch op {
		case "list", "replace":
			return api.JSON(200, map[string]any{"tags": tags}), nil
		case "add":
			return api.Empty(201), nil
		}
		return api.Empty(204), nil
	}
}
