package netplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	"nimbus/internal/netstate"
)

// BenchmarkApply1000Rules applies a host state of 10 ports, each in its
// own group of 100 rules (port ranges, prefixes, remote groups with 50
// members), to a fresh host namespace: the whole ruleset in one
// transaction, as every apply does. Every other apply has one rule less,
// so each is a change (and checks the tracked connections).
func BenchmarkApply1000Rules(b *testing.B) {
	host := testNS(b)
	fw, err := newFirewall(Config{NetNS: host})
	if err != nil {
		b.Fatal(err)
	}
	states := [2]*netstate.Host{benchState(10, 100), benchState(10, 100)}
	states[1].SecurityGroups[0].Rules = states[1].SecurityGroups[0].Rules[1:]
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	i := 0
	for b.Loop() {
		if err := fw.apply(ctx, states[i%2]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(b.N), "ms/op")
}

func benchState(ports, rules int) *netstate.Host {
	st := &netstate.Host{Networks: []netstate.Network{{ID: "benchnet", VNI: 7, MTU: 1450}}}
	for i := range ports {
		gid := fmt.Sprintf("bench-sg-%02d", i)
		g := netstate.SecurityGroup{ID: gid, Stateful: true}
		for j := range 50 {
			g.Members = append(g.Members, fmt.Sprintf("10.1.%d.%d", i, j+1))
		}
		for j := range rules {
			r := netstate.Rule{ID: fmt.Sprintf("%s-r%d", gid, j), Direction: "ingress", Ethertype: "IPv4", Protocol: "tcp",
				PortMin: ptr(1000 + j), PortMax: ptr(1000 + j + j%3)}
			switch j % 4 {
			case 0:
				r.RemoteIPPrefix = fmt.Sprintf("192.168.%d.0/24", j)
			case 1:
				r.RemoteGroupID = fmt.Sprintf("bench-sg-%02d", (i+1)%ports)
			case 2:
				r.Direction, r.Protocol = "egress", "udp"
			case 3:
				r.Ethertype, r.RemoteIPPrefix = "IPv6", fmt.Sprintf("2001:db8:%x::/48", j)
			}
			g.Rules = append(g.Rules, r)
		}
		st.SecurityGroups = append(st.SecurityGroups, g)
		st.Ports = append(st.Ports, netstate.Port{ID: fmt.Sprintf("benchport-%02d", i), NetworkID: "benchnet",
			MAC: fmt.Sprintf("fa:16:3e:01:00:%02x", i), PortSecurity: true, SecurityGroups: []string{gid},
			IPs: []netstate.FixedIP{{IP: fmt.Sprintf("10.1.%d.1", i)}}})
	}
	return st
}
