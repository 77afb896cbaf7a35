package panel

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
)

// resourceRoutes are the pages of what a customer has besides servers:
// volumes, backups (of servers and of volumes), networks, SSH keys and
// floating IPs. Each lists, makes
// and deletes through the API with the user's token.
func (p *Panel) resourceRoutes() []route {
	return []route{
		{"GET /volumes", member, p.volumes},
		{"POST /volumes", member, p.createVolume},
		{"POST /volumes/{id}/delete", member, p.deleteVolume},
		{"GET /backups", member, p.backups},
		{"POST /backups", member, p.createBackup},
		{"POST /backups/{id}/restore", member, p.restoreBackup},
		{"POST /backups/{id}/delete", member, p.deleteBackup},
		{"POST /volume-backups", member, p.createVolumeBackup},
		{"POST /volume-backups/{id}/restore", member, p.restoreVolumeBackup},
		{"POST /volume-backups/{id}/delete", member, p.deleteVolumeBackup},
		{"GET /networks", member, p.networks},
		{"POST /networks", member, p.createNetwork},
		{"POST /networks/{id}/delete", member, p.deleteNetwork},
		{"GET /keys", member, p.keys},
		{"POST /keys", member, p.createKey},
		{"POST /keys/{name}/delete", member, p.deleteKey},
		{"GET /floating-ips", member, p.floatingIPs},
		{"POST /floating-ips", member, p.createFloatingIP},
		{"POST /floating-ips/{id}/associate", member, p.associateFloatingIP},
		{"POST /floating-ips/{id}/delete", member, p.deleteFloatingIP},
	}
}

// pathID is a path value safe to put back in an API path.
func pathID(q *req, name string) (string, error) {
	v := q.r.PathValue(name)
	if v == "" || len(v) > 255 || strings.ContainsAny(v, "/?#%\\") {
		return "", errNotFound
	}
	return url.PathEscape(v), nil
}

// confirmed is a destructive form's required checkbox, so a delete works
// without JavaScript and never by a stray click.
func confirmed(q *req) error {
	if q.r.PostForm.Get("confirm") != "yes" {
		return BadRequest(q.T("Tick the box to confirm."))
	}
	return nil
}

// serverNames maps the user's server ids to names, for lists that show
// what a resource is attached to.
func serverNames(ctx context.Context, c *Client) (map[string]string, []serverRef, error) {
	var out struct {
		Servers []serverRef `json:"servers"`
	}
	if err := c.Get(ctx, Compute, "/servers?limit=1000", &out); err != nil {
		return nil, nil, err
	}
	m := make(map[string]string, len(out.Servers))
	for _, s := range out.Servers {
		m[s.ID] = s.Name
	}
	return m, out.Servers, nil
}

type serverRef struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// --- volumes

type volumeRow struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Size        int    `json:"size"`
	Status      string `json:"status"`
	VolumeType  string `json:"volume_type"`
	Bootable    string `json:"bootable"`
	CreatedAt   string `json:"created_at"`
	Attachments []struct {
		ServerID string `json:"server_id"`
	} `json:"attachments"`
	AttachedTo []string `json:"-"`
}

type volumesPage struct {
	Volumes []volumeRow
	Types   []string
}

func (p *Panel) volumes(q *req) error {
	ctx := q.r.Context()
	var vols struct {
		Volumes []volumeRow `json:"volumes"`
	}
	if err := q.api.Get(ctx, Volume, "/volumes/detail", &vols); err != nil {
		return err
	}
	var types struct {
		Types []struct {
			Name string `json:"name"`
		} `json:"volume_types"`
	}
	if err := q.api.Get(ctx, Volume, "/types", &types); err != nil {
		return err
	}
	names, _, err := serverNames(ctx, q.api)
	if err != nil {
		return err
	}
	page := volumesPage{Volumes: vols.Volumes}
	for i := range page.Volumes {
		for _, a := range page.Volumes[i].Attachments {
			page.Volumes[i].AttachedTo = append(page.Volumes[i].AttachedTo, names[a.ServerID])
		}
	}
	for _, t := range types.Types {
		page.Types = append(page.Types, t.Name)
	}
	return q.render("volumes", q.T("Volumes"), page)
}

func (p *Panel) createVolume(q *req) error {
	f := q.r.PostForm
	size, err := strconv.Atoi(f.Get("size"))
	if err != nil || size < 1 {
		return q.back("/volumes", BadRequest(q.T("The size must be a whole number of GB, at least 1.")))
	}
	body := map[string]any{"name": strings.TrimSpace(f.Get("name")), "size": size}
	if t := f.Get("type"); t != "" {
		body["volume_type"] = t
	}
	if err := q.api.Post(q.r.Context(), Volume, "/volumes", map[string]any{"volume": body}, nil); err != nil {
		return q.back("/volumes", err)
	}
	return q.redirect("/volumes", q.T("The volume is being created."))
}

func (p *Panel) deleteVolume(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/volumes", err)
	}
	if err := q.api.Delete(q.r.Context(), Volume, "/volumes/"+id); err != nil {
		return q.back("/volumes", err)
	}
	return q.redirect("/volumes", q.T("The volume is being deleted."))
}

// --- backups: images made by createBackup, with their rotation

type imageRow struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Status       string `json:"status"`
	Size         *int64 `json:"size"`
	CreatedAt    string `json:"created_at"`
	BackupType   string `json:"backup_type"`
	InstanceUUID string `json:"instance_uuid"`
	Server       string `json:"-"`
}

// volBackupRow is a Cinder backup of a volume.
type volBackupRow struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	VolumeID    string `json:"volume_id"`
	Size        int    `json:"size"`
	Status      string `json:"status"`
	CreatedAt   string `json:"created_at"`
	Incremental bool   `json:"is_incremental"`
	Volume      string `json:"-"`
}

type backupsPage struct {
	Backups       []imageRow
	Servers       []serverRef
	VolumeBackups []volBackupRow
	Volumes       []volumeRow // the ones a backup can be made of
}

// backups lists both kinds: Nova's backup images of servers and Cinder's
// backups of volumes.
func (p *Panel) backups(q *req) error {
	ctx := q.r.Context()
	var imgs struct {
		Images []imageRow `json:"images"`
	}
	path := "/v2/images?image_type=backup&owner=" + url.QueryEscape(q.s.ProjectID) + "&sort=created_at:desc&limit=200"
	if err := q.api.Get(ctx, Image, path, &imgs); err != nil {
		return err
	}
	names, servers, err := serverNames(ctx, q.api)
	if err != nil {
		return err
	}
	for i := range imgs.Images {
		imgs.Images[i].Server = names[imgs.Images[i].InstanceUUID]
	}
	sort.Slice(servers, func(i, j int) bool { return servers[i].Name < servers[j].Name })
	page := backupsPage{Backups: imgs.Images, Servers: servers}
	var bks struct {
		Backups []volBackupRow `json:"backups"`
	}
	if err := q.api.Get(ctx, Volume, "/backups/detail?sort=created_at:desc", &bks); err != nil {
		return err
	}
	var vols struct {
		Volumes []volumeRow `json:"volumes"`
	}
	if err := q.api.Get(ctx, Volume, "/volumes/detail", &vols); err != nil {
		return err
	}
	volNames := map[string]string{}
	for _, v := range vols.Volumes {
		volNames[v.ID] = cmp.Or(v.Name, v.ID)
		if v.Status == "available" || v.Status == "in-use" {
			page.Volumes = append(page.Volumes, v)
		}
	}
	for _, b := range bks.Backups {
		b.Volume = cmp.Or(volNames[b.VolumeID], b.VolumeID)
		page.VolumeBackups = append(page.VolumeBackups, b)
	}
	return q.render("backups", q.T("Backups"), page)
}

// createVolumeBackup is Cinder's backup create: full or incremental, of
// an attached volume too (force: the copy is taken live).
func (p *Panel) createVolumeBackup(q *req) error {
	f := q.r.PostForm
	vol := f.Get("volume")
	if vol == "" || strings.ContainsAny(vol, "/?#%") {
		return q.back("/backups", BadRequest(q.T("Choose a volume.")))
	}
	name := strings.TrimSpace(f.Get("name"))
	if name == "" {
		name = "backup"
	}
	body := map[string]any{"backup": map[string]any{"volume_id": vol, "name": name,
		"incremental": f.Get("incremental") == "yes", "force": true}}
	if err := q.api.Post(q.r.Context(), Volume, "/backups", body, nil); err != nil {
		return q.back("/backups", err)
	}
	return q.redirect("/backups", q.T("The backup is being made."))
}

// restoreVolumeBackup restores a volume backup to a new volume.
func (p *Panel) restoreVolumeBackup(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/backups", err)
	}
	body := map[string]any{"restore": map[string]any{"name": "restored"}}
	if err := q.api.Post(q.r.Context(), Volume, "/backups/"+id+"/restore", body, nil); err != nil {
		return q.back("/backups", err)
	}
	return q.redirect("/volumes", q.T("The backup is being restored to a new volume."))
}

func (p *Panel) deleteVolumeBackup(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/backups", err)
	}
	if err := q.api.Delete(q.r.Context(), Volume, "/backups/"+id); err != nil {
		return q.back("/backups", err)
	}
	return q.redirect("/backups", q.T("The backup was deleted."))
}

// createBackup is Nova's createBackup: a backup image of a server, keeping
// the newest rotation backups of its type.
func (p *Panel) createBackup(q *req) error {
	f := q.r.PostForm
	server := f.Get("server")
	rotation, err := strconv.Atoi(f.Get("rotation"))
	if err != nil || rotation < 1 || rotation > 100 {
		return q.back("/backups", BadRequest(q.T("Keep between 1 and 100 backups.")))
	}
	typ := f.Get("backup_type")
	if typ != "daily" && typ != "weekly" {
		return q.back("/backups", BadRequest(q.T("Choose daily or weekly.")))
	}
	if server == "" || strings.ContainsAny(server, "/?#%") {
		return q.back("/backups", BadRequest(q.T("Choose a server.")))
	}
	name := strings.TrimSpace(f.Get("name"))
	if name == "" {
		name = "backup"
	}
	body := map[string]any{"createBackup": map[string]any{"name": name, "backup_type": typ, "rotation": rotation}}
	if err := q.api.Post(q.r.Context(), Compute, "/servers/"+url.PathEscape(server)+"/action", body, nil); err != nil {
		return q.back("/backups", err)
	}
	return q.redirect("/backups", q.T("The backup is being made."))
}

// restoreBackup rebuilds the backup's server from it.
func (p *Panel) restoreBackup(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/backups", err)
	}
	ctx := q.r.Context()
	var img imageRow
	if err := q.api.Get(ctx, Image, "/v2/images/"+id, &img); err != nil {
		return q.back("/backups", err)
	}
	if img.InstanceUUID == "" {
		return q.back("/backups", BadRequest(q.T("This backup does not name its server.")))
	}
	body := map[string]any{"rebuild": map[string]any{"imageRef": img.ID}}
	if err := q.api.Post(ctx, Compute, "/servers/"+url.PathEscape(img.InstanceUUID)+"/action", body, nil); err != nil {
		return q.back("/backups", err)
	}
	return q.redirect("/servers/"+url.PathEscape(img.InstanceUUID), q.T("The server is being restored from the backup."))
}

func (p *Panel) deleteBackup(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/backups", err)
	}
	if err := q.api.Delete(q.r.Context(), Image, "/v2/images/"+id); err != nil {
		return q.back("/backups", err)
	}
	return q.redirect("/backups", q.T("The backup was deleted."))
}

// --- networks

type networkRow struct {
	ID       string   `json:"id"`
	Name     string   `json:"name"`
	Status   string   `json:"status"`
	Shared   bool     `json:"shared"`
	External bool     `json:"router:external"`
	TenantID string   `json:"tenant_id"`
	Subnets  []string `json:"subnets"`
	CIDRs    []string `json:"-"`
	Own      bool     `json:"-"`
}

func (p *Panel) networks(q *req) error {
	ctx := q.r.Context()
	var nets struct {
		Networks []networkRow `json:"networks"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/networks", &nets); err != nil {
		return err
	}
	var subs struct {
		Subnets []struct {
			ID   string `json:"id"`
			CIDR string `json:"cidr"`
		} `json:"subnets"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/subnets", &subs); err != nil {
		return err
	}
	cidr := map[string]string{}
	for _, s := range subs.Subnets {
		cidr[s.ID] = s.CIDR
	}
	for i := range nets.Networks {
		n := &nets.Networks[i]
		n.Own = n.TenantID == q.s.ProjectID
		for _, s := range n.Subnets {
			if c, ok := cidr[s]; ok {
				n.CIDRs = append(n.CIDRs, c)
			}
		}
	}
	return q.render("networks", q.T("Networks"), nets.Networks)
}

// createNetwork makes a network with one IPv4 subnet, undoing the network
// when the subnet is refused.
func (p *Panel) createNetwork(q *req) error {
	ctx := q.r.Context()
	f := q.r.PostForm
	name, cidr := strings.TrimSpace(f.Get("name")), strings.TrimSpace(f.Get("cidr"))
	if name == "" || cidr == "" {
		return q.back("/networks", BadRequest(q.T("Give the network a name and an address range.")))
	}
	var net struct {
		Network struct {
			ID string `json:"id"`
		} `json:"network"`
	}
	if err := q.api.Post(ctx, Network, "/v2.0/networks", map[string]any{"network": map[string]any{"name": name}}, &net); err != nil {
		return q.back("/networks", err)
	}
	sub := map[string]any{"subnet": map[string]any{"network_id": net.Network.ID, "cidr": cidr, "ip_version": 4, "name": name}}
	if err := q.api.Post(ctx, Network, "/v2.0/subnets", sub, nil); err != nil {
		q.api.Delete(ctx, Network, "/v2.0/networks/"+url.PathEscape(net.Network.ID))
		return q.back("/networks", err)
	}
	return q.redirect("/networks", q.T("The network was created."))
}

func (p *Panel) deleteNetwork(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/networks", err)
	}
	if err := q.api.Delete(q.r.Context(), Network, "/v2.0/networks/"+id); err != nil {
		return q.back("/networks", err)
	}
	return q.redirect("/networks", q.T("The network was deleted."))
}

// --- SSH keys

type keyRow struct {
	Name        string `json:"name"`
	Fingerprint string `json:"fingerprint"`
	Type        string `json:"type"`
}

type keysPage struct {
	Keys []keyRow
	// PrivateKey is a key generated for this answer only, shown once.
	PrivateKey, NewName string
}

func (p *Panel) keys(q *req) error {
	var out struct {
		Keypairs []struct {
			Keypair keyRow `json:"keypair"`
		} `json:"keypairs"`
	}
	if err := q.api.Get(q.r.Context(), Compute, "/os-keypairs", &out); err != nil {
		return err
	}
	page := keysPage{}
	for _, k := range out.Keypairs {
		page.Keys = append(page.Keys, k.Keypair)
	}
	return q.render("keys", q.T("SSH keys"), page)
}

// createKey imports a pasted public key, or generates an ed25519 key pair,
// imports its public half and shows the private half once; the panel keeps
// no copy.
func (p *Panel) createKey(q *req) error {
	f := q.r.PostForm
	name := strings.TrimSpace(f.Get("name"))
	pub := strings.TrimSpace(f.Get("public_key"))
	var private string
	if f.Get("generate") == "yes" {
		var err error
		if pub, private, err = GenerateKey(name); err != nil {
			return err
		}
	} else if pub == "" {
		return q.back("/keys", BadRequest(q.T("Paste a public key, or choose to generate one.")))
	}
	body := map[string]any{"keypair": map[string]any{"name": name, "public_key": pub}}
	if err := q.api.Post(q.r.Context(), Compute, "/os-keypairs", body, nil); err != nil {
		return q.back("/keys", err)
	}
	if private == "" {
		return q.redirect("/keys", q.T("The key was added."))
	}
	return q.render("keys", q.T("SSH keys"), keysPage{PrivateKey: private, NewName: name})
}

// GenerateKey makes an ed25519 key pair: the public key in authorized_keys
// form and the private key in OpenSSH PEM form.
func GenerateKey(comment string) (public, private string, err error) {
	pk, sk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	sshPub, err := ssh.NewPublicKey(pk)
	if err != nil {
		return "", "", err
	}
	block, err := ssh.MarshalPrivateKey(sk, comment)
	if err != nil {
		return "", "", err
	}
	public = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))
	if comment != "" {
		public += " " + comment
	}
	return public, string(pem.EncodeToMemory(block)), nil
}

func (p *Panel) deleteKey(q *req) error {
	name, err := pathID(q, "name")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/keys", err)
	}
	if err := q.api.Delete(q.r.Context(), Compute, "/os-keypairs/"+name); err != nil {
		return q.back("/keys", err)
	}
	return q.redirect("/keys", q.T("The key was deleted."))
}

// --- floating IPs

type fipRow struct {
	ID         string  `json:"id"`
	Address    string  `json:"floating_ip_address"`
	Status     string  `json:"status"`
	PortID     *string `json:"port_id"`
	FixedIP    *string `json:"fixed_ip_address"`
	NetworkID  string  `json:"floating_network_id"`
	ServerName string  `json:"-"`
}

type fipsPage struct {
	IPs []fipRow
	// Ports are the user's servers' ports an address can go to.
	Ports []portChoice
}

type portChoice struct {
	ID, Label string
}

func (p *Panel) floatingIPs(q *req) error {
	ctx := q.r.Context()
	var fips struct {
		FloatingIPs []fipRow `json:"floatingips"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/floatingips?project_id="+url.QueryEscape(q.s.ProjectID), &fips); err != nil {
		return err
	}
	var ports struct {
		Ports []struct {
			ID       string `json:"id"`
			DeviceID string `json:"device_id"`
			Owner    string `json:"device_owner"`
			FixedIPs []struct {
				IP string `json:"ip_address"`
			} `json:"fixed_ips"`
		} `json:"ports"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/ports?project_id="+url.QueryEscape(q.s.ProjectID), &ports); err != nil {
		return err
	}
	names, _, err := serverNames(ctx, q.api)
	if err != nil {
		return err
	}
	page := fipsPage{IPs: fips.FloatingIPs}
	portServer := map[string]string{}
	for _, pt := range ports.Ports {
		name, ok := names[pt.DeviceID]
		if !ok || !strings.HasPrefix(pt.Owner, "compute:") {
			continue
		}
		portServer[pt.ID] = name
		label := name
		if len(pt.FixedIPs) > 0 {
			label += " (" + pt.FixedIPs[0].IP + ")"
		}
		page.Ports = append(page.Ports, portChoice{ID: pt.ID, Label: label})
	}
	sort.Slice(page.Ports, func(i, j int) bool { return page.Ports[i].Label < page.Ports[j].Label })
	for i := range page.IPs {
		if pid := page.IPs[i].PortID; pid != nil {
			page.IPs[i].ServerName = portServer[*pid]
		}
	}
	return q.render("floating_ips", q.T("Floating IPs"), page)
}

// createFloatingIP allocates an address from the external network.
func (p *Panel) createFloatingIP(q *req) error {
	ctx := q.r.Context()
	var nets struct {
		Networks []struct {
			ID string `json:"id"`
		} `json:"networks"`
	}
	if err := q.api.Get(ctx, Network, "/v2.0/networks?router:external=true", &nets); err != nil {
		return q.back("/floating-ips", err)
	}
	if len(nets.Networks) == 0 {
		return q.back("/floating-ips", &APIError{Status: http.StatusConflict, Message: q.T("This cloud has no public network.")})
	}
	body := map[string]any{"floatingip": map[string]any{"floating_network_id": nets.Networks[0].ID}}
	if err := q.api.Post(ctx, Network, "/v2.0/floatingips", body, nil); err != nil {
		return q.back("/floating-ips", err)
	}
	return q.redirect("/floating-ips", q.T("A public address was allocated."))
}

// associateFloatingIP points an address at a port, or frees it from one
// when no port is chosen. A port that no router joins to the public
// network gets one first (routeToPublic), which the customer asked for in
// asking for the address.
func (p *Panel) associateFloatingIP(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	var port any // JSON null detaches
	v := q.r.PostForm.Get("port")
	if v != "" {
		port = v
	}
	body := map[string]any{"floatingip": map[string]any{"port_id": port}}
	err = q.api.Do(q.r.Context(), http.MethodPut, Network, "/v2.0/floatingips/"+id, body, nil)
	if v != "" && StatusOf(err) == http.StatusNotFound {
		if err = p.routeToPublic(q, id, v); err == nil {
			err = q.api.Do(q.r.Context(), http.MethodPut, Network, "/v2.0/floatingips/"+id, body, nil)
		}
	}
	if err != nil {
		return q.back("/floating-ips", err)
	}
	return q.redirect("/floating-ips", q.T("The address was updated."))
}

func (p *Panel) deleteFloatingIP(q *req) error {
	id, err := pathID(q, "id")
	if err != nil {
		return err
	}
	if err := confirmed(q); err != nil {
		return q.back("/floating-ips", err)
	}
	if err := q.api.Delete(q.r.Context(), Network, "/v2.0/floatingips/"+id); err != nil {
		return q.back("/floating-ips", err)
	}
	return q.redirect("/floating-ips", q.T("The address was released."))
}
