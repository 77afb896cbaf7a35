package qemu

import (
	"reflect"
	"strings"
	"testing"

	"nimbus/internal/driver"
)

func TestUserNetNetdev(t *testing.T) {
	base := driver.Port{ID: "p1", MAC: "fa:16:3e:11:22:33", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", DNS: []string{"8.8.8.8"}}
	with := func(f func(*driver.Port)) driver.Port {
		p := base
		p.DNS = append([]string(nil), base.DNS...)
		f(&p)
		return p
	}
	cases := []struct {
		name     string
		u        UserNet
		nic      string
		port     driver.Port
		forwards map[int]int
		want     string
		wantErr  string
	}{
		{name: "ssh forward, outside DNS → .3", nic: "net0", port: base, forwards: map[int]int{22: 2222},
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.5,dns=10.0.0.3,ipv6=off,restrict=off,hostfwd=tcp:0.0.0.0:2222-10.0.0.5:22"},
		{name: "listen address, two forwards sorted", u: UserNet{ListenAddr: "127.0.0.1"}, nic: "net0", port: base, forwards: map[int]int{3389: 40001, 22: 40000},
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.5,dns=10.0.0.3,ipv6=off,restrict=off,hostfwd=tcp:127.0.0.1:40000-10.0.0.5:22,hostfwd=tcp:127.0.0.1:40001-10.0.0.5:3389"},
		{name: "no forwards (second port)", nic: "net1", port: with(func(p *driver.Port) { p.IP, p.CIDR, p.Gateway = "192.168.7.20", "192.168.7.0/24", "192.168.7.254" }),
			want: "user,id=net1,net=192.168.7.0/24,host=192.168.7.254,dhcpstart=192.168.7.20,dns=192.168.7.3,ipv6=off,restrict=off"},
		{name: "DNS inside the subnet is used", nic: "net0", port: with(func(p *driver.Port) { p.DNS = []string{"10.0.0.53", "10.0.0.54"} }),
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.5,dns=10.0.0.53,ipv6=off,restrict=off"},
		{name: "DNS equal to the gateway is not", nic: "net0", port: with(func(p *driver.Port) { p.DNS = []string{"10.0.0.1"} }),
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.5,dns=10.0.0.3,ipv6=off,restrict=off"},
		{name: ".3 is the fixed IP → last usable", nic: "net0", port: with(func(p *driver.Port) { p.IP = "10.0.0.3"; p.DNS = nil }),
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.3,dns=10.0.0.254,ipv6=off,restrict=off"},
		{name: ".3 is the gateway → last usable", nic: "net0", port: with(func(p *driver.Port) { p.Gateway = "10.0.0.3" }),
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.3,dhcpstart=10.0.0.5,dns=10.0.0.254,ipv6=off,restrict=off"},
		{name: "/29 all taken but one", nic: "net0", port: with(func(p *driver.Port) { p.CIDR, p.IP, p.Gateway = "10.1.1.8/29", "10.1.1.14", "10.1.1.11" }),
			want: "user,id=net0,net=10.1.1.8/29,host=10.1.1.11,dhcpstart=10.1.1.14,dns=10.1.1.9,ipv6=off,restrict=off"},
		{name: "no gateway → first free", nic: "net0", port: with(func(p *driver.Port) { p.Gateway = "" }),
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.5,dns=10.0.0.3,ipv6=off,restrict=off"},
		{name: "empty port → slirp defaults", nic: "net0", port: driver.Port{}, forwards: map[int]int{22: 2222},
			want: "user,id=net0,ipv6=off,restrict=off,hostfwd=tcp:0.0.0.0:2222-:22"},
		{name: "CIDR not masked", nic: "net0", port: with(func(p *driver.Port) { p.CIDR = "10.0.0.77/24" }),
			want: "user,id=net0,net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.5,dns=10.0.0.3,ipv6=off,restrict=off"},

		{name: "bad CIDR", nic: "net0", port: with(func(p *driver.Port) { p.CIDR = "10.0.0.0" }), wantErr: "bad CIDR"},
		{name: "IPv6 subnet", nic: "net0", port: with(func(p *driver.Port) { p.CIDR, p.IP = "fd00::/64", "fd00::5" }), wantErr: "not IPv4"},
		{name: "subnet too small", nic: "net0", port: with(func(p *driver.Port) { p.CIDR, p.IP, p.Gateway = "10.0.0.4/30", "10.0.0.5", "10.0.0.6" }), wantErr: "too small"},
		{name: "fixed IP outside", nic: "net0", port: with(func(p *driver.Port) { p.IP = "10.0.1.5" }), wantErr: "fixed IP 10.0.1.5 is not a usable address"},
		{name: "fixed IP is broadcast", nic: "net0", port: with(func(p *driver.Port) { p.IP = "10.0.0.255" }), wantErr: "not a usable address"},
		{name: "fixed IP not an IP", nic: "net0", port: with(func(p *driver.Port) { p.IP = "ten" }), wantErr: "bad IPv4 fixed IP"},
		{name: "gateway outside", nic: "net0", port: with(func(p *driver.Port) { p.Gateway = "10.9.0.1" }), wantErr: "gateway 10.9.0.1 is not a usable address"},
		{name: "gateway is the fixed IP", nic: "net0", port: with(func(p *driver.Port) { p.Gateway = "10.0.0.5" }), wantErr: "is the fixed IP"},
		{name: "bad MAC", nic: "net0", port: with(func(p *driver.Port) { p.MAC = "fa:16:3e:11:22" }), wantErr: "bad MAC"},
		{name: "EUI-64 MAC", nic: "net0", port: with(func(p *driver.Port) { p.MAC = "02:00:5e:10:00:00:00:01" }), wantErr: "bad MAC"},
		{name: "no MAC", nic: "net0", port: with(func(p *driver.Port) { p.MAC = "" }), wantErr: "bad MAC"},
		{name: "no CIDR", nic: "net0", port: with(func(p *driver.Port) { p.CIDR = "" }), wantErr: "bad CIDR"},
		{name: "bad NIC id", nic: "0net", port: base, wantErr: "bad NIC id"},
		{name: "NIC id with comma", nic: "net0,x", port: base, wantErr: "bad NIC id"},
		{name: "bad host port", nic: "net0", port: base, forwards: map[int]int{22: 70000}, wantErr: "bad forward"},
		{name: "bad listen address", u: UserNet{ListenAddr: "::"}, nic: "net0", port: base, wantErr: "bad listen address"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.u.Netdev(c.nic, c.port, c.forwards)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one containing %q (got %q)", err, c.wantErr, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("Netdev =\n  %s\nwant\n  %s", got, c.want)
			}
		})
	}
}

func TestUserNetAccess(t *testing.T) {
	cases := []struct {
		name     string
		u        UserNet
		forwards map[int]int
		want     []driver.Access
	}{
		{"none", UserNet{AccessHost: "h"}, nil, nil},
		{"ssh and rdp sorted, others left out", UserNet{AccessHost: "compute1.example.org"}, map[int]int{3389: 40001, 22: 40000, 80: 40002},
			[]driver.Access{{Protocol: "ssh", Host: "compute1.example.org", Port: 40000}, {Protocol: "rdp", Host: "compute1.example.org", Port: 40001}}},
		{"listen address as host", UserNet{ListenAddr: "192.0.2.10"}, map[int]int{22: 2222},
			[]driver.Access{{Protocol: "ssh", Host: "192.0.2.10", Port: 2222}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.u.Access(c.forwards); !reflect.DeepEqual(got, c.want) {
				t.Errorf("Access = %+v, want %+v", got, c.want)
			}
		})
	}
	// With neither AccessHost nor a specific ListenAddr, some host name.
	if got := (UserNet{}).Access(map[int]int{22: 2222}); len(got) != 1 || got[0].Host == "" || got[0].Host == "0.0.0.0" {
		t.Errorf("Access without host = %+v", got)
	}
}
