package cloud

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// A volume of the file backend is a sparse file: 100 GB of which a guest
// wrote 2. Go's archive/tar writes no holes (golang.org/issue/22735), so
// such a file goes into the tar in GNU tar's sparse format 1.0 (a PAX
// header naming the real file and size, then a map of the data extents and
// the extents alone), which GNU tar, bsdtar and Go's reader unpack with
// their holes.

// extent is a run of data in a file.
type extent struct{ off, n int64 }

// dataExtents lists f's data extents (SEEK_DATA, SEEK_HOLE); a file
// system that cannot tell gives the whole file as one.
func dataExtents(f *os.File, size int64) ([]extent, error) {
	var out []extent
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // a hole to the end
		} else if errors.Is(err, unix.EINVAL) && off == 0 {
			return []extent{{0, size}}, nil
		} else if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		hole = min(hole, size)
		out = append(out, extent{data, hole - data})
		off = hole
	}
	return out, nil
}

// sparseWorthIt: a file whose holes save less than this goes in whole.
const sparseWorthIt = 1 << 20

// writeSparse writes f (size bytes, data extents ext) as entry name in
// GNU sparse format 1.0 to w, at a block boundary of the tar stream, and
// answers the data bytes written.
func writeSparse(ctx context.Context, w io.Writer, name string, f *os.File, size int64, ext []extent, mtime time.Time) (int64, error) {
	// The map: the number of extents, then offset and length of each, and
	// an empty extent at the end when the file ends in a hole.
	if len(ext) == 0 || ext[len(ext)-1].off+ext[len(ext)-1].n < size {
		ext = append(ext, extent{size, 0})
	}
	sparseMap := strconv.AppendInt(nil, int64(len(ext)), 10)
	sparseMap = append(sparseMap, '\n')
	var data int64
	for _, e := range ext {
		sparseMap = strconv.AppendInt(sparseMap, e.off, 10)
		sparseMap = append(sparseMap, '\n')
		sparseMap = strconv.AppendInt(sparseMap, e.n, 10)
		sparseMap = append(sparseMap, '\n')
		data += e.n
	}
	sparseMap = append(sparseMap, make([]byte, pad(int64(len(sparseMap))))...)
	stored := int64(len(sparseMap)) + data

	dir, file := path.Split(name)
	records := paxRecords([][2]string{{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"},
		{"GNU.sparse.name", name}, {"GNU.sparse.realsize", strconv.FormatInt(size, 10)}, {"size", strconv.FormatInt(stored, 10)}})
	hdrName := path.Join(dir, "GNUSparseFile.0", file)
	paxHdr, err := ustarHeader(path.Join(dir, "PaxHeaders.0", file), 'x', int64(len(records)), mtime)
	if err != nil {
		return 0, err
	}
	fileHdr, err := ustarHeader(hdrName, '0', stored, mtime)
	if err != nil {
		return 0, err
	}
	for _, b := range [][]byte{paxHdr, records, make([]byte, pad(int64(len(records)))), fileHdr, sparseMap} {
		if _, err := w.Write(b); err != nil {
			return 0, err
		}
	}
	var written int64
	for _, e := range ext {
		n, err := io.Copy(w, &ctxReader{ctx: ctx, r: io.NewSectionReader(f, e.off, e.n)})
		written += n
		if err != nil {
			return written, err
		}
		if n != e.n {
			return written, fmt.Errorf("%s shrank while copied", name)
		}
	}
	_, err = w.Write(make([]byte, pad(stored)))
	return written, err
}

// pad is how many bytes fill n up to a 512-byte block.
func pad(n int64) int64 { return (512 - n%512) % 512 }

// paxRecords encodes PAX extended header records, "<len> key=value\n"
// each, len counting the whole record.
func paxRecords(kv [][2]string) []byte {
	var out []byte
	for _, r := range kv {
		body := " " + r[0] + "=" + r[1] + "\n"
		n := len(body) + 1
		for n != len(strconv.Itoa(n))+len(body) {
			n = len(strconv.Itoa(n)) + len(body)
		}
		out = append(out, strconv.Itoa(n)+body...)
	}
	return out
}

// ustarHeader is a POSIX ustar header block. Sizes past the 8 GiB the
// octal field holds take GNU's base-256 form, which every reader of GNU
// sparse files reads.
func ustarHeader(name string, typeflag byte, size int64, mtime time.Time) ([]byte, error) {
	if len(name) > 100 {
		return nil, fmt.Errorf("tar name %q longer than 100 bytes", name)
	}
	b := make([]byte, 512)
	copy(b[0:100], name)
	octal := func(field []byte, v int64) { copy(field, fmt.Sprintf("%0*o\x00", len(field)-1, v)) }
	octal(b[100:108], 0o600)
	octal(b[108:116], 0)
	octal(b[116:124], 0)
	if size < 1<<33 {
		octal(b[124:136], size)
	} else {
		f := b[124:136]
		for i := len(f) - 1; i > 0; i-- {
			f[i] = byte(size)
			size >>= 8
		}
		f[0] = 0x80
	}
	octal(b[136:148], mtime.Unix())
	b[156] = typeflag
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b, nil
}
