package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
)

// An import from a URL downloads the vendor's image into the cache
// directory, verifies it against the vendor's checksum list (and that
// list's signature), and uploads the verified file as a local import does.

// isImageURL tells an http(s) URL from a file name.
func isImageURL(s string) bool {
	return strings.HasPrefix(s, "https://") || strings.HasPrefix(s, "http://")
}

// downloadsDir is where partial downloads wait to be resumed.
func downloadsDir() (string, error) {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory: set XDG_CACHE_HOME (%w)", err)
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "nimbus", "downloads"), nil
}

// downloadClient trusts the system's CAs and, if given, the PEM file cacert
// (a mirror with its own CA). No overall timeout: an image takes as long as
// it takes; a stalled connection is cut by the response header timeout.
func downloadClient(cacert string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = time.Minute
	if cacert != "" {
		pem, err := os.ReadFile(cacert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cacert %s holds no PEM certificate", cacert)
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return &http.Client{Transport: tr}, nil
}

// expectedSum is the checksum list's word on one file.
type expectedSum struct {
	algo string // sha256 or sha512
	hex  string
}

func (e expectedSum) hash() hash.Hash {
	if e.algo == "sha512" {
		return sha512.New()
	}
	return sha256.New()
}

// bsdSumLine is the BSD form, "SHA256 (name) = hex".
var bsdSumLine = regexp.MustCompile(`^(SHA256|SHA512) \((.+)\) = ([0-9a-fA-F]+)$`)

// findSum picks name's line out of a checksum list in the GNU form
// ("<hex>  name", "<hex> *name") or the BSD one; the hash kind comes from
// the BSD tag, else the list's name (SHA256SUMS, *.sha512sum, ...), else
// the length of the hex. A list of one line (CentOS's and openSUSE's
// per-file sums of a "latest" link, which name the versioned file) is that
// file's.
func findSum(list []byte, listName, name string) (expectedSum, error) {
	type entry struct{ algo, sum string }
	var only []entry
	sc := bufio.NewScanner(bytes.NewReader(list))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		var e entry
		var file string
		if m := bsdSumLine.FindStringSubmatch(line); m != nil {
			e, file = entry{strings.ToLower(m[1]), m[3]}, m[2]
		} else if sum, rest, ok := strings.Cut(line, " "); ok && isHexSum(sum) {
			e, file = entry{algoOfList(listName, sum), sum}, strings.TrimPrefix(strings.TrimLeft(rest, " "), "*")
		} else {
			continue
		}
		if path.Base(file) == name {
			return checkSum(e.algo, e.sum, name)
		}
		only = append(only, e)
	}
	if len(only) == 1 {
		return checkSum(only[0].algo, only[0].sum, name)
	}
	return expectedSum{}, fmt.Errorf("the checksum list %s has no line for %s", listName, name)
}

// isHexSum tells a GNU line's SHA-256 or SHA-512 from a comment or the
// armour of a clear-signed list.
func isHexSum(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil && (len(s) == 64 || len(s) == 128)
}

// algoOfList is the hash kind a list's name or a hex's length says.
func algoOfList(listName, sum string) string {
	n := strings.ToLower(listName)
	switch {
	case strings.Contains(n, "sha512"):
		return "sha512"
	case strings.Contains(n, "sha256"):
		return "sha256"
	case len(sum) == 128:
		return "sha512"
	}
	return "sha256"
}

func checkSum(algo, sum, name string) (expectedSum, error) {
	want := map[string]int{"sha256": 64, "sha512": 128}[algo]
	if _, err := hex.DecodeString(sum); err != nil || len(sum) != want {
		return expectedSum{}, fmt.Errorf("the checksum list's %s line for %s is no %d-digit hex", algo, name, want)
	}
	return expectedSum{algo: algo, hex: strings.ToLower(sum)}, nil
}

// fetchSmall reads a small document (a checksum list, a signature) whole.
func fetchSmall(ctx context.Context, client *http.Client, rawURL string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", rawURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch %s: %s", rawURL, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20+1))
	if err == nil && len(b) > 4<<20 {
		err = errors.New("more than 4 MiB: not a checksum list or signature")
	}
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", rawURL, err)
	}
	return b, nil
}

// verifySignature checks the checksum list's detached signature with gpgv
// against the keyring the operator trusts.
func verifySignature(ctx context.Context, client *http.Client, list []byte, sigURL, keyring string) error {
	if keyring == "" {
		return errors.New("--signature needs --keyring FILE, the vendor's public keys")
	}
	if _, err := os.Stat(keyring); err != nil {
		return fmt.Errorf("--keyring: %w", err)
	}
	sig, err := fetchSmall(ctx, client, sigURL)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nimbus-gpgv-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	listFile, sigFile := filepath.Join(dir, "list"), filepath.Join(dir, "list.sig")
	if err := os.WriteFile(listFile, list, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(sigFile, sig, 0o600); err != nil {
		return err
	}
	kr, err := filepath.Abs(keyring) // gpgv reads a bare name from ~/.gnupg
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "gpgv", "--keyring", kr, sigFile, listFile).CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) {
		return errors.New("gpgv is not installed (apt-get install gpgv)")
	}
	if err != nil {
		return fmt.Errorf("the checksum list's signature %s does not verify with %s: %s", sigURL, keyring, strings.TrimSpace(string(out)))
	}
	return nil
}

// download is one URL's download into the cache directory.
type download struct {
	client    *http.Client
	url       string
	part      string // the partial file
	validator string // the file holding the ETag or Last-Modified of the partial file
	stderr    io.Writer
}

// maxDownloadTries bounds the resumptions after a cut connection.
const maxDownloadTries = 5

// fetchImage downloads rawURL, verified against the checksum list, and
// answers the verified file and a function that removes it. A mismatch
// removes the download.
func (a *adminRun) fetchImage(ctx context.Context, rawURL string, o *importOptions) (string, func(), error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || path.Base(u.Path) == "/" || path.Base(u.Path) == "." {
		return "", nil, fmt.Errorf("invalid URL %q: want https://host/path/to/image-file", rawURL)
	}
	if o.checksums == "" {
		return "", nil, errors.New("an import from a URL needs --checksums URL, the vendor's SHA256SUMS or SHA512SUMS")
	}
	name := path.Base(u.Path)
	client, err := downloadClient(o.cacert)
	if err != nil {
		return "", nil, err
	}
	// The list first: a wrong list or signature fails before gigabytes move.
	list, err := fetchSmall(ctx, client, o.checksums)
	if err != nil {
		return "", nil, err
	}
	if o.signature != "" {
		if err := verifySignature(ctx, client, list, o.signature, o.keyring); err != nil {
			return "", nil, err
		}
	}
	want, err := findSum(list, path.Base(o.checksums), name)
	if err != nil {
		return "", nil, err
	}
	dir, err := downloadsDir()
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	key := sha256.Sum256([]byte(rawURL))
	base := filepath.Join(dir, hex.EncodeToString(key[:8])+"-"+name)
	d := &download{client: client, url: rawURL, part: base + ".part", validator: base + ".part.validator", stderr: a.stderr}
	if err := d.run(ctx); err != nil {
		return "", nil, err
	}
	fmt.Fprintf(a.stderr, "verifying %s against %s (%s)\n", name, o.checksums, want.algo)
	got, err := fileSum(d.part, want.hash())
	if err != nil {
		return "", nil, err
	}
	if got != want.hex {
		d.remove()
		return "", nil, fmt.Errorf("%s has %s %s, but the checksum list says %s: refused, and the download is deleted",
			rawURL, want.algo, got, want.hex)
	}
	os.Remove(d.validator)
	return d.part, d.remove, nil
}

func (d *download) remove() {
	os.Remove(d.part)
	os.Remove(d.validator)
}

func fileSum(name string, h hash.Hash) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// run downloads into the partial file, resuming what is there and
// resuming again after a cut connection.
func (d *download) run(ctx context.Context) error {
	var lastErr error
	for try := 0; try < maxDownloadTries; try++ {
		done, err := d.once(ctx)
		if done || err == nil {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("download interrupted; run the command again to resume from %s", d.part)
		}
		var fatal fatalDownloadError
		if errors.As(err, &fatal) {
			return err
		}
		lastErr = err
		fmt.Fprintf(d.stderr, "download cut (%v); resuming\n", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * time.Second):
		}
	}
	return fmt.Errorf("download of %s failed %d times, last: %w; run the command again to resume", d.url, maxDownloadTries, lastErr)
}

// fatalDownloadError is an answer that another try would not change.
type fatalDownloadError struct{ error }

// once makes one request, from the partial file's end when there is one.
// done is true when the file is complete.
func (d *download) once(ctx context.Context) (done bool, err error) {
	offset := int64(0)
	if st, err := os.Stat(d.part); err == nil {
		offset = st.Size()
	}
	validator := ""
	if b, err := os.ReadFile(d.validator); err == nil {
		validator = string(b)
	}
	if offset > 0 && validator == "" {
		offset = 0 // no way to know the bytes are the same file's: restart
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return false, fatalDownloadError{err}
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
		req.Header.Set("If-Range", validator) // a changed file answers 200: restart
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	total, flags := int64(-1), os.O_WRONLY|os.O_CREATE|os.O_TRUNC
	switch resp.StatusCode {
	case http.StatusOK:
		offset, total = 0, resp.ContentLength
		if err := d.saveValidator(resp.Header); err != nil {
			return false, fatalDownloadError{err}
		}
	case http.StatusPartialContent:
		start, size, ok := contentRange(resp.Header.Get("Content-Range"))
		if !ok || start != offset {
			os.Remove(d.validator) // an answer we cannot append: start over
			return false, fmt.Errorf("the server answered the range from %d with %q", offset, resp.Header.Get("Content-Range"))
		}
		total, flags = size, os.O_WRONLY|os.O_APPEND
	case http.StatusRequestedRangeNotSatisfiable:
		if _, size, ok := contentRange(resp.Header.Get("Content-Range")); ok && size == offset {
			return true, nil // it was all there
		}
		os.Remove(d.validator)
		return false, errors.New("the server refused the range: starting over")
	default:
		return false, fatalDownloadError{fmt.Errorf("download %s: %s", d.url, resp.Status)}
	}
	f, err := os.OpenFile(d.part, flags, 0o600)
	if err != nil {
		return false, fatalDownloadError{err}
	}
	if offset > 0 {
		fmt.Fprintf(d.stderr, "resuming %s at %s\n", d.url, formatBytes(offset, max(total, offset)))
	} else {
		fmt.Fprintf(d.stderr, "downloading %s\n", d.url)
	}
	n, err := copyWithProgress(f, resp.Body, offset, total, d.stderr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	if total >= 0 && offset+n != total {
		return false, fmt.Errorf("got %d of %d bytes", offset+n, total)
	}
	return true, nil
}

// saveValidator keeps what tells a later range request whether the file
// changed: a strong ETag, else Last-Modified; none means no resumption.
func (d *download) saveValidator(h http.Header) error {
	v := h.Get("ETag")
	if v == "" || strings.HasPrefix(v, "W/") {
		v = h.Get("Last-Modified")
	}
	if v == "" {
		os.Remove(d.validator)
		return nil
	}
	return os.WriteFile(d.validator, []byte(v), 0o600)
}

// contentRange reads "bytes start-end/size".
func contentRange(h string) (start, size int64, ok bool) {
	spec, found := strings.CutPrefix(h, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, sz, found := strings.Cut(spec, "/")
	if !found {
		return 0, 0, false
	}
	size, err := strconv.ParseInt(sz, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if rng == "*" {
		return 0, size, true
	}
	a, _, found := strings.Cut(rng, "-")
	if start, err = strconv.ParseInt(a, 10, 64); !found || err != nil {
		return 0, 0, false
	}
	return start, size, true
}

// copyWithProgress copies the body, moving a progress bar when the total
// is known.
func copyWithProgress(w io.Writer, r io.Reader, offset, total int64, stderr io.Writer) (int64, error) {
	var bar *progressBar
	if total > 0 {
		bar = newProgressBar(stderr, total)
		defer bar.finish()
	}
	buf := make([]byte, 256<<10)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return n, fatalDownloadError{werr}
			}
			n += int64(k)
			if bar != nil {
				bar.update(offset + n)
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// pathBase is the file name a URL ends with.
func pathBase(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil {
		return path.Base(u.Path)
	}
	return path.Base(rawURL)
}

// replaceImageData swaps the data of the active image from into image id
// with Nimbus's admin-only nimbus-replace-data action, and answers image
// id as it is then; from is deleted.
func replaceImageData(ctx context.Context, client *gophercloud.ServiceClient, id, from string) (*images.Image, error) {
	var out images.Image
	_, err := client.Post(ctx, client.ServiceURL("images", id, "actions", "nimbus-replace-data"),
		map[string]string{"from": from}, &out, &gophercloud.RequestOpts{OkCodes: []int{http.StatusOK}})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// applyGiven sets on an image whose data was replaced what the command
// line gave (properties, --min-disk, --min-ram, --public): the rest of the
// image stays as it was.
func applyGiven(ctx context.Context, client *gophercloud.ServiceClient, img *images.Image, props map[string]string, o *importOptions) (*images.Image, error) {
	var ops images.UpdateOpts
	for k, v := range props {
		op := images.AddOp // Glance's add conflicts with a present property
		if _, ok := img.Properties[k]; ok {
			op = images.ReplaceOp
		}
		ops = append(ops, images.UpdateImageProperty{Op: op, Name: k, Value: v})
	}
	if o.set["min-disk"] {
		ops = append(ops, images.ReplaceImageMinDisk{NewMinDisk: o.minDisk})
	}
	if o.set["min-ram"] {
		ops = append(ops, images.ReplaceImageMinRam{NewMinRam: o.minRAM})
	}
	if o.set["public"] {
		vis := images.ImageVisibilityPrivate
		if o.public {
			vis = images.ImageVisibilityPublic
		}
		ops = append(ops, images.UpdateVisibility{Visibility: vis})
	}
	if len(ops) == 0 {
		return img, nil
	}
	return images.Update(ctx, client, img.ID, ops).Extract()
}

// showStaging makes a staging image an ordinary one of visibility vis.
func showStaging(ctx context.Context, client *gophercloud.ServiceClient, id string, vis images.ImageVisibility) (*images.Image, error) {
	ops := images.UpdateOpts{images.ReplaceImageHidden{NewHidden: false}}
	if vis != images.ImageVisibilityPrivate {
		ops = append(ops, images.UpdateVisibility{Visibility: vis})
	}
	return images.Update(ctx, client, id, ops).Extract()
}
