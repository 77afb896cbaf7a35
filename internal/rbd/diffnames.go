package rbd

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
)

// diffHeader starts rbd's diff format (doc/dev/rbd-diff.rst), the one
// ExportDiff writes.
const diffHeader = "rbd diff v1\n"

// RenameDiff is the diff read from r with its starting snapshot named
// from and its ending one to ("" keeps a name): ImportDiff wants the
// starting snapshot on its target under the diff's name and makes the
// ending one under it, so a diff between two snapshots of one image can
// go onto an image whose snapshots are named otherwise. Only the
// metadata records, which come before the data, are rewritten.
func RenameDiff(r io.Reader, from, to string) io.Reader {
	return &diffRenamer{src: bufio.NewReader(r), names: map[byte]string{'f': from, 't': to}}
}

type diffRenamer struct {
	src   *bufio.Reader
	names map[byte]string
	out   io.Reader // nil until the metadata is read
}

func (d *diffRenamer) Read(p []byte) (int, error) {
	if d.out == nil {
		head, err := d.metadata()
		if err != nil {
			return 0, err
		}
		d.out = io.MultiReader(bytes.NewReader(head), d.src)
	}
	return d.out.Read(p)
}

// metadata reads the header and the metadata records (from snap 'f', to
// snap 't', size 's') and answers them rewritten, leaving the first data
// record unread.
func (d *diffRenamer) metadata() ([]byte, error) {
	var out bytes.Buffer
	h := make([]byte, len(diffHeader))
	if _, err := io.ReadFull(d.src, h); err != nil {
		return nil, fmt.Errorf("rbd: reading diff header: %w", err)
	}
	if string(h) != diffHeader {
		return nil, fmt.Errorf("rbd: diff header %q is not %q: %w", h, diffHeader, ErrInvalid)
	}
	out.Write(h)
	for {
		peek, err := d.src.Peek(1)
		if err != nil {
			return nil, fmt.Errorf("rbd: reading diff: %w", err)
		}
		switch tag := peek[0]; tag {
		case 'f', 't':
			name, err := d.name()
			if err != nil {
				return nil, err
			}
			if n := d.names[tag]; n != "" {
				name = n
			}
			out.WriteByte(tag)
			binary.Write(&out, binary.LittleEndian, uint32(len(name))) //nolint:errcheck // a bytes.Buffer
			out.WriteString(name)
		case 's':
			rec := make([]byte, 1+8)
			if _, err := io.ReadFull(d.src, rec); err != nil {
				return nil, fmt.Errorf("rbd: reading diff size: %w", err)
			}
			out.Write(rec)
		default:
			return out.Bytes(), nil
		}
	}
}

// name reads an 'f' or 't' record's snapshot name: le32 length, bytes.
func (d *diffRenamer) name() (string, error) {
	rec := make([]byte, 1+4)
	if _, err := io.ReadFull(d.src, rec); err != nil {
		return "", fmt.Errorf("rbd: reading diff snapshot name: %w", err)
	}
	n := binary.LittleEndian.Uint32(rec[1:])
	if n > 4096 {
		return "", fmt.Errorf("rbd: diff snapshot name of %d bytes: %w", n, ErrInvalid)
	}
	name := make([]byte, n)
	if _, err := io.ReadFull(d.src, name); err != nil {
		return "", fmt.Errorf("rbd: reading diff snapshot name: %w", err)
	}
	return string(name), nil
}
