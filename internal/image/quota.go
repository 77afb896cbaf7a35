package image

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"

	"nimbus/internal/api"
	"nimbus/internal/quota"
	"nimbus/internal/store"
)

// Per-project image quotas under Glance's unified-limits names
// (glance/quota/keystone.py); image_size_total and image_stage_total are in
// MiB, as Glance counts them. -1 is unlimited.
const (
	quotaSizeTotal      = "image_size_total"
	quotaStageTotal     = "image_stage_total"
	quotaCountTotal     = "image_count_total"
	quotaCountUploading = "image_count_uploading"
)

// quotaDefaults suit a hosting provider's customer: 100 images holding up to
// 1000 GiB, 10 uploads at once. Nimbus has no staging area (no interoperable
// import), so image_stage_total is shown but never used.
var quotaDefaults = map[string]int64{
	quotaSizeTotal: 1000 << 10, quotaStageTotal: 1000 << 10, quotaCountTotal: 100, quotaCountUploading: 10,
}

// maxQuota bounds a limit an admin sets: 2^40 MiB (1 EiB) keeps the limit
// in bytes inside int64.
const maxQuota = 1 << 40

// shelvedProperty marks the image that keeps a shelved server's disk. Such
// images count and are charged like any other, but are never refused: shelve
// is how a server stops costing (and how billing suspends an account that
// ran dry), and a shelve without its image would lose the server's disk.
// The key is reserved, so no client can set it.
const shelvedProperty = "nimbus_shelved"

// quotaOf is a project's limits: the defaults under what an admin set.
func quotaOf(ctx context.Context, q store.Querier, project string) (map[string]int64, error) {
	return quota.Limits(ctx, q, "image_quotas", project, quotaDefaults)
}

// imageUsage is what a project's images take.
type imageUsage struct {
	count, uploading int64
	bytes            int64 // stored data, of every image but `except`
}

// usageOf counts project's images, their stored bytes leaving out image
// except (the one being stored), and those being uploaded.
func usageOf(ctx context.Context, q store.Querier, project, except string) (imageUsage, error) {
	var u imageUsage
	err := q.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(CASE WHEN id <> ? THEN size ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN status = ? THEN 1 ELSE 0 END), 0) FROM images WHERE owner = ?`,
		except, StatusSaving, project).Scan(&u.count, &u.bytes, &u.uploading)
	return u, err
}

// lockQuota serialises project's quota checks (quota.Lock).
func lockQuota(ctx context.Context, tx *store.Tx, project string) error {
	return quota.Lock(ctx, tx, "image_quota_locks", project)
}

// overLimit is Glance's LimitExceeded (glance/common/exception.py) with
// oslo.limit's ProjectOverLimit as the body.
func overLimit(project, resource string, limit, usage, delta int64) error {
	return api.OverLimit("The request returned a 413 Request Entity Too Large. This generally means that rate limiting "+
		"or a quota threshold was breached.\n\nThe response body:\nProject %s is over a limit for "+
		"[Resource %s is over limit of %d due to current usage %d and delta %d]", project, resource, limit, usage, delta)
}

// exempt reports whether img is outside quota enforcement: it has no owner
// to count against, or it keeps a shelved server's disk.
func exempt(img *Image) bool { return img.Owner == "" || img.Properties[shelvedProperty] == "true" }

// lockedUsage takes project's quota lock in tx, then reads its limits and
// usage (stored bytes leaving out image except).
func lockedUsage(ctx context.Context, tx *store.Tx, project, except string) (map[string]int64, imageUsage, error) {
	if err := lockQuota(ctx, tx, project); err != nil {
		return nil, imageUsage{}, err
	}
	lim, err := quotaOf(ctx, tx, project)
	if err != nil {
		return nil, imageUsage{}, err
	}
	u, err := usageOf(ctx, tx, project, except)
	return lim, u, err
}

// checkCount refuses, in tx, one more image for img's owner beyond
// image_count_total.
func checkCount(ctx context.Context, tx *store.Tx, img *Image) error {
	if exempt(img) {
		return nil
	}
	lim, u, err := lockedUsage(ctx, tx, img.Owner, "")
	if err != nil {
		return err
	}
	if l := lim[quotaCountTotal]; l >= 0 && u.count+1 > l {
		return overLimit(img.Owner, quotaCountTotal, l, u.count, 1)
	}
	return nil
}

// checkUpload refuses, in tx, an upload to img (still queued) when its
// owner has image_count_uploading uploads running or no room left under
// image_size_total.
func checkUpload(ctx context.Context, tx *store.Tx, img *Image) error {
	if exempt(img) {
		return nil
	}
	lim, u, err := lockedUsage(ctx, tx, img.Owner, img.ID)
	if err != nil {
		return err
	}
	if l := lim[quotaCountUploading]; l >= 0 && u.uploading+1 > l {
		return overLimit(img.Owner, quotaCountUploading, l, u.uploading, 1)
	}
	if l := lim[quotaSizeTotal]; l >= 0 && u.bytes >= l<<20 {
		return overLimit(img.Owner, quotaSizeTotal, l, u.bytes>>20, 0)
	}
	return nil
}

// room is what image_size_total leaves for one image's data: the owner's
// limit in MiB (-1 unlimited) and the bytes its other images hold.
type room struct{ limit, used int64 }

// roomFor reads img's room; an exempt image has no limit.
func roomFor(ctx context.Context, q store.Querier, img *Image) (room, error) {
	if exempt(img) {
		return room{limit: -1}, nil
	}
	lim, err := quotaOf(ctx, q, img.Owner)
	if err != nil {
		return room{}, err
	}
	u, err := usageOf(ctx, q, img.Owner, img.ID)
	return room{limit: lim[quotaSizeTotal], used: u.bytes}, err
}

// left is how many bytes fit, -1 for any number.
func (r room) left() int64 {
	if r.limit < 0 {
		return -1
	}
	return max(r.limit<<20-r.used, 0)
}

// check answers the 413 for size bytes that do not fit, nil when they do.
func (r room) check(owner string, size int64) error {
	if l := r.left(); l < 0 || size <= l {
		return nil
	}
	return overLimit(owner, quotaSizeTotal, r.limit, r.used>>20, (size+1<<20-1)>>20)
}

// checkSize refuses, in tx, size bytes of data for img beyond its owner's
// image_size_total: the last word once concurrent uploads have finished.
func checkSize(ctx context.Context, tx *store.Tx, img *Image, size int64) error {
	if exempt(img) {
		return nil
	}
	if err := lockQuota(ctx, tx, img.Owner); err != nil {
		return err
	}
	rm, err := roomFor(ctx, tx, img)
	if err != nil {
		return err
	}
	return rm.check(img.Owner, size)
}

// errQuota is what capReader answers once the data outgrows its allowance.
var errQuota = fmt.Errorf("image data exceeds the storage quota")

// capReader passes at most left bytes through and fails with errQuota as
// soon as the data goes beyond them.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	// One byte more than allowed is enough to know the data is too big.
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, errQuota
	}
	return n, err
}

// usageView is Glance's usage document for a project: each quota's limit
// and what is used (glance/api/v2/info.py get_usage).
func usageView(ctx context.Context, q store.Querier, project string) (map[string]any, error) {
	lim, err := quotaOf(ctx, q, project)
	if err != nil {
		return nil, err
	}
	u, err := usageOf(ctx, q, project, "")
	if err != nil {
		return nil, err
	}
	used := map[string]int64{quotaSizeTotal: u.bytes >> 20, quotaStageTotal: 0, quotaCountTotal: u.count,
		quotaCountUploading: u.uploading}
	out := make(map[string]any, len(lim))
	for k, l := range lim {
		out[k] = map[string]int64{"limit": l, "usage": used[k]}
	}
	return out, nil
}

// usage is GET /v2/info/usage: the caller's project's quotas and usage.
func (s *Service) usage(r *http.Request) (*api.Response, error) {
	v, err := usageView(r.Context(), s.db, api.CallerFrom(r.Context()).ProjectID)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"usage": v}), nil
}

// showQuota is GET /v2/quotas/{project} (a Nimbus extension; Glance keeps
// its limits in Keystone): the project's quotas and usage, for an admin or
// the project itself.
func (s *Service) showQuota(r *http.Request) (*api.Response, error) {
	c, p := api.CallerFrom(r.Context()), r.PathValue("project")
	if !c.IsAdmin() && p != c.ProjectID {
		return nil, api.PolicyForbidden("get_quota")
	}
	v, err := usageView(r.Context(), s.db, p)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"usage": v}), nil
}

// updateQuota is PUT /v2/quotas/{project} (admin): {"quota_set": {name:
// limit}} sets each named limit, an integer from -1 (unlimited) to 2^40;
// null puts it back to its default. It may go below what is used: nothing
// is removed, further images and uploads are refused.
func (s *Service) updateQuota(r *http.Request) (*api.Response, error) {
	p := r.PathValue("project")
	set, err := parseQuotaSet(r)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	var out map[string]any
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		keys := make([]string, 0, len(set))
		for k := range set {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := quota.Set(ctx, tx, "image_quotas", p, k, set[k]); err != nil {
				return err
			}
		}
		var err error
		out, err = usageView(ctx, tx, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"usage": out}), nil
}

// parseQuotaSet reads {"quota_set": {name: limit or null}} with known
// names and limits in range.
func parseQuotaSet(r *http.Request) (map[string]*int64, error) {
	raw, err := readJSON(r)
	if err != nil {
		return nil, err
	}
	body, _ := raw.(map[string]any)
	qs, ok := body["quota_set"].(map[string]any)
	if !ok || len(body) != 1 {
		return nil, api.BadRequest("The body must be {\"quota_set\": {name: limit}}.")
	}
	set := make(map[string]*int64, len(qs))
	for k, v := range qs {
		if _, known := quotaDefaults[k]; !known {
			return nil, api.BadRequest("Bad key in quota set: %s. Known: %s, %s, %s, %s.", k,
				quotaCountTotal, quotaCountUploading, quotaSizeTotal, quotaStageTotal)
		}
		if v == nil {
			set[k] = nil
			continue
		}
		num, _ := v.(json.Number)
		n, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil || n < -1 || n > maxQuota {
			return nil, api.BadRequest("Quota %s must be an integer from -1 (unlimited) to %d, got %s.", k, int64(maxQuota), jsonText(v))
		}
		set[k] = &n
	}
	return set, nil
}
