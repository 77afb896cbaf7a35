package compute

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
)

// The panel's configurator: what a customer may choose (Options), the
// flavor an order of a choice uses (ProjectFlavor, project_flavors.go) and
// whether it can be placed now (Capacity). Any configuration the
// configurator can produce is a flavor the ordering project sees through
// the API (PRODUCT.md, Flavors).

// Boot disk bounds, and the catalogue's disk size per vCPU (d1.2g has 20
// GB, d4.8g 80 GB), which a canonical flavor name leaves out.
const (
	MinDiskGB   = 10
	MaxDiskGB   = 2048
	diskPerVCPU = 20
	// MaxQuantity bounds the servers one Capacity question asks about, so
	// that its dry run stays cheap.
	MaxQuantity = 100
)

// Boot disk types (nimbus:disk_type).
const (
	DiskLocal   = "local"
	DiskNetwork = "network"
)

// Shape is one configuration a customer chose.
type Shape struct {
	VCPUs, RAMGB, DiskGB int
	DiskType             string // DiskLocal or DiskNetwork
	GPUModel             string // a driver.GPU.Model the fleet has, "" for none
	GPUCount             int
	PublicIPv4           bool
}

// GPUOption is one GPU model of the fleet.
type GPUOption struct {
	Model      string // as the driver names it: "A100 80GB"
	Alias      string // in flavor names and pci_passthrough:alias: "a100-80gb"
	MaxPerHost int    // the most one host has
	Hosts      int    // hosts that have it
}

// ConfiguratorOptions is what the configurator offers: only what some
// host of the fleet can hold, whether or not it is free now.
type ConfiguratorOptions struct {
	VCPUs    []int // suggested counts; any count up to MaxVCPUs is valid
	MaxVCPUs int
	RAMGB    []int // suggested sizes; any size up to MaxRAMGB is valid
	MaxRAMGB int
	// DiskTypes are the boot disk types; a local disk is at most
	// MaxLocalDiskGB (the largest host's pool), a network one MaxDiskGB.
	DiskTypes            []string
	MinDiskGB, MaxDiskGB int
	MaxLocalDiskGB       int
	GPUs                 []GPUOption // by model name

	hosts []hostSize
}

// hostSize is what one host can hold at most.
type hostSize struct {
	vcpus, ramGB, diskGB int
	gpus                 map[string]int // by model
}

// Options reads the fleet's hosts (all of them: a host down now still
// bounds what can exist) and says what the configurator offers.
func (s *Service) Options(ctx context.Context) (ConfiguratorOptions, error) {
	hosts, _, err := s.hostSets(ctx)
	if err != nil {
		return ConfiguratorOptions{}, err
	}
	if len(hosts) == 0 {
		return optionsOf(nil), nil
	}
	// hostSets hands out the same slice until the fleet changes (or a
	// couple of seconds pass), so the options are worked out once per
	// slice rather than on every configurator change.
	if c := lastOptions.Load(); c != nil && c.first == &hosts[0] && c.n == len(hosts) {
		return c.opts.clone(), nil
	}
	o := optionsOf(hosts)
	lastOptions.Store(&optionsCache{first: &hosts[0], n: len(hosts), opts: o})
	return o.clone(), nil
}

// optionsCache is the options of one slice of hosts.
type optionsCache struct {
	first *driver.Host
	n     int
	opts  ConfiguratorOptions
}

var lastOptions atomic.Pointer[optionsCache]

// clone copies what a caller could change.
func (o ConfiguratorOptions) clone() ConfiguratorOptions {
	o.VCPUs, o.RAMGB = slices.Clone(o.VCPUs), slices.Clone(o.RAMGB)
	o.DiskTypes, o.GPUs = slices.Clone(o.DiskTypes), slices.Clone(o.GPUs)
	return o
}

func optionsOf(hosts []driver.Host) ConfiguratorOptions {
	o := ConfiguratorOptions{DiskTypes: []string{DiskNetwork}, MinDiskGB: MinDiskGB, MaxDiskGB: MaxDiskGB}
	gpus := map[string]*GPUOption{}
	for _, h := range hosts {
		hs := sizeOf(h)
		o.hosts = append(o.hosts, hs)
		o.MaxVCPUs, o.MaxRAMGB = max(o.MaxVCPUs, hs.vcpus), max(o.MaxRAMGB, hs.ramGB)
		o.MaxLocalDiskGB = max(o.MaxLocalDiskGB, min(hs.diskGB, MaxDiskGB))
		for model, n := range hs.gpus {
			g := gpus[model]
			if g == nil {
				g = &GPUOption{Model: model, Alias: gpuAlias(model)}
				gpus[model] = g
			}
			g.MaxPerHost, g.Hosts = max(g.MaxPerHost, n), g.Hosts+1
		}
	}
	if o.MaxLocalDiskGB >= MinDiskGB {
		o.DiskTypes = []string{DiskLocal, DiskNetwork}
	}
	o.VCPUs, o.RAMGB = doublings(o.MaxVCPUs), doublings(o.MaxRAMGB)
	for _, g := range gpus {
		o.GPUs = append(o.GPUs, *g)
	}
	slices.SortFunc(o.GPUs, func(a, b GPUOption) int { return strings.Compare(a.Model, b.Model) })
	return o
}

// sizeOf reads a host's capacity as the scheduler counts it (the vCPUs are
// the CPUs not reserved, the memory that of its NUMA nodes), as
// driver.Host.Normalize would without copying the host's topology.
func sizeOf(h driver.Host) hostSize {
	hs := hostSize{vcpus: h.VCPUs, ramGB: h.MemoryMB / 1024, diskGB: h.DiskGB}
	if len(h.CPUs) > 0 {
		hs.vcpus = len(h.CPUs) - reservedAmong(h)
	}
	if len(h.NUMANodes) > 0 {
		mem := 0
		for _, n := range h.NUMANodes {
			mem += n.MemoryMB
		}
		hs.ramGB = mem / 1024
	}
	for _, g := range h.GPUs {
		if hs.gpus == nil {
			hs.gpus = map[string]int{}
		}
		hs.gpus[g.Model]++
	}
	return hs
}

// reservedAmong counts the host's CPUs that are reserved.
func reservedAmong(h driver.Host) int {
	n := 0
	if len(h.ReservedCPUs) <= 16 {
		for _, c := range h.CPUs {
			if slices.Contains(h.ReservedCPUs, c.ID) {
				n++
			}
		}
		return n
	}
	res := make(map[int]bool, len(h.ReservedCPUs))
	for _, id := range h.ReservedCPUs {
		res[id] = true
	}
	for _, c := range h.CPUs {
		if res[c.ID] {
			n++
		}
	}
	return n
}

// doublings is 1, 2, 4, … up to top, and top itself.
func doublings(top int) []int {
	var out []int
	for n := 1; n <= top; n *= 2 {
		out = append(out, n)
	}
	if top > 0 && out[len(out)-1] != top {
		out = append(out, top)
	}
	return out
}

// gpuAlias names a GPU model as flavor names and pci_passthrough:alias do:
// lower case, runs of anything but letters and digits as one dash
// ("A100 80GB" is "a100-80gb").
func gpuAlias(model string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(model) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
		} else {
			dash = true
		}
	}
	if b.Len() == 0 {
		return "gpu"
	}
	return b.String()
}

// gpu returns the option of a model, or nil.
func (o *ConfiguratorOptions) gpu(model string) *GPUOption {
	for i := range o.GPUs {
		if o.GPUs[i].Model == model {
			return &o.GPUs[i]
		}
	}
	return nil
}

// Validate refuses a shape no host of the fleet could ever hold, with a 400
// that says which choice is out of range (a 409 while there are no hosts).
func (sh Shape) Validate(o ConfiguratorOptions) error {
	if o.MaxVCPUs == 0 {
		return api.Conflict("This cloud has no hypervisor hosts yet.")
	}
	if sh.VCPUs < 1 || sh.VCPUs > o.MaxVCPUs {
		return api.BadRequest("Invalid vCPU count %d: it must be 1 to %d.", sh.VCPUs, o.MaxVCPUs)
	}
	if sh.RAMGB < 1 || sh.RAMGB > o.MaxRAMGB {
		return api.BadRequest("Invalid RAM size %d GB: it must be 1 to %d GB.", sh.RAMGB, o.MaxRAMGB)
	}
	if err := sh.validateDisk(o); err != nil {
		return err
	}
	if err := sh.validateGPU(o); err != nil {
		return err
	}
	for _, h := range o.hosts {
		if sh.fitsHost(h) {
			return nil
		}
	}
	return api.BadRequest("No host of this cloud holds %s together.", sh.amounts())
}

func (sh Shape) validateDisk(o ConfiguratorOptions) error {
	top := o.MaxDiskGB
	switch sh.DiskType {
	case DiskLocal:
		top = o.MaxLocalDiskGB
	case DiskNetwork:
	default:
		return api.BadRequest("Invalid boot disk type %q: it must be %s or %s.", sh.DiskType, DiskLocal, DiskNetwork)
	}
	if top < o.MinDiskGB {
		return api.BadRequest("This cloud has no %s boot disks.", sh.DiskType)
	}
	if sh.DiskGB < o.MinDiskGB || sh.DiskGB > top {
		return api.BadRequest("Invalid %s boot disk size %d GB: it must be %d to %d GB.", sh.DiskType, sh.DiskGB, o.MinDiskGB, top)
	}
	return nil
}

func (sh Shape) validateGPU(o ConfiguratorOptions) error {
	if sh.GPUModel == "" {
		if sh.GPUCount != 0 {
			return api.BadRequest("Invalid GPU count %d: no GPU model was chosen.", sh.GPUCount)
		}
		return nil
	}
	g := o.gpu(sh.GPUModel)
	if g == nil {
		have := make([]string, 0, len(o.GPUs))
		for _, g := range o.GPUs {
			have = append(have, g.Model)
		}
		if len(have) == 0 {
			return api.BadRequest("Invalid GPU model %q: this cloud has no GPUs.", sh.GPUModel)
		}
		return api.BadRequest("Invalid GPU model %q: this cloud has %s.", sh.GPUModel, strings.Join(have, ", "))
	}
	if sh.GPUCount < 1 || sh.GPUCount > g.MaxPerHost {
		return api.BadRequest("Invalid GPU count %d: it must be 1 to %d %s GPUs.", sh.GPUCount, g.MaxPerHost, g.Model)
	}
	return nil
}

// fitsHost reports whether an empty h holds the shape.
func (sh Shape) fitsHost(h hostSize) bool {
	return sh.VCPUs <= h.vcpus && sh.RAMGB <= h.ramGB &&
		(sh.DiskType != DiskLocal || sh.DiskGB <= h.diskGB) && sh.GPUCount <= h.gpus[sh.GPUModel]
}

// amounts lists what the shape takes of a host, for messages.
func (sh Shape) amounts() string {
	parts := []string{fmt.Sprintf("%d vCPUs", sh.VCPUs), fmt.Sprintf("%d GB RAM", sh.RAMGB)}
	if sh.DiskType == DiskLocal {
		parts = append(parts, fmt.Sprintf("%d GB local disk", sh.DiskGB))
	}
	if sh.GPUCount > 0 {
		parts = append(parts, gpuWords(sh.GPUCount, sh.GPUModel))
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

func gpuWords(n int, model string) string {
	if n == 1 {
		return "1 " + model + " GPU"
	}
	return fmt.Sprintf("%d %s GPUs", n, model)
}

// alias is the shape's pci_passthrough:alias name.
func (sh Shape) alias() string { return gpuAlias(sh.GPUModel) }

// Name is the configurator's flavor name of the shape:
// d<vCPU>.<RAM>g.<type>, then .<disk>gb unless the disk is the catalogue's
// for that size, then .<alias>x<count> for GPUs, then .ipv4.
func (sh Shape) Name() string {
	name := fmt.Sprintf("d%d.%dg.%s", sh.VCPUs, sh.RAMGB, sh.DiskType)
	if sh.DiskGB != diskPerVCPU*sh.VCPUs {
		name += fmt.Sprintf(".%dgb", sh.DiskGB)
	}
	if sh.GPUCount > 0 {
		name += fmt.Sprintf(".%sx%d", sh.alias(), sh.GPUCount)
	}
	if sh.PublicIPv4 {
		name += ".ipv4"
	}
	return name
}

// specs are the extra specs of the shape's flavor, as the catalogue's.
func (sh Shape) specs() map[string]string {
	m := map[string]string{
		"hw:cpu_policy":      "dedicated",
		"nimbus:disk_type":   sh.DiskType,
		"nimbus:public_ipv4": fmt.Sprint(sh.PublicIPv4),
	}
	if sh.GPUCount > 0 {
		m["nimbus:gpu_model"] = sh.GPUModel
		m["pci_passthrough:alias"] = fmt.Sprintf("%s:%d", sh.alias(), sh.GPUCount)
	}
	return m
}

// flavor is a flavor of exactly the shape under the shape's Name, as the
// scheduler and the catalogue see it.
func (sh Shape) flavor() *Flavor {
	desc := fmt.Sprintf("%d dedicated vCPU, %d GB RAM, %d GB %s disk", sh.VCPUs, sh.RAMGB, sh.DiskGB, sh.DiskType)
	if sh.GPUCount > 0 {
		desc += ", " + gpuWords(sh.GPUCount, sh.GPUModel)
	}
	if sh.PublicIPv4 {
		desc += ", public IPv4"
	}
	name := sh.Name()
	return &Flavor{ID: name, Name: name, VCPUs: sh.VCPUs, RAM: sh.RAMGB * 1024, Disk: sh.DiskGB,
		RxTxFactor: 1, IsPublic: true, ExtraSpecs: sh.specs(), Description: &desc}
}

// ownFlavor is the shape's flavor private to project. Flavor ids and names
// are unique across projects, so both are the shape's Name and the
// project's id; the id is the name, as the catalogue's are, so the
// project's scripts can name it.
func (sh Shape) ownFlavor(project string) *Flavor {
	f := sh.flavor()
	f.ID = sh.Name() + "." + project
	f.Name, f.IsPublic = f.ID, false
	return f
}

// matches reports whether f is exactly the shape's flavor: usable by
// everyone, the same sizes and the same extra specs, no more (a spec such
// as hw:numa_nodes or quota:* would change the server).
func (sh Shape) matches(f *Flavor) bool { return f.IsPublic && sh.sized(f) }

// matchesOwn is matches for a project's own flavor, which is private.
func (sh Shape) matchesOwn(f *Flavor) bool { return !f.IsPublic && sh.sized(f) }

func (sh Shape) sized(f *Flavor) bool {
	return !f.Disabled && f.VCPUs == sh.VCPUs && f.RAM == sh.RAMGB*1024 && f.Disk == sh.DiskGB &&
		f.Ephemeral == 0 && f.Swap == 0 && mapsEqual(f.ExtraSpecs, sh.specs())
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func isConflict(err error) bool {
	var e *api.Error
	return errors.Is(err, store.ErrConflict) || (errors.As(err, &e) && e.Status == http.StatusConflict)
}

// findFlavor returns the id of the shape's public flavor, "" when there is
// none: the one under the shape's name if it matches, else the oldest that
// does.
func (s *Service) findFlavor(ctx context.Context, sh Shape) (string, error) {
	rows, err := s.db.Query(ctx, `SELECT id FROM compute_flavors WHERE vcpus = ? AND ram = ? AND disk = ?
 AND ephemeral = 0 AND swap = 0 AND is_public = 1 AND disabled = 0 ORDER BY created_at, id`,
		sh.VCPUs, sh.RAMGB*1024, sh.DiskGB)
	if err != nil {
		return "", err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return "", err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", err
	}
	if i := slices.Index(ids, sh.Name()); i > 0 {
		ids[0], ids[i] = ids[i], ids[0]
	}
	for _, id := range ids {
		f, err := s.getFlavor(ctx, s.db, id)
		if errors.Is(err, store.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return "", err
		}
		if sh.matches(f) {
			return id, nil
		}
	}
	return "", nil
}

// Availability is how many servers of a shape can be placed right now and,
// when fewer than asked, why not.
type Availability struct {
	Fits   int
	Reason string
}

// Capacity asks the scheduler how many of count servers of the shape it
// would place right now: a dry run on its live snapshot that takes
// nothing and writes nothing.
func (s *Service) Capacity(ctx context.Context, sh Shape, count int) (Availability, error) {
	if count < 1 || count > MaxQuantity {
		return Availability{}, api.BadRequest("Invalid quantity %d: it must be 1 to %d.", count, MaxQuantity)
	}
	o, err := s.Options(ctx)
	if err != nil {
		return Availability{}, err
	}
	if err := sh.Validate(o); err != nil {
		return Availability{}, err
	}
	st, err := s.schedState(ctx)
	if err != nil {
		return Availability{}, err
	}
	// The request placement makes of the shape's flavor.
	req := flavorRequest(snapOf(sh.flavor()))
	fits, short, err := st.DryRun(req, count)
	if err != nil {
		return Availability{}, err
	}
	a := Availability{Fits: fits}
	if fits < count {
		a.Reason = reason(sh, req, short, fits, count)
	}
	return a, nil
}

// reason says in words why no more than fits of count servers fit.
func reason(sh Shape, req scheduler.Request, short scheduler.Short, fits, count int) string {
	host := "No host"
	if req.GPUs > 0 && short > scheduler.ShortGPU {
		host = fmt.Sprintf("No host with %s free", gpuWords(req.GPUs, req.GPUModel))
	}
	var why string
	switch short {
	case scheduler.ShortHost:
		why = "No host takes new servers"
	case scheduler.ShortGPU:
		why = fmt.Sprintf("No host has %d free %s %s", req.GPUs, req.GPUModel, plural(req.GPUs, "GPU"))
	case scheduler.ShortVCPU:
		why = fmt.Sprintf("%s has %d free %s", host, req.VCPUs, plural(req.VCPUs, "vCPU"))
	case scheduler.ShortMemory:
		why = fmt.Sprintf("%s has %d GB of free RAM", host, sh.RAMGB)
	case scheduler.ShortDisk:
		why = fmt.Sprintf("%s has %d GB of free local disk", host, req.DiskGB)
	default:
		why = fmt.Sprintf("No host has %s free together", sh.amounts())
	}
	if fits == 0 {
		return why + " right now."
	}
	return fmt.Sprintf("Only %d of %d fit right now: then %s.", fits, count, lowerFirst(why))
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func lowerFirst(s string) string { return strings.ToLower(s[:1]) + s[1:] }

// HostGPUs is each host's GPU devices by model, the inventory the
// operator's hosts page shows beside what servers hold (the Nova API has
// no GPU inventory to read it from).
func (s *Service) HostGPUs(ctx context.Context) (map[string]map[string]int, error) {
	hosts, _, err := s.hostSets(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]int{}
	for _, h := range hosts {
		for _, g := range h.GPUs {
			if out[h.Name] == nil {
				out[h.Name] = map[string]int{}
			}
			out[h.Name][g.Model]++
		}
	}
	return out, nil
}
