package compute

import (
	"context"
	"errors"
	"net/http"
	"unicode/utf8"

	"nimbus/internal/metadata"
	"nimbus/internal/network"
	"nimbus/internal/store"
)

// maxPasswordSize is the most a guest may post as its password (Nova's
// password.MAX_SIZE: four system_metadata chunks of 255): a 4096-bit
// RSA key's ciphertext in base64 is 684 bytes.
const maxPasswordSize = 4 * 255

// Metadata answers one request of a server's guest to the metadata
// service at 169.254.169.254, Nova's tree of metadata.Server.Lookup:
// 200 with the body, 404 for a path the tree does not have (or a server
// that no longer exists), 405 for a method the path does not take. The
// caller (the agent's metadata proxy, through the controller) has already
// told which server asks; nothing of the request but method, path and
// body is taken. A POST to a version's password stores the guest's
// encrypted password once (409 when there is one), where
// os-server-password reads and clears it.
func (s *Service) Metadata(ctx context.Context, serverID, method, path string, body []byte) (status int, contentType string, out []byte, err error) {
	sv, err := s.loadServer(ctx, s.db, serverID, false)
	if errors.Is(err, store.ErrNotFound) || (err == nil && sv.Deleted) {
		return plain(http.StatusNotFound, "404 Not Found\n")
	}
	if err != nil {
		return 0, "", nil, err
	}
	md, err := s.metadataOf(ctx, sv)
	if err != nil {
		return 0, "", nil, err
	}
	a, err := md.Lookup(path)
	if err != nil {
		return 0, "", nil, err
	}
	switch {
	case a.Status != http.StatusOK:
	case method == http.MethodGet || method == http.MethodHead:
	case method == http.MethodPost && a.Password:
		return s.postPassword(ctx, sv.ID, body)
	default:
		return plain(http.StatusMethodNotAllowed, "405 Method Not Allowed\n")
	}
	return a.Status, a.ContentType, a.Body, nil
}

func plain(status int, body string) (int, string, []byte, error) {
	return status, metadata.TextPlain, []byte(body), nil
}

// metadataOf is what sv's metadata shows: the server as its driver spec
// has it (without the admin password, which only a config drive
// carries), with its flavor's name, security groups, floating IP and
// stored password.
func (s *Service) metadataOf(ctx context.Context, sv *server) (metadata.Server, error) {
	md := metadata.Server{UUID: sv.ID, Name: sv.Name, Hostname: sv.Hostname, ProjectID: sv.ProjectID, AZ: sv.AZ,
		LaunchIndex: sv.LaunchIndex, ReservationID: sv.ReservationID, ImageID: sv.ImageRef,
		InstanceType: sv.Doc.Flavor.Name, KeyName: sv.KeyName, PublicKey: sv.Doc.PublicKey, Meta: sv.Doc.Metadata,
		SecurityGroups: sv.Doc.SecurityGroups, Password: sv.Doc.Password}
	if sv.Doc.UserData != nil {
		if b, err := base64Decode(*sv.Doc.UserData); err == nil {
			md.UserData = b
		}
	}
	c, ok, err := loadClaim(ctx, s.db, sv.ID)
	if err != nil {
		return md, err
	}
	if ok {
		for _, cl := range c.Cells {
			md.DedicatedCPUs = append(md.DedicatedCPUs, cl.CPUs...)
		}
	}
	ref := network.ServerRef{ID: sv.ID, ProjectID: sv.ProjectID}
	ports, err := s.networks.ServerPorts(ctx, ref)
	if err != nil {
		return md, err
	}
	for _, p := range ports {
		md.Ports = append(md.Ports, metadata.Port{ID: p.ID, NetworkID: p.NetworkID, MAC: p.MAC, IP: p.IP,
			CIDR: p.CIDR, Gateway: p.Gateway, DNS: p.DNS, MTU: p.MTU})
		if p.IP != "" {
			md.FixedIPs = append(md.FixedIPs, p.IP)
		}
	}
	addrs, err := s.networks.Addresses(ctx, []network.ServerRef{ref})
	if err != nil {
		return md, err
	}
	md.FloatingIP = floatingIP(ports, addrs[sv.ID])
	return md, nil
}

// floatingIP is the server's first floating IPv4 address, its ports in
// order (the primary first): EC2's public-ipv4.
func floatingIP(ports []network.ServerPort, byNet map[string][]network.Address) string {
	for _, p := range ports {
		for _, as := range byNet {
			for _, a := range as {
				if a.Type == "floating" && a.Version == 4 && a.MAC == p.MAC {
					return a.Addr
				}
			}
		}
	}
	return ""
}

// postPassword stores the guest's encrypted password, once, as Nova's
// password.handle_password does: 409 when one is stored (until
// os-server-password's DELETE clears it), 400 when it is too large; an
// empty one stores nothing.
func (s *Service) postPassword(ctx context.Context, id string, body []byte) (int, string, []byte, error) {
	if len(body) > maxPasswordSize {
		return plain(http.StatusBadRequest, "Request is too large.\n")
	}
	if !utf8.Valid(body) {
		return plain(http.StatusBadRequest, "The password is not UTF-8 text.\n")
	}
	conflict := false
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		cur, err := s.loadServer(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if cur.Doc.Password != "" {
			conflict = true
			return nil
		}
		if len(body) == 0 {
			return nil
		}
		cur.Doc.Password = string(body)
		return s.saveServer(ctx, tx, cur)
	})
	switch {
	case err != nil:
		return 0, "", nil, err
	case conflict:
		return plain(http.StatusConflict, "409 Conflict\n")
	}
	return http.StatusOK, metadata.TextPlain, nil, nil
}
