package driver

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDriversFreeOfStore: the hypervisor drivers, which the agent runs on
// every host, hold no database code: neither the control plane's store nor
// the engines beneath it. A driver that needs a fact of a service (the
// stock images, a port's tap) reads it from a package of plain data.
func TestDriversFreeOfStore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "nimbus/internal/driver/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, forbidden := range []string{"nimbus/internal/store", "github.com/jackc/pgx", "modernc.org/sqlite"} {
			if dep == forbidden || strings.HasPrefix(dep, forbidden+"/") {
				t.Errorf("the drivers import %s", dep)
			}
		}
	}
}
