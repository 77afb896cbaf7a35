package region

import (
	"fmt"
	"testing"
)

// Region is docs/operator.md's region on loopback: PostgreSQL under
// Patroni on three etcd members, three controllers (--no-local-agent) on
// its multi-host URL, and HAProxy in front of them.
type Region struct {
	Cluster     *Cluster
	Bin         string // the nimbus binary
	Controllers []*Controller
	Balancer    *Balancer
	CA          string // the controllers' CA certificate
}

// StartRegion starts a region: HAProxy on lb, a controller on each of
// addrs, all on the same ports, each with args besides the flags every
// region controller takes.
func StartRegion(t testing.TB, lb string, addrs []string, args ...string) *Region {
	t.Helper()
	r := &Region{Cluster: StartCluster(t), Bin: Build(t)}
	ports := SharedPorts(t, append([]string{lb}, addrs...)...)
	for i, a := range addrs {
		cfg := ControllerConfig{Bin: r.Bin, DatabaseURL: r.Cluster.URL, Addr: a, Ports: ports, PublicHost: lb,
			Args: append([]string{"--no-local-agent", "--trusted-proxies", lb}, args...)}
		if i > 0 {
			cfg.CA = r.Controllers[0].Dir // docs/operator.md: every controller after the first gets its CA and secrets
		}
		r.Controllers = append(r.Controllers, StartController(t, fmt.Sprintf("controller%d", i+1), cfg))
	}
	r.CA = r.Controllers[0].CACert()
	r.Balancer = StartBalancer(t, lb, r.CA, ports, r.Controllers...)
	return r
}

// Procs are the balancer's and the controllers' processes, whose logs'
// tails a failure shows.
func (r *Region) Procs() []*Proc {
	out := []*Proc{r.Balancer.Proc}
	for _, c := range r.Controllers {
		out = append(out, c.Proc)
	}
	return out
}

// StartAgent starts an agent of the fake driver with the hosts in fleet,
// its state in dir, reaching the controllers through HAProxy.
func (r *Region) StartAgent(t testing.TB, dir, fleet string, args ...string) *Proc {
	t.Helper()
	return StartAgent(t, r.Bin, r.Controllers[0].Dir, r.Cluster.URL, r.Balancer.URL("agent"), r.CA, dir, fleet, args...)
}
