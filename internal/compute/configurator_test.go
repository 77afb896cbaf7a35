package compute_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

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

// TestFlavorFor: the catalogue's flavors are found, a new shape gets one
// flavor under the configurator's name, seen through the API.
func TestFlavorFor(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		pc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.61")
		tests := []struct {
			name    string
			shape   compute.Shape
			id      string
			created bool
		}{
			{"catalogue", compute.Shape{VCPUs: 1, RAMGB: 2, DiskGB: 20, DiskType: "local"}, "d1.2g.local", false},
			{"catalogue with IPv4", compute.Shape{VCPUs: 4, RAMGB: 8, DiskGB: 80, DiskType: "network", PublicIPv4: true}, "d4.8g.network.ipv4", false},
			{"catalogue GPU", compute.Shape{VCPUs: 16, RAMGB: 120, DiskGB: 200, DiskType: "local", GPUModel: a100, GPUCount: 1, PublicIPv4: true}, "g.a100-80gb.x1", false},
			{"new size", compute.Shape{VCPUs: 3, RAMGB: 6, DiskGB: 60, DiskType: "local"}, "d3.6g.local", true},
			{"same again", compute.Shape{VCPUs: 3, RAMGB: 6, DiskGB: 60, DiskType: "local"}, "d3.6g.local", false},
			{"catalogue size, other disk", compute.Shape{VCPUs: 2, RAMGB: 4, DiskGB: 100, DiskType: "network"}, "d2.4g.network.100gb", true},
			{"GPUs and IPv4", compute.Shape{VCPUs: 8, RAMGB: 64, DiskGB: 100, DiskType: "local", GPUModel: l4, GPUCount: 2, PublicIPv4: true}, "d8.64g.local.100gb.l4x2.ipv4", true},
			{"catalogue GPU size without IPv4", compute.Shape{VCPUs: 16, RAMGB: 120, DiskGB: 200, DiskType: "local", GPUModel: a100, GPUCount: 1}, "d16.120g.local.200gb.a100-80gbx1", true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				id, created, err := e.c.Compute.FlavorFor(ctx, tt.shape)
				if err != nil || id != tt.id || created != tt.created {
					t.Fatalf("FlavorFor = %q, %v, %v; want %q, %v", id, created, err, tt.id, tt.created)
				}
				f, err := flavors.Get(ctx, pc, id).Extract()
				if err != nil {
					t.Fatal(err)
				}
				sh := tt.shape
				specs := map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": sh.DiskType,
					"nimbus:public_ipv4": fmt.Sprint(sh.PublicIPv4)}
				if sh.GPUCount > 0 {
					specs["nimbus:gpu_model"] = sh.GPUModel
					specs["pci_passthrough:alias"] = fmt.Sprintf("%s:%d", map[string]string{a100: "a100-80gb", l4: "l4"}[sh.GPUModel], sh.GPUCount)
				}
				if f.Name != tt.id || f.VCPUs != sh.VCPUs || f.RAM != sh.RAMGB*1024 || f.Disk != sh.DiskGB || !f.IsPublic ||
					!mapEqual(f.ExtraSpecs, specs) {
					t.Errorf("flavor %+v, want %+v with %v", f, sh, specs)
				}
			})
		}
		// Nothing was duplicated: one flavor of each shape.
		for _, tt := range tests {
			if n := countFlavors(t, e, tt.shape); n != 1 {
				t.Errorf("%s: %d flavors of the shape", tt.name, n)
			}
		}
	})
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

// TestFlavorForConcurrent: calls at once for one new shape end with one
// flavor, created by one of them.
func TestFlavorForConcurrent(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		sh := compute.Shape{VCPUs: 6, RAMGB: 12, DiskGB: 50, DiskType: "network", PublicIPv4: true}
		const n = 8
		var wg sync.WaitGroup
		ids, created, errs := make([]string, n), make([]bool, n), make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids[i], created[i], errs[i] = e.c.Compute.FlavorFor(context.Background(), sh)
			}()
		}
		wg.Wait()
		made := 0
		for i := range n {
			if errs[i] != nil || ids[i] != "d6.12g.network.50gb.ipv4" {
				t.Errorf("call %d: %q, %v", i, ids[i], errs[i])
			}
			if created[i] {
				made++
			}
		}
		if made != 1 {
			t.Errorf("%d calls say they created it", made)
		}
		if got := countFlavors(t, e, sh); got != 1 {
			t.Errorf("%d flavors of the shape", got)
		}
	})
}

// TestFlavorForNameTaken: a flavor of another configuration under the
// configurator's name is left alone, and the call answers 409; a disabled
// or private flavor of the shape is not the shape's flavor.
func TestFlavorForNameTaken(t *testing.T) {
	e := newEnv(t, "")
	e.flavor("d5.10g.local", 5, 10240, 100, map[string]string{"hw:cpu_policy": "dedicated"})
	_, _, err := e.c.Compute.FlavorFor(context.Background(), compute.Shape{VCPUs: 5, RAMGB: 10, DiskGB: 100, DiskType: "local"})
	checkAPIError(t, err, 409, "Flavor d5.10g.local already exists and is not this configuration's: it is private, disabled or of other sizes or extra specs.")
	f := e.must(200, "GET", "/flavors/d5.10g.local", e.admin, "2.61", "")["flavor"].(map[string]any)
	if specs := f["extra_specs"].(map[string]any); len(specs) != 1 || f["disk"] != float64(100) {
		t.Errorf("the taken flavor changed: %v", f)
	}

	// A private flavor of exactly the shape is someone's own: a public one
	// is made beside it.
	e.must(200, "POST", "/flavors", e.admin, "", `{"flavor":{"name":"mine","id":"mine","vcpus":7,"ram":7168,"disk":140,"os-flavor-access:is_public":false}}`)
	e.must(200, "POST", "/flavors/mine/os-extra_specs", e.admin, "",
		`{"extra_specs":{"hw:cpu_policy":"dedicated","nimbus:disk_type":"local","nimbus:public_ipv4":"false"}}`)
	id, created, err := e.c.Compute.FlavorFor(context.Background(), compute.Shape{VCPUs: 7, RAMGB: 7, DiskGB: 140, DiskType: "local"})
	if err != nil || id != "d7.7g.local" || !created {
		t.Errorf("beside a private flavor: %q, %v, %v", id, created, err)
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
		id, _, err := e.c.Compute.FlavorFor(ctx, gpu(16, a100, 2))
		if err != nil {
			t.Fatal(err)
		}
		e.flavorID = id
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
		id, _, err = e.c.Compute.FlavorFor(ctx, gpu(64, l4, 2))
		if err != nil {
			t.Fatal(err)
		}
		e.flavorID = id
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
