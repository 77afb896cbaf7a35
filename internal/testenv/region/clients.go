package region

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
)

// Clients are a region's customer and operator as gophercloud sees them,
// through its catalog.
type Clients struct {
	Admin, Demo                *gophercloud.ProviderClient
	Compute, Network           *gophercloud.ServiceClient // the demo project's
	Volume, Image              *gophercloud.ServiceClient // the demo project's
	AdminCompute, AdminNetwork *gophercloud.ServiceClient
	DemoProject                string
}

// Connect authenticates the first accounts at identityURL, trusting
// caFile, with deadline on every request.
func Connect(t testing.TB, identityURL, caFile string, deadline time.Duration) *Clients {
	t.Helper()
	c := &Clients{
		Admin: provider(t, identityURL, caFile, deadline, "admin", AdminPassword),
		Demo:  provider(t, identityURL, caFile, deadline, "demo", DemoPassword),
	}
	c.Compute, c.Network = services(t, c.Demo)
	c.AdminCompute, c.AdminNetwork = services(t, c.Admin)
	var err error
	if c.Volume, err = openstack.NewBlockStorageV3(c.Demo, gophercloud.EndpointOpts{}); err != nil {
		t.Fatal(err)
	}
	if c.Image, err = openstack.NewImageV2(c.Demo, gophercloud.EndpointOpts{}); err != nil {
		t.Fatal(err)
	}
	res, ok := c.Demo.GetAuthResult().(tokens.CreateResult)
	if !ok {
		t.Fatalf("auth result %T", c.Demo.GetAuthResult())
	}
	p, err := res.ExtractProject()
	if err != nil {
		t.Fatal(err)
	}
	c.DemoProject = p.ID
	return c
}

func provider(t testing.TB, identityURL, caFile string, deadline time.Duration, user, password string) *gophercloud.ProviderClient {
	t.Helper()
	pc, err := openstack.NewClient(identityURL)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := HTTPClient(caFile, deadline)
	if err != nil {
		t.Fatal(err)
	}
	pc.HTTPClient = *hc
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := openstack.Authenticate(ctx, pc, gophercloud.AuthOptions{IdentityEndpoint: identityURL,
		Username: user, Password: password, DomainID: "default", TenantName: user, AllowReauth: true}); err != nil {
		t.Fatalf("authenticate %s: %v", user, err)
	}
	return pc
}

func services(t testing.TB, pc *gophercloud.ProviderClient) (compute, network *gophercloud.ServiceClient) {
	t.Helper()
	compute, err := openstack.NewComputeV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	network, err = openstack.NewNetworkV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	return compute, network
}

// Unlimit lifts the demo project's quotas that a load fills.
func (c *Clients) Unlimit(t testing.TB) {
	projectID := c.DemoProject
	t.Helper()
	ctx := context.Background()
	_, err := c.AdminCompute.Put(ctx, c.AdminCompute.ServiceURL("os-quota-sets", projectID),
		map[string]any{"quota_set": map[string]int{"instances": -1, "cores": -1, "ram": -1, "key_pairs": -1}}, nil,
		&gophercloud.RequestOpts{OkCodes: []int{http.StatusOK}})
	if err != nil {
		t.Fatalf("compute quotas: %v", err)
	}
	_, err = c.AdminNetwork.Put(ctx, c.AdminNetwork.ServiceURL("quotas", projectID),
		map[string]any{"quota": map[string]int{"security_group": -1, "security_group_rule": -1, "port": -1}}, nil,
		&gophercloud.RequestOpts{OkCodes: []int{http.StatusOK}})
	if err != nil {
		t.Fatalf("network quotas: %v", err)
	}
	av, err := openstack.NewBlockStorageV3(c.Admin, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = av.Put(ctx, av.ServiceURL("os-quota-sets", projectID),
		map[string]any{"quota_set": map[string]int{"volumes": -1, "gigabytes": -1}}, nil,
		&gophercloud.RequestOpts{OkCodes: []int{http.StatusOK}})
	if err != nil {
		t.Fatalf("volume quotas: %v", err)
	}
}

// BootChoice is what a customer would boot: the first public image, the
// smallest flavor that holds it, and the private network.
func (c *Clients) BootChoice(t testing.TB) (image, flavor, network string) {
	t.Helper()
	ctx := context.Background()
	ic, err := openstack.NewImageV2(c.Demo, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := images.List(ic, images.ListOpts{}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	imgs, _ := images.ExtractImages(ip)
	if len(imgs) == 0 {
		t.Fatal("no image")
	}
	img := imgs[0]
	fp, err := flavors.ListDetail(c.Compute, nil).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fl, _ := flavors.ExtractFlavors(fp)
	best := -1
	for i, f := range fl {
		if f.Disk >= img.MinDiskGigabytes && f.RAM >= img.MinRAMMegabytes && f.ExtraSpecs == nil &&
			(best < 0 || f.VCPUs*100000+f.RAM < fl[best].VCPUs*100000+fl[best].RAM) {
			best = i
		}
	}
	if best < 0 {
		t.Fatal("no flavor holds the image")
	}
	np, err := networks.List(c.Network, networks.ListOpts{Name: "private"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nets, _ := networks.ExtractNetworks(np)
	if len(nets) != 1 {
		t.Fatalf("%d private networks", len(nets))
	}
	return img.ID, fl[best].ID, nets[0].ID
}

// HostUp tells whether the compute service of host is up, as the operator
// sees it.
func (c *Clients) HostUp(t testing.TB, host string) bool {
	t.Helper()
	var out struct {
		Services []struct {
			Host  string `json:"host"`
			State string `json:"state"`
		} `json:"services"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.AdminCompute.Get(ctx, c.AdminCompute.ServiceURL("os-services")+"?binary=nova-compute", &out, nil); err != nil {
		return false
	}
	for _, s := range out.Services {
		if s.Host == host && s.State == "up" {
			return true
		}
	}
	return false
}

// HostsUp counts the compute services up, as the operator sees them.
func (c *Clients) HostsUp(t testing.TB) int {
	t.Helper()
	var out struct {
		Services []struct {
			State string `json:"state"`
		} `json:"services"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.AdminCompute.Get(ctx, c.AdminCompute.ServiceURL("os-services")+"?binary=nova-compute", &out, nil); err != nil {
		return 0
	}
	n := 0
	for _, s := range out.Services {
		if s.State == "up" {
			n++
		}
	}
	return n
}

// Writes makes one security group and answers its status (0: no answer).
func (c *Clients) Writes(t testing.TB) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Network.Post(ctx, c.Network.ServiceURL("security-groups"),
		map[string]any{"security_group": map[string]any{"name": "probe"}}, nil, &gophercloud.RequestOpts{OkCodes: []int{201}})
	if err != nil {
		if resp != nil {
			return resp.StatusCode
		}
		return 0
	}
	return resp.StatusCode
}
