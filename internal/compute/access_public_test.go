package compute_test

import (
	"context"
	"slices"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

// TestAccessPublicAddress: on bridged hosts a server with a public IPv4
// address (a nimbus:public_ipv4 flavor's floating IP) is reached there
// first, by SSH or for Windows by RDP, then as the driver says; one
// without has only the driver's entries; on user-mode hosts the floating
// IP, which reaches nothing there, is not listed.
func TestAccessPublicAddress(t *testing.T) {
	bridged := func(c *cloud.Config) {
		c.Fleet = fake.DefaultFleet()
		for i := range c.Fleet {
			c.Fleet[i].NetworkMode = "bridged"
		}
	}
	for _, mode := range []string{"bridged", "user"} {
		t.Run(mode, func(t *testing.T) {
			testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
				var opts []testenv.Options
				if mode == "bridged" {
					opts = append(opts, bridged)
				}
				e := newEnv(t, dbURL, opts...)
				var winImage string
				if err := e.c.DB.QueryRow(context.Background(), "SELECT id FROM images WHERE name = 'Windows Server 2022'").Scan(&winImage); err != nil {
					t.Fatal(err)
				}
				e.flavor("wpub", 4, 8192, 60, map[string]string{"nimbus:public_ipv4": "true"})
				cases := []struct {
					name, flavor, image string
					public              bool   // a public address listed first
					proto               string // its protocol
					port                float64
				}{
					{"linux with a public IPv4", "d1.2g.local.ipv4", e.imageID, mode == "bridged", "ssh", 22},
					{"windows with a public IPv4", "wpub", winImage, mode == "bridged", "rdp", 3389},
					{"no public address", "2", e.imageID, false, "ssh", 22},
				}
				for _, tc := range cases {
					t.Run(tc.name, func(t *testing.T) {
						body := `{"server":{"name":"a","imageRef":"` + tc.image + `","flavorRef":"` + tc.flavor + `","networks":"auto"}}`
						id := e.must(202, "POST", "/servers", e.demo, "2.96", body)["server"].(map[string]any)["id"].(string)
						sv := e.wait(id, e.demo, "ACTIVE")
						var fixed, floating []string
						for _, addrs := range sv["addresses"].(map[string]any) {
							for _, a := range addrs.([]any) {
								am := a.(map[string]any)
								if am["OS-EXT-IPS:type"] == "floating" {
									floating = append(floating, am["addr"].(string))
								} else {
									fixed = append(fixed, am["addr"].(string))
								}
							}
						}
						if tc.flavor != "2" && len(floating) != 1 {
							t.Fatalf("public IPv4 flavor, floating addresses %v", floating)
						}
						acc := e.must(200, "GET", "/servers/"+id+"/access", e.demo, "", "")["access"].([]any)
						var hosts []string
						for _, a := range acc {
							am := a.(map[string]any)
							hosts = append(hosts, am["host"].(string))
							if am["protocol"] != tc.proto || am["port"] != tc.port || am["user"] == "" {
								t.Errorf("access entry %v, want %s port %v with a user", am, tc.proto, tc.port)
							}
						}
						want := fixed // the fake driver's entry: the fixed IP
						if tc.public {
							want = append(floating, fixed...)
						}
						if !slices.Equal(hosts, want) {
							t.Errorf("access hosts %v, want %v", hosts, want)
						}
						e.must(204, "DELETE", "/servers/"+id, e.demo, "", "")
					})
				}
			})
		})
	}
}
