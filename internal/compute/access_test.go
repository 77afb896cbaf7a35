package compute_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"nimbus/internal/driver"
	"nimbus/internal/testenv"
)

// TestDriverSpecAndAccess checks what a hypervisor is given to build a
// server — its pinned pCPUs, boot image, ports and disk throttle — and the
// access list its owner sees.
func TestDriverSpecAndAccess(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		e.flavor("pn", 2, 1024, 10, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "network",
			"quota:disk_write_iops_sec": "500"})
		e.flavor("pw", 2, 4096, 40, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local"})
		var checksum, hash, loginUser, winImage string
		ctx := context.Background()
		if err := e.c.DB.QueryRow(ctx, "SELECT checksum, os_hash_value FROM images WHERE id = ?", e.imageID).Scan(&checksum, &hash); err != nil {
			t.Fatal(err)
		}
		img, err := e.c.Images.Get(ctx, "", true, e.imageID)
		if err != nil {
			t.Fatal(err)
		}
		loginUser = img.Properties["login_user"]
		if err := e.c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = 'Windows Server 2022'").Scan(&winImage); err != nil {
			t.Fatal(err)
		}

		cases := []struct {
			name, flavor, image string
			iops                driver.IOPS
			diskType            string
			access              driver.Access
		}{
			{"linux on local disk", "p2", e.imageID, driver.IOPS{Read: 75000, Write: 20000}, "local",
				driver.Access{Protocol: "ssh", Port: 22, User: loginUser}},
			{"network disk, write throttle set by the operator", "pn", e.imageID, driver.IOPS{Read: 70000, Write: 500}, "network",
				driver.Access{Protocol: "ssh", Port: 22, User: loginUser}},
			{"windows", "pw", winImage, driver.IOPS{Read: 75000, Write: 20000}, "local",
				driver.Access{Protocol: "rdp", Port: 3389, User: "Administrator"}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				body := `{"server":{"name":"a","imageRef":"` + tc.image + `","flavorRef":"` + tc.flavor + `","networks":"auto","config_drive":true}}`
				id := e.must(202, "POST", "/servers", e.demo, "2.96", body)["server"].(map[string]any)["id"].(string)
				e.wait(id, e.demo, "ACTIVE")
				sp, ok := e.c.Fake.Spec(id)
				if !ok {
					t.Fatal("the driver has no VM for the server")
				}
				var cpus []int
				for _, c := range sp.Cells {
					cpus = append(cpus, c.CPUs...)
				}
				slices.Sort(cpus)
				if want := e.pinned(id); !slices.Equal(cpus, want) {
					t.Errorf("spec pins %v, the claim holds %v", cpus, want)
				}
				if sp.DiskType != tc.diskType || sp.DiskIOPS != tc.iops {
					t.Errorf("disk %s %+v, want %s %+v", sp.DiskType, sp.DiskIOPS, tc.diskType, tc.iops)
				}
				if tc.image == e.imageID && (sp.Image.ID != e.imageID || sp.Image.Checksum != checksum || sp.Image.HashValue != hash || sp.Image.DiskFormat == "") {
					t.Errorf("image ref %+v", sp.Image)
				}
				if !sp.ConfigDrive {
					t.Error("config_drive asked for and not in the spec")
				}
				if len(sp.Ports) != 1 {
					t.Fatalf("ports %+v", sp.Ports)
				}
				p := sp.Ports[0]
				pfx, err := netip.ParsePrefix(p.CIDR)
				if err != nil || !pfx.Contains(netip.MustParseAddr(p.IP)) || p.Gateway == "" || p.MAC == "" || p.MTU == 0 {
					t.Errorf("port %+v", p)
				}
				if !slices.Equal(sp.FixedIPs, []string{p.IP}) {
					t.Errorf("fixed IPs %v, port %s", sp.FixedIPs, p.IP)
				}

				acc := e.must(200, "GET", "/servers/"+id+"/access", e.demo, "", "")["access"].([]any)
				want := tc.access
				want.Host = p.IP
				if len(acc) != 1 {
					t.Fatalf("access %v", acc)
				}
				a := acc[0].(map[string]any)
				if a["protocol"] != want.Protocol || a["host"] != want.Host || a["port"] != float64(want.Port) || a["user"] != want.User {
					t.Errorf("access %v, want %+v", a, want)
				}
				e.must(204, "DELETE", "/servers/"+id, e.demo, "", "")
			})
		}
		// Not the owner's server: not found.
		e.must(404, "GET", "/servers/00000000-0000-0000-0000-000000000000/access", e.demo, "", "")
	})
}
