package compute_test

import (
	"testing"

	"nimbus/internal/testenv"
)

// TestAccessIPShowsPublicAddress: a server with a public address shows it
// as Nova's accessIPv4, so that `openstack server show` says where it is
// reached, unless its owner set accessIPv4 themselves.
func TestAccessIPShowsPublicAddress(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		e.flavorID = "d1.2g.local.ipv4"
		for _, tc := range []struct {
			name, extra string
			own         bool
		}{
			{"public address", "", false},
			{"the owner's own", `,"accessIPv4":"192.0.2.7"`, true},
		} {
			sv := e.wait(e.create(e.demo, "2.96", tc.extra), e.demo, "ACTIVE")
			var floating string
			for _, addrs := range sv["addresses"].(map[string]any) {
				for _, a := range addrs.([]any) {
					if am := a.(map[string]any); am["OS-EXT-IPS:type"] == "floating" {
						floating = am["addr"].(string)
					}
				}
			}
			want := floating
			if tc.own {
				want = "192.0.2.7"
			}
			if floating == "" || sv["accessIPv4"] != want {
				t.Errorf("%s: accessIPv4 %v, floating %q; want %q", tc.name, sv["accessIPv4"], floating, want)
			}
		}
		e.flavorID = "2"
		if sv := e.wait(e.create(e.demo, "2.96", ""), e.demo, "ACTIVE"); sv["accessIPv4"] != "" {
			t.Errorf("a server without a public address shows accessIPv4 %v", sv["accessIPv4"])
		}
	})
}
