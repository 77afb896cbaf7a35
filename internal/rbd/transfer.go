package rbd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"nimbus/internal/driver"
)

// importFormats are the image formats ImportImage converts (Glance's
// disk_format values qemu-img reads). The format is always given to
// qemu-img: probing a user's file is how a raw image that looks like
// qcow2 reads the host's files.
var importFormats = map[string]bool{"raw": true, "qcow2": true, "vmdk": true, "vdi": true, "vhdx": true, "vpc": true, "qed": true}

// ImportImage makes image name of sizeBytes from a disk image file in
// format (Cinder's copy_image_to_volume): qemu-img converts it straight
// into the image through librbd, skipping zeroes, so the image stays
// thin. ErrInvalid if the file's virtual size exceeds sizeBytes (0: the
// virtual size, rounded up to 1 MiB).
func (s *Store) ImportImage(ctx context.Context, name, path, format string, sizeBytes int64) error {
	if err := checkImage(name); err != nil {
		return err
	}
	if format == "vhd" {
		format = "vpc"
	}
	if !importFormats[format] {
		return fmt.Errorf("rbd: image format %q: %w", format, ErrInvalid)
	}
	out, err := s.run(ctx, cmd{name: "qemu-img", args: []string{"info", "--output=json", "-f", format, path}})
	if err != nil {
		return err
	}
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("qemu-img info %s: %v", path, err)
	}
	if sizeBytes == 0 {
		sizeBytes = (info.VirtualSize + 1<<20 - 1) &^ (1<<20 - 1)
	}
	if info.VirtualSize > sizeBytes {
		return fmt.Errorf("rbd: image's virtual size %d exceeds the volume's %d: %w", info.VirtualSize, sizeBytes, ErrInvalid)
	}
	if err := s.Create(ctx, name, sizeBytes); err != nil {
		return err
	}
	conn, err := s.Conn(ctx, name)
	if err == nil {
		err = s.qemuImg(ctx, conn.Key, func(secret string) []string {
			// -n: into the image just made; --target-is-zero: it reads
			// as zeroes, so zero areas are not written.
			return []string{"convert", "-n", "--target-is-zero", "-f", format, "--target-image-opts", path, ImageOpts(conn, secret)}
		})
	}
	if err != nil {
		s.rbd(context.WithoutCancel(ctx), "rm", "--no-progress", s.spec(name))
	}
	return err
}

// qemuImg runs qemu-img with the arguments args(secret), where secret
// is the id of an object holding key: the key goes in a secret object
// read from a private file, so it never shows on a command line.
func (s *Store) qemuImg(ctx context.Context, key string, args func(secret string) []string) error {
	f, err := os.CreateTemp("", "nimbus-rbd-key-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(key)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	const secret = "rbdkey"
	// qemu-img takes --object after its subcommand.
	a := args(secret)
	a = append([]string{a[0], "--object", SecretObject(secret, f.Name())}, a[1:]...)
	_, err = s.run(ctx, cmd{name: "qemu-img", args: a, long: true})
	return err
}

// SecretObject is QEMU's --object (or -object) for a Ceph key kept in
// file: the key is base64 already, and QEMU's rbd driver hands librados
// the secret re-encoded as base64, so the object must decode it.
func SecretObject(id, file string) string {
	return "secret,id=" + id + ",format=base64,file=" + optEscape(file)
}

// ImageOpts is conn's image as QEMU's --image-opts/-drive options,
// format raw over the rbd protocol (BlockdevOptionsRbd): pool, image,
// user, the monitors as server.N and the key from secret object
// keySecret. No ceph.conf is needed on the host.
func ImageOpts(conn driver.VolumeConn, keySecret string) string {
	o := []string{
		"driver=raw", "file.driver=rbd",
		"file.pool=" + optEscape(conn.Pool), "file.image=" + optEscape(conn.Image),
		"file.user=" + optEscape(conn.User), "file.key-secret=" + optEscape(keySecret),
		"file.auth-client-required.0=cephx",
	}
	for i, m := range conn.Monitors {
		host, port := splitHostPort(m)
		o = append(o, fmt.Sprintf("file.server.%d.host=%s", i, optEscape(host)))
		if port != "" {
			o = append(o, fmt.Sprintf("file.server.%d.port=%s", i, optEscape(port)))
		}
	}
	return strings.Join(o, ",")
}

// splitHostPort splits "host:port", "[v6]:port" or a bare host.
func splitHostPort(a string) (host, port string) {
	if strings.HasPrefix(a, "[") {
		if i := strings.Index(a, "]"); i > 0 {
			host, rest := a[1:i], a[i+1:]
			return host, strings.TrimPrefix(rest, ":")
		}
	}
	if i := strings.LastIndex(a, ":"); i >= 0 && strings.Count(a, ":") == 1 {
		if _, err := strconv.Atoi(a[i+1:]); err == nil {
			return a[:i], a[i+1:]
		}
	}
	return a, ""
}

// optEscape doubles commas, QEMU's option-string quoting.
func optEscape(v string) string { return strings.ReplaceAll(v, ",", ",,") }

// Copy writes image (at snap, if not "") over dest in store to, from
// its start, zeroes included (Cinder's full backup restore): qemu-img
// converts through librbd, so dest keeps any snapshots of its own. dest
// must be at least as large; both stores must be the same cluster's,
// reached as the same client (InPool).
func (s *Store) Copy(ctx context.Context, image, snap string, to *Store, dest string) error {
	if snap != "" {
		if err := checkSnap(snap); err != nil {
			return err
		}
	}
	src, err := s.Conn(ctx, image)
	if err != nil {
		return err
	}
	dst, err := to.Conn(ctx, dest)
	if err != nil {
		return err
	}
	if dst.SizeBytes < src.SizeBytes {
		return fmt.Errorf("rbd: %s is %d bytes, smaller than %s's %d: %w", dest, dst.SizeBytes, image, src.SizeBytes, ErrInvalid)
	}
	return s.qemuImg(ctx, dst.Key, func(secret string) []string {
		from := ImageOpts(src, secret)
		if snap != "" {
			from += ",file.snapshot=" + optEscape(snap)
		}
		return []string{"convert", "-n", "--image-opts", from, "--target-image-opts", ImageOpts(dst, secret)}
	})
}

// Export writes the image (at snap, if not "") to w as raw data.
func (s *Store) Export(ctx context.Context, image, snap string, w io.Writer) error {
	if err := checkImage(image); err != nil {
		return err
	}
	if snap != "" {
		if err := checkSnap(snap); err != nil {
			return err
		}
	}
	_, err := s.run(ctx, cmd{name: "rbd", args: s.rbdArgs("export", "--no-progress", s.spec(image, snap), "-"), long: true, stdout: w})
	return err
}

// ExportFile writes the image (at snap, if not "") to a new file at
// path as raw data, sparse: rbd leaves zeroed extents as holes.
func (s *Store) ExportFile(ctx context.Context, image, snap, path string) error {
	if err := checkImage(image); err != nil {
		return err
	}
	if snap != "" {
		if err := checkSnap(snap); err != nil {
			return err
		}
	}
	_, err := s.run(ctx, cmd{name: "rbd", args: s.rbdArgs("export", "--no-progress", s.spec(image, snap), path), long: true})
	return err
}

// ExportDiff writes to w the changes to image from fromSnap (""
// for the whole image) to toSnap, in rbd's diff format (the Ceph backup
// driver's incremental backups). The diff names both snapshots;
// ImportDiff requires fromSnap on its target and makes toSnap there.
func (s *Store) ExportDiff(ctx context.Context, image, fromSnap, toSnap string, w io.Writer) error {
	if err := checkImage(image); err != nil {
		return err
	}
	for _, sn := range []string{fromSnap, toSnap} {
		if sn == "" && sn == fromSnap {
			continue
		}
		if err := checkSnap(sn); err != nil {
			return err
		}
	}
	args := []string{"export-diff", "--no-progress"}
	if fromSnap != "" {
		args = append(args, "--from-snap", fromSnap)
	}
	args = append(args, s.spec(image, toSnap), "-")
	_, err := s.run(ctx, cmd{name: "rbd", args: s.rbdArgs(args...), long: true, stdout: w})
	return err
}

// ImportDiff applies a diff from ExportDiff, read from r, to image: the
// image must have the diff's starting snapshot (if any) and gains its
// ending one; it grows to the diff's size.
func (s *Store) ImportDiff(ctx context.Context, image string, r io.Reader) error {
	if err := checkImage(image); err != nil {
		return err
	}
	_, err := s.run(ctx, cmd{name: "rbd", args: s.rbdArgs("import-diff", "--no-progress", "-", s.spec(image)), long: true, stdin: r})
	return err
}
