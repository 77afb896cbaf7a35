package network

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"testing"

	"nimbus/internal/netstate"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// Size of the benchmark's cloud: 1,000 bridged hosts (10 of them gateway
// hosts) and 10,000 server ports on 500 networks of 500 projects, 20
// ports a network spread over the hosts, each project's default group
// with its remote-group rule, and 100 routers with a floating IP each.
const (
	benchHosts    = 1000
	benchGateways = 10
	benchNets     = 500
	benchPerNet   = 20
	benchRouters  = 100
)

// BenchmarkHostState builds one host's state in a cloud of
// benchHosts hosts and benchNets*benchPerNet ports: a compute host's and
// a gateway host's.
func BenchmarkHostState(b *testing.B) {
	for _, e := range storetest.Engines(b) {
		b.Run(e.Name, func(b *testing.B) {
			s, hosts := benchCloud(b, e.URL)
			ctx := context.Background()
			for _, kind := range []struct {
				name string
				pick func(i int) string
			}{
				{"compute-host", func(i int) string { return fmt.Sprintf("h%04d", benchGateways+i%(benchHosts-benchGateways)) }},
				{"gateway-host", func(i int) string { return fmt.Sprintf("h%04d", i%benchGateways) }},
			} {
				b.Run(kind.name, func(b *testing.B) {
					var ports, routers int
					i := 0
					for b.Loop() {
						st, err := s.HostState(ctx, kind.pick(i), hosts)
						if err != nil {
							b.Fatal(err)
						}
						ports, routers = len(st.Ports), len(st.Routers)
						i++
					}
					b.ReportMetric(float64(ports), "ports")
					b.ReportMetric(float64(routers), "routers")
				})
			}
		})
	}
}

// benchCloud fills a database with the benchmark's cloud, its DHCP ports
// and router placement made, and answers its hosts.
func benchCloud(b *testing.B, url string) (*Service, []HostInfo) {
	b.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	s := New(db)
	if err := s.Bootstrap(ctx); err != nil {
		b.Fatal(err)
	}
	hosts := make([]HostInfo, benchHosts)
	for i := range hosts {
		hosts[i] = HostInfo{Name: fmt.Sprintf("h%04d", i), VTEP: fmt.Sprintf("10.%d.%d.1", 100+i/256, i%256),
			Gateway: i < benchGateways, Up: true}
	}
	var netIDs []string
	err = db.Tx(ctx, func(tx *store.Tx) error {
		pub, err := loadNets(ctx, tx, "builtin = 'public'")
		if err != nil {
			return err
		}
		t := now()
		port := 0
		for n := range benchNets {
			project := fmt.Sprintf("p%03d", n)
			netID, err := ensureDefaults(ctx, tx, project)
			if err != nil {
				return err
			}
			netIDs = append(netIDs, netID)
			sg, err := ensureDefaultSG(ctx, tx, project)
			if err != nil {
				return err
			}
			var sub string
			if err := tx.QueryRow(ctx, "SELECT id FROM subnets WHERE network_id = ?", netID).Scan(&sub); err != nil {
				return err
			}
			var first string
			for j := range benchPerNet {
				id, server := newID(), newID()
				host := hosts[benchGateways+(port*7)%(benchHosts-benchGateways)].Name
				port++
				if _, err := tx.Exec(ctx, `INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, host,
					flavor_id, reservation_id, hostname, created_at, updated_at, doc)
					VALUES (?, ?, 'u', 'vm', 'active', ?, '1', 'r', 'vm', ?, ?, '{}')`, server, project, host, t, t); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO ports (id, network_id, project_id, mac_address, status, device_id,
					device_owner, bound_by, bound_device, security_groups, created_at, updated_at)
					VALUES (?, ?, ?, ?, 'ACTIVE', ?, 'compute:nova', ?, ?, ?, ?, ?)`, id, netID, project,
					fmt.Sprintf("fa:16:3e:%02x:%02x:%02x", port>>16, port>>8&255, port&255), server, bindCompute, server,
					store.JSON([]string{sg}), t, t); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO ip_allocations (subnet_id, ip_address, network_id, owner_id, seq)
					VALUES (?, ?, ?, ?, 0)`, sub, fmt.Sprintf("10.0.0.%d", 10+j), netID, id); err != nil {
					return err
				}
				if err := setPortSGs(ctx, tx, id, []string{sg}); err != nil {
					return err
				}
				if j == 0 {
					first = id
				}
			}
			if n < benchRouters {
				if err := benchRouter(ctx, s, tx, project, pub[0].ID, sub, first); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.ensureDHCP(ctx, netIDs); err != nil {
		b.Fatal(err)
	}
	if err := s.placeRouters(ctx, hosts); err != nil {
		b.Fatal(err)
	}
	// Statistics, as PostgreSQL's autovacuum keeps them.
	if _, err := db.Exec(ctx, "ANALYZE"); err != nil {
		b.Fatal(err)
	}
	return s, hosts
}

// benchRouter makes a router of project with its gateway, an interface on
// subnet and a floating IP for port.
func benchRouter(ctx context.Context, s *Service, tx *store.Tx, project, pub, subnet, port string) error {
	id := newID()
	gw := &portRow{ID: newID(), NetworkID: pub, Status: "ACTIVE", DeviceID: id, DeviceOwner: ownerRouterGateway,
		BoundBy: bindRouter, BoundDevice: id, AdminStateUp: true}
	if err := insertPort(ctx, tx, gw, nil, ""); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO routers (id, project_id, gw_network_id, gw_port_id, tags, created_at, updated_at)
		VALUES (?, ?, ?, ?, '[]', ?, ?)`, id, project, pub, gw.ID, now(), now()); err != nil {
		return err
	}
	itf := &portRow{ID: newID(), NetworkID: "", ProjectID: project, Status: "ACTIVE", DeviceID: id,
		DeviceOwner: ownerRouterInterface, BoundBy: bindRouter, BoundDevice: id, AdminStateUp: true}
	if err := tx.QueryRow(ctx, "SELECT network_id FROM subnets WHERE id = ?", subnet).Scan(&itf.NetworkID); err != nil {
		return err
	}
	if err := insertPort(ctx, tx, itf, []ipRequest{{SubnetID: subnet, IPAddress: "10.0.0.1"}}, ""); err != nil {
		return err
	}
	var server string
	if err := tx.QueryRow(ctx, "SELECT bound_device FROM ports WHERE id = ?", port).Scan(&server); err != nil {
		return err
	}
	_, err := s.AttachPublicIP(ctx, tx, project, server, port)
	return err
}

// BenchmarkRuleChange is one security group rule added in the benchmark's
// cloud with an agent long-polling on every host: the time until every
// affected host's new state is ready. per-host is one build for each
// waiting host, as every poll rebuilt its own state on each change;
// one-build is HostStates over all of them, as the controller's change
// feed now builds them. Both compare each state's digest with the one
// before to find the hosts the change affected.
func BenchmarkRuleChange(b *testing.B) {
	for _, e := range storetest.Engines(b) {
		b.Run(e.Name, func(b *testing.B) {
			s, hosts := benchCloud(b, e.URL)
			ctx := context.Background()
			names := make([]string, len(hosts))
			for i, h := range hosts {
				names[i] = h.Name
			}
			i := 0 // rules made, across the ways: each rule is new
			for _, way := range []struct {
				name  string
				build func() (map[string]*netstate.Host, error)
			}{
				{"per-host", func() (map[string]*netstate.Host, error) {
					out := map[string]*netstate.Host{}
					for _, h := range names {
						st, err := s.HostState(ctx, h, hosts)
						if err != nil {
							return nil, err
						}
						out[h] = st
					}
					return out, nil
				}},
				{"one-build", func() (map[string]*netstate.Host, error) { return s.HostStates(ctx, names, hosts) }},
			} {
				b.Run(way.name, func(b *testing.B) {
					sums := map[string][32]byte{}
					states, err := way.build()
					if err != nil {
						b.Fatal(err)
					}
					for h, st := range states {
						sums[h] = digest(st)
					}
					var affected int
					for b.Loop() {
						b.StopTimer()
						project := fmt.Sprintf("p%03d", i%benchNets)
						i++
						err := s.db.Tx(ctx, func(tx *store.Tx) error {
							sg, err := ensureDefaultSG(ctx, tx, project)
							if err != nil {
								return err
							}
							port := 1000 + i
							return insertRule(ctx, tx, &ruleRow{ID: newID(), SecurityGroupID: sg, ProjectID: project,
								Direction: "ingress", Ethertype: "IPv4", Protocol: strPtr("tcp"), PortMin: &port, PortMax: &port})
						})
						if err != nil {
							b.Fatal(err)
						}
						s.NetworkChanged()
						b.StartTimer()
						states, err := way.build()
						if err != nil {
							b.Fatal(err)
						}
						affected = 0
						for h, st := range states {
							if sum := digest(st); sum != sums[h] {
								sums[h] = sum
								affected++
							}
						}
					}
					b.ReportMetric(float64(affected), "affected-hosts")
				})
			}
		})
	}
}

func strPtr(s string) *string { return &s }

// digest is fleet.Digest: a state's content, its revision aside.
func digest(st *netstate.Host) [32]byte {
	c := *st
	c.Revision = 0
	j, _ := json.Marshal(&c)
	return sha256.Sum256(j)
}
