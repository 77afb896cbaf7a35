package metadata

import (
	"crypto/rand"
	"net/http"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// File names of an OpenStack version (nova/api/metadata/base.py).
const (
	MetaDataJSON    = "meta_data.json"
	UserData        = "user_data"
	PasswordName    = "password"
	VendorDataJSON  = "vendor_data.json"
	NetworkDataJSON = "network_data.json"
	VendorData2JSON = "vendor_data2.json"
)

// The EC2 versions a config drive has (Nova's default
// config_drive_skip_versions leaves out all older ones).
var configDriveEC2 = []string{"2009-04-04", "latest"}

// vendorData is vendor_data.json and vendor_data2.json: Nimbus has no
// vendor data.
var vendorData = []byte("{}")

// ConfigDrive is a config drive's files (slash paths → contents):
// openstack/{dates…,latest}/ with meta_data.json, user_data (only when
// there is user data), vendor_data.json, network_data.json and
// vendor_data2.json as each version has them, and ec2/{2009-04-04,latest}/
// with meta-data.json and user-data. randomSeed is as MetaData's.
func (s *Server) ConfigDrive(randomSeed []byte) (map[string][]byte, error) {
	nd, err := s.NetworkData()
	if err != nil {
		return nil, err
	}
	if randomSeed == nil {
		// One seed for the whole drive, as the versions are one boot's.
		randomSeed = make([]byte, 512)
		if _, err := rand.Read(randomSeed); err != nil {
			return nil, err
		}
	}
	files := map[string][]byte{}
	for _, v := range append(slices.Clone(OpenStackVersions), "latest") {
		md, err := s.MetaData(v, randomSeed)
		if err != nil {
			return nil, err
		}
		dir := "openstack/" + v + "/"
		files[dir+MetaDataJSON] = md
		if s.UserData != nil {
			files[dir+UserData] = s.UserData
		}
		if atLeast(v, Havana) {
			files[dir+VendorDataJSON] = vendorData
		}
		if atLeast(v, Liberty) {
			files[dir+NetworkDataJSON] = nd
		}
		if atLeast(v, Newton2) {
			files[dir+VendorData2JSON] = vendorData
		}
	}
	for _, v := range configDriveEC2 {
		ec2, err := s.ec2MetaDataJSON(v)
		if err != nil {
			return nil, err
		}
		dir := "ec2/" + v + "/"
		files[dir+"meta-data.json"] = ec2
		if s.UserData != nil {
			files[dir+"user-data"] = s.UserData
		}
	}
	return files, nil
}

// Content types of the answers.
const (
	TextPlain = "text/plain; charset=UTF-8"
	JSON      = "application/json"
)

// Answer is the metadata service's answer to one path.
type Answer struct {
	Status      int // 200, or 404 for a path the tree does not have
	ContentType string
	Body        []byte
	// Password is set on a version's password path: a GET shows
	// Server.Password (Body), a POST stores the guest's password, which
	// is the caller's to do.
	Password bool
}

var notFound = Answer{Status: http.StatusNotFound, ContentType: TextPlain, Body: []byte("404 Not Found\n")}

func text(lines ...string) Answer {
	return Answer{Status: http.StatusOK, ContentType: TextPlain, Body: []byte(strings.Join(lines, "\n"))}
}

// Lookup answers a GET of path as Nova's metadata service does: "/" and
// "/ec2" list the EC2 versions, "/openstack" the OpenStack ones, and
// anything else that is not under /openstack is under /ec2 (so
// /latest/meta-data/instance-id). Listings are text, one entry a line, a
// directory with a trailing "/". The path is cleaned first (a trailing
// "/" is the same path) and its query is ignored. Only errors of the
// server's own facts (a port's bad address) fail it.
func (s *Server) Lookup(p string) (Answer, error) {
	p, _, _ = strings.Cut(p, "?")
	p = path.Clean("/" + p)
	if p == "/" {
		return text(versionList(EC2Versions)...), nil
	}
	toks := strings.Split(p[1:], "/")
	switch toks[0] {
	case "openstack":
		return s.openstack(toks[1:])
	case "ec2":
		toks = toks[1:]
	}
	if len(toks) == 0 {
		return text(versionList(EC2Versions)...), nil
	}
	return s.ec2(toks), nil
}

func versionList(vs []string) []string { return append(slices.Clone(vs), "latest") }

// openstack answers /openstack/toks….
func (s *Server) openstack(toks []string) (Answer, error) {
	if len(toks) == 0 {
		return text(versionList(OpenStackVersions)...), nil
	}
	v := toks[0]
	if v != "latest" && !slices.Contains(OpenStackVersions, v) {
		return notFound, nil
	}
	if len(toks) == 1 {
		return text(s.versionFiles(v)...), nil
	}
	switch strings.Join(toks[1:], "/") {
	case MetaDataJSON:
		md, err := s.MetaData(v, nil)
		return Answer{Status: http.StatusOK, ContentType: JSON, Body: md}, err
	case UserData:
		if s.UserData == nil {
			return notFound, nil
		}
		return Answer{Status: http.StatusOK, ContentType: TextPlain, Body: s.UserData}, nil
	case PasswordName:
		if !atLeast(v, Grizzly) {
			return notFound, nil
		}
		return Answer{Status: http.StatusOK, ContentType: TextPlain, Body: []byte(s.Password), Password: true}, nil
	case VendorDataJSON:
		if !atLeast(v, Havana) {
			return notFound, nil
		}
		return Answer{Status: http.StatusOK, ContentType: JSON, Body: vendorData}, nil
	case NetworkDataJSON:
		// Nova serves it at every version (only the listing waits
		// for Liberty), as text.
		nd, err := s.NetworkData()
		return Answer{Status: http.StatusOK, ContentType: TextPlain, Body: nd}, err
	case VendorData2JSON:
		if !atLeast(v, Newton2) {
			return notFound, nil
		}
		return Answer{Status: http.StatusOK, ContentType: JSON, Body: vendorData}, nil
	}
	return notFound, nil
}

// versionFiles is the listing of /openstack/v.
func (s *Server) versionFiles(v string) []string {
	out := []string{MetaDataJSON}
	if s.UserData != nil {
		out = append(out, UserData)
	}
	if atLeast(v, Grizzly) {
		out = append(out, PasswordName)
	}
	if atLeast(v, Havana) {
		out = append(out, VendorDataJSON)
	}
	if atLeast(v, Liberty) {
		out = append(out, NetworkDataJSON)
	}
	if atLeast(v, Newton2) {
		out = append(out, VendorData2JSON)
	}
	return out
}

// ec2 answers /ec2/toks… (toks[0] the version): a walk of the version's
// tree, {meta-data/, user-data}.
func (s *Server) ec2(toks []string) Answer {
	v := toks[0]
	if v != "latest" && !slices.Contains(EC2Versions, v) {
		return notFound
	}
	var node any = map[string]any{"meta-data": s.ec2MetaData(v)}
	if s.UserData != nil {
		node.(map[string]any)["user-data"] = s.UserData
	}
	for _, t := range toks[1:] {
		dir, ok := node.(map[string]any)
		if !ok {
			return notFound
		}
		if node, ok = dir[t]; !ok || t == "_name" {
			return notFound
		}
	}
	return ec2Print(node)
}

// ec2Print is a node of the EC2 tree as Nova's ec2_md_print writes it.
func ec2Print(node any) Answer {
	switch n := node.(type) {
	case map[string]any:
		keys := make([]string, 0, len(n))
		for k := range n {
			if k != "_name" {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		lines := make([]string, 0, len(keys))
		for _, k := range keys {
			if sub, ok := n[k].(map[string]any); ok {
				if name, ok := sub["_name"].(string); ok {
					k = name
				} else {
					k += "/"
				}
			}
			lines = append(lines, k)
		}
		return text(lines...)
	case []string:
		return text(n...)
	case []byte:
		return Answer{Status: http.StatusOK, ContentType: TextPlain, Body: n}
	case int:
		return text(strconv.Itoa(n))
	case string:
		return text(n)
	}
	return notFound
}
