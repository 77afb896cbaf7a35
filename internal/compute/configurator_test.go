package compute_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"

	"nimbus/internal/api"
	"nimbus/internal/cloud"
	"nimbus/internal/compute"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

// The fake default fleet: four hosts of 64 vCPUs, 256 GB and 4000 GB, and
// one of 96 vCPUs, 512 GB and 8000 GB with four A100 80GB and two L4.
var (
	a100 = "A100 80GB"
	l4   = "L4"
)

func TestConfiguratorOptions(t *testing.T) {
	e := newEnv(t, "")
	o, err := e.c.Compute.Options(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxVCPUs != 96 || o.MaxRAMGB != 512 || o.MaxLocalDiskGB != 2048 || o.MinDiskGB != 10 || o.MaxDiskGB != 2048 {
		t.Errorf("bounds %+v", o)
	}
	if !slices.Equal(o.VCPUs, []int{1, 2, 4, 8, 16, 32, 64, 96}) || !slices.Equal(o.RAMGB, []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}) {
		t.Errorf("choices %v %v", o.VCPUs, o.RAMGB)
	}
	if !slices.Equal(o.DiskTypes, []string{"local", "network"}) {
		t.Errorf("disk types %v", o.DiskTypes)
	}
	want := []compute.GPUOption{{Model: a100, Alias: "a100-80gb", MaxPerHost: 4, Hosts: 1}, {Model: l4, Alias: "l4", MaxPerHost: 2, Hosts: 1}}
	if !slices.Equal(o.GPUs, want) {
		t.Errorf("GPUs %+v, want %+v", o.GPUs, want)
	}
}

// TestShapeValidate: out-of-range choices are a 400 that names them.
func TestShapeValidate(t *testing.T) {
	ok := compute.Shape{VCPUs: 2, RAMGB: 4, DiskGB: 40, DiskType: "local"}
	with := func(f func(*compute.Shape)) compute.Shape { s := ok; f(&s); return s }
	tests := []struct {
		name  string
		shape compute.Shape
		want  string // "" for valid
	}{
		{"catalogue size", ok, ""},
		{"largest host", with(func(s *compute.Shape) { s.VCPUs, s.RAMGB, s.DiskGB, s.DiskType = 96, 512, 2048, "network" }), ""},
		{"four A100", with(func(s *compute.Shape) { s.GPUModel, s.GPUCount = a100, 4 }), ""},
		{"no vCPU", with(func(s *compute.Shape) { s.VCPUs = 0 }), "Invalid vCPU count 0: it must be 1 to 96."},
		{"more vCPUs than a host", with(func(s *compute.Shape) { s.VCPUs = 97 }), "Invalid vCPU count 97: it must be 1 to 96."},
		{"no RAM", with(func(s *compute.Shape) { s.RAMGB = 0 }), "Invalid RAM size 0 GB: it must be 1 to 512 GB."},
		{"more RAM than a host", with(func(s *compute.Shape) { s.RAMGB = 513 }), "Invalid RAM size 513 GB: it must be 1 to 512 GB."},
		{"small disk", with(func(s *compute.Shape) { s.DiskGB = 9 }), "Invalid local boot disk size 9 GB: it must be 10 to 2048 GB."},
		{"big disk", with(func(s *compute.Shape) { s.DiskGB, s.DiskType = 2049, "network" }), "Invalid network boot disk size 2049 GB: it must be 10 to 2048 GB."},
		{"disk type", with(func(s *compute.Shape) { s.DiskType = "ssd" }), `Invalid boot disk type "ssd": it must be local or network.`},
		{"GPU model", with(func(s *compute.Shape) { s.GPUModel, s.GPUCount = "H100", 1 }), `Invalid GPU model "H100": this cloud has A100 80GB, L4.`},
		{"too many GPUs", with(func(s *compute.Shape) { s.GPUModel, s.GPUCount = l4, 3 }), "Invalid GPU count 3: it must be 1 to 2 L4 GPUs."},
		{"no GPU count", with(func(s *compute.Shape) { s.GPUModel = l4 }), "Invalid GPU count 0: it must be 1 to 2 L4 GPUs."},
		{"count without model", with(func(s *compute.Shape) { s.GPUCount = 1 }), "Invalid GPU count 1: no GPU model was chosen."},
	}
	e := newEnv(t, "")
	o, err := e.c.Compute.Options(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkAPIError(t, tt.shape.Validate(o), 400, tt.want)
		})
	}
}

// TestShapeValidateTogether: each amount is some host's, but no host has
// them all.
func TestShapeValidateTogether(t *testing.T) {
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.Fleet = []driver.Host{
			{Name: "cpu", VCPUs: 64, MemoryMB: 64 << 10, DiskGB: 500, Zone: "nova", Up: true, Hypervisor: "fake"},
			{Name: "ram", VCPUs: 8, MemoryMB: 512 << 10, DiskGB: 500, Zone: "nova", Up: true, Hypervisor: "fake"},
		}
	})
	o, err := c.Compute.Options(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	err = compute.Shape{VCPUs: 32, RAMGB: 256, DiskGB: 100, DiskType: "local"}.Validate(o)
	checkAPIError(t, err, 400, "No host of this cloud holds 32 vCPUs, 256 GB RAM and 100 GB local disk together.")
	err = compute.Shape{VCPUs: 1, RAMGB: 1, DiskGB: 10, DiskType: "local", GPUModel: l4, GPUCount: 1}.Validate(o)
	checkAPIError(t, err, 400, `Invalid GPU model "L4": this cloud has no GPUs.`)
}

func checkAPIError(t *testing.T, err error, status int, msg string) {
	t.Helper()
	if msg == "" {
		if err != nil {
			t.Errorf("error %v, want none", err)
		}
		return
	}
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != status || ae.Message != msg {
		t.Errorf("error %#v, want %d %q", err, status, msg)
	}
}

// caller is a member of the named project, as the panel acts for one.
func caller(t *testing.T, e *env, project string) *api.Caller {
	t.Helper()
	p, err := e.c.Identity.ProjectByName(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	return &api.Caller{ProjectID: p.ID, Roles: []string{"member"}}
}

// specsOf are the extra specs a configurator flavor of sh has.
func specsOf(sh compute.Shape) map[string]string {
	specs := map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": sh.DiskType,
		"nimbus:public_ipv4": fmt.Sprint(sh.PublicIPv4)}
	if sh.GPUCount > 0 {
		specs["nimbus:gpu_model"] = sh.GPUModel
		specs["pci_passthrough:alias"] = fmt.Sprintf("%s:%d", map[string]string{a100: "a100-80gb", l4: "l4"}[sh.GPUModel], sh.GPUCount)
	}
	return specs
}

// TestProjectFlavor: the catalogue's flavors are used as they are; a new
// shape gets a flavor private to the ordering project, taken again by its
// next order of the shape, which the project sees through the API and
// another project does not.
func TestProjectFlavor(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		demo := caller(t, e, cloud.DemoProject)
		pc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.61")
		admin := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "2.61")
		own := func(name string) string { return name + "." + demo.ProjectID }
		tests := []struct {
			name  string
			shape compute.Shape
			id    string
			lease int64
		}{
			{"catalogue", compute.Shape{VCPUs: 1, RAMGB: 2, DiskGB: 20, DiskType: "local"}, "d1.2g.local", 0},
			{"catalogue with IPv4", compute.Shape{VCPUs: 4, RAMGB: 8, DiskGB: 80, DiskType: "network", PublicIPv4: true}, "d4.8g.network.ipv4", 0},
			{"catalogue GPU", compute.Shape{VCPUs: 16, RAMGB: 120, DiskGB: 200, DiskType: "local", GPUModel: a100, GPUCount: 1, PublicIPv4: true}, "g.a100-80gb.x1", 0},
			{"new size", compute.Shape{VCPUs: 3, RAMGB: 6, DiskGB: 60, DiskType: "local"}, own("d3.6g.local"), 1},
			{"same again", compute.Shape{VCPUs: 3, RAMGB: 6, DiskGB: 60, DiskType: "local"}, own("d3.6g.local"), 2},
			{"catalogue size, other disk", compute.Shape{VCPUs: 2, RAMGB: 4, DiskGB: 100, DiskType: "network"}, own("d2.4g.network.100gb"), 1},
			{"GPUs and IPv4", compute.Shape{VCPUs: 8, RAMGB: 64, DiskGB: 100, DiskType: "local", GPUModel: l4, GPUCount: 2, PublicIPv4: true}, own("d8.64g.local.100gb.l4x2.ipv4"), 1},
			{"catalogue GPU size without IPv4", compute.Shape{VCPUs: 16, RAMGB: 120, DiskGB: 200, DiskType: "local", GPUModel: a100, GPUCount: 1}, own("d16.120g.local.200gb.a100-80gbx1"), 1},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				of, err := e.c.Compute.ProjectFlavor(ctx, demo, tt.shape)
				if err != nil || of.ID != tt.id || of.Lease != tt.lease {
					t.Fatalf("ProjectFlavor = %+v, %v; want %q, lease %d", of, err, tt.id, tt.lease)
				}
				f, err := flavors.Get(ctx, pc, of.ID).Extract()
				if err != nil {
					t.Fatal(err)
				}
				sh := tt.shape
				if f.Name != tt.id || f.VCPUs != sh.VCPUs || f.RAM != sh.RAMGB*1024 || f.Disk != sh.DiskGB || f.IsPublic != (tt.lease == 0) ||
					!mapEqual(f.ExtraSpecs, specsOf(sh)) {
					t.Errorf("flavor %+v, want %+v with %v", f, sh, specsOf(sh))
				}
				if tt.lease > 0 {
					access, err := flavors.ListAccesses(admin, of.ID).AllPages(ctx)
					if err != nil {
						t.Fatal(err)
					}
					list, _ := flavors.ExtractAccesses(access)
					if len(list) != 1 || list[0].TenantID != demo.ProjectID {
						t.Errorf("access list %+v, want only %s", list, demo.ProjectID)
					}
				}
			})
		}
		// Nothing was duplicated: one flavor of each shape.
		for _, tt := range tests {
			if n := countFlavors(t, e, tt.shape); n != 1 {
				t.Errorf("%s: %d flavors of the shape", tt.name, n)
			}
		}
		// Another project sees none of them, and gets its own.
		other := &api.Caller{ProjectID: caller(t, e, cloud.AdminProject).ProjectID}
		otherList := flavorNames(t, admin)
		for _, tt := range tests {
			if tt.lease > 0 && slices.Contains(otherList, tt.id) {
				t.Errorf("another project lists %s", tt.id)
			}
		}
		of, err := e.c.Compute.ProjectFlavor(ctx, other, tests[3].shape)
		if err != nil || of.ID != "d3.6g.local."+other.ProjectID || of.Lease != 1 {
			t.Errorf("another project's order of d3.6g.local: %+v, %v", of, err)
		}
		// A caller without a project acts for none.
		_, err = e.c.Compute.ProjectFlavor(ctx, &api.Caller{UserID: "u"}, tests[3].shape)
		checkAPIError(t, err, 403, "Ordering a server needs a token scoped to a project.")
	})
}

// flavorNames lists the flavors sc's caller sees by default.
func flavorNames(t *testing.T, sc *gophercloud.ServiceClient) []string {
	t.Helper()
	pages, err := flavors.ListDetail(sc, nil).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all, err := flavors.ExtractFlavors(pages)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range all {
		out = append(out, f.Name)
	}
	return out
}

func mapEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || v != w {
			return false
		}
	}
	return true
}

// countFlavors counts flavors of the shape's sizes, through the API.
func countFlavors(t *testing.T, e *env, sh compute.Shape) int {
	t.Helper()
	pc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "2.61")
	pages, err := flavors.ListDetail(pc, flavors.ListOpts{AccessType: flavors.AllAccess}).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all, err := flavors.ExtractFlavors(pages)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range all {
		if f.VCPUs == sh.VCPUs && f.RAM == sh.RAMGB*1024 && f.Disk == sh.DiskGB && f.ExtraSpecs["nimbus:disk_type"] == sh.DiskType &&
			f.ExtraSpecs["nimbus:public_ipv4"] == fmt.Sprint(sh.PublicIPv4) && f.ExtraSpecs["nimbus:gpu_model"] == sh.GPUModel {
			n++
		}
	}
	return n
}

// TestProjectFlavorConcurrent: orders at once of one new shape end with
// one flavor, each with a hand-out of its own.
func TestProjectFlavorConcurrent(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		demo := caller(t, e, cloud.DemoProject)
		sh := compute.Shape{VCPUs: 6, RAMGB: 12, DiskGB: 50, DiskType: "network", PublicIPv4: true}
		const n = 8
		var wg sync.WaitGroup
		got, errs := make([]compute.OrderFlavor, n), make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = e.c.Compute.ProjectFlavor(context.Background(), demo, sh)
			}()
		}
		wg.Wait()
		leases := map[int64]bool{}
		for i := range n {
			if errs[i] != nil || got[i].ID != "d6.12g.network.50gb.ipv4."+demo.ProjectID {
				t.Errorf("order %d: %+v, %v", i, got[i], errs[i])
			}
			leases[got[i].Lease] = true
		}
		if len(leases) != n {
			t.Errorf("hand-outs %v, want %d distinct", leases, n)
		}
		if c := countFlavors(t, e, sh); c != 1 {
			t.Errorf("%d flavors of the shape", c)
		}
	})
}

// TestProjectFlavorBound: a project holds at most MaxProjectFlavors
// flavors of its own, also when its orders race; a flavor no server uses
// is given back by a refused order, dropped after the grace by the next
// new size, and goes with the last server of its size.
func TestProjectFlavorBound(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		demo := caller(t, e, cloud.DemoProject)
		size := func(ram int) compute.Shape { return compute.Shape{VCPUs: 1, RAMGB: ram, DiskGB: 10, DiskType: "local"} }
		own := func() int {
			var n int
			if err := e.c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM compute_project_flavors WHERE project_id = ?", demo.ProjectID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		// Twice the bound at once: the bound holds, the rest are refused.
		var wg sync.WaitGroup
		errs := make([]error, 2*compute.MaxProjectFlavors)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[i] = e.c.Compute.ProjectFlavor(ctx, demo, size(i+1)) }()
		}
		wg.Wait()
		refused := 0
		for _, err := range errs {
			if err != nil {
				checkAPIError(t, err, 403, fmt.Sprintf("Your servers already use %d sizes of your own, the most a project may: choose a size of the catalogue, or delete the servers of a size you no longer need.", compute.MaxProjectFlavors))
				refused++
			}
		}
		if n := own(); n != compute.MaxProjectFlavors || refused != compute.MaxProjectFlavors {
			t.Fatalf("%d flavors of its own, %d orders refused; want %d each", n, refused, compute.MaxProjectFlavors)
		}

		// A refused order gives its hand-out back: the flavor goes,
		// unless another order took it since.
		var taken []compute.OrderFlavor
		for ram := 1; ram <= 2*compute.MaxProjectFlavors && len(taken) < 2; ram++ {
			if of, err := e.c.Compute.ProjectFlavor(ctx, demo, size(ram)); err == nil {
				taken = append(taken, of)
			}
		}
		stale := taken[0]
		stale.Lease--
		if err := e.c.Compute.ReleaseFlavor(ctx, demo, stale); err != nil || own() != compute.MaxProjectFlavors {
			t.Errorf("giving back an older hand-out: %v, %d left", err, own())
		}
		if err := e.c.Compute.ReleaseFlavor(ctx, demo, taken[0]); err != nil || own() != compute.MaxProjectFlavors-1 {
			t.Errorf("giving back the last hand-out: %v, %d left", err, own())
		}
		if err := e.c.Compute.ReleaseFlavor(ctx, caller(t, e, cloud.AdminProject), taken[1]); err != nil || own() != compute.MaxProjectFlavors-1 {
			t.Errorf("another project gave back a hand-out: %v, %d left", err, own())
		}

		// One in use by a server is kept; the unused ones go once the
		// grace has passed.
		e.flavorID = taken[1].ID
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		if _, err := e.c.DB.Exec(ctx, "UPDATE compute_project_flavors SET handed_at = ?", "2000-01-01T00:00:00.000000Z"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.Compute.ProjectFlavor(ctx, demo, size(100)); err != nil {
			t.Fatal(err)
		}
		if n := own(); n != 2 {
			t.Errorf("after the grace %d flavors of its own, want the one in use and the new one", n)
		}

		// The last server of its size deleted, its flavor goes.
		e.must(204, "DELETE", "/servers/"+id, e.demo, "", "")
		e.waitGone(id, e.demo)
		if st, _, _ := e.do("GET", "/flavors/"+taken[1].ID, e.admin, "", ""); st != 404 {
			t.Errorf("the flavor of a deleted server's size: %d", st)
		}
		if n := own(); n != 1 {
			t.Errorf("%d flavors of its own after the delete, want 1", n)
		}
	})
}

// TestProjectFlavorNameTaken: a flavor of another configuration under the
// name of the project's own is left alone, and the order answers 409; a
// private flavor of the shape that is not the project's is not used.
func TestProjectFlavorNameTaken(t *testing.T) {
	e := newEnv(t, "")
	demo := caller(t, e, cloud.DemoProject)
	name := "d5.10g.local." + demo.ProjectID
	e.flavor(name, 5, 10240, 100, map[string]string{"hw:cpu_policy": "dedicated"})
	_, err := e.c.Compute.ProjectFlavor(context.Background(), demo, compute.Shape{VCPUs: 5, RAMGB: 10, DiskGB: 100, DiskType: "local"})
	checkAPIError(t, err, 409, "Flavor "+name+" already exists and is not this configuration's.")
	f := e.must(200, "GET", "/flavors/"+name, e.admin, "2.61", "")["flavor"].(map[string]any)
	if specs := f["extra_specs"].(map[string]any); len(specs) != 1 || f["disk"] != float64(100) {
		t.Errorf("the taken flavor changed: %v", f)
	}

	// A private flavor of exactly the shape is someone's own: the
	// project gets its own beside it.
	e.must(200, "POST", "/flavors", e.admin, "", `{"flavor":{"name":"mine","id":"mine","vcpus":7,"ram":7168,"disk":140,"os-flavor-access:is_public":false}}`)
	e.must(200, "POST", "/flavors/mine/os-extra_specs", e.admin, "",
		`{"extra_specs":{"hw:cpu_policy":"dedicated","nimbus:disk_type":"local","nimbus:public_ipv4":"false"}}`)
	of, err := e.c.Compute.ProjectFlavor(context.Background(), demo, compute.Shape{VCPUs: 7, RAMGB: 7, DiskGB: 140, DiskType: "local"})
	if err != nil || of.ID != "d7.7g.local."+demo.ProjectID || of.Lease != 1 {
		t.Errorf("beside a private flavor: %+v, %v", of, err)
	}
}

// TestCapacity: how many servers of a shape fit now and why not more, as
// servers take the fleet; asking takes nothing.
func TestCapacity(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		project, err := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		if err != nil {
			t.Fatal(err)
		}
		e.must(200, "PUT", "/os-quota-sets/"+project.ID, e.admin, "", `{"quota_set":{"instances":1000,"cores":10000,"ram":10000000}}`)
		type step struct {
			name   string
			shape  compute.Shape
			count  int
			fits   int
			reason string
		}
		check := func(t *testing.T, steps []step) {
			t.Helper()
			for _, s := range steps {
				a, err := e.c.Compute.Capacity(ctx, s.shape, s.count)
				if err != nil || a.Fits != s.fits || a.Reason != s.reason {
					t.Errorf("%s: Capacity = %+v, %v; want %d, %q", s.name, a, err, s.fits, s.reason)
				}
			}
		}
		net := func(vcpus, ram int) compute.Shape {
			return compute.Shape{VCPUs: vcpus, RAMGB: ram, DiskGB: 20, DiskType: "network"}
		}
		gpu := func(vcpus int, model string, n int) compute.Shape {
			s := net(vcpus, 8)
			s.GPUModel, s.GPUCount = model, n
			return s
		}
		check(t, []step{
			{"small", net(1, 2), 10, 10, ""},
			{"largest vCPUs", net(64, 8), 6, 5, "Only 5 of 6 fit right now: then no host has 64 free vCPUs."},
			{"RAM of one host", net(2, 300), 2, 1, "Only 1 of 2 fit right now: then no host has 300 GB of free RAM."},
			{"local disk", compute.Shape{VCPUs: 2, RAMGB: 2, DiskGB: 2048, DiskType: "local"}, 8, 7,
				"Only 7 of 8 fit right now: then no host has 2048 GB of free local disk."},
			{"two A100 pairs", gpu(4, a100, 2), 3, 2, "Only 2 of 3 fit right now: then no host has 2 free A100 80GB GPUs."},
			{"L4 pair", gpu(4, l4, 2), 2, 1, "Only 1 of 2 fit right now: then no host has 2 free L4 GPUs."},
		})

		// Two servers take the four A100s and 32 of the GPU host's vCPUs.
		demo := caller(t, e, cloud.DemoProject)
		of, err := e.c.Compute.ProjectFlavor(ctx, demo, gpu(16, a100, 2))
		if err != nil {
			t.Fatal(err)
		}
		e.flavorID = of.ID
		e.create(e.demo, "2.96", `,"min_count":2,"max_count":2`)
		check(t, []step{
			{"A100 gone", gpu(4, a100, 1), 1, 0, "No host has 1 free A100 80GB GPU right now."},
			{"L4 host short of vCPUs", gpu(80, l4, 1), 1, 0, "No host with 1 L4 GPU free has 80 free vCPUs right now."},
			{"L4 beside", gpu(64, l4, 1), 1, 1, ""},
		})

		// Asking took nothing: the store holds the two servers' claims,
		// and what Capacity said fits, a create places.
		var claims int
		if err := e.c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM compute_claims").Scan(&claims); err != nil || claims != 2 {
			t.Errorf("%d claims in the store, %v; want 2", claims, err)
		}
		of, err = e.c.Compute.ProjectFlavor(ctx, demo, gpu(64, l4, 2))
		if err != nil {
			t.Fatal(err)
		}
		e.flavorID = of.ID
		e.wait(e.create(e.demo, "2.96", ""), e.demo, "ACTIVE")

		// A bad quantity or shape is the caller's.
		_, err = e.c.Compute.Capacity(ctx, net(1, 2), 0)
		checkAPIError(t, err, 400, "Invalid quantity 0: it must be 1 to 100.")
		_, err = e.c.Compute.Capacity(ctx, net(1, 2), 101)
		checkAPIError(t, err, 400, "Invalid quantity 101: it must be 1 to 100.")
		_, err = e.c.Compute.Capacity(ctx, gpu(1, "H100", 1), 1)
		checkAPIError(t, err, 400, `Invalid GPU model "H100": this cloud has A100 80GB, L4.`)
	})
}

// BenchmarkCapacity: one configurator question (10 servers of a shape) on
// a fleet of 1,000 hosts, 100 of them with GPUs.
func BenchmarkCapacity(b *testing.B) {
	fleet := make([]driver.Host, 0, 1000)
	for i := range 1000 {
		h := driver.Host{Name: fmt.Sprintf("bench-%04d", i), MemoryMB: 256 << 10, DiskGB: 4000, Zone: "nova", Up: true, Hypervisor: "fake"}
		fake.Topology(&h, 2, 17, 1)
		if i%10 == 0 {
			for g := range 4 {
				h.GPUs = append(h.GPUs, driver.GPU{Address: fmt.Sprintf("0000:%02x:00.0", 0x3b+g), Vendor: "NVIDIA", Model: a100, NUMA: g / 2})
			}
		}
		fleet = append(fleet, h)
	}
	c := testenv.StartCloud(b, "", func(cfg *cloud.Config) { cfg.Fleet = fleet })
	ctx := context.Background()
	for _, bc := range []struct {
		name  string
		shape compute.Shape
	}{
		{"plain", compute.Shape{VCPUs: 4, RAMGB: 8, DiskGB: 80, DiskType: "local"}},
		{"gpu", compute.Shape{VCPUs: 16, RAMGB: 120, DiskGB: 200, DiskType: "local", GPUModel: a100, GPUCount: 2}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if _, err := c.Compute.Capacity(ctx, bc.shape, 10); err != nil { // loads the snapshot
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				a, err := c.Compute.Capacity(ctx, bc.shape, 10)
				if err != nil || a.Fits != 10 {
					b.Fatalf("%+v %v", a, err)
				}
			}
		})
	}
}
