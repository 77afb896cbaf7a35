package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strconv"

	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
)

// imageListCommand is "nimbus admin image list": which images are real
// operating systems and which still carry their placeholder.
var imageListCommand = adminCommand{
	help: "Lists the images the credentials' project sees (an admin: every image) through the Glance v2\n" +
		"API: id, name, status, size, whether the data is a real image (\"no\" for a catalog image still\n" +
		"carrying its placeholder, nimbus_placeholder=true, which the qemu driver refuses to boot),\n" +
		"os_distro and the login user. Credentials as for \"image import\".\n" +
		"openstack image list --property nimbus_placeholder=true lists the placeholders alone.",
	setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
		o := &importOptions{set: map[string]bool{}}
		fs.StringVar(&o.cloud, "os-cloud", envOr("OS_CLOUD", "nimbus-admin"), "cloud to use from the clouds file (env OS_CLOUD)")
		fs.StringVar(&o.clouds, "clouds", "", "clouds.yaml to read (default $OS_CLIENT_CONFIG_FILE, else clouds.yaml in --data-dir)")
		return func(ctx context.Context, _ []string) error {
			fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
			return a.imageList(ctx, o)
		}
	},
}

// listedImage is one row of "image list".
type listedImage struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Size      int64  `json:"size"`
	Real      bool   `json:"real"`
	OSDistro  string `json:"os_distro"`
	LoginUser string `json:"login_user"`
}

func (a *adminRun) imageList(ctx context.Context, o *importOptions) error {
	creds, err := a.imageCredentials(o)
	if err != nil {
		return err
	}
	client, _, err := creds.connect(ctx)
	if err != nil {
		return err
	}
	pages, err := images.List(client, images.ListOpts{}).AllPages(ctx)
	if err != nil {
		return fmt.Errorf("list images: %s", apiMessage(err))
	}
	all, err := images.ExtractImages(pages)
	if err != nil {
		return err
	}
	rows := listedImages(all)
	if a.json {
		return a.printJSON(map[string]any{"images": rows})
	}
	table := make([][]string, 0, len(rows))
	for _, r := range rows {
		table = append(table, []string{r.ID, r.Name, r.Status, formatBytes(r.Size, r.Size), yesNo(r.Real), r.OSDistro, r.LoginUser})
	}
	return a.table([]string{"ID", "NAME", "STATUS", "SIZE", "REAL", "OS_DISTRO", "LOGIN_USER"}, table)
}

// listedImages are the rows of imgs, by name then id.
func listedImages(imgs []images.Image) []listedImage {
	rows := make([]listedImage, 0, len(imgs))
	for _, im := range imgs {
		rows = append(rows, listedImage{ID: im.ID, Name: im.Name, Status: string(im.Status), Size: im.SizeBytes,
			Real: !isPlaceholder(im.Properties["nimbus_placeholder"]), OSDistro: propString(im.Properties["os_distro"]),
			LoginUser: propString(im.Properties["login_user"])})
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Name != rows[j].Name {
			return rows[i].Name < rows[j].Name
		}
		return rows[i].ID < rows[j].ID
	})
	return rows
}

// isPlaceholder reads nimbus_placeholder as Glance hands it back: a string.
func isPlaceholder(v any) bool {
	b, _ := strconv.ParseBool(propString(v))
	return b
}

func propString(v any) string {
	s, _ := v.(string)
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
