package region

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Balancer is HAProxy from deploy/region/haproxy.cfg in front of
// controllers.
type Balancer struct {
	*Proc
	Addr  string
	Ports map[string]int
}

// SharedPorts picks, for each service, a port free on every address, so
// that the balancer and the controllers use the same ports as docs/operator.md's
// region does (the catalog names the controller's ports at the
// balancer's address).
func SharedPorts(t testing.TB, addrs ...string) map[string]int {
	t.Helper()
	ports := map[string]int{}
	for _, s := range Services {
		for try := 0; ; try++ {
			p := FreePort(t, addrs[0])
			if freeOn(p, addrs[1:]) {
				ports[s] = p
				break
			}
			if try > 50 {
				t.Fatalf("no port free on %v", addrs)
			}
		}
	}
	return ports
}

func freeOn(port int, addrs []string) bool {
	for _, a := range addrs {
		ln, err := net.Listen("tcp", net.JoinHostPort(a, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

// StartBalancer renders haproxy.cfg for the controllers, which listen on
// ports at their addresses, starts HAProxy at addr and waits until every
// service answers through it.
func StartBalancer(t testing.TB, addr, caFile string, ports map[string]int, controllers ...*Controller) *Balancer {
	t.Helper()
	Need(t, "NIMBUS_REQUIRE_PGHA", "haproxy")
	if len(controllers) != 3 {
		t.Fatalf("haproxy.cfg names three controllers, not %d", len(controllers))
	}
	vars := map[string]string{"LB_ADDR": addr, "NIMBUS_CA": caFile}
	for i, c := range controllers {
		vars["CONTROLLER_"+strconv.Itoa(i+1)] = c.Addr
	}
	for _, s := range Services {
		vars[strings.ToUpper(s)+"_PORT"] = strconv.Itoa(ports[s])
	}
	cfg := Render(t, "deploy/region/haproxy.cfg", t.TempDir(), vars)
	run(t, nil, nil, "haproxy", "-c", "-q", "-f", cfg)
	b := &Balancer{Proc: Start(t, "haproxy", nil, nil, "haproxy", "-db", "-f", cfg), Addr: addr, Ports: ports}
	client, err := HTTPClient(caFile, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 30*time.Second, "every service through haproxy", func() bool {
		for _, s := range Services {
			resp, err := client.Get(b.URL(s) + "/healthz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	}, b.Proc)
	return b
}

// URL is the balancer's URL of a service.
func (b *Balancer) URL(service string) string {
	return "https://" + net.JoinHostPort(b.Addr, strconv.Itoa(b.Ports[service]))
}
