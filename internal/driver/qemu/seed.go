package qemu

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/kdomanski/iso9660"

	"nimbus/internal/driver"
)

// Seed is a server's first-boot data.
type Seed struct {
	ConfigDrive bool        // OpenStack config-2 drive; else NoCloud cidata
	Spec        driver.Spec // server id, name, hostname, project, zone, key name and public key, user data, admin pass, metadata, launch index, reservation id, ports (for network_data.json)
	// Windows guests always get a config drive, whatever ConfigDrive
	// says: cloudbase-init's default metadata services read config drives
	// (and take admin_pass from meta_data.json), not NoCloud.
	Windows bool
	// RandomSeed is meta_data.json's random_seed (base64 of it); nil reads
	// 512 bytes from crypto/rand, as Nova does. Tests set it for
	// byte-stable output.
	RandomSeed []byte
	// RootDevice is the boot disk's device in the guest, for the EC2
	// block-device-mapping ("/dev/vda" when empty).
	RootDevice string
}

// Volume ids of the two kinds of seed, which cloud-init and
// cloudbase-init look for.
const (
	ConfigDriveLabel = "config-2"
	NoCloudLabel     = "cidata"
)

// seedMinSize is the size a seed ISO is padded to: busybox findfs does not
// see ISO file systems smaller than about 128 KiB.
const seedMinSize = 1 << 20

// WriteSeed writes the seed ISO at path (atomically, mode 0600).
//
// A config drive (volume config-2) has Nova's layout:
// openstack/{2012-08-10,…,2020-10-14,latest}/ with meta_data.json,
// user_data (only when there is user data), vendor_data.json,
// network_data.json and vendor_data2.json as each version has them, and
// ec2/{2009-04-04,latest}/ with meta-data.json and user-data. A NoCloud
// seed (volume cidata) has meta-data (instance-id, local-hostname,
// public-keys) and user-data: the server's user data as it is, else a
// minimal #cloud-config with the hostname and the SSH key. It has no
// network-config: cloud-init's fallback (DHCP on the first NIC) is what
// the data plane serves, and a v2 network-config would name interfaces
// that the seed cannot know.
//
// The ISO is plain ISO 9660 (no Rock Ridge or Joliet; Linux shows the
// names in lower case, without the ";1" version), padded to 1 MiB, and
// the same Seed (with RandomSeed set) gives the same bytes.
func WriteSeed(path string, s Seed) error {
	files, label, err := seedFiles(s)
	if err != nil {
		return err
	}
	img, err := buildISO(files, label)
	if err != nil {
		return err
	}
	return writeFileAtomic0600(path, img)
}

// seedFiles is the seed's file tree (slash paths → contents) and volume id.
func seedFiles(s Seed) (map[string][]byte, string, error) {
	if s.ConfigDrive || s.Windows {
		files, err := configDriveFiles(s)
		return files, ConfigDriveLabel, err
	}
	files, err := noCloudFiles(s)
	return files, NoCloudLabel, err
}

// The OpenStack metadata versions of Nova's config drive
// (nova/api/metadata/base.py), oldest first.
const (
	mdFolsom   = "2012-08-10"
	mdGrizzly  = "2013-04-04" // random_seed
	mdHavana   = "2013-10-17" // vendor_data.json
	mdLiberty  = "2015-10-15" // project_id, network_data.json
	mdNewton1  = "2016-06-30" // devices
	mdNewton2  = "2016-10-06" // vendor_data2.json
	mdOcata    = "2017-02-22"
	mdRocky    = "2018-08-27"
	mdVictoria = "2020-10-14" // dedicated_cpus
)

var openstackVersions = []string{mdFolsom, mdGrizzly, mdHavana, mdLiberty, mdNewton1, mdNewton2, mdOcata, mdRocky, mdVictoria, "latest"}

// ec2Versions are the EC2 versions Nova writes (its default
// config_drive_skip_versions leaves out all older ones).
var ec2Versions = []string{"2009-04-04", "latest"}

// atLeast reports whether OpenStack metadata version v has what came
// with version since ("latest" has everything).
func atLeast(v, since string) bool { return v == "latest" || v >= since }

type mdKey struct {
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
	Keys             []mdKey           `json:"keys,omitempty"`
	Hostname         string            `json:"hostname"`
	Name             string            `json:"name"`
	LaunchIndex      int               `json:"launch_index"`
	AvailabilityZone *string           `json:"availability_zone"`
	RandomSeed       string            `json:"random_seed,omitempty"`
	ProjectID        *string           `json:"project_id,omitempty"`
	Devices          *[]any            `json:"devices,omitempty"`
	DedicatedCPUs    *[]int            `json:"dedicated_cpus,omitempty"`
}

// networkData is openstack/VERSION/network_data.json
// (nova/virt/netutils.py get_network_metadata).
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

func configDriveFiles(s Seed) (map[string][]byte, error) {
	sp := s.Spec
	nd, err := buildNetworkData(sp.Ports)
	if err != nil {
		return nil, err
	}
	ndJSON, err := marshalJSON(nd)
	if err != nil {
		return nil, err
	}
	rs := s.RandomSeed
	if rs == nil {
		rs = make([]byte, 512)
		if _, err := rand.Read(rs); err != nil {
			return nil, err
		}
	}
	files := map[string][]byte{}
	for _, v := range openstackVersions {
		md, err := marshalJSON(buildMetaData(s, v, rs))
		if err != nil {
			return nil, err
		}
		dir := "openstack/" + v + "/"
		files[dir+"meta_data.json"] = md
		if sp.UserData != nil {
			files[dir+"user_data"] = sp.UserData
		}
		if atLeast(v, mdHavana) {
			files[dir+"vendor_data.json"] = []byte("{}")
		}
		if atLeast(v, mdLiberty) {
			files[dir+"network_data.json"] = ndJSON
		}
		if atLeast(v, mdNewton2) {
			files[dir+"vendor_data2.json"] = []byte("{}")
		}
	}
	ec2, err := marshalJSON(buildEC2MetaData(s))
	if err != nil {
		return nil, err
	}
	for _, v := range ec2Versions {
		dir := "ec2/" + v + "/"
		files[dir+"meta-data.json"] = ec2
		if sp.UserData != nil {
			files[dir+"user-data"] = sp.UserData
		}
	}
	return files, nil
}

func buildMetaData(s Seed, version string, randomSeed []byte) metaData {
	sp := s.Spec
	md := metaData{
		UUID:        sp.ServerID,
		AdminPass:   sp.AdminPass,
		Hostname:    seedHostname(sp),
		Name:        sp.Name,
		LaunchIndex: sp.LaunchIndex,
	}
	if len(sp.Metadata) > 0 {
		md.Meta = sp.Metadata
	}
	if key := strings.TrimSpace(sp.PublicKey); key != "" {
		name := keyName(sp)
		md.PublicKeys = map[string]string{name: key}
		md.Keys = []mdKey{{Name: name, Type: "ssh", Data: key}}
	}
	if sp.Zone != "" {
		z := sp.Zone
		md.AvailabilityZone = &z
	}
	if atLeast(version, mdGrizzly) {
		md.RandomSeed = base64.StdEncoding.EncodeToString(randomSeed)
	}
	if atLeast(version, mdLiberty) {
		p := sp.ProjectID
		md.ProjectID = &p
	}
	if atLeast(version, mdNewton1) {
		md.Devices = &[]any{}
	}
	if atLeast(version, mdVictoria) {
		cpus := []int{}
		for _, c := range sp.Cells {
			cpus = append(cpus, c.CPUs...)
		}
		md.DedicatedCPUs = &cpus
	}
	return md
}

func keyName(sp driver.Spec) string {
	if sp.KeyName != "" {
		return sp.KeyName
	}
	return "default"
}

// buildNetworkData is network_data.json for ports (in order, the primary
// first): one "phy" link per port, one static network per port address
// (the data plane hands out the same address by DHCP), a default route
// through the subnet's gateway, and the DNS servers.
func buildNetworkData(ports []driver.Port) (networkData, error) {
	nd := networkData{Links: []nwLink{}, Networks: []nwNetwork{}, Services: []nwService{}}
	seenDNS := map[string]bool{}
	for i, p := range ports {
		link := nwLink{ID: linkID(p, i), VifID: p.ID, Type: "phy", MAC: strings.ToLower(p.MAC)}
		if p.MTU > 0 {
			mtu := p.MTU
			link.MTU = &mtu
		}
		nd.Links = append(nd.Links, link)
		if p.IP == "" {
			continue
		}
		ip, err := netip.ParseAddr(p.IP)
		if err != nil {
			return nd, fmt.Errorf("qemu: seed: port %s: bad IP %q", p.ID, p.IP)
		}
		prefix, err := netip.ParsePrefix(p.CIDR)
		if err != nil || prefix.Addr().Is4() != ip.Is4() {
			return nd, fmt.Errorf("qemu: seed: port %s: bad CIDR %q for %s", p.ID, p.CIDR, p.IP)
		}
		nw := nwNetwork{
			ID:        fmt.Sprintf("network%d", len(nd.Networks)),
			Type:      "ipv4",
			Link:      link.ID,
			IPAddress: ip.String(),
			Routes:    []nwRoute{},
			NetworkID: p.NetworkID,
		}
		anyAddr := "0.0.0.0"
		bits := 32
		if !ip.Is4() {
			nw.Type, anyAddr, bits = "ipv6", "::", 128
		}
		nw.Netmask = net.IP(net.CIDRMask(prefix.Bits(), bits)).String()
		if p.Gateway != "" {
			nw.Routes = append(nw.Routes, nwRoute{Network: anyAddr, Netmask: anyAddr, Gateway: p.Gateway})
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
	return nd, nil
}

// linkID is Nova's name for a port's link: its tap device ("tap" and the
// port id's first 11 characters).
func linkID(p driver.Port, i int) string {
	if p.ID == "" {
		return fmt.Sprintf("interface%d", i)
	}
	id := p.ID
	if len(id) > 11 {
		id = id[:11]
	}
	return "tap" + id
}

// buildEC2MetaData is ec2/VERSION/meta-data.json, as Nova's
// get_ec2_metadata for 2009-04-04.
func buildEC2MetaData(s Seed) map[string]any {
	sp := s.Spec
	host := seedHostname(sp)
	root := s.RootDevice
	if root == "" {
		root = "/dev/vda"
	}
	md := map[string]any{
		"ami-id":               ec2ID("ami", sp.ImageID),
		"ami-launch-index":     sp.LaunchIndex,
		"ami-manifest-path":    "FIXME",
		"block-device-mapping": map[string]string{"ami": strings.TrimPrefix(root, "/dev/"), "root": root},
		"hostname":             host,
		"instance-action":      "none",
		"instance-id":          ec2ID("i", sp.ServerID),
		"local-hostname":       host,
		"local-ipv4":           primaryIP(sp),
		"placement":            map[string]string{"availability-zone": sp.Zone},
		"public-hostname":      host,
		"public-ipv4":          "",
		"reservation-id":       sp.ReservationID,
		"security-groups":      []string{},
	}
	if key := strings.TrimSpace(sp.PublicKey); key != "" {
		md["public-keys"] = map[string]any{"0": map[string]string{"openssh-key": key}}
	}
	return md
}

// ec2ID is an EC2-style id ("i-0123abcd") derived from a Nimbus id.
func ec2ID(prefix, id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	return fmt.Sprintf("%s-%08x", prefix, h.Sum32())
}

func primaryIP(sp driver.Spec) string {
	if len(sp.Ports) > 0 && sp.Ports[0].IP != "" {
		return sp.Ports[0].IP
	}
	if len(sp.FixedIPs) > 0 {
		return sp.FixedIPs[0]
	}
	return ""
}

var (
	hostnameSpaces  = regexp.MustCompile(`[ _.]+`)
	hostnameInvalid = regexp.MustCompile(`[^a-z0-9-]+`)
)

// seedHostname is the server's hostname: Spec.Hostname, else its name
// made a hostname as Nova's sanitize_hostname does, else "server-<id>".
func seedHostname(sp driver.Spec) string {
	if sp.Hostname != "" {
		return sp.Hostname
	}
	h := strings.ToLower(sp.Name)
	h = hostnameSpaces.ReplaceAllString(h, "-")
	h = hostnameInvalid.ReplaceAllString(h, "")
	h = strings.Trim(h, ".-")
	if len(h) > 63 {
		h = strings.Trim(h[:63], ".-")
	}
	if h == "" {
		h = "server-" + sp.ServerID
	}
	return h
}

func noCloudFiles(s Seed) (map[string][]byte, error) {
	sp := s.Spec
	host := seedHostname(sp)
	keys := publicKeyLines(sp.PublicKey)
	var md bytes.Buffer
	fmt.Fprintf(&md, "instance-id: %s\n", yamlScalar(sp.ServerID))
	fmt.Fprintf(&md, "local-hostname: %s\n", yamlScalar(host))
	if len(keys) > 0 {
		md.WriteString("public-keys:\n")
		for _, k := range keys {
			fmt.Fprintf(&md, "  - %s\n", yamlScalar(k))
		}
	}
	files := map[string][]byte{"meta-data": md.Bytes()}
	if sp.UserData != nil {
		files["user-data"] = sp.UserData
	} else {
		var ud bytes.Buffer
		ud.WriteString("#cloud-config\n")
		fmt.Fprintf(&ud, "hostname: %s\n", yamlScalar(host))
		if len(keys) > 0 {
			ud.WriteString("ssh_authorized_keys:\n")
			for _, k := range keys {
				fmt.Fprintf(&ud, "  - %s\n", yamlScalar(k))
			}
		}
		files["user-data"] = ud.Bytes()
	}
	return files, nil
}

// publicKeyLines splits a public key field into its keys (one a line).
func publicKeyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

var yamlPlain = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9 ._@+/=,-]*$`)

// yamlScalar writes s as a YAML scalar: plain when that is unambiguous
// (easy to read for a shell script too), else as a double-quoted (JSON)
// string.
func yamlScalar(s string) string {
	if yamlPlain.MatchString(s) && !strings.HasSuffix(s, " ") {
		switch strings.ToLower(s) {
		case "y", "n", "yes", "no", "on", "off", "true", "false", "null":
		default:
			return s
		}
	}
	b, _ := json.Marshal(s)
	return string(b)
}

func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// pvdTimestamps are the offsets in the image of the primary volume
// descriptor's creation, modification, expiration and effective dates
// (ECMA-119 8.4.26-29; the descriptor is sector 16).
var pvdTimestamps = []int{16*2048 + 813, 16*2048 + 830, 16*2048 + 847, 16*2048 + 864}

// unspecifiedDate is an ECMA-119 8.4.26.1 date "not specified".
var unspecifiedDate = []byte("0000000000000000\x00")

// buildISO makes an ISO 9660 image of files with volume id label, with
// the volume dates "not specified" (the library stamps the current time)
// so that the bytes depend on the files only, padded to seedMinSize.
func buildISO(files map[string][]byte, label string) ([]byte, error) {
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, fmt.Errorf("qemu: seed: %w", err)
	}
	defer w.Cleanup()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := w.AddFile(bytes.NewReader(files[n]), n); err != nil {
			return nil, fmt.Errorf("qemu: seed: %s: %w", n, err)
		}
	}
	var buf bytes.Buffer
	if err := w.WriteTo(&buf, label); err != nil {
		return nil, fmt.Errorf("qemu: seed: %w", err)
	}
	img := buf.Bytes()
	if len(img) < pvdTimestamps[3]+len(unspecifiedDate) || string(img[16*2048+1:16*2048+6]) != "CD001" {
		return nil, errors.New("qemu: seed: the ISO writer made no primary volume descriptor")
	}
	for _, off := range pvdTimestamps {
		copy(img[off:], unspecifiedDate)
	}
	if len(img) < seedMinSize {
		img = append(img, make([]byte, seedMinSize-len(img))...)
	}
	return img, nil
}

// writeFileAtomic0600 writes b to path through a temporary file in the
// same directory, synced and renamed into place.
func writeFileAtomic0600(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("qemu: seed: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("qemu: seed: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("qemu: seed: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("qemu: seed: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("qemu: seed: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("qemu: seed: %w", err)
	}
	ok = true
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
