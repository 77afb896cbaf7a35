package compute

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/image"
	"nimbus/internal/store"
)

// The image proxy is Nova's window onto Glance (nova/api/openstack/compute/
// images.py, views/images.py). It was deprecated in 2.36: from then on it
// answers 404, so only clients at older microversions (Tempest's default
// 2.1 among them) use it.
func (s *Service) imageProxyRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.1/images", Handler: s.proxyList(false)},
		{Pattern: "GET /v2.1/images/detail", Handler: s.proxyList(true)},
		{Pattern: "GET /v2.1/images/{id}", Handler: s.proxyShow},
		{Pattern: "DELETE /v2.1/images/{id}", Handler: s.proxyDelete},
		{Pattern: "GET /v2.1/images/{id}/metadata", Handler: s.proxyMetadata},
	}
}

// proxyDeprecated is the 404 the proxy gives from 2.36 on.
func proxyDeprecated(r *http.Request) error {
	if VersionFrom(r.Context()).AtLeast(36) {
		return api.NotFound("The resource could not be found.")
	}
	return nil
}

// imageStatus maps Glance's status to Nova's (views/images.py _get_status).
var imageStatus = map[string]string{
	"active": "ACTIVE", "queued": "SAVING", "saving": "SAVING", "importing": "SAVING", "uploading": "SAVING",
	"deleted": "DELETED", "pending_delete": "DELETED", "killed": "ERROR", "deactivated": "ERROR",
}

// imageProgress is views/images.py _get_progress.
var imageProgress = map[string]int{"active": 100, "saving": 50, "queued": 25}

func imageLinks(r *http.Request, id string) []map[string]string {
	l := links(r, "images/"+id)
	return append(l, map[string]string{"rel": "alternate", "type": "application/vnd.openstack.image",
		"href": api.BaseURL(r) + "/images/" + id})
}

func imageView(r *http.Request, img *image.Image, detail bool) obj {
	m := obj{{"id", img.ID}, {"name", img.Name}}
	if detail {
		st := imageStatus[img.Status]
		if st == "" {
			st = "UNKNOWN"
		}
		meta := map[string]string{}
		for k, v := range img.Properties {
			meta[k] = v
		}
		m = append(m, kv{"minRam", img.MinRAM}, kv{"minDisk", img.MinDisk}, kv{"metadata", meta},
			kv{"status", st}, kv{"progress", imageProgress[img.Status]},
			kv{"created", isoTime(img.CreatedAt)}, kv{"updated", isoTime(img.UpdatedAt)},
			kv{"OS-EXT-IMG-SIZE:size", img.Size})
		if sid := img.Properties["instance_uuid"]; sid != "" {
			m.set("server", obj{{"id", sid}, {"links", links(r, "servers/"+sid)}})
		}
	}
	m.set("links", imageLinks(r, img.ID))
	return m
}

func (s *Service) proxyList(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		if err := proxyDeprecated(r); err != nil {
			return nil, err
		}
		q := r.URL.Query()
		limit, err := parseLimit(q.Get("limit"))
		if err != nil {
			return nil, err
		}
		imgs, err := s.images.List(r.Context(), api.CallerFrom(r.Context()))
		if err != nil {
			return nil, err
		}
		var since time.Time
		if cs := q.Get("changes-since"); cs != "" {
			if since, err = parseISOTime(cs); err != nil {
				return nil, api.BadRequest("Invalid filter field: changes-since.")
			}
		}
		// server may be an id or a server's URL (images.py _get_filters).
		server := q.Get("server")
		if i := strings.LastIndexByte(server, '/'); i >= 0 {
			server = server[i+1:]
		}
		start := 0
		if m := q.Get("marker"); m != "" {
			start = -1
			for i, img := range imgs {
				if img.ID == m {
					start = i + 1
				}
			}
			if start < 0 {
				return nil, api.BadRequest("marker [%s] not found", m)
			}
		}
		out := []any{}
		for _, img := range imgs[start:] {
			if len(out) == limit {
				break
			}
			if n := q.Get("name"); n != "" && img.Name != n {
				continue
			}
			if st := q.Get("status"); st != "" && imageStatus[img.Status] != st {
				continue
			}
			if t := q.Get("type"); t != "" && img.Properties["image_type"] != t {
				continue
			}
			if server != "" && img.Properties["instance_uuid"] != server {
				continue
			}
			if !since.IsZero() && img.UpdatedAt.Before(since) {
				continue
			}
			out = append(out, imageView(r, img, detail))
		}
		body := map[string]any{"images": out}
		if limit > 0 && len(out) == limit {
			last := out[len(out)-1].(obj)[0].v.(string)
			nq := q
			nq.Set("limit", strconv.Itoa(limit))
			nq.Set("marker", last)
			path := "images"
			if detail {
				path = "images/detail"
			}
			body["images_links"] = []map[string]string{{"rel": "next", "href": links(r, path)[0]["href"] + "?" + nq.Encode()}}
		}
		return api.JSON(http.StatusOK, body), nil
	}
}

func (s *Service) proxyImage(r *http.Request) (*image.Image, error) {
	if err := proxyDeprecated(r); err != nil {
		return nil, err
	}
	c := api.CallerFrom(r.Context())
	img, err := s.images.Get(r.Context(), c.ProjectID, c.IsAdmin(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Image not found.")
	}
	return img, err
}

func (s *Service) proxyShow(r *http.Request) (*api.Response, error) {
	img, err := s.proxyImage(r)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"image": imageView(r, img, true)}), nil
}

func (s *Service) proxyMetadata(r *http.Request) (*api.Response, error) {
	img, err := s.proxyImage(r)
	if err != nil {
		return nil, err
	}
	meta := map[string]string{}
	for k, v := range img.Properties {
		meta[k] = v
	}
	return api.JSON(http.StatusOK, map[string]any{"metadata": meta}), nil
}

// proxyDelete deletes an image its project owns (Glance's delete_image
// policy: owner or admin); a protected image is 403, as Glance says.
func (s *Service) proxyDelete(r *http.Request) (*api.Response, error) {
	img, err := s.proxyImage(r)
	if err != nil {
		return nil, err
	}
	c := api.CallerFrom(r.Context())
	if !c.IsAdmin() && img.Owner != c.ProjectID {
		return nil, api.Forbidden("You are not permitted to delete this image.")
	}
	if img.Protected {
		return nil, api.Forbidden("Image %s is protected and cannot be deleted.", img.ID)
	}
	if err := s.images.Delete(r.Context(), img.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}
