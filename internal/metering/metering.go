// Package metering records what each billable resource was made of, and
// when: one usage period per stretch of time a resource stayed the same
// and billable. The services that own resources (compute for servers,
// network for public addresses, volume for volumes, image for stored image
// data and backups) write periods in the same transaction as the
// resource's own row; billing charges from them, and compute's usage
// report counts the same hours from them, so the two always agree.
//
// A resource has at most one open period (ended_at ”). Set closes it and
// opens a new one when the resource's Spec changes (a resize), closes it
// when the resource stops being billable (shelve, delete), and opens one
// when it becomes billable again (unshelve).
//
// What each resource pays — the one rule, which billing prices (its Quote)
// and the owners follow when they open periods:
//   - a server, from placement to shelve or delete (stopped or not): its
//     flavor's vCPUs, RAM, disk (not a boot volume of its own), GPUs,
//     public IPv4 and the Windows licence of the image it boots;
//   - what the flavor gave the server is paid with the server while the
//     server is billed, and on its own only while it is not (shelved):
//     its public address as a public IPv4, a network-disk flavor's root
//     volume as a volume (and what it grew past the flavor's disk,
//     always);
//   - a floating IP of the customer's own, from allocation to release;
//   - volumes, volume snapshots, backups and stored images, per GB, from
//     creation to deletion.
//
// Each started hour is charged in full, at the largest price a resource
// had in it (billing's charging pass).
package metering

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/flavorspec"
	"nimbus/internal/store"
)

// Kinds of metered resources.
const (
	KindServer   = "server"
	KindPublicIP = "public_ipv4"
	KindVolume   = "volume"
	KindBackup   = "backup"
	KindSnapshot = "volume_snapshot" // a Cinder volume snapshot
	KindImage    = "image"           // stored image data other than backups
)

// Spec is what a resource is made of, as far as its price goes.
type Spec struct {
	Flavor     string `json:"flavor,omitempty"` // for people reading the ledger
	VCPUs      int64  `json:"vcpus,omitempty"`
	RAMMB      int64  `json:"ram_mb,omitempty"`
	DiskGB     int64  `json:"disk_gb,omitempty"`
	DiskType   string `json:"disk_type,omitempty"`
	GPUModel   string `json:"gpu_model,omitempty"`
	GPUCount   int64  `json:"gpu_count,omitempty"`
	PublicIPv4 bool   `json:"public_ipv4,omitempty"`
	OSType     string `json:"os_type,omitempty"`
	// SizeGB is the size of a volume, snapshot, backup or image. A
	// server's periods never carry it; billing's gate is asked about a
	// server create with the volumes it makes for the server there.
	SizeGB int64 `json:"size_gb,omitempty"`
	// Name is the resource's name (an address's address), for the ledger:
	// kept in a column of its own, so a rename opens no period and specs
	// of one flavor still share their text.
	Name string `json:"-"`
}

// ServerSpec is what a server of a flavor amounts to: its vCPUs, RAM and
// disk, and from the flavor's extra specs the disk type (nimbus:disk_type,
// default local), a public IPv4 (nimbus:public_ipv4) and the GPUs as
// flavorspec reads them for the scheduler too (a flavor whose GPUs cannot
// be read is never placed, so has none here); osType "windows" adds the
// licence.
func ServerSpec(flavor string, vcpus, ramMB, diskGB int64, extraSpecs map[string]string, osType string) Spec {
	s := Spec{Flavor: flavor, VCPUs: vcpus, RAMMB: ramMB, DiskGB: diskGB, DiskType: extraSpecs["nimbus:disk_type"]}
	if s.DiskType == "" {
		s.DiskType = "local"
	}
	s.PublicIPv4 = extraSpecs["nimbus:public_ipv4"] == "true"
	if g, err := flavorspec.GPUsOf(extraSpecs); err == nil && g.Count > 0 {
		s.GPUModel, s.GPUCount = g.Model, int64(g.Count)
	}
	if strings.EqualFold(osType, "windows") {
		s.OSType = "windows"
	}
	return s
}

// Period is one stretch of a resource's billable life.
type Period struct {
	ID, ResourceID, Kind, ProjectID string
	Spec                            Spec
	SpecText                        string // Spec as stored
	Start                           time.Time
	End                             time.Time // zero while open
	Changed                         time.Time // the later of Start and End
}

// Open reports whether the period has not ended.
func (p *Period) Open() bool { return p.End.IsZero() }

// Set records, as of at, that resource is described by spec, or is not
// billable when spec is nil. It changes nothing when the open period
// already has spec, kind and project; a resource that changes kind or
// project (an image given to another project) starts a new period. Call it
// inside the transaction that changes the resource.
func Set(ctx context.Context, q store.Querier, kind, resource, project string, spec *Spec, at time.Time) error {
	var id, raw, oldKind, oldProject, oldName string
	err := q.QueryRow(ctx, "SELECT id, spec, kind, project_id, name FROM metering_periods WHERE resource_id = ? AND ended_at = ''",
		resource).Scan(&id, &raw, &oldKind, &oldProject, &oldName)
	switch {
	case store.IsNoRows(err):
		id = ""
	case err != nil:
		return err
	}
	if id != "" && spec != nil && raw == store.JSON(spec) && oldKind == kind && oldProject == project {
		if spec.Name != oldName {
			_, err = q.Exec(ctx, "UPDATE metering_periods SET name = ? WHERE id = ?", spec.Name, id)
		}
		return err
	}
	now := store.FormatTime(at)
	if id != "" {
		if _, err := q.Exec(ctx, "UPDATE metering_periods SET ended_at = ?, changed_at = ? WHERE id = ?", now, now, id); err != nil {
			return err
		}
		if err := countOpen(ctx, q, oldProject, oldKind, raw, -1); err != nil {
			return err
		}
	}
	return Open(ctx, q, kind, resource, project, spec, at)
}

// Open is Set for a resource that has no open period (one being created):
// it only inserts the new period, if any.
func Open(ctx context.Context, q store.Querier, kind, resource, project string, spec *Spec, at time.Time) error {
	if spec == nil {
		return nil
	}
	now, text := store.FormatTime(at), store.JSON(spec)
	if _, err := q.Exec(ctx, `INSERT INTO metering_periods (id, resource_id, kind, project_id, spec, started_at, ended_at, changed_at, name)
 VALUES (?, ?, ?, ?, ?, ?, '', ?, ?)`, uuid.Must(uuid.NewV7()).String(), resource, kind, project, text, now, now, spec.Name); err != nil {
		return err
	}
	return countOpen(ctx, q, project, kind, text, 1)
}

// countOpen adds n to project's count of open periods of kind and spec
// (as stored), which Touching reads: every statement that opens or ends
// a period calls it in the same transaction.
func countOpen(ctx context.Context, q store.Querier, project, kind, spec string, n int64) error {
	_, err := q.Exec(ctx, `INSERT INTO metering_open_counts (project_id, kind, spec, open_count) VALUES (?, ?, ?, ?)
 ON CONFLICT (project_id, kind, spec) DO UPDATE SET open_count = metering_open_counts.open_count + excluded.open_count`,
		project, kind, spec, n)
	return err
}

// Drop removes resource's periods that began at or after since, as if the
// resource had never been billable then: a server whose build failed
// before it ever ran is never billed.
func Drop(ctx context.Context, q store.Querier, resource string, since time.Time) error {
	var project, kind, spec string
	err := q.QueryRow(ctx, "SELECT project_id, kind, spec FROM metering_periods WHERE resource_id = ? AND started_at >= ? AND ended_at = ''",
		resource, store.FormatTime(since)).Scan(&project, &kind, &spec)
	switch {
	case store.IsNoRows(err):
	case err != nil:
		return err
	default:
		if err := countOpen(ctx, q, project, kind, spec, -1); err != nil {
			return err
		}
	}
	_, err = q.Exec(ctx, "DELETE FROM metering_periods WHERE resource_id = ? AND started_at >= ?", resource, store.FormatTime(since))
	return err
}

// Opening is a period to open: resource, of kind and project, is spec from
// At.
type Opening struct {
	Kind, Resource, Project string
	Spec                    Spec
	At                      time.Time
}

// OpenMany opens a period for each opening, 500 per statement, without
// looking for open ones: it seeds a database whose resources have none
// (benchmarks and tests of 100,000 servers).
func OpenMany(ctx context.Context, q store.Querier, openings []Opening) error {
	const per = 500
	type key struct{ project, kind, spec string }
	counts := map[key]int64{}
	for _, o := range openings {
		counts[key{o.Project, o.Kind, store.JSON(o.Spec)}]++
	}
	for k, n := range counts {
		if err := countOpen(ctx, q, k.project, k.kind, k.spec, n); err != nil {
			return err
		}
	}
	for len(openings) > 0 {
		part := openings[:min(per, len(openings))]
		openings = openings[len(part):]
		var b strings.Builder
		b.WriteString("INSERT INTO metering_periods (id, resource_id, kind, project_id, spec, started_at, ended_at, changed_at, name) VALUES ")
		args := make([]any, 0, 8*len(part))
		for i, o := range part {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?, ?, '', ?, ?)")
			at := store.FormatTime(o.At)
			args = append(args, uuid.Must(uuid.NewV7()).String(), o.Resource, o.Kind, o.Project, store.JSON(o.Spec), at, at, o.Spec.Name)
		}
		if _, err := q.Exec(ctx, b.String(), args...); err != nil {
			return err
		}
	}
	return nil
}

// Scan reads a period from a row of Columns.
func Scan(sc interface{ Scan(...any) error }, p *Period) error { return ScanCached(sc, p, nil) }

// ScanCached is Scan that decodes each distinct spec text once, keeping
// the results in cache (nil: none): a charging pass reads 100,000 periods
// of a handful of flavors.
func ScanCached(sc interface{ Scan(...any) error }, p *Period, cache map[string]Spec) error {
	var start, end, changed, name string
	if err := sc.Scan(&p.ID, &p.ResourceID, &p.Kind, &p.ProjectID, &p.SpecText, &start, &end, &changed, &name); err != nil {
		return err
	}
	if sp, ok := cache[p.SpecText]; ok {
		p.Spec = sp
	} else {
		p.Spec = Spec{}
		if err := store.FromJSON(p.SpecText, &p.Spec); err != nil {
			return err
		}
		if cache != nil {
			cache[p.SpecText] = p.Spec
		}
	}
	p.Spec.Name = name
	p.Start, p.End, p.Changed = store.ParseTime(start), store.ParseTime(end), store.ParseTime(changed)
	return nil
}

// Columns are the columns Scan reads, in order.
const Columns = "id, resource_id, kind, project_id, spec, started_at, ended_at, changed_at, name"

// Hours is the range of started hours a period covers, as hour starts:
// from the hour it started in to the hour its last instant is in (a period
// ending on the hour does not reach into the next one). An open period
// runs to until. A period that started and ended at the same instant still
// pays its hour: the resource existed.
func (p *Period) Hours(until time.Time) (first, last time.Time) {
	first = p.Start.Truncate(time.Hour)
	switch {
	case p.Open():
		last = until.Truncate(time.Hour)
	case p.End.After(p.Start):
		last = p.End.Add(-time.Nanosecond).Truncate(time.Hour)
	default:
		last = first
	}
	return first, last
}

// Hour is one resource's hour and the period that pays for it.
type Hour struct {
	Start  time.Time
	Period *Period
}

// Assign lists, for each resource, the hours in [from, to] (hour starts)
// that its periods cover, each hour paid by the earliest period that
// covers it: a resize or unshelve within an hour changes the price from
// the next hour. ps must be sorted by resource and start (SortPeriods);
// open periods run to `to`. f is called once per resource and hour, in
// order; stop early by returning false.
func Assign(ps []Period, from, to time.Time, f func(h Hour) bool) {
	last := map[string]time.Time{} // the latest hour assigned per resource
	for i := range ps {
		p := &ps[i]
		first, end := p.Hours(to)
		if first.Before(from) {
			first = from
		}
		if end.After(to) {
			end = to
		}
		if l, ok := last[p.ResourceID]; ok && !first.After(l) {
			first = l.Add(time.Hour)
		}
		for h := first; !h.After(end); h = h.Add(time.Hour) {
			if !f(Hour{Start: h, Period: p}) {
				return
			}
			last[p.ResourceID] = h
		}
	}
}

// SortPeriods orders periods by resource, then start.
func SortPeriods(ps []Period) {
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].ResourceID != ps[j].ResourceID {
			return ps[i].ResourceID < ps[j].ResourceID
		}
		if !ps[i].Start.Equal(ps[j].Start) {
			return ps[i].Start.Before(ps[j].Start)
		}
		return ps[i].ID < ps[j].ID
	})
}

// Overlapping reads every period of kind ("" for all) that covers an hour
// in [from, to] (hour starts), of project when project is not "", sorted
// for Assign.
func Overlapping(ctx context.Context, q store.Querier, kind, project string, from, to time.Time) ([]Period, error) {
	query := "SELECT " + Columns + " FROM metering_periods WHERE " + overlaps
	args := overlapArgs(from, to)
	if kind != "" {
		query += " AND kind = ?"
		args = append(args, kind)
	}
	if project != "" {
		query += " AND project_id = ?"
		args = append(args, project)
	}
	out, err := readPeriods(ctx, q, nil, query, args...)
	if err != nil {
		return nil, err
	}
	SortPeriods(out)
	return out, nil
}

// overlaps is the condition on a period that covers an hour in [from, to]
// (hour starts), with overlapArgs' arguments: it starts before the hour
// after to and ends after from, or is a zero-length period in the window.
const overlaps = "started_at < ? AND (ended_at = '' OR ended_at > ? OR (ended_at = started_at AND started_at >= ?))"

func overlapArgs(from, to time.Time) []any {
	return []any{store.FormatTime(to.Add(time.Hour)), store.FormatTime(from), store.FormatTime(from)}
}

// Page reads up to limit periods that cover an hour in [from, to], the
// next after (afterResource, afterID) in that order, decoding specs
// through cache: billing's charge pass reads every period in batches.
func Page(ctx context.Context, q store.Querier, afterResource, afterID string, from, to time.Time, limit int,
	cache map[string]Spec) ([]Period, error) {
	args := append([]any{afterResource, afterID}, overlapArgs(from, to)...)
	return readPeriods(ctx, q, cache, "SELECT "+Columns+" FROM metering_periods WHERE (resource_id, id) > (?, ?) AND "+overlaps+
		" ORDER BY resource_id, id LIMIT ?", append(args, limit)...)
}

// Group is how many of a project's periods have one kind and spec.
type Group struct {
	Kind  string
	Spec  Spec
	Count int64
}

// Touching counts project's periods that touch the hour starting at hour
// (open, or ended after it began) by kind and spec: it reads no history,
// the open ones from their counts (0078: a row per kind and spec, so a
// project of thousands of servers costs what one of a few does), the
// ended ones by their end (0058's index), and the project's resources
// share a handful of specs, each decoded once. A spec may come twice,
// once open and once ended.
func Touching(ctx context.Context, q store.Querier, project string, hour time.Time) ([]Group, error) {
	var out []Group
	for _, part := range []struct {
		query string
		args  []any
	}{
		{"SELECT kind, spec, open_count FROM metering_open_counts WHERE project_id = ? AND open_count > 0", []any{project}},
		{"SELECT kind, spec, COUNT(*) FROM metering_periods WHERE project_id = ? AND ended_at > ? GROUP BY kind, spec",
			[]any{project, store.FormatTime(hour)}},
	} {
		rows, err := q.Query(ctx, part.query, part.args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var g Group
			var raw string
			if err := rows.Scan(&g.Kind, &raw, &g.Count); err != nil {
				rows.Close()
				return nil, err
			}
			if err := store.FromJSON(raw, &g.Spec); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, g)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Current reads resource's open period; store.IsNoRows(err) when it has
// none.
func Current(ctx context.Context, q store.Querier, resource string) (Period, error) {
	var p Period
	err := Scan(q.QueryRow(ctx, "SELECT "+Columns+" FROM metering_periods WHERE resource_id = ? AND ended_at = ''", resource), &p)
	return p, err
}

// Unmetered is an SQL condition, for the owner's query of its resources,
// true when the resource whose id is in column idColumn has no period at
// all (openOnly false) or no open one (openOnly true): the owners find
// their resources stored before metering without reading its table.
func Unmetered(idColumn string, openOnly bool) string {
	cond := "NOT EXISTS (SELECT 1 FROM metering_periods m WHERE m.resource_id = " + idColumn
	if openOnly {
		cond += " AND m.ended_at = ''"
	}
	return cond + ")"
}

// readPeriods reads the periods a query of Columns returns.
func readPeriods(ctx context.Context, q store.Querier, cache map[string]Spec, sql string, args ...any) ([]Period, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Period
	for rows.Next() {
		var p Period
		if err := ScanCached(rows, &p, cache); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
