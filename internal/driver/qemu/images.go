package qemu

import (
	"context"
	"crypto/md5"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"nimbus/internal/driver"
)

// imageCache keeps the images this host's servers boot from, one read-only
// file per image in DataDir/images named by its sha512 (Glance's
// os_hash_value), else its md5 (checksum), else its id (kernels and
// ramdisks, which a spec names only by id; Glance's data is immutable once
// active). Concurrent requests for the same image download it once.
type imageCache struct {
	dir string

	mu      sync.Mutex
	flights map[string]*flight
}

type flight struct {
	done chan struct{}
	err  error
}

func newImageCache(dir string) *imageCache {
	return &imageCache{dir: dir, flights: map[string]*flight{}}
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
// checked, made read-only and renamed.
func (c *imageCache) fetch(ctx context.Context, store driver.ImageStore, ref driver.ImageRef, path string) error {
	if store == nil {
		return fmt.Errorf("qemu: image %s: no image store (the agent sets one)", ref.ID)
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	r, err := store.Open(ctx, ref.ID)
	if err != nil {
		return fmt.Errorf("qemu: image %s: %w", ref.ID, err)
	}
	defer r.Close()
	tmp, err := os.CreateTemp(c.dir, ".download-*")
	if err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	hm, hs := md5.New(), sha512.New()
	n, err := io.Copy(io.MultiWriter(tmp, hm, hs), ctxReader{ctx, r})
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("qemu: image %s: download: %w", ref.ID, err)
	}
	if err := verify(ref, n, hm, hs); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("qemu: image cache: %w", err)
	}
	return nil
}

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
