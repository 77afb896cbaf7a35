package image

import (
	"net/http"

	"nimbus/internal/api"
)

// The JSON schemas glanceclient and Tempest fetch from /v2/schemas/*,
// built like glance/api/v2/images.py get_schema and image_members.py
// get_schema, with the properties this service serves.

func nullableString(desc string, maxLen int) map[string]any {
	m := map[string]any{"type": []any{"null", "string"}, "description": desc}
	if maxLen > 0 {
		m["maxLength"] = maxLen
	}
	return m
}

func readOnly(m map[string]any) map[string]any { m["readOnly"] = true; return m }

func enumWithNull(values []string) []any {
	out := []any{nil}
	for _, v := range values {
		out = append(out, v)
	}
	return out
}

func imageSchema() map[string]any {
	uuid := `^([0-9a-fA-F]){8}-([0-9a-fA-F]){4}-([0-9a-fA-F]){4}-([0-9a-fA-F]){4}-([0-9a-fA-F]){12}$`
	props := map[string]any{
		"id":               map[string]any{"type": "string", "description": "An identifier for the image", "pattern": uuid},
		"name":             nullableString("Descriptive name for the image", 255),
		"status":           readOnly(map[string]any{"type": "string", "description": "Status of the image", "enum": []string{"queued", "saving", "active", "killed", "deleted", "uploading", "importing", "pending_delete", "deactivated"}}),
		"visibility":       map[string]any{"type": "string", "description": "Scope of image accessibility", "enum": visibilities},
		"protected":        map[string]any{"type": "boolean", "description": "If true, image will not be deletable."},
		"os_hidden":        map[string]any{"type": "boolean", "description": "If true, image will not appear in default image list response."},
		"checksum":         readOnly(nullableString("md5 hash of image contents.", 32)),
		"os_hash_algo":     readOnly(nullableString("Algorithm to calculate the os_hash_value", 64)),
		"os_hash_value":    readOnly(nullableString("Hexdigest of the image contents using the algorithm specified by the os_hash_algo", 128)),
		"owner":            nullableString("Owner of the image", 255),
		"size":             readOnly(map[string]any{"type": []any{"null", "integer"}, "description": "Size of image file in bytes"}),
		"virtual_size":     readOnly(map[string]any{"type": []any{"null", "integer"}, "description": "Virtual size of image in bytes"}),
		"container_format": map[string]any{"type": []any{"null", "string"}, "description": "Format of the container", "enum": enumWithNull(containerFormats)},
		"disk_format":      map[string]any{"type": []any{"null", "string"}, "description": "Format of the disk", "enum": enumWithNull(diskFormats)},
		"created_at":       readOnly(map[string]any{"type": "string", "description": "Date and time of image registration"}),
		"updated_at":       readOnly(map[string]any{"type": "string", "description": "Date and time of the last image modification"}),
		"tags":             map[string]any{"type": "array", "description": "List of strings related to the image", "items": map[string]any{"type": "string", "maxLength": 255}},
		"min_ram":          map[string]any{"type": "integer", "description": "Amount of ram (in MB) required to boot image."},
		"min_disk":         map[string]any{"type": "integer", "description": "Amount of disk space (in GB) required to boot image."},
		"self":             readOnly(map[string]any{"type": "string", "description": "An image self url"}),
		"file":             readOnly(map[string]any{"type": "string", "description": "An image file url"}),
		"schema":           readOnly(map[string]any{"type": "string", "description": "An image schema url"}),
		"direct_url":       readOnly(map[string]any{"type": "string", "description": "URL to access the image file kept in external store"}),
		"locations": map[string]any{"type": "array", "description": "A set of URLs to access the image file kept in external store",
			"items": map[string]any{"type": "object", "required": []string{"url", "metadata"}, "properties": map[string]any{
				"url": map[string]any{"type": "string", "maxLength": 255}, "metadata": map[string]any{"type": "object"}}}},
		// Nimbus's own properties, documented so that clients show them.
		"os_type":            map[string]any{"type": "string", "description": "The operating system installed on the image.", "enum": []string{"linux", "windows"}, "is_base": false},
		"os_distro":          map[string]any{"type": "string", "description": "The common name of the operating system distribution in lowercase.", "is_base": false},
		"os_version":         map[string]any{"type": "string", "description": "The operating system version as specified by the distributor.", "is_base": false},
		"login_protocol":     map[string]any{"type": "string", "description": "How to log in to a server booted from the image.", "enum": []string{"ssh", "rdp"}, "is_base": false},
		"login_user":         map[string]any{"type": "string", "description": "The user to log in as.", "is_base": false},
		"nimbus_marketplace": map[string]any{"type": "string", "description": "\"true\" for marketplace images.", "is_base": false},
		"nimbus_base_image":  map[string]any{"type": "string", "description": "The base image a marketplace image is built on.", "is_base": false},
		"nimbus_placeholder": map[string]any{"type": "string", "description": "\"true\" when the image data is a placeholder that must be replaced by a real import.", "is_base": false},
	}
	return map[string]any{
		"name":                 "image",
		"properties":           props,
		"additionalProperties": map[string]any{"type": "string"},
		"links": []map[string]string{
			{"rel": "self", "href": "{self}"},
			{"rel": "enclosure", "href": "{file}"},
			{"rel": "describedby", "href": "{schema}"},
		},
	}
}

func collection(name string, item map[string]any, paged bool) map[string]any {
	props := map[string]any{
		name:     map[string]any{"type": "array", "items": item},
		"schema": map[string]any{"type": "string"},
	}
	links := []map[string]string{}
	if paged {
		props["first"] = map[string]any{"type": "string"}
		props["next"] = map[string]any{"type": "string"}
		links = append(links, map[string]string{"rel": "first", "href": "{first}"},
			map[string]string{"rel": "next", "href": "{next}"})
	}
	links = append(links, map[string]string{"rel": "describedby", "href": "{schema}"})
	return map[string]any{"name": name, "properties": props, "links": links}
}

func imagesSchema() map[string]any { return collection("images", imageSchema(), true) }

func memberSchema() map[string]any {
	return map[string]any{
		"name": "member",
		"properties": map[string]any{
			"member_id":  map[string]any{"type": "string", "description": "An identifier for the image member (tenantId)"},
			"image_id":   map[string]any{"type": "string", "description": "An identifier for the image", "pattern": uuidPattern.String()},
			"created_at": map[string]any{"type": "string", "description": "Date and time of image member creation"},
			"updated_at": map[string]any{"type": "string", "description": "Date and time of last modification of image member"},
			"status":     map[string]any{"type": "string", "description": "The status of this image member", "enum": memberStatuses},
			"schema":     map[string]any{"readOnly": true, "type": "string"},
		},
	}
}

func membersSchema() map[string]any { return collection("members", memberSchema(), false) }

func schemaHandler(f func() map[string]any) api.HandlerFunc {
	body := f()
	return func(r *http.Request) (*api.Response, error) { return api.JSON(http.StatusOK, body), nil }
}
