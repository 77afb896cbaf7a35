package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsecurity"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"nimbus/internal/cloud"
	"nimbus/internal/netstate"
	"nimbus/internal/testenv"
)

// TestMetadataSpoof: the metadata service knows a guest by its network
// and source address, so a guest that takes another's address must get
// nothing. Two servers of one network run on the same host, where the
// controller's check that the server runs on the asking agent's hosts
// does not help: only the port's anti-spoofing rules stand between the
// attacker and the victim's metadata. The attacker asks 169.254.169.254
// from the victim's address, then with the victim's MAC too; it gets no
// answer at all, and a counter in the metadata proxy's namespace (the
// test's own nftables table there) shows that not one packet from the
// victim's address arrived. Its own requests, before and after, work and
// are counted. (A short name: the lab's temporary directory holds QEMU's
// unix sockets, whose paths are limited to 107 bytes.)
func TestMetadataSpoof(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs in a lab of network namespaces")
	}
	guest := testenv.TestGuest(t)
	l := startNetlab(t)
	ctx := context.Background()
	l.waitHostsUp(ctx)
	a := l.tenant(ctx, guest, l.provider(cloud.DemoUser, labDemoPassword, cloud.DemoProject))
	flavor := a.q.flavor(ctx, "lab.1c", 1, 256, 1)
	victim, victimIP, host := a.boot(ctx, l, "victim", flavor)
	attacker, attackerIP, attackerHost := a.bootWith(ctx, l, "attacker", flavor, servers.SchedulerHintOpts{SameHost: []string{victim}})
	if attackerHost != host {
		t.Fatalf("attacker on %s, victim on %s despite same_host", attackerHost, host)
	}
	_, victimMAC := serverPort(ctx, t, a, victim)
	attackerPort, attackerMAC := serverPort(ctx, t, a, attacker)
	fip := a.floatingIP(ctx, attacker)

	// The observers, the test's own nftables tables (the data plane
	// leaves tables not its own alone): counters of TCP to port 80 by
	// source MAC and address, on the attacker's tap (what its guest sent)
	// and in the network's DHCP namespace on the host, where the metadata
	// proxy listens (what arrived).
	tap := watch{t: t, ns: l.ns[host], dev: netstate.TapName(attackerPort)}
	dhcp := watch{t: t, ns: l.prefix + host + "-dhcp-" + netstate.ShortID(a.netID), dev: "eth0"}
	tap.start()
	dhcp.start()
	t.Cleanup(tap.stop)
	for _, w := range []watch{tap, dhcp} {
		w.count(attackerMAC, attackerIP)
		w.count(attackerMAC, victimIP)
		w.count(victimMAC, victimIP)
	}

	// The attacker's own request works (and is counted): the way to the
	// service is open, and the observer sees it.
	const get = "timeout 8 wget -q -O- http://169.254.169.254/openstack/latest/meta_data.json" // (busybox 1.35's wget -T crashes)
	out, err := l.sshFrom(ctx, a, fip, get+" 2>&1")
	if err != nil || !strings.Contains(out, `"uuid":"`+attacker+`"`) {
		t.Fatalf("the attacker's own metadata: %v\n%s\n%s", err, out, l.agents[host].tail())
	}
	if tap.counted(attackerMAC, attackerIP) == 0 || dhcp.counted(attackerMAC, attackerIP) == 0 {
		t.Fatal("the observers counted none of the attacker's own requests")
	}

	results := spoofMetadata(ctx, t, l, a, fip, victimIP, victimMAC, get)
	for _, part := range strings.Split(results, "---")[1:] {
		if strings.Contains(part, "uuid") || strings.Contains(part, "HTTP/") || strings.Contains(part, "exit 0") || !strings.Contains(part, "exit ") {
			t.Errorf("a request from the victim's address got an answer (or did not run):\n%s", part)
		}
	}
	if strings.Contains(results, victim) {
		t.Errorf("the attacker read the victim's metadata (%s):\n%s", victim, results)
	}
	sent := map[string]int{}
	for _, mac := range []string{attackerMAC, victimMAC} {
		n, arrived := tap.counted(mac, victimIP), dhcp.counted(mac, victimIP)
		t.Logf("from %s %s: %d packets sent, %d arrived at the metadata proxy", mac, victimIP, n, arrived)
		if n == 0 {
			t.Errorf("the attacker's guest sent nothing from %s %s: the spoofing was not tried", mac, victimIP)
		}
		if arrived != 0 {
			t.Errorf("%d packets from %s %s reached the metadata proxy's namespace", arrived, mac, victimIP)
		}
		sent[mac] = n
	}
	// And the attacker, itself again, is answered as itself.
	before := dhcp.counted(attackerMAC, attackerIP)
	out, err = l.sshFrom(ctx, a, fip, get+" 2>&1")
	if err != nil || !strings.Contains(out, `"uuid":"`+attacker+`"`) || dhcp.counted(attackerMAC, attackerIP) <= before {
		t.Errorf("the attacker's own metadata afterwards: %v\n%s", err, out)
	}

	// The control: without anti-spoofing on the attacker's port (which
	// only an admin or the network's owner, here the attacker's own
	// project, may turn off), the same spoofing reaches the proxy's
	// namespace, so the observers above would have seen it. (The
	// attacker then reads the victim's metadata, as a guest can in
	// Neutron: the address is all the service knows a guest by. Here
	// both are the owner's own servers.)
	noSG, off := []string{}, false
	if _, err := ports.Update(ctx, a.network, attackerPort, portsecurity.PortUpdateOptsExt{
		UpdateOptsBuilder: ports.UpdateOpts{SecurityGroups: &noSG}, PortSecurityEnabled: &off}).Extract(); err != nil {
		t.Fatalf("turning the attacker's port security off: %v", err)
	}
	// The host applies it: the attacker's tap leaves the bridge table,
	// its anti-spoofing chain with it.
	waitFor(t, 30*time.Second, "the attacker's port unsecured on "+host, func() bool {
		rs, _ := l.in(host, "nft", "list", "table", "bridge", "nimbus")
		return !strings.Contains(rs, netstate.TapName(attackerPort))
	})
	results = spoofMetadata(ctx, t, l, a, fip, victimIP, victimMAC, get)
	arrived := dhcp.counted(attackerMAC, victimIP) + dhcp.counted(victimMAC, victimIP)
	t.Logf("without port security: %d packets from the victim's address arrived at the metadata proxy; the attacker's requests:\n%s", arrived, results)
	if tap.counted(attackerMAC, victimIP) == sent[attackerMAC] || arrived == 0 {
		t.Errorf("without port security the spoofed requests were not sent or not seen arriving: the observers prove nothing")
	}

	for _, id := range []string{attacker, victim} {
		must(t, servers.Delete(ctx, a.q.compute, id).ExtractErr())
	}
	for _, id := range []string{attacker, victim} {
		waitGone(t, a.q.compute, id)
	}
}

// spoofMetadata has the attacker (reached over SSH at fip) ask the
// metadata service with command get, from victimIP, then with victimMAC
// too, and returns what each request printed and how it exited, after
// "---" lines. It runs in the guest's background: with the victim's MAC
// the SSH session stalls until the MAC is back. The gateway's ARP entry
// is pinned (again after the MAC changed, which flushes it; busybox's ip
// has no "neigh replace"), so that what is tried is IP from the victim's
// address, not only an ARP request speaking for it (which anti-spoofing
// drops as well).
func spoofMetadata(ctx context.Context, t *testing.T, l *netlab, tn *labTenant, fip, victimIP, victimMAC, get string) string {
	t.Helper()
	script := fmt.Sprintf(`rm -f /tmp/spoof-*
gw=$(ip -4 route show 169.254.169.254 | awk '{print $3}')
gwmac=$(ip neigh show "$gw" | awk '{for (i = 1; i < NF; i++) if ($i == "lladdr") print $(i+1)}')
echo "gateway $gw $gwmac"
(
mac=$(cat /sys/class/net/eth0/address)
arp -i eth0 -s "$gw" "$gwmac"
ip addr add %[1]s/32 dev eth0
ip route replace 169.254.169.254/32 via "$gw" dev eth0 src %[1]s
%[3]s >/tmp/spoof-ip 2>&1; echo "exit $?" >>/tmp/spoof-ip
ip link set eth0 address %[2]s
arp -i eth0 -s "$gw" "$gwmac"
%[3]s >/tmp/spoof-ip-mac 2>&1; echo "exit $?" >>/tmp/spoof-ip-mac
arp -i eth0 -d "$gw"
ip link set eth0 address "$mac"
ip route replace 169.254.169.254/32 via "$gw" dev eth0
ip addr del %[1]s/32 dev eth0
echo done >/tmp/spoof-done
) >/tmp/spoof-log 2>&1 </dev/null &`, victimIP, victimMAC, get)
	if out, err := l.sshFrom(ctx, tn, fip, script); err != nil || !strings.Contains(out, "gateway 10.") {
		t.Fatalf("the spoofing script: %v\n%s", err, out)
	}
	var results string
	waitFor(t, 90*time.Second, "the spoofing script done", func() bool {
		var err error
		results, err = l.sshFrom(ctx, tn, fip, "cat /tmp/spoof-done /tmp/spoof-log; echo '--- from the victim address:'; cat /tmp/spoof-ip; echo '--- and its MAC:'; cat /tmp/spoof-ip-mac")
		return err == nil && strings.HasPrefix(results, "done")
	})
	t.Logf("the attacker's requests as the victim:\n%s", results)
	return results
}

// serverPort is the id and MAC address of server id's one port.
func serverPort(ctx context.Context, t *testing.T, tn *labTenant, id string) (portID, mac string) {
	t.Helper()
	pages, err := ports.List(tn.network, ports.ListOpts{DeviceID: id}).AllPages(ctx)
	must(t, err)
	ps, err := ports.ExtractPorts(pages)
	must(t, err)
	if len(ps) != 1 || ps[0].MACAddress == "" {
		t.Fatalf("server %s's ports: %+v", id, ps)
	}
	return ps[0].ID, ps[0].MACAddress
}

// watch is a table of the test's, "labwatch", in namespace ns counting
// the TCP packets to port 80 that device dev receives, by source MAC and
// address.
type watch struct {
	t       *testing.T
	ns, dev string
}

func (w watch) nft(args ...string) string {
	w.t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", w.ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		w.t.Fatalf("nft %s in %s: %v\n%s", strings.Join(args, " "), w.ns, err, out)
	}
	return string(out)
}

func (w watch) start() {
	w.nft("add", "table", "netdev", "labwatch")
	w.nft("add", "chain", "netdev", "labwatch", "in", "{ type filter hook ingress device "+w.dev+" priority 0; }")
}

// stop removes the table (the host's namespace outlives it).
func (w watch) stop() {
	exec.Command("ip", "netns", "exec", w.ns, "nft", "delete", "table", "netdev", "labwatch").Run()
}

func (w watch) count(mac, ip string) {
	w.nft("add", "rule", "netdev", "labwatch", "in", "ether", "saddr", mac, "ip", "saddr", ip, "tcp", "dport", "80", "counter")
}

// counted is the count of packets from mac and ip.
func (w watch) counted(mac, ip string) int {
	w.t.Helper()
	re := regexp.MustCompile(`ether saddr ` + regexp.QuoteMeta(strings.ToLower(mac)) + ` ip saddr ` + regexp.QuoteMeta(ip) + ` tcp dport 80 counter packets (\d+)`)
	m := re.FindStringSubmatch(w.nft("list", "table", "netdev", "labwatch"))
	if m == nil {
		w.t.Fatalf("no counter for %s %s on %s in %s", mac, ip, w.dev, w.ns)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
