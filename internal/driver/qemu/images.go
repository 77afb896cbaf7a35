package qemu

import (
	"context"
	"crypto/md5"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/rbd"
)

// imageCache keeps the images this host's servers boot from, one read-only
// file per image in DataDir/images named by its sha512 (Glance's
// os_hash_value), else its md5 (checksum), else its id (kernels and
// ramdisks, which a spec names only by id; Glance's data is immutable once
// active). Concurrent requests for the same image download it once.
type imageCache struct {
	dir     string
	qemuImg string // reads images in Ceph (readDirect)
	log     *slog.Logger

	mu      sync.Mutex
	flights map[string]*flight
}

type flight struct {
	done chan struct{}
	err  error
}

func newImageCache(dir, qemuImg string, log *slog.Logger) *imageCache {
	if log == nil {
		log = slog.Default()
	}
	return &imageCache{dir: dir, qemuImg: qemuImg, log: log, flights: map[string]*flight{}}
}

// cacheName is the file name an image is cached under.
func cacheName(ref driver.ImageRef) (string, error) {
	switch {
	case ref.HashValue != "":
		if !isHex(ref.HashValue, sha512.Size) {
			return "", fmt.Errorf("qemu: image %s: os_hash_value %.20q… is not a sha512", ref.ID, ref.HashValue)
		}
		return "sha512-" + strings.ToLower(ref.HashValue), nil
	case ref.Checksum != "":
		if !isHex(ref.Checksum, md5.Size) {
			return "", fmt.Errorf("qemu: image %s: checksum %q is not an md5", ref.ID, ref.Checksum)
		}
		return "md5-" + strings.ToLower(ref.Checksum), nil
	}
	if !validImageID(ref.ID) {
		return "", fmt.Errorf("qemu: image id %q is not usable", ref.ID)
	}
	return "id-" + ref.ID, nil
}

func isHex(s string, n int) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == n
}

// get returns the cached file of ref, downloading it through store if it is
// not there yet. The data is checked against the ref's hashes and size.
func (c *imageCache) get(ctx context.Context, store driver.ImageStore, ref driver.ImageRef) (string, error) {
	name, err := cacheName(ref)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, name)
	for {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
		c.mu.Lock()
		f, ok := c.flights[name]
		if !ok {
			f = &flight{done: make(chan struct{})}
			c.flights[name] = f
			c.mu.Unlock()
			f.err = c.fetch(ctx, store, ref, path)
			c.mu.Lock()
			delete(c.flights, name)
			c.mu.Unlock()
			close(f.done)
			if f.err != nil {
				return "", f.err
			}
			return path, nil
		}
		c.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if f.err != nil && ctx.Err() == nil && !errors.Is(f.err, context.Canceled) && !errors.Is(f.err, context.DeadlineExceeded) {
			return "", f.err
		}
		// The download we waited for succeeded (the file is there now) or
		// was cut short by its own caller's context: look again.
	}
}

// fetch downloads ref into path: a temporary file, hashed on the way,
// checked, made read-only and renamed. An image the store says the host
// reads itself (in Ceph) is read there, and through the store's Open when
// that fails.
func (c *imageCache) fetch(ctx context.Context, store driver.ImageStore, ref driver.ImageRef, path string) error {
	if store == nil {
		return fmt.Errorf("qemu: image %s: no image store (the agent sets one)", ref.ID)
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	tmp, err := os.CreateTemp(c.dir, ".download-*")
	if err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	tmp.Close()
	if ds, ok := store.(driver.DirectImages); ok {
		d, err := ds.Direct(ctx, ref.ID)
		if err == nil && d != nil {
			if err = c.readDirect(ctx, d, tmp.Name()); err == nil {
				err = c.finish(ref, tmp.Name(), path, nil)
			}
			if err == nil {
				c.log.Info("qemu: image read from Ceph", "image", ref.ID, "pool", d.Conn.Pool, "bytes", d.Conn.SizeBytes)
				return nil
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("qemu: image %s: %w", ref.ID, ctx.Err())
			}
			c.log.Warn("qemu: image not read from Ceph; downloading it", "image", ref.ID, "error", err)
		}
	}
	r, err := store.Open(ctx, ref.ID)
	if err != nil {
		return fmt.Errorf("qemu: image %s: %w", ref.ID, err)
	}
	defer r.Close()
	f, err := os.OpenFile(tmp.Name(), os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	h := newHashes()
	_, err = io.Copy(io.MultiWriter(f, h), ctxReader{ctx, r})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("qemu: image %s: download: %w", ref.ID, err)
	}
	return c.finish(ref, tmp.Name(), path, h)
}

// hashes are what the cache checks an image's data by.
type hashes struct {
	n      int64
	md, sh hash.Hash
}

func newHashes() *hashes { return &hashes{md: md5.New(), sh: sha512.New()} }

func (h *hashes) Write(p []byte) (int, error) {
	h.n += int64(len(p))
	h.md.Write(p)
	h.sh.Write(p)
	return len(p), nil
}

// finish checks the data in tmp against ref (its hashes h, taken as it
// was written, or else read back now), makes it read-only and renames it
// to path.
func (c *imageCache) finish(ref driver.ImageRef, tmp, path string, h *hashes) error {
	if h == nil {
		f, err := os.Open(tmp)
		if err != nil {
			return fmt.Errorf("qemu: image cache: %w", err)
		}
		h = newHashes()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("qemu: image cache: %w", err)
		}
	}
	if err := verify(ref, h.n, h.md, h.sh); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	return nil
}

// readDirect copies an image's RBD snapshot into the file dst through
// QEMU's rbd driver (Debian's qemu-block-extra), the key in a private
// file for the time of the copy. It reads with qemu-img dd: convert asks
// Debian 12's QEMU 7.2 for block status, which aborts on an image whose
// size is no multiple of 512 bytes. QEMU sizes the copy in whole sectors:
// it is cut back to the data's size. A cluster that does not answer fails
// it within directConnectTimeout, and the image is then downloaded.
func (c *imageCache) readDirect(ctx context.Context, d *driver.ImageDirect, dst string) error {
	conn := d.Conn
	if conn.Driver != driver.VolumeRBD || conn.Pool == "" || conn.Image == "" || conn.User == "" || len(conn.Monitors) == 0 || d.Snapshot == "" {
		return fmt.Errorf("an RBD image needs pool, image, snapshot, user and monitors")
	}
	if _, err := base64.StdEncoding.DecodeString(conn.Key); err != nil || conn.Key == "" {
		return fmt.Errorf("the RBD key is not base64")
	}
	tmp, err := os.MkdirTemp(c.dir, ".ceph-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	key, conf := filepath.Join(tmp, "key"), filepath.Join(tmp, "ceph.conf")
	if err := os.WriteFile(key, []byte(conn.Key), 0o600); err != nil {
		return err
	}
	t := strconv.Itoa(int(directConnectTimeout.Seconds()))
	if err := os.WriteFile(conf, []byte("[global]\nclient_mount_timeout = "+t+"\nrados_mon_op_timeout = "+t+"\n"), 0o600); err != nil {
		return err
	}
	const secret = "imagekey"
	src := rbd.ImageOpts(conn, secret) + ",file.snapshot=" + optEscape(d.Snapshot) + ",file.conf=" + optEscape(conf)
	out, err := exec.CommandContext(ctx, c.qemuImg, "dd", "--object", rbd.SecretObject(secret, key), "--image-opts",
		"-O", "raw", "bs=4M", "if="+src, "of="+dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img dd: %v: %s", err, strings.TrimSpace(string(out)))
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return err
	}
	if fi.Size() < conn.SizeBytes || fi.Size()-conn.SizeBytes >= 512 {
		return fmt.Errorf("read %d bytes of an image of %d", fi.Size(), conn.SizeBytes)
	}
	return os.Truncate(dst, conn.SizeBytes)
}

// directConnectTimeout bounds reaching the cluster for readDirect.
const directConnectTimeout = 20 * time.Second

// optEscape doubles commas, QEMU's option-string quoting.
func optEscape(v string) string { return strings.ReplaceAll(v, ",", ",,") }

func verify(ref driver.ImageRef, n int64, hm, hs hash.Hash) error {
	if ref.Size > 0 && n != ref.Size {
		return fmt.Errorf("qemu: image %s: got %d bytes, the image has %d", ref.ID, n, ref.Size)
	}
	if ref.Checksum != "" {
		if got := hex.EncodeToString(hm.Sum(nil)); !strings.EqualFold(got, ref.Checksum) {
			return fmt.Errorf("qemu: image %s: md5 %s does not match the image's checksum %s", ref.ID, got, ref.Checksum)
		}
	}
	if ref.HashValue != "" {
		if got := hex.EncodeToString(hs.Sum(nil)); !strings.EqualFold(got, ref.HashValue) {
			return fmt.Errorf("qemu: image %s: sha512 does not match the image's os_hash_value", ref.ID)
		}
	}
	return nil
}

// ctxReader ends a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
