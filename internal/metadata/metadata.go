// Package metadata builds what a server reads about itself: Nova's
// metadata tree (nova/api/metadata/base.py), from one server's facts.
// The config drive (package qemu) writes its files from it and the
// metadata service at 169.254.169.254 (package compute) answers its
// paths, so both say the same. It only builds; it reads no store.
package metadata

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"regexp"
	"strings"

	"nimbus/internal/driver"
)

// Server is one server's facts, as the metadata shows them.
type Server struct {
	UUID, Name    string
	Hostname      string // "" derives one from Name (HostnameOrDefault)
	ProjectID     string
	AZ            string // "" shows null
	LaunchIndex   int
	ReservationID string
	ImageID       string // EC2 ami-id
	// InstanceType is the flavor's name (EC2 instance-type); "" leaves
	// the key out.
	InstanceType string
	KeyName      string // "" names the key "default"
	PublicKey    string
	UserData     []byte // nil: no user data (an empty one is user data)
	// AdminPass goes into meta_data.json; only a config drive sets it
	// (Nova's extra_md): the metadata service never shows it.
	AdminPass      string
	Meta           map[string]string
	Ports          []Port // the primary first
	FixedIPs       []string
	FloatingIP     string   // EC2 public-ipv4
	SecurityGroups []string // EC2 security-groups (names)
	DedicatedCPUs  []int
	RootDevice     string // the boot disk in the guest; "" is /dev/vda
	// Password is the guest's encrypted password (the password path's
	// GET); storing one is the caller's.
	Password string
}

// Port is one of the server's ports, as network_data.json shows it.
type Port struct {
	ID, NetworkID, MAC string
	IP, CIDR, Gateway  string // CIDR is the subnet's
	DNS                []string
	MTU                int
}

// FromSpec is the metadata of the server a driver builds.
func FromSpec(sp driver.Spec) Server {
	s := Server{UUID: sp.ServerID, Name: sp.Name, Hostname: sp.Hostname, ProjectID: sp.ProjectID, AZ: sp.Zone,
		LaunchIndex: sp.LaunchIndex, ReservationID: sp.ReservationID, ImageID: sp.ImageID, KeyName: sp.KeyName,
		PublicKey: sp.PublicKey, UserData: sp.UserData, AdminPass: sp.AdminPass, Meta: sp.Metadata,
		FixedIPs: sp.FixedIPs}
	for _, p := range sp.Ports {
		s.Ports = append(s.Ports, Port{ID: p.ID, NetworkID: p.NetworkID, MAC: p.MAC, IP: p.IP, CIDR: p.CIDR,
			Gateway: p.Gateway, DNS: p.DNS, MTU: p.MTU})
	}
	for _, c := range sp.Cells {
		s.DedicatedCPUs = append(s.DedicatedCPUs, c.CPUs...)
	}
	return s
}

// The OpenStack metadata versions (Nova's OPENSTACK_VERSIONS), with what
// each brought.
const (
	Folsom   = "2012-08-10"
	Grizzly  = "2013-04-04" // random_seed, password
	Havana   = "2013-10-17" // vendor_data.json
	Liberty  = "2015-10-15" // project_id, network_data.json
	Newton1  = "2016-06-30" // devices
	Newton2  = "2016-10-06" // vendor_data2.json
	Ocata    = "2017-02-22"
	Rocky    = "2018-08-27"
	Victoria = "2020-10-14" // dedicated_cpus
)

// OpenStackVersions are the OpenStack metadata versions, oldest first
// ("latest" is the last of them).
var OpenStackVersions = []string{Folsom, Grizzly, Havana, Liberty, Newton1, Newton2, Ocata, Rocky, Victoria}

// EC2Versions are the EC2 metadata versions (Nova's VERSIONS), oldest
// first ("latest" is the last).
var EC2Versions = []string{"1.0", "2007-01-19", "2007-03-01", "2007-08-29", "2007-10-10", "2007-12-15",
	"2008-02-01", "2008-09-01", "2009-04-04"}

// atLeast reports whether version v (a date, or "latest") has what came
// with version since. Dates compare as strings.
func atLeast(v, since string) bool { return v == "latest" || v >= since }

type key struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Data string `json:"data"`
}

// metaData is openstack/VERSION/meta_data.json.
type metaData struct {
	UUID             string            `json:"uuid"`
	Meta             map[string]string `json:"meta,omitempty"`
	AdminPass        string            `json:"admin_pass,omitempty"`
	PublicKeys       map[string]string `json:"public_keys,omitempty"`
	Keys             []key             `json:"keys,omitempty"`
	Hostname         string            `json:"hostname"`
	Name             string            `json:"name"`
	LaunchIndex      int               `json:"launch_index"`
	AvailabilityZone *string           `json:"availability_zone"`
	RandomSeed       string            `json:"random_seed,omitempty"`
	ProjectID        *string           `json:"project_id,omitempty"`
	Devices          *[]any            `json:"devices,omitempty"`
	DedicatedCPUs    *[]int            `json:"dedicated_cpus,omitempty"`
}

// MetaData is openstack/VERSION/meta_data.json. randomSeed is its
// random_seed; nil reads 512 bytes from crypto/rand, as Nova does for
// every answer.
func (s *Server) MetaData(version string, randomSeed []byte) ([]byte, error) {
	md := metaData{UUID: s.UUID, AdminPass: s.AdminPass, Hostname: s.HostnameOrDefault(), Name: s.Name,
		LaunchIndex: s.LaunchIndex}
	if len(s.Meta) > 0 {
		md.Meta = s.Meta
	}
	if k := strings.TrimSpace(s.PublicKey); k != "" {
		name := s.keyName()
		md.PublicKeys = map[string]string{name: k}
		md.Keys = []key{{Name: name, Type: "ssh", Data: k}}
	}
	if s.AZ != "" {
		z := s.AZ
		md.AvailabilityZone = &z
	}
	if atLeast(version, Grizzly) {
		if randomSeed == nil {
			randomSeed = make([]byte, 512)
			if _, err := rand.Read(randomSeed); err != nil {
				return nil, err
			}
		}
		md.RandomSeed = base64.StdEncoding.EncodeToString(randomSeed)
	}
	if atLeast(version, Liberty) {
		p := s.ProjectID
		md.ProjectID = &p
	}
	if atLeast(version, Newton1) {
		md.Devices = &[]any{}
	}
	if atLeast(version, Victoria) {
		cpus := append([]int{}, s.DedicatedCPUs...)
		md.DedicatedCPUs = &cpus
	}
	return marshalJSON(md)
}

func (s *Server) keyName() string {
	if s.KeyName != "" {
		return s.KeyName
	}
	return "default"
}

// networkData is network_data.json (nova/virt/netutils.py
// get_network_metadata).
type networkData struct {
	Links    []nwLink    `json:"links"`
	Networks []nwNetwork `json:"networks"`
	Services []nwService `json:"services"`
}

type nwLink struct {
	ID    string `json:"id"`
	VifID string `json:"vif_id"`
	Type  string `json:"type"`
	MTU   *int   `json:"mtu"`
	MAC   string `json:"ethernet_mac_address"`
}

type nwNetwork struct {
	ID        string      `json:"id"`
	Type      string      `json:"type"`
	Link      string      `json:"link"`
	IPAddress string      `json:"ip_address"`
	Netmask   string      `json:"netmask"`
	Routes    []nwRoute   `json:"routes"`
	NetworkID string      `json:"network_id"`
	Services  []nwService `json:"services,omitempty"`
}

type nwRoute struct {
	Network string `json:"network"`
	Netmask string `json:"netmask"`
	Gateway string `json:"gateway"`
}

type nwService struct {
	Type    string `json:"type"`
	Address string `json:"address"`
}

// NetworkData is network_data.json: one "phy" link per port, one static
// network per port address (the data plane hands out the same address by
// DHCP), a default route through the subnet's gateway, and the DNS
// servers.
func (s *Server) NetworkData() ([]byte, error) {
	nd := networkData{Links: []nwLink{}, Networks: []nwNetwork{}, Services: []nwService{}}
	seenDNS := map[string]bool{}
	for i, p := range s.Ports {
		link := nwLink{ID: linkID(p, i), VifID: p.ID, Type: "phy", MAC: strings.ToLower(p.MAC)}
		if p.MTU > 0 {
			mtu := p.MTU
			link.MTU = &mtu
		}
		nd.Links = append(nd.Links, link)
		if p.IP == "" {
			continue
		}
		nw, err := portNetwork(p, link.ID, len(nd.Networks))
		if err != nil {
			return nil, err
		}
		for _, d := range p.DNS {
			nw.Services = append(nw.Services, nwService{Type: "dns", Address: d})
			if !seenDNS[d] {
				seenDNS[d] = true
				nd.Services = append(nd.Services, nwService{Type: "dns", Address: d})
			}
		}
		nd.Networks = append(nd.Networks, nw)
	}
	return marshalJSON(nd)
}

// portNetwork is the n-th network of network_data.json: p's address on
// link.
func portNetwork(p Port, link string, n int) (nwNetwork, error) {
	ip, err := netip.ParseAddr(p.IP)
	if err != nil {
		return nwNetwork{}, fmt.Errorf("metadata: port %s: bad IP %q", p.ID, p.IP)
	}
	prefix, err := netip.ParsePrefix(p.CIDR)
	if err != nil || prefix.Addr().Is4() != ip.Is4() {
		return nwNetwork{}, fmt.Errorf("metadata: port %s: bad CIDR %q for %s", p.ID, p.CIDR, p.IP)
	}
	nw := nwNetwork{ID: fmt.Sprintf("network%d", n), Type: "ipv4", Link: link, IPAddress: ip.String(),
		Routes: []nwRoute{}, NetworkID: p.NetworkID}
	anyAddr, bits := "0.0.0.0", 32
	if !ip.Is4() {
		nw.Type, anyAddr, bits = "ipv6", "::", 128
	}
	nw.Netmask = net.IP(net.CIDRMask(prefix.Bits(), bits)).String()
	if p.Gateway != "" {
		nw.Routes = append(nw.Routes, nwRoute{Network: anyAddr, Netmask: anyAddr, Gateway: p.Gateway})
	}
	return nw, nil
}

// linkID is Nova's name for a port's link: its tap device ("tap" and the
// port id's first 11 characters).
func linkID(p Port, i int) string {
	if p.ID == "" {
		return fmt.Sprintf("interface%d", i)
	}
	id := p.ID
	if len(id) > 11 {
		id = id[:11]
	}
	return "tap" + id
}

// ec2MetaData is the EC2 meta-data tree of version (a date of
// EC2Versions, or "latest"), as Nova's get_ec2_metadata: leaves are
// strings, ints and string lists; a directory whose listing shows another
// name than its key has that name under "_name" (public-keys' "0=KEY").
func (s *Server) ec2MetaData(version string) map[string]any {
	if version == "latest" {
		version = EC2Versions[len(EC2Versions)-1]
	}
	host := s.HostnameOrDefault()
	sgs := append([]string{}, s.SecurityGroups...)
	md := map[string]any{
		"ami-id":            EC2ID("ami", s.ImageID),
		"ami-launch-index":  s.LaunchIndex,
		"ami-manifest-path": "FIXME",
		"instance-id":       EC2ID("i", s.UUID),
		"hostname":          host,
		"local-ipv4":        s.primaryIP(),
		"reservation-id":    s.ReservationID,
		"security-groups":   sgs,
	}
	if k := strings.TrimSpace(s.PublicKey); k != "" {
		md["public-keys"] = map[string]any{"0": map[string]any{"_name": "0=" + s.keyName(), "openssh-key": k}}
	}
	if version >= "2007-01-19" {
		md["local-hostname"], md["public-hostname"], md["public-ipv4"] = host, host, s.FloatingIP
	}
	if version >= "2007-08-29" && s.InstanceType != "" {
		md["instance-type"] = s.InstanceType
	}
	if version >= "2007-12-15" {
		root := s.RootDevice
		if root == "" {
			root = "/dev/vda"
		}
		md["block-device-mapping"] = map[string]any{"ami": strings.TrimPrefix(root, "/dev/"), "root": root}
	}
	if version >= "2008-02-01" {
		md["placement"] = map[string]any{"availability-zone": s.AZ}
	}
	if version >= "2008-09-01" {
		md["instance-action"] = "none"
	}
	return md
}

// ec2MetaDataJSON is the config drive's ec2/VERSION/meta-data.json: the
// tree without its "_name"s.
func (s *Server) ec2MetaDataJSON(version string) ([]byte, error) {
	md := s.ec2MetaData(version)
	if pk, ok := md["public-keys"].(map[string]any); ok {
		delete(pk["0"].(map[string]any), "_name")
	}
	return marshalJSON(md)
}

// EC2ID is an EC2-style id ("i-0123abcd") derived from a Nimbus id.
func EC2ID(prefix, id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	return fmt.Sprintf("%s-%08x", prefix, h.Sum32())
}

func (s *Server) primaryIP() string {
	if len(s.Ports) > 0 && s.Ports[0].IP != "" {
		return s.Ports[0].IP
	}
	if len(s.FixedIPs) > 0 {
		return s.FixedIPs[0]
	}
	return ""
}

var (
	hostnameSpaces  = regexp.MustCompile(`[ _.]+`)
	hostnameInvalid = regexp.MustCompile(`[^a-z0-9-]+`)
)

// HostnameOrDefault is the server's hostname: Hostname, else its name
// made a hostname as Nova's sanitize_hostname does, else "server-<id>".
func (s *Server) HostnameOrDefault() string {
	if s.Hostname != "" {
		return s.Hostname
	}
	h := strings.ToLower(s.Name)
	h = hostnameSpaces.ReplaceAllString(h, "-")
	h = hostnameInvalid.ReplaceAllString(h, "")
	h = strings.Trim(h, ".-")
	if len(h) > 63 {
		h = strings.Trim(h[:63], ".-")
	}
	if h == "" {
		h = "server-" + s.UUID
	}
	return h
}

// marshalJSON is compact JSON without HTML escaping (a key's comment
// stays as it is).
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
