package panel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"

	"nimbus/internal/cloud"
	"nimbus/internal/compute"
	"nimbus/internal/testenv"
)

// flavorIDs lists the flavors sc's user sees (every flavor for the
// operator with all), sorted.
func flavorIDs(t *testing.T, sc *gophercloud.ServiceClient, all bool) []string {
	t.Helper()
	opts := flavors.ListOpts{}
	if all {
		opts.AccessType = flavors.AllAccess
	}
	pages, err := flavors.ListDetail(sc, opts).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fs, err := flavors.ExtractFlavors(pages)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(fs))
	for _, f := range fs {
		ids = append(ids, f.ID)
	}
	slices.Sort(ids)
	return ids
}

// added is what after has and before has not.
func added(before, after []string) []string {
	var out []string
	for _, id := range after {
		if !slices.Contains(before, id) {
			out = append(out, id)
		}
	}
	return out
}

// refused posts an order that must be refused and returns the message
// the configurator shows for it.
func (w *web) refused(form map[string][]string) string {
	w.t.Helper()
	status, loc, body := w.post("/configure", "/configure/order", form, true)
	if status != http.StatusSeeOther || !strings.HasPrefix(loc, "/configure?") {
		w.t.Errorf("order %v was not refused: %d %s %s", form, status, loc, snippet(body))
		return ""
	}
	return flashOf(w.t, w)
}

// TestConfigureFlavorsStayPrivate (issue 26): an order makes a flavor only
// once everything else passed (a missing key leaves none behind), and the
// flavor it makes is the ordering project's own: another project's list
// does not grow, a project holds at most compute.MaxProjectFlavors of
// them, and one goes when the last server of its size does.
func TestConfigureFlavorsStayPrivate(t *testing.T) {
	c := startCloud(t)
	ctx := context.Background()
	admin := testenv.Compute(t, testenv.Provider(t, c, cloud.AdminUser), "2.61")
	demoPC := testenv.Provider(t, c, cloud.DemoUser)
	demo := testenv.Compute(t, demoPC, "2.61")
	otherUser, otherPW := newCustomer(t, c, "other")
	other := testenv.Compute(t, testenv.ProviderAs(t, c, otherUser, otherPW, "other"), "2.61")
	all0, other0, demo0 := flavorIDs(t, admin, true), flavorIDs(t, other, false), flavorIDs(t, demo, false)

	member := newWeb(t, c)
	member.login(demoLogin(c))
	// Small sizes of no catalogue flavor (1 vCPU, n GB, 10 GB local disk).
	shape := func(ramGB int, kv ...string) map[string][]string {
		f := choiceForm(append([]string{"vcpus", "1", "ram_gb", strconv.Itoa(ramGB), "disk_type", "local", "disk_gb", "10",
			"name", fmt.Sprintf("s%d", ramGB), "key_mode", "existing", "key_name", "mine"}, kv...)...)
		f.Del("ipv4")
		return f
	}

	// Orders whose key does not exist are refused and leave nothing.
	for ram := 1; ram <= 5; ram++ {
		if msg := member.refused(shape(ram, "key_name", "no-such-key")); !strings.Contains(msg, "no-such-key") {
			t.Errorf("a missing key is refused with %q", msg)
		}
	}
	if got := added(all0, flavorIDs(t, admin, true)); len(got) > 0 {
		t.Errorf("refused orders left flavors behind: %v", got)
	}

	// Orders of distinct sizes, up to the bound: each project sees only
	// its own.
	_, pub := testenv.NewSSHKey(t)
	resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "POST", c.ComputeURL+"/os-keypairs", demoPC.Token(),
		`{"keypair":{"name":"mine","public_key":"`+pub+`"}}`)
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	resp, raw = testenv.Do(t, testenv.HTTPClient(t, c), "PUT", c.ComputeURL+"/os-quota-sets/"+bilProject(t, c, cloud.DemoUser),
		testenv.Token(t, c, cloud.AdminUser), `{"quota_set":{"instances":1000,"cores":10000,"ram":100000000}}`)
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	start := time.Now()
	for ram := 1; ram <= compute.MaxProjectFlavors; ram++ {
		if status, loc, body := member.post("/configure", "/configure/order", shape(ram), true); status != http.StatusSeeOther || loc != "/servers" {
			t.Fatalf("order of %d GB: %d %s %s (%s)", ram, status, loc, snippet(body), flashOf(t, member))
		}
	}
	t.Logf("%d orders of distinct sizes took %v", compute.MaxProjectFlavors, time.Since(start))
	if got := added(other0, flavorIDs(t, other, false)); len(got) > 0 {
		t.Errorf("another project's flavor list grew by %v", got)
	}
	mine := added(demo0, flavorIDs(t, demo, false))
	if len(mine) != compute.MaxProjectFlavors {
		t.Errorf("the ordering project has %d flavors of its own, want %d: %v", len(mine), compute.MaxProjectFlavors, mine)
	}
	for _, id := range mine {
		f, err := flavors.Get(ctx, admin, id).Extract()
		if err != nil || f.IsPublic {
			t.Errorf("flavor %s: %+v, %v; want a private one", id, f, err)
		}
	}

	// The bound: one more size is refused, and makes nothing.
	before := flavorIDs(t, admin, true)
	if msg := member.refused(shape(compute.MaxProjectFlavors + 1)); !strings.Contains(msg, strconv.Itoa(compute.MaxProjectFlavors)) {
		t.Errorf("an order past the bound is refused with %q", msg)
	}
	if got := added(before, flavorIDs(t, admin, true)); len(got) > 0 {
		t.Errorf("an order past the bound made %v", got)
	}

	// The clean-up: the last server of a size deleted, its flavor goes,
	// and another size may be ordered.
	var list struct {
		Servers []struct {
			ID     string `json:"id"`
			Flavor struct {
				ID string `json:"id"`
			} `json:"flavor"`
		} `json:"servers"`
	}
	resp, raw = testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+"/servers/detail?name=%5Es1%24", demoPC.Token(), "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	if err := json.Unmarshal([]byte(raw), &list); err != nil || len(list.Servers) != 1 {
		t.Fatalf("server s1: %s", snippet(raw))
	}
	gone := list.Servers[0].Flavor.ID
	resp, raw = testenv.Do(t, testenv.HTTPClient(t, c), "DELETE", c.ComputeURL+"/servers/"+list.Servers[0].ID, demoPC.Token(), "")
	testenv.MustStatus(t, resp, raw, http.StatusNoContent)
	testenv.Eventually(t, 30*time.Second, "flavor "+gone+" deleted with its last server", func() bool {
		_, err := flavors.Get(ctx, admin, gone).Extract()
		return gophercloud.ResponseCodeIs(err, http.StatusNotFound)
	})
	if status, loc, body := member.post("/configure", "/configure/order", shape(compute.MaxProjectFlavors+1), true); status != http.StatusSeeOther || loc != "/servers" {
		t.Errorf("an order after the clean-up: %d %s %s (%s)", status, loc, snippet(body), flashOf(t, member))
	}
}
