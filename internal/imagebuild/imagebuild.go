// Package imagebuild builds real cloud images on the operator's machine
// from a distribution's packages, with build scripts embedded in the
// binary and run by bash. A build is cached under its recipe's name and
// the hash of its script, so an unchanged recipe is built once.
package imagebuild

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Recipe is one image the build knows: a bash script that takes OUTDIR and
// leaves there disk.qcow2, sha256 (its hash) and manifest.
type Recipe struct {
	Name string
	// Image is the catalog image the build replaces.
	Image  string
	Script []byte
}

//go:embed debian-12.sh
var debian12 []byte

// recipes are the images "nimbus admin image build" knows.
var recipes = map[string]Recipe{
	"debian-12": {Name: "debian-12", Image: "Debian 12", Script: debian12},
}

// Lookup answers the recipe called name.
func Lookup(name string) (Recipe, bool) {
	r, ok := recipes[name]
	return r, ok
}

// Names are the known recipes, sorted.
func Names() []string {
	names := make([]string, 0, len(recipes))
	for n := range recipes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Stamp identifies the recipe's script: its cache directory's suffix.
func (r Recipe) Stamp() string {
	sum := sha256.Sum256(r.Script)
	return hex.EncodeToString(sum[:6])
}

// Options are where and how a build runs.
type Options struct {
	// Cache is Nimbus's cache directory (default
	// ${XDG_CACHE_HOME:-~/.cache}/nimbus); images go to Cache/images.
	Cache string
	// Rebuild builds even when a cached image is there.
	Rebuild bool
	// Log receives the script's progress (its stderr).
	Log io.Writer
}

// Result is a built (or cached) image.
type Result struct {
	Dir, Image, Manifest string
	SHA256               string
	Size, VirtualSize    int64
	Cached               bool
	Elapsed              time.Duration
}

// ErrMissingTools is returned when the script lacks host tools it cannot
// install (its exit status 3).
var ErrMissingTools = errors.New("the build needs host tools it cannot install (run as root, or with password-less sudo)")

// DefaultCache is ${XDG_CACHE_HOME:-~/.cache}/nimbus.
func DefaultCache() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "nimbus"), nil
}

// Build builds r into its cache directory, or answers the cached image
// when its hash still matches. Concurrent builds of one recipe wait on a
// lock.
func Build(ctx context.Context, r Recipe, o Options) (*Result, error) {
	start := time.Now()
	if o.Cache == "" {
		var err error
		if o.Cache, err = DefaultCache(); err != nil {
			return nil, err
		}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	images := filepath.Join(o.Cache, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return nil, err
	}
	dir := filepath.Join(images, r.Name+"-"+r.Stamp())
	unlock, err := lock(dir + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !o.Rebuild {
		if res, err := cached(dir); err == nil {
			res.Elapsed = time.Since(start)
			return res, nil
		}
	}
	if err := run(ctx, r, dir, o); err != nil {
		return nil, err
	}
	res, err := cached(dir)
	if err != nil {
		return nil, fmt.Errorf("the build of %s left no valid image: %w", r.Name, err)
	}
	res.Cached, res.Elapsed = false, time.Since(start)
	return res, nil
}

// lock takes an exclusive flock on path, waiting for another build.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// run writes the script beside dir and runs it with bash.
func run(ctx context.Context, r Recipe, dir string, o Options) error {
	script := dir + ".sh"
	if err := os.WriteFile(script, r.Script, 0o644); err != nil {
		return err
	}
	defer os.Remove(script)
	cmd := exec.CommandContext(ctx, "bash", script, dir)
	cmd.Env = append(os.Environ(), "NIMBUS_CACHE="+filepath.Dir(filepath.Dir(dir)))
	var tail tailWriter
	cmd.Stdout, cmd.Stderr = io.Discard, io.MultiWriter(o.Log, &tail)
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit) && exit.ExitCode() == 3:
		return fmt.Errorf("%w:\n%s", ErrMissingTools, tail.String())
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return fmt.Errorf("build %s: %v:\n%s", r.Name, err, tail.String())
	}
}

// cached answers the image in dir when it is complete and its sha256
// file matches the data.
func cached(dir string) (*Result, error) {
	res := &Result{Dir: dir, Image: filepath.Join(dir, "disk.qcow2"), Manifest: filepath.Join(dir, "manifest"), Cached: true}
	want, err := os.ReadFile(filepath.Join(dir, "sha256"))
	if err != nil {
		return nil, err
	}
	f, err := os.Open(res.Image)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if res.Size, err = io.Copy(h, f); err != nil {
		return nil, err
	}
	res.SHA256 = hex.EncodeToString(h.Sum(nil))
	if res.SHA256 != strings.TrimSpace(string(want)) {
		return nil, fmt.Errorf("%s: sha256 %s, its sha256 file says %s", res.Image, res.SHA256, bytes.TrimSpace(want))
	}
	if res.VirtualSize, err = virtualSize(res.Manifest); err != nil {
		return nil, err
	}
	return res, nil
}

// virtualSize reads "size N bytes, virtual M bytes ..." from a manifest.
func virtualSize(manifest string) (int64, error) {
	f, err := os.Open(manifest)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && fields[0] == "size" && fields[3] == "virtual" {
			return strconv.ParseInt(fields[4], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no size line", manifest)
}

// tailWriter keeps the last lines written, for error messages.
type tailWriter struct{ buf []byte }

const tailBytes = 4096

func (w *tailWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	if len(w.buf) > tailBytes {
		w.buf = w.buf[len(w.buf)-tailBytes:]
	}
	return len(p), nil
}

func (w *tailWriter) String() string { return strings.TrimSpace(string(w.buf)) }
