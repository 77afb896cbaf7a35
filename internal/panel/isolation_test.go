package panel_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// newCustomer makes a project with a member user through Keystone's API,
// as an operator would, and returns the user's name and password.
func newCustomer(t *testing.T, c *cloud.Cloud, name string) (string, string) {
	t.Helper()
	ctx := context.Background()
	id, err := openstack.NewIdentityV3(testenv.Provider(t, c, cloud.AdminUser), gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := projects.Create(ctx, id, projects.CreateOpts{Name: name, DomainID: "default"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	pw := name + "-password-1"
	u, err := users.Create(ctx, id, users.CreateOpts{Name: name + "@example.com", Password: pw, DomainID: "default", DefaultProjectID: p.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := roles.List(id, roles.ListOpts{Name: "member"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	member, _ := roles.ExtractRoles(rs)
	if err := roles.Assign(ctx, id, member[0].ID, roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	return u.Name, pw
}

// TestCustomersAreApart: a second customer reaches none of the first one's
// pages or actions by URL, and a form without its token changes nothing.
func TestCustomersAreApart(t *testing.T) {
	c := startCloud(t)
	ctx := context.Background()
	demo := testenv.Provider(t, c, cloud.DemoUser)
	nova := testenv.Compute(t, demo, "2.96")
	neutron, err := openstack.NewNetworkV2(demo, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	np, err := networks.List(neutron, networks.ListOpts{Name: "private"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nets, _ := networks.ExtractNetworks(np)
	srv, err := servers.Create(ctx, nova, servers.CreateOpts{Name: "secret-box", FlavorRef: "d1.2g.local",
		ImageRef: imageID(t, c, demo, "Debian 12"), Networks: []servers.Network{{UUID: nets[0].ID}}}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if err := servers.WaitForStatus(ctx, nova, srv.ID, "ACTIVE"); err != nil {
		t.Fatal(err)
	}
	owner := newWeb(t, c)
	owner.login(demoLogin(c))
	owner.post("/keys", "/keys", url.Values{"name": {"demo-key"}, "generate": {"yes"}}, true)

	other := newWeb(t, c)
	other.login(newCustomer(t, c, "rival"))
	for _, path := range []string{"/servers/" + srv.ID, "/servers/" + srv.ID + "/delete"} {
		status, _, body := other.get(path)
		if status != http.StatusNotFound && status != http.StatusForbidden {
			t.Errorf("GET %s as another customer: %d", path, status)
		}
		if strings.Contains(body, "secret-box") {
			t.Errorf("GET %s as another customer shows the server's name", path)
		}
	}
	for _, path := range []string{"/servers/" + srv.ID + "/stop", "/servers/" + srv.ID + "/delete",
		"/networks/" + nets[0].ID + "/delete", "/keys/demo-key/delete"} {
		other.post("/servers", path, url.Values{"confirm": {"yes"}}, true)
	}
	// Without its form token, the owner's own stop is refused too.
	if status, _, _ := owner.post("/servers", "/servers/"+srv.ID+"/stop", url.Values{}, false); status != http.StatusForbidden {
		t.Errorf("stop without a form token: %d, want 403", status)
	}
	got, err := servers.Get(ctx, nova, srv.ID).Extract()
	if err != nil || got.Status != "ACTIVE" {
		t.Fatalf("after the other customer's tries the server is %v, %v", got, err)
	}
	if _, err := networks.Get(ctx, neutron, nets[0].ID).Extract(); err != nil {
		t.Fatalf("the network is gone: %v", err)
	}
	if _, _, body := owner.get("/keys"); !strings.Contains(body, "demo-key") {
		t.Fatal("the other customer deleted the key")
	}
	if _, _, body := other.get("/servers"); strings.Contains(body, "secret-box") {
		t.Fatal("the other customer's list shows the server")
	}
}

// imageID is the id of the image called name.
func imageID(t *testing.T, c *cloud.Cloud, pc *gophercloud.ProviderClient, name string) string {
	t.Helper()
	hc := testenv.HTTPClient(t, c)
	req, _ := http.NewRequest(http.MethodGet, c.ImageURL+"/v2/images?name="+url.QueryEscape(name), nil)
	req.Header.Set("X-Auth-Token", pc.Token())
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Images []struct {
			ID string `json:"id"`
		} `json:"images"`
	}
	if err := jsonDecode(resp, &out); err != nil || len(out.Images) == 0 {
		t.Fatalf("no image %q: %v", name, err)
	}
	return out.Images[0].ID
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }
