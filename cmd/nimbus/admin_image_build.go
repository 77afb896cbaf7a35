package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"nimbus/internal/imagebuild"
)

// imageBuildHook, when set (by tests), is called with the built image
// before it is imported.
var imageBuildHook func(*imagebuild.Result)

func init() {
	imageCommands["build"] = adminCommand{args: "<" + strings.Join(imagebuild.Names(), "|") + "> [--rebuild] [--no-import]", nargs: 1,
		help: "Builds a real cloud image on this machine from the distribution's packages only (debian-12:\n" +
			"mmdebstrap of bookworm with the cloud kernel, cloud-init, OpenSSH, qemu-guest-agent, sudo,\n" +
			"growroot, systemd-networkd; syslinux on a FAT boot partition and an ext4 root partition, last\n" +
			"so that it grows to the server's disk; login user debian), without loop devices or mounts.\n" +
			"Needs root or password-less sudo, and a Debian mirror: the .debs are kept, so a rebuild\n" +
			"downloads only the package lists and what changed. The image is cached in\n" +
			"${XDG_CACHE_HOME:-~/.cache}/nimbus/images/<name>-<script hash> with its sha256 and manifest, and\n" +
			"then imported in place of the catalog's placeholder (\"Debian 12\") as \"image import --replace\"\n" +
			"does, with the same credential flags. Prints the build time and the image's size.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			o := &importOptions{props: kvFlag{}, set: map[string]bool{}}
			fs.StringVar(&o.cloud, "os-cloud", envOr("OS_CLOUD", "nimbus-admin"), "cloud to use from the clouds file (env OS_CLOUD)")
			fs.StringVar(&o.clouds, "clouds", "", "clouds.yaml to read (default $OS_CLIENT_CONFIG_FILE, else clouds.yaml in --data-dir)")
			var b imagebuild.Options
			fs.BoolVar(&b.Rebuild, "rebuild", false, "build again even when the cached image is current")
			noImport := fs.Bool("no-import", false, "build (or find cached) only; print the image's path")
			return func(ctx context.Context, args []string) error {
				fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
				return a.imageBuild(ctx, args[0], b, *noImport, o)
			}
		}}
}

// imageBuild builds recipe name and imports it over its catalog image.
func (a *adminRun) imageBuild(ctx context.Context, name string, b imagebuild.Options, noImport bool, o *importOptions) error {
	r, ok := imagebuild.Lookup(name)
	if !ok {
		return fmt.Errorf("no image build %q: one of %s", name, strings.Join(imagebuild.Names(), ", "))
	}
	b.Log = a.stderr
	res, err := imagebuild.Build(ctx, r, b)
	if err != nil {
		return err
	}
	how := "built"
	if res.Cached {
		how = "cached"
	}
	fmt.Fprintf(a.stderr, "%s %s in %s: %s, %s (virtual %s), sha256 %s\n", how, name, res.Elapsed.Round(100*time.Millisecond),
		res.Image, mib(res.Size), mib(res.VirtualSize), res.SHA256)
	if imageBuildHook != nil {
		imageBuildHook(res)
	}
	if noImport {
		_, err := fmt.Fprintln(a.stdout, res.Image)
		return err
	}
	o.name, o.replace, o.diskFormat = r.Image, true, "qcow2"
	o.props["nimbus_build"] = r.Name + "-" + r.Stamp()
	o.props["nimbus_build_sha256"] = res.SHA256
	// The built image has the guest agent, which the vendor's does not.
	o.props["hw_qemu_guest_agent"] = "yes"
	return a.imageImport(ctx, res.Image, o)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
