package main

import (
	"context"
	"crypto/md5"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"golang.org/x/sys/unix"
)

// imageCommands are "nimbus admin image …": the image service, through the
// Glance v2 API with an OpenStack user's credentials, as the openstack CLI
// would do it.
var imageCommands = map[string]adminCommand{
	"list": imageListCommand,
	"import": {args: "<file|URL> [--checksums URL [--signature URL --keyring FILE]] [--name NAME] [--property k=v ...] [--replace]", nargs: 1,
		help: "Uploads a local cloud image file (qcow2, raw, iso; aki or ari kernel and ramdisk files) to the\n" +
			"image service through the Glance v2 API, showing progress on stderr, and checks that the\n" +
			"service stored exactly the file (size and MD5 checksum). A failed or interrupted upload\n" +
			"deletes the image it made.\n\n" +
			"Given an http(s) URL instead of a file, it downloads the vendor's image first, into\n" +
			"${XDG_CACHE_HOME:-~/.cache}/nimbus/downloads, resuming an interrupted download (by an HTTP\n" +
			"Range request, also on a rerun) and verifying it against the vendor's checksum list --checksums\n" +
			"(SHA256SUMS or SHA512SUMS, GNU or BSD lines), and that list's detached signature --signature\n" +
			"with gpgv against --keyring when given. A mismatch is refused: the download is deleted and\n" +
			"no image is made. --cacert trusts a mirror's own CA.\n\n" +
			"The disk format is detected unless given: qcow2 by its magic, iso by its volume descriptor,\n" +
			"else raw; aki and ari only when given (their container format follows).\n\n" +
			"Credentials are those of the openstack CLI: cloud --os-cloud of the clouds.yaml --clouds\n" +
			"(by default the one \"nimbus serve\" wrote into --data-dir), or the OS_* variables of an\n" +
			"openrc file (OS_AUTH_URL, OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME, OS_CACERT, ...) when\n" +
			"OS_AUTH_URL is set and neither --os-cloud, --clouds, --data-dir nor OS_CLOUD is.\n\n" +
			"--replace swaps the data of the newest image of that name the project owns, such as a catalog\n" +
			"image whose data is still a placeholder (nimbus_placeholder=true), for the new upload: the\n" +
			"image keeps its id, name, properties and visibility (the placeholder mark goes), so flavors,\n" +
			"quotes and references keep working; other images of that name the project owns are deleted.\n" +
			"The data goes to a staging image first, swapped in by the admin-only nimbus-replace-data\n" +
			"action; without the admin role the staging image takes the old one's properties and place\n" +
			"under a new id. Without --replace a second image of the same name is made, as Glance allows.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			o := &importOptions{props: kvFlag{}, set: map[string]bool{}}
			fs.StringVar(&o.cloud, "os-cloud", envOr("OS_CLOUD", "nimbus-admin"), "cloud to use from the clouds file (env OS_CLOUD)")
			fs.StringVar(&o.clouds, "clouds", "", "clouds.yaml to read (default $OS_CLIENT_CONFIG_FILE, else clouds.yaml in --data-dir)")
			fs.StringVar(&o.name, "name", "", "image name (default: the file's name without its extension)")
			fs.StringVar(&o.diskFormat, "disk-format", "", "qcow2, raw, iso, aki, ari, vmdk, vdi, vhd, vhdx, ploop or ami (default: detected)")
			fs.StringVar(&o.containerFormat, "container-format", "", "bare, ovf, ova, aki, ari, ami, docker or compressed (default: aki, ari or ami for those disk formats, else bare)")
			fs.BoolVar(&o.public, "public", false, "make the image public (default private; admin only); --public=false keeps a replacement private")
			fs.IntVar(&o.minDisk, "min-disk", 0, "smallest root disk, in GB, the image boots from")
			fs.IntVar(&o.minRAM, "min-ram", 0, "smallest RAM, in MB, the image boots with")
			fs.Var(o.props, "property", "an image property key=value, repeatable (os_type=linux, login_user=debian, kernel_id=…,\nramdisk_id=…, os_command_line=…, hw_cdrom_bus=…, img_config_drive=mandatory)")
			fs.StringVar(&o.osType, "os-type", "", "linux or windows: the os_type property")
			fs.BoolVar(&o.replace, "replace", false, "replace the data of the project's image of this name, keeping its id (see above)")
			fs.StringVar(&o.checksums, "checksums", "", "with a URL: the vendor's checksum list (SHA256SUMS, SHA512SUMS) to verify against")
			fs.StringVar(&o.signature, "signature", "", "with a URL: the checksum list's detached OpenPGP signature (SHA256SUMS.sign, .gpg, .asc)")
			fs.StringVar(&o.keyring, "keyring", "", "the vendor's public keys that --signature is checked against (gpgv --keyring)")
			fs.StringVar(&o.cacert, "cacert", "", "with a URL: a PEM CA certificate to trust besides the system's")
			return func(ctx context.Context, args []string) error {
				fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
				return a.imageImport(ctx, args[0], o)
			}
		}},
}

// importOptions are the flags of "image import"; set says which were given.
type importOptions struct {
	cloud, clouds               string
	name                        string
	diskFormat, containerFormat string
	public, replace             bool
	minDisk, minRAM             int
	props                       kvFlag
	osType                      string
	set                         map[string]bool
	// An import from a URL.
	checksums, signature, keyring, cacert string
}

// kvFlag is a repeatable key=value flag.
type kvFlag map[string]string

func (f kvFlag) String() string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k+"="+f[k])
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (f kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	f[strings.TrimSpace(k)] = v
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Glance's formats (glance-api.conf disk_formats and container_formats).
var (
	glanceDiskFormats      = []string{"ami", "ari", "aki", "vhd", "vhdx", "vmdk", "raw", "qcow2", "vdi", "iso", "ploop"}
	glanceContainerFormats = []string{"ami", "ari", "aki", "bare", "ovf", "ova", "docker", "compressed"}
)

// imageAttrFlags are image attributes that are no properties: --property
// must not set them behind the flags' back.
var imageAttrFlags = map[string]string{
	"name": "--name", "disk_format": "--disk-format", "container_format": "--container-format",
	"visibility": "--public", "min_disk": "--min-disk", "min_ram": "--min-ram",
	"id": "", "status": "", "owner": "", "protected": "", "os_hidden": "", "tags": "", "size": "",
	"virtual_size": "", "checksum": "", "os_hash_algo": "", "os_hash_value": "", "locations": "",
	"direct_url": "", "created_at": "", "updated_at": "", "self": "", "file": "", "schema": "",
}

// importHeadSize is how much of a file format detection reads: through an
// ISO 9660 primary volume descriptor's "CD001" at 0x8001.
const importHeadSize = 0x8001 + 5

// detectDiskFormat names the disk format of a file that starts with head:
// qcow2 by its magic, iso by the ISO 9660 volume descriptor, else raw.
func detectDiskFormat(head []byte) string {
	switch {
	case len(head) >= 4 && string(head[:4]) == "QFI\xfb":
		return "qcow2"
	case len(head) >= importHeadSize && string(head[0x8001:0x8006]) == "CD001":
		return "iso"
	}
	return "raw"
}

// defaultContainerFormat is the container format a disk format goes with:
// Glance wants the kernel, ramdisk and machine formats of AWS in their own
// containers.
func defaultContainerFormat(diskFormat string) string {
	switch diskFormat {
	case "aki", "ari", "ami":
		return diskFormat
	}
	return "bare"
}

// imageNameFromFile is a file's name without its extension; an "extension"
// of digits only (ubuntu-24.04) is part of the name.
func imageNameFromFile(path string) string {
	base := filepath.Base(path)
	ext := filepath.Ext(base)
	if len(ext) < 2 || ext == base || !strings.ContainsFunc(ext[1:], func(r rune) bool { return r < '0' || r > '9' }) {
		return base
	}
	return strings.TrimSuffix(base, ext)
}

// importPlan is what the options resolve to before anything is sent.
type importPlan struct {
	name, diskFormat, containerFormat string
	props                             map[string]string
	warnings                          []string
}

// plan validates the options against the file's first bytes.
func (o *importOptions) plan(path string, head []byte) (*importPlan, error) {
	p := &importPlan{name: o.name, diskFormat: o.diskFormat, containerFormat: o.containerFormat, props: map[string]string{}}
	if p.name == "" {
		p.name = imageNameFromFile(path)
	}
	if strings.TrimSpace(p.name) == "" || len([]rune(p.name)) > 255 {
		return nil, fmt.Errorf("invalid --name %q: 1 to 255 characters", p.name)
	}
	detected := detectDiskFormat(head)
	switch {
	case p.diskFormat == "":
		p.diskFormat = detected
	case !slices.Contains(glanceDiskFormats, p.diskFormat):
		return nil, fmt.Errorf("invalid --disk-format %q: one of %s", p.diskFormat, strings.Join(glanceDiskFormats, ", "))
	case p.diskFormat != detected && (detected != "raw" || p.diskFormat == "qcow2" || p.diskFormat == "iso"):
		p.warnings = append(p.warnings, fmt.Sprintf("%s looks like %s, not %s; uploading it as %s as told", path, detected, p.diskFormat, p.diskFormat))
	}
	if p.containerFormat == "" {
		p.containerFormat = defaultContainerFormat(p.diskFormat)
	} else if !slices.Contains(glanceContainerFormats, p.containerFormat) {
		return nil, fmt.Errorf("invalid --container-format %q: one of %s", p.containerFormat, strings.Join(glanceContainerFormats, ", "))
	}
	if o.minDisk < 0 || o.minRAM < 0 {
		return nil, errors.New("--min-disk and --min-ram must not be negative")
	}
	for k, v := range o.props {
		if fl, ok := imageAttrFlags[k]; ok {
			if fl != "" {
				return nil, fmt.Errorf("--property %s: set it with %s", k, fl)
			}
			return nil, fmt.Errorf("--property %s: %s is an image attribute, not a property", k, k)
		}
		p.props[k] = v
	}
	switch o.osType {
	case "":
	case "linux", "windows":
		if v, ok := p.props["os_type"]; ok && v != o.osType {
			return nil, fmt.Errorf("--os-type %s and --property os_type=%s disagree", o.osType, v)
		}
		p.props["os_type"] = o.osType
	default:
		return nil, fmt.Errorf("invalid --os-type %q: linux or windows", o.osType)
	}
	return p, nil
}

// importedImage is what "image import" prints.
type importedImage struct {
	ID              string            `json:"id"`
	Name            string            `json:"name"`
	Status          string            `json:"status"`
	Checksum        string            `json:"checksum"`
	Size            int64             `json:"size"`
	VirtualSize     int64             `json:"virtual_size"`
	DiskFormat      string            `json:"disk_format"`
	ContainerFormat string            `json:"container_format"`
	Visibility      string            `json:"visibility"`
	Owner           string            `json:"owner"`
	MinDisk         int               `json:"min_disk"`
	MinRAM          int               `json:"min_ram"`
	Properties      map[string]string `json:"properties"`
}

// importProgressHook, when set (by tests), is called as the upload reads
// the file, with the bytes read so far.
var importProgressHook func(sent, total int64)

func (a *adminRun) imageImport(ctx context.Context, path string, o *importOptions) (err error) {
	label := path // what names the image and the messages
	if isImageURL(path) {
		local, remove, err := a.fetchImage(ctx, path, o)
		if err != nil {
			return err
		}
		defer remove()
		label, path = pathBase(path), local
	} else if o.checksums != "" || o.signature != "" {
		return errors.New("--checksums and --signature verify a download: give a URL")
	}
	f, size, head, err := openImageFile(path)
	if err != nil {
		return err
	}
	defer f.Close()
	plan, err := o.plan(label, head)
	if err != nil {
		return err
	}
	for _, w := range plan.warnings {
		fmt.Fprintln(a.stderr, "warning:", w)
	}

	creds, err := a.imageCredentials(o)
	if err != nil {
		return err
	}
	client, projectID, err := creds.connect(ctx)
	if err != nil {
		return err
	}

	// The images --replace replaces, found before the new one exists.
	var old []images.Image
	if o.replace {
		if old, err = ownImagesNamed(ctx, client, plan.name, projectID); err != nil {
			return fmt.Errorf("list the images named %q: %s", plan.name, apiMessage(err))
		}
		for _, im := range old {
			if im.Protected {
				return fmt.Errorf("image %s (%q) is protected and cannot be replaced: unprotect it first "+
					"(openstack image set --unprotected %s)", im.ID, im.Name, im.ID)
			}
		}
	}
	create := images.CreateOpts{Name: plan.name, DiskFormat: plan.diskFormat, ContainerFormat: plan.containerFormat,
		MinDisk: o.minDisk, MinRAM: o.minRAM, Properties: map[string]string{}}
	vis := images.ImageVisibilityPrivate
	if len(old) > 0 {
		tmpl := old[0] // the newest
		for k, v := range tmpl.Properties {
			if s, ok := v.(string); ok && inheritable(k) {
				create.Properties[k] = s
			}
		}
		if !o.set["min-disk"] {
			create.MinDisk = tmpl.MinDiskGigabytes
		}
		if !o.set["min-ram"] {
			create.MinRAM = tmpl.MinRAMMegabytes
		}
		if tmpl.Visibility != "" {
			vis = tmpl.Visibility
		}
	}
	if o.set["public"] {
		vis = images.ImageVisibilityPrivate
		if o.public {
			vis = images.ImageVisibilityPublic
		}
	}
	create.Visibility = &vis
	if len(old) > 0 {
		// A staging image: out of customers' sight until its data is
		// swapped into the old image (or, for a non-admin, it is shown).
		private, hidden := images.ImageVisibilityPrivate, true
		create.Visibility, create.Hidden = &private, &hidden
	}
	for k, v := range plan.props {
		create.Properties[k] = v
	}

	img, err := images.Create(ctx, client, create).Extract()
	if err != nil {
		return fmt.Errorf("create image %q: %s", plan.name, apiMessage(err))
	}
	// From here on a failure leaves no half-made image behind: Glance
	// would keep it queued (or saving) for ever.
	defer func() {
		var keep keepImageError
		if err == nil || errors.As(err, &keep) {
			return
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := images.Delete(dctx, client, img.ID).ExtractErr(); derr != nil && !gophercloud.ResponseCodeIs(derr, http.StatusNotFound) {
			err = fmt.Errorf("%w; the incomplete image %s is left behind, delete it with openstack image delete %s: %s",
				err, img.ID, img.ID, apiMessage(derr))
			return
		}
		err = fmt.Errorf("%w; deleted the incomplete image %s", err, img.ID)
	}()

	fmt.Fprintf(a.stderr, "uploading %s (%s, %s) to image %s %q\n", label, formatBytes(size, size), plan.diskFormat, img.ID, plan.name)
	bar := newProgressBar(a.stderr, size)
	body := &uploadReader{r: io.NewSectionReader(f, 0, size), size: size, md5: md5.New(), bar: bar, hook: importProgressHook}
	err = imagedata.Upload(ctx, client, img.ID, body).ExtractErr()
	bar.finish()
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("upload interrupted")
		}
		return fmt.Errorf("upload refused: %s", apiMessage(err))
	}

	got, err := waitImageActive(ctx, client, img.ID)
	if err != nil {
		return err
	}
	sum := body.sum()
	if got.SizeBytes != size || got.Checksum != sum {
		return fmt.Errorf("the image service stored %d bytes with MD5 %s, but %s has %d bytes with MD5 %s",
			got.SizeBytes, orDash(got.Checksum), label, size, sum)
	}
	if len(old) > 0 {
		swapped, err := replaceImageData(ctx, client, old[0].ID, got.ID)
		switch {
		case err == nil:
			// The old image holds the data now; the staging one is gone.
			if swapped, err = applyGiven(ctx, client, swapped, plan.props, o); err != nil {
				return keepImageError{fmt.Errorf("imported into image %s, but could not set what was given: %s", swapped.ID, apiMessage(err))}
			}
			return a.deleteReplaced(ctx, client, swapped, []string{swapped.ID}, old[1:])
		case !gophercloud.ResponseCodeIs(err, http.StatusForbidden):
			return fmt.Errorf("swap the new data into image %s: %s", old[0].ID, apiMessage(err))
		}
		// Not an admin: the staging image, shown, replaces the old ones.
		if got, err = showStaging(ctx, client, got.ID, vis); err != nil {
			return fmt.Errorf("show the new image: %s", apiMessage(err))
		}
	}
	return a.deleteReplaced(ctx, client, got, nil, old)
}

// deleteReplaced deletes the images old that got replaces and prints got.
func (a *adminRun) deleteReplaced(ctx context.Context, client *gophercloud.ServiceClient, got *images.Image, replaced []string, old []images.Image) error {
	for _, im := range old {
		if derr := images.Delete(ctx, client, im.ID).ExtractErr(); derr != nil && !gophercloud.ResponseCodeIs(derr, http.StatusNotFound) {
			// The new image is good: keep it, and say what is left.
			if perr := a.printImported(got, replaced); perr != nil {
				return keepImageError{perr}
			}
			return keepImageError{fmt.Errorf("imported %s, but could not delete the image it replaces, %s: %s",
				got.ID, im.ID, apiMessage(derr))}
		}
		replaced = append(replaced, im.ID)
	}
	return a.printImported(got, replaced)
}

// keepImageError is an error after which the new image stays: it is good,
// and only what came after failed.
type keepImageError struct{ error }

func (e keepImageError) Unwrap() error { return e.error }

// inheritable says whether a replaced image's property is carried over.
func inheritable(k string) bool {
	switch k {
	case "nimbus_placeholder", "os_hash_algo", "os_hash_value", "locations", "direct_url", "stores", "properties", "file", "schema":
		return false
	}
	// Glance's own bookkeeping, and the openstack CLI's checksums of the
	// old data.
	return !strings.HasPrefix(k, "os_glance") && !strings.HasPrefix(k, "owner_specified.")
}

// openImageFile opens a regular, non-empty file and reads its head.
func openImageFile(path string) (*os.File, int64, []byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil, fmt.Errorf("no such file: %s", path)
	}
	if err != nil {
		return nil, 0, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() == 0 {
		f.Close()
		return nil, 0, nil, fmt.Errorf("%s is empty", path)
	}
	head := make([]byte, min(st.Size(), importHeadSize))
	if _, err := f.ReadAt(head, 0); err != nil && err != io.EOF {
		f.Close()
		return nil, 0, nil, fmt.Errorf("read %s: %w", path, err)
	}
	return f, st.Size(), head, nil
}

// ownImagesNamed lists the images called exactly name that project owns,
// newest first.
func ownImagesNamed(ctx context.Context, client *gophercloud.ServiceClient, name, project string) ([]images.Image, error) {
	opts := images.ListOpts{Name: name, Owner: project, Sort: "created_at:desc"}
	if strings.HasPrefix(name, "in:") {
		opts.Name = "" // the server would read a list of names: filter here
	}
	pages, err := images.List(client, opts).AllPages(ctx)
	if err != nil {
		return nil, err
	}
	all, err := images.ExtractImages(pages)
	if err != nil {
		return nil, err
	}
	var out []images.Image
	for _, im := range all {
		if im.Name == name && im.Owner == project {
			out = append(out, im)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

// waitImageActive answers the image once its data is stored: Glance v2
// makes it active before the upload returns, but a store may take a moment.
func waitImageActive(ctx context.Context, client *gophercloud.ServiceClient, id string) (*images.Image, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		img, err := images.Get(ctx, client, id).Extract()
		if err != nil {
			return nil, fmt.Errorf("read the uploaded image: %s", apiMessage(err))
		}
		switch img.Status {
		case images.ImageStatusActive:
			return img, nil
		case images.ImageStatusSaving, images.ImageStatusImporting:
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the image is still %s after the upload", img.Status)
			}
		default:
			return nil, fmt.Errorf("the image is %s after the upload, not active", img.Status)
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("interrupted waiting for the image to become active")
		case <-time.After(time.Second):
		}
	}
}

func (a *adminRun) printImported(img *images.Image, replaced []string) error {
	out := importedImage{ID: img.ID, Name: img.Name, Status: string(img.Status), Checksum: img.Checksum, Size: img.SizeBytes,
		VirtualSize: img.VirtualSize, DiskFormat: img.DiskFormat, ContainerFormat: img.ContainerFormat,
		Visibility: string(img.Visibility), Owner: img.Owner, MinDisk: img.MinDiskGigabytes, MinRAM: img.MinRAMMegabytes,
		Properties: map[string]string{}}
	for k, v := range img.Properties {
		if s, ok := v.(string); ok && inheritable(k) {
			out.Properties[k] = s
		}
	}
	if replaced == nil {
		replaced = []string{}
	}
	if a.json {
		return a.printJSON(map[string]any{"image": out, "replaced": replaced})
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "id\t%s\n", out.ID)
	fmt.Fprintf(w, "name\t%s\n", out.Name)
	fmt.Fprintf(w, "status\t%s\n", out.Status)
	fmt.Fprintf(w, "checksum\t%s\n", out.Checksum)
	fmt.Fprintf(w, "size\t%d (%s)\n", out.Size, formatBytes(out.Size, out.Size))
	fmt.Fprintf(w, "disk_format\t%s\n", out.DiskFormat)
	fmt.Fprintf(w, "container_format\t%s\n", out.ContainerFormat)
	fmt.Fprintf(w, "visibility\t%s\n", out.Visibility)
	if len(replaced) > 0 {
		fmt.Fprintf(w, "replaced\t%s\n", strings.Join(replaced, ", "))
	}
	return w.Flush()
}

// uploadReader streams the file to the request, hashing it and moving the
// progress bar. It is an io.ReadCloser, so that the request keeps it as its
// body and sizedTransport can give the request its length, and it seeks,
// so that gophercloud can send it again after reauthenticating.
type uploadReader struct {
	mu   sync.Mutex // Read runs on the transport's goroutine
	r    *io.SectionReader
	size int64
	sent int64
	md5  hash.Hash
	bar  *progressBar
	hook func(sent, total int64) // importProgressHook, read once
}

func (u *uploadReader) Read(p []byte) (int, error) {
	u.mu.Lock()
	n, err := u.r.Read(p)
	u.md5.Write(p[:n])
	u.sent += int64(n)
	sent := u.sent
	u.mu.Unlock()
	u.bar.update(sent)
	if u.hook != nil {
		u.hook(sent, u.size)
	}
	return n, err
}

func (u *uploadReader) Seek(offset int64, whence int) (int64, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if offset != 0 || whence != io.SeekStart {
		return 0, errors.New("upload: can only start over")
	}
	u.md5.Reset()
	u.sent = 0
	return u.r.Seek(0, io.SeekStart)
}

func (u *uploadReader) Close() error { return nil }

// Size is the body's length, for sizedTransport.
func (u *uploadReader) Size() int64 { return u.size }

func (u *uploadReader) sum() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return hex.EncodeToString(u.md5.Sum(nil))
}

// sizedTransport gives a request whose body knows its size a
// Content-Length: gophercloud hands the body to http.NewRequest, which
// learns the length only of in-memory readers and would otherwise send
// the file chunked.
type sizedTransport struct{ base http.RoundTripper }

func (t sizedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if s, ok := req.Body.(interface{ Size() int64 }); ok && req.ContentLength == 0 {
		req = req.Clone(req.Context())
		req.ContentLength = s.Size()
	}
	return t.base.RoundTrip(req)
}

// progressBar shows an upload's progress: on a terminal one line redrawn
// at most ten times a second, otherwise a line per tenth, so that logs
// stay short.
type progressBar struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	total  int64
	start  time.Time
	last   time.Time // the terminal line's last redraw
	drawn  int       // the terminal line's length
	decile int64     // the tenths already logged
	sent   int64
	now    func() time.Time
}

func newProgressBar(w io.Writer, total int64) *progressBar {
	b := &progressBar{w: w, tty: isTerminal(w), total: total, now: time.Now}
	b.start = b.now()
	return b
}

// isTerminal tells whether w is a terminal. A character device is not
// enough: /dev/null, a serial line or a pipe-backed log is one too, and there
// every redraw would be a line of its own.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func (b *progressBar) update(sent int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	again := sent == b.sent // the reader's EOF, say
	b.sent = sent
	now := b.now()
	if b.tty {
		if (now.Sub(b.last) < 100*time.Millisecond || again) && (sent < b.total || again) {
			return
		}
		b.last = now
		b.redraw(now)
		return
	}
	if d := sent * 10 / b.total; d > b.decile {
		b.decile = d
		fmt.Fprintln(b.w, b.line(now))
	}
}

// redraw rewrites the terminal line, blanking what is left of a longer one.
func (b *progressBar) redraw(now time.Time) {
	s := b.line(now)
	pad := max(b.drawn-len(s), 0)
	fmt.Fprintf(b.w, "\r%s%s", s, strings.Repeat(" ", pad))
	b.drawn = len(s)
}

// finish ends the terminal line.
func (b *progressBar) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tty && b.drawn > 0 {
		b.redraw(b.now())
		fmt.Fprintln(b.w)
	}
}

// line is "  45%  1.17 / 2.60 GiB  85.3 MiB/s  ETA 0:17".
func (b *progressBar) line(now time.Time) string {
	elapsed := now.Sub(b.start).Seconds()
	rate, eta := "", "ETA --:--"
	if elapsed > 0 && b.sent > 0 {
		r := float64(b.sent) / elapsed
		rate = "  " + formatBytes(int64(r), int64(r)) + "/s"
		eta = "ETA " + formatETA(time.Duration(float64(b.total-b.sent)/r*float64(time.Second)))
	}
	if b.sent >= b.total {
		eta = "in " + formatETA(now.Sub(b.start))
	}
	pct := b.sent * 100 / b.total
	return fmt.Sprintf("%4d%%  %s / %s%s  %s", pct, formatNumber(b.sent, b.total), formatBytes(b.total, b.total), rate, eta)
}

// byteUnit is the binary unit of the scale of n.
func byteUnit(n int64) (float64, string) {
	switch {
	case n >= 1<<30:
		return 1 << 30, "GiB"
	case n >= 1<<20:
		return 1 << 20, "MiB"
	case n >= 1<<10:
		return 1 << 10, "KiB"
	}
	return 1, "B"
}

// formatBytes is n in the unit of scale: "1.17 GiB".
func formatBytes(n, scale int64) string {
	return formatNumber(n, scale) + " " + unitName(scale)
}

func unitName(scale int64) string { _, u := byteUnit(scale); return u }

// formatNumber is n in the unit of scale, without the unit.
func formatNumber(n, scale int64) string {
	div, u := byteUnit(scale)
	if u == "B" {
		return strconv.FormatInt(n, 10)
	}
	return strconv.FormatFloat(float64(n)/div, 'f', 2, 64)
}

// formatETA is d as m:ss or h:mm:ss.
func formatETA(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

// apiMessage is an OpenStack API error as a person wants to read it: the
// status and the service's message, not the whole response.
func apiMessage(err error) string {
	var ue gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &ue) {
		var pue *gophercloud.ErrUnexpectedResponseCode
		if !errors.As(err, &pue) {
			return err.Error()
		}
		ue = *pue
	}
	msg := bodyMessage(ue.Body)
	s := fmt.Sprintf("%d %s", ue.Actual, http.StatusText(ue.Actual))
	if msg != "" {
		s += ": " + msg
	}
	return s
}

// bodyMessage finds the message of an OpenStack error body: Keystone's and
// Glance's {"error": {"message"}}, Nimbus's Glance {"message"}, Nova's
// {"<fault>": {"message"}}, or plain text.
func bodyMessage(body []byte) string {
	var v map[string]any
	if json.Unmarshal(body, &v) == nil {
		if m, ok := v["message"].(string); ok {
			return m
		}
		for _, inner := range v {
			if m, ok := inner.(map[string]any); ok {
				if s, ok := m["message"].(string); ok {
					return s
				}
			}
		}
	}
	s := strings.Join(strings.Fields(string(body)), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// cloudCredentials are an OpenStack user's credentials and where they came
// from.
type cloudCredentials struct {
	source                              string
	authURL, username, userID, password string
	projectName, projectID              string
	userDomainName, userDomainID        string
	projectDomainName, projectDomainID  string
	region, iface, cacert               string
}

// imageCredentials finds the credentials as the openstack CLI does: the OS_*
// variables of an openrc when OS_AUTH_URL is set and no cloud was named,
// else a cloud of a clouds.yaml.
func (a *adminRun) imageCredentials(o *importOptions) (*cloudCredentials, error) {
	named := o.set["os-cloud"] || o.set["clouds"] || o.set["data-dir"] || os.Getenv("OS_CLOUD") != ""
	if !named && os.Getenv("OS_AUTH_URL") != "" {
		c := &cloudCredentials{source: "OS_* environment variables",
			authURL: os.Getenv("OS_AUTH_URL"), username: os.Getenv("OS_USERNAME"), userID: os.Getenv("OS_USER_ID"),
			password: os.Getenv("OS_PASSWORD"), projectName: envOr("OS_PROJECT_NAME", os.Getenv("OS_TENANT_NAME")),
			projectID:      envOr("OS_PROJECT_ID", os.Getenv("OS_TENANT_ID")),
			userDomainName: os.Getenv("OS_USER_DOMAIN_NAME"), userDomainID: os.Getenv("OS_USER_DOMAIN_ID"),
			projectDomainName: os.Getenv("OS_PROJECT_DOMAIN_NAME"), projectDomainID: os.Getenv("OS_PROJECT_DOMAIN_ID"),
			region: os.Getenv("OS_REGION_NAME"), iface: os.Getenv("OS_INTERFACE"), cacert: os.Getenv("OS_CACERT")}
		return c, c.check()
	}
	file := o.clouds
	if file == "" {
		if env := os.Getenv("OS_CLIENT_CONFIG_FILE"); env != "" && !o.set["data-dir"] {
			file = env
		} else {
			file = filepath.Join(a.dataDir, "clouds.yaml")
		}
	}
	c, err := loadCloud(file, o.cloud)
	if err != nil {
		return nil, err
	}
	return c, c.check()
}

func (c *cloudCredentials) check() error {
	switch {
	case c.authURL == "":
		return fmt.Errorf("no auth URL in the %s", c.source)
	case c.username == "" && c.userID == "":
		return fmt.Errorf("no user name in the %s", c.source)
	case c.password == "":
		return fmt.Errorf("no password in the %s", c.source)
	case c.projectName == "" && c.projectID == "":
		return fmt.Errorf("no project in the %s", c.source)
	}
	// Keystone v3 needs the domains of names; the openstack CLI's users
	// nearly always mean the Default domain.
	if c.userDomainName == "" && c.userDomainID == "" {
		c.userDomainName = "Default"
	}
	if c.projectDomainName == "" && c.projectDomainID == "" {
		c.projectDomainName = "Default"
	}
	return nil
}

// loadCloud reads cloud name from a clouds.yaml.
func loadCloud(file, name string) (*cloudCredentials, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no clouds.yaml at %s: give the controller's --data-dir, --clouds FILE, or the OS_* variables "+
			"of an openrc file (source admin-openrc.sh)", file)
	}
	if err != nil {
		return nil, err
	}
	doc, err := parseYAMLMap(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	clouds, _ := doc["clouds"].(map[string]any)
	cl, ok := clouds[name].(map[string]any)
	if !ok {
		names := make([]string, 0, len(clouds))
		for k := range clouds {
			names = append(names, k)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("no cloud %q in %s (it has: %s)", name, file, strings.Join(names, ", "))
	}
	get := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	auth, _ := cl["auth"].(map[string]any)
	if t := get(cl, "auth_type"); t != "" && t != "password" && t != "v3password" {
		return nil, fmt.Errorf("cloud %q in %s: auth_type %s is not supported, only password", name, file, t)
	}
	c := &cloudCredentials{source: fmt.Sprintf("cloud %s of %s", name, file),
		authURL: get(auth, "auth_url"), username: get(auth, "username"), userID: get(auth, "user_id"),
		password: get(auth, "password"), projectName: get(auth, "project_name"), projectID: get(auth, "project_id"),
		userDomainName: get(auth, "user_domain_name"), userDomainID: get(auth, "user_domain_id"),
		projectDomainName: get(auth, "project_domain_name"), projectDomainID: get(auth, "project_domain_id"),
		region: get(cl, "region_name"), iface: get(cl, "interface"), cacert: get(cl, "cacert")}
	if d := get(auth, "domain_name"); d != "" {
		c.userDomainName, c.projectDomainName = firstOf(c.userDomainName, d), firstOf(c.projectDomainName, d)
	}
	if c.projectName == "" && c.projectID == "" {
		c.projectName = get(auth, "tenant_name")
	}
	return c, nil
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// connect authenticates and answers an image client and the project the
// token is scoped to.
func (c *cloudCredentials) connect(ctx context.Context) (*gophercloud.ServiceClient, string, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.cacert != "" {
		pem, err := os.ReadFile(c.cacert)
		if err != nil {
			return nil, "", fmt.Errorf("the CA certificate of the %s: %w", c.source, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("the CA certificate %s of the %s holds no PEM certificate", c.cacert, c.source)
		}
		tlsCfg.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	pc, err := openstack.NewClient(c.authURL)
	if err != nil {
		return nil, "", fmt.Errorf("auth URL %q of the %s: %w", c.authURL, c.source, err)
	}
	// No overall timeout: an upload takes as long as it takes.
	pc.HTTPClient = http.Client{Transport: sizedTransport{base: tr}}
	scope := &gophercloud.AuthScope{ProjectID: c.projectID}
	if c.projectID == "" {
		scope = &gophercloud.AuthScope{ProjectName: c.projectName, DomainName: c.projectDomainName, DomainID: c.projectDomainID}
		if c.projectDomainID != "" {
			scope.DomainName = ""
		}
	}
	ao := gophercloud.AuthOptions{IdentityEndpoint: c.authURL, Username: c.username, UserID: c.userID, Password: c.password,
		DomainName: c.userDomainName, DomainID: c.userDomainID, Scope: scope, AllowReauth: true}
	if c.userID != "" || c.userDomainID != "" {
		ao.DomainName = ""
	}
	if c.userID != "" {
		ao.Username, ao.DomainID = "", ""
	}
	who := firstOf(c.username, c.userID)
	if err := openstack.Authenticate(ctx, pc, ao); err != nil {
		return nil, "", fmt.Errorf("authentication as %s at %s failed (%s): %s%s", who, c.authURL, c.source, apiMessage(err), connectHint(err))
	}
	project := c.projectID
	if r, ok := pc.GetAuthResult().(interface {
		ExtractProject() (*tokens.Project, error)
	}); ok {
		if p, err := r.ExtractProject(); err == nil && p != nil {
			project = p.ID
		}
	}
	if project == "" {
		return nil, "", fmt.Errorf("the token of %s at %s names no project", who, c.authURL)
	}
	client, err := openstack.NewImageV2(pc, gophercloud.EndpointOpts{Region: c.region, Availability: availability(c.iface)})
	if err != nil {
		return nil, "", fmt.Errorf("no image service in the catalog of %s: %w", c.authURL, err)
	}
	return client, project, nil
}

// availability is the endpoint interface a clouds.yaml or OS_INTERFACE names.
func availability(iface string) gophercloud.Availability {
	switch strings.TrimSuffix(strings.ToLower(iface), "url") {
	case "internal":
		return gophercloud.AvailabilityInternal
	case "admin":
		return gophercloud.AvailabilityAdmin
	}
	return gophercloud.AvailabilityPublic
}

// connectHint says what usually causes a connection error.
func connectHint(err error) string {
	var ue gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &ue) {
		return ""
	}
	var ua x509.UnknownAuthorityError
	var cv *tls.CertificateVerificationError
	switch {
	case errors.As(err, &ua) || errors.As(err, &cv):
		return " (is the cloud's CA given: cacert in clouds.yaml, or OS_CACERT?)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return " (is nimbus serve running there?)"
	}
	return ""
}

// parseYAMLMap reads the subset of YAML a clouds.yaml uses: nested block
// mappings of scalars (plain, 'single' or "double" quoted), with comments.
// Lists and block scalars are skipped: credentials need neither.
func parseYAMLMap(data []byte) (map[string]any, error) {
	type level struct {
		indent int // -1 until the mapping's first line is read
		m      map[string]any
		parent map[string]any // where m is, under key
		key    string
	}
	stack := []*level{{indent: -1, m: map[string]any{}}}
	root := stack[0].m
	skipDeeper := -1 // skip the lines of a list or block scalar
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimRight(raw, " \t\r")
		text := strings.TrimLeft(line, " ")
		if text == "" || text[0] == '#' || text == "---" || text == "..." {
			continue
		}
		if text[0] == '\t' {
			return nil, fmt.Errorf("line %d: tabs are not YAML indentation", i+1)
		}
		indent := len(line) - len(text)
		isItem := text == "-" || strings.HasPrefix(text, "- ")
		if skipDeeper >= 0 && (indent > skipDeeper || (indent == skipDeeper && isItem)) {
			continue
		}
		skipDeeper = -1
		top := stack[len(stack)-1]
		if top.indent < 0 && len(stack) > 1 && indent <= stack[len(stack)-2].indent {
			// The key opened no mapping: an empty value.
			stack = stack[:len(stack)-1]
			top.parent[top.key] = ""
		}
		for len(stack) > 1 && indent < stack[len(stack)-1].indent {
			stack = stack[:len(stack)-1]
		}
		top = stack[len(stack)-1]
		if top.indent < 0 {
			top.indent = indent
		}
		if indent != top.indent {
			return nil, fmt.Errorf("line %d: unexpected indentation", i+1)
		}
		if isItem {
			skipDeeper = indent // a list: not read
			continue
		}
		key, rest, err := yamlKey(text)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		switch {
		case rest == "":
			child := map[string]any{}
			top.m[key] = child
			stack = append(stack, &level{indent: -1, m: child, parent: top.m, key: key})
		case rest[0] == '|' || rest[0] == '>':
			top.m[key] = "" // a block scalar: not read
			skipDeeper = indent
		default:
			if top.m[key], err = yamlScalar(rest); err != nil {
				return nil, fmt.Errorf("line %d: %w", i+1, err)
			}
		}
	}
	if top := stack[len(stack)-1]; top.indent < 0 && top.parent != nil {
		top.parent[top.key] = ""
	}
	return root, nil
}

// yamlKey splits "key: rest" (the key possibly quoted) and answers rest
// trimmed, "" when the value is on the following lines.
func yamlKey(text string) (key, rest string, err error) {
	end := -1
	if text[0] == '"' || text[0] == '\'' {
		if end = quotedEnd(text); end < 0 {
			return "", "", errors.New("unterminated quoted key")
		}
		if key, err = yamlScalar(text[:end+1]); err != nil {
			return "", "", err
		}
		end++
		if end >= len(text) || text[end] != ':' || (end+1 < len(text) && text[end+1] != ' ') {
			return "", "", errors.New("want key: value")
		}
	} else {
		for j := 0; j < len(text); j++ {
			if text[j] == ':' && (j+1 == len(text) || text[j+1] == ' ') {
				end = j
				break
			}
		}
		if end < 0 {
			return "", "", errors.New("want key: value")
		}
		key = strings.TrimSpace(text[:end])
	}
	rest = strings.TrimSpace(text[end+1:])
	if strings.HasPrefix(rest, "#") {
		rest = ""
	}
	return key, rest, nil
}

// quotedEnd is the index of the quote closing the string s starts with, or
// -1: a double quote after an odd number of backslashes is escaped, two
// single quotes are one.
func quotedEnd(s string) int {
	q := s[0]
	for j := 1; j < len(s); j++ {
		switch {
		case q == '"' && s[j] == '\\':
			j++
		case s[j] == q && q == '\'' && j+1 < len(s) && s[j+1] == '\'':
			j++
		case s[j] == q:
			return j
		}
	}
	return -1
}

// yamlScalar reads a scalar value: quoted, or plain up to a comment.
func yamlScalar(s string) (string, error) {
	if s[0] != '"' && s[0] != '\'' {
		if i := strings.Index(s, " #"); i >= 0 {
			s = s[:i]
		}
		return strings.TrimSpace(s), nil
	}
	end := quotedEnd(s)
	if end < 0 {
		return "", errors.New("unterminated quoted string")
	}
	body := s[1:end]
	if s[0] == '\'' {
		return strings.ReplaceAll(body, "''", "'"), nil
	}
	if v, err := strconv.Unquote(s[:end+1]); err == nil {
		return v, nil
	}
	// YAML escapes Go does not know (\/, \e, \N, …): the common ones.
	return strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\/`, `/`, `\t`, "\t", `\n`, "\n").Replace(body), nil
}
