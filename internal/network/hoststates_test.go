package network

import (
	"context"
	"encoding/json"
	"testing"

	"nimbus/internal/store/storetest"
)

// TestHostStatesOneBuild: the states of several hosts built at once are
// each what that host's own build gives, a host with nothing included.
func TestHostStatesOneBuild(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newDPFixture(t, dbURL)
		ctx := context.Background()
		names := []string{"h1", "h2", "gw", "idle", "h1"}
		all, err := f.s.HostStates(ctx, names, f.hosts)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 4 {
			t.Fatalf("%d states for %v", len(all), names)
		}
		for _, host := range names {
			t.Run(host, func(t *testing.T) {
				one := f.state(t, host)
				got := all[host]
				if err := got.Validate(); err != nil {
					t.Fatal(err)
				}
				got.Revision = one.Revision
				a, _ := json.Marshal(got)
				b, _ := json.Marshal(one)
				if string(a) != string(b) {
					t.Errorf("built with others:\n%s\nalone:\n%s", a, b)
				}
			})
		}
		if st := all["idle"]; len(st.Ports) != 0 || len(st.Networks) != 0 || len(st.Routers) != 0 {
			t.Errorf("a host with nothing: %+v", st)
		}
	})
}
