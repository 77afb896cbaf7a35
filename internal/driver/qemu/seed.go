package qemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/kdomanski/iso9660"

	"nimbus/internal/driver"
	"nimbus/internal/metadata"
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
// A config drive (volume config-2) has Nova's layout, the tree the
// metadata service answers (metadata.Server.ConfigDrive):
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

func configDriveFiles(s Seed) (map[string][]byte, error) {
	md := seedMetadata(s)
	files, err := md.ConfigDrive(s.RandomSeed)
	if err != nil {
		return nil, fmt.Errorf("qemu: seed: %w", err)
	}
	return files, nil
}

// seedMetadata is the metadata a seed shows: the spec's, with the admin
// password (which only a config drive carries) and the root device.
func seedMetadata(s Seed) metadata.Server {
	md := metadata.FromSpec(s.Spec)
	md.RootDevice = s.RootDevice
	return md
}

func noCloudFiles(s Seed) (map[string][]byte, error) {
	sp := s.Spec
	server := seedMetadata(s)
	host := server.HostnameOrDefault()
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
