package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// imgInfo is what the driver reads of `qemu-img info --output=json`.
type imgInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	ActualSize      int64  `json:"actual-size"`
	BackingFilename string `json:"backing-filename"`
	FormatSpecific  struct {
		Type string `json:"type"`
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// qemuImgTimeout bounds a qemu-img run that only reads headers: a crafted
// image must not hold a spawn forever.
const qemuImgTimeout = 60 * time.Second

// qemuImg runs qemu-img with args and returns its stdout; a failure carries
// qemu-img's stderr.
func (d *Driver) qemuImg(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, d.cfg.QemuImg, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = err.Error()
		}
		return nil, fmt.Errorf("qemu-img %s: %s", args[0], msg)
	}
	return out.Bytes(), nil
}

// info reads an image's header. format "" lets qemu-img probe it (only
// ever for checking what an image really is); share reads a disk a running
// QEMU holds (-U).
func (d *Driver) info(ctx context.Context, path, format string, share bool) (imgInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, qemuImgTimeout)
	defer cancel()
	args := []string{"info", "--output=json"}
	if format != "" {
		args = append(args, "-f", format)
	}
	if share {
		args = append(args, "-U")
	}
	out, err := d.qemuImg(ctx, append(args, path)...)
	if err != nil {
		return imgInfo{}, err
	}
	var in imgInfo
	if err := json.Unmarshal(out, &in); err != nil {
		return imgInfo{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	return in, nil
}

// checkImage makes sure a cached image is what its disk_format says and is
// safe to use as a base: a raw image that probes as something else (the
// classic host-file-read through a crafted header) and a qcow2 with a
// backing or external data file are refused. It returns the format to open
// the image with and its virtual size.
func (d *Driver) checkImage(ctx context.Context, path, diskFormat string) (string, int64, error) {
	in, err := d.info(ctx, path, "", false)
	if err != nil {
		return "", 0, err
	}
	want := strings.ToLower(diskFormat)
	switch want {
	case "":
		want = in.Format
	case "qcow2", "raw":
	default:
		return "", 0, fmt.Errorf("disk_format %q is not supported by the qemu driver (qcow2 or raw)", diskFormat)
	}
	if in.Format != want {
		return "", 0, fmt.Errorf("the image's data is %s, not its disk_format %s", in.Format, want)
	}
	switch want {
	case "qcow2":
		if in.BackingFilename != "" {
			return "", 0, fmt.Errorf("the qcow2 image has a backing file (%.80q): refused", in.BackingFilename)
		}
		if in.FormatSpecific.Data.DataFile != "" {
			return "", 0, fmt.Errorf("the qcow2 image has an external data file: refused")
		}
	case "raw":
	default:
		return "", 0, fmt.Errorf("the image's data is %s: only qcow2 and raw are supported", in.Format)
	}
	if in.VirtualSize <= 0 {
		return "", 0, fmt.Errorf("the image has no size")
	}
	return want, in.VirtualSize, nil
}

// createOverlay makes path a qcow2 overlay of base of size bytes.
func (d *Driver) createOverlay(ctx context.Context, path, base, baseFormat string, size int64) error {
	_, err := d.qemuImg(ctx, "create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", base, path, strconv.FormatInt(size, 10))
	return err
}

// growDisk resizes a qcow2 disk to size bytes if it is smaller (never
// shrinks). It returns the new virtual size.
func (d *Driver) growDisk(ctx context.Context, path string, size int64) (int64, error) {
	in, err := d.info(ctx, path, "qcow2", true)
	if err != nil {
		return 0, err
	}
	if size <= in.VirtualSize {
		return in.VirtualSize, nil
	}
	if _, err := d.qemuImg(ctx, "resize", "-q", "-f", "qcow2", path, strconv.FormatInt(size, 10)); err != nil {
		return 0, err
	}
	return size, nil
}
