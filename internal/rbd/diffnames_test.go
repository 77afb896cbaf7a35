package rbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// diffStream is an rbd diff v1 with the given from and to snapshots
// ("" for none), a size record, one data record and the end.
func diffStream(from, to string) []byte {
	var b bytes.Buffer
	b.WriteString(diffHeader)
	for _, r := range []struct {
		tag  byte
		name string
	}{{'f', from}, {'t', to}} {
		if r.name == "" {
			continue
		}
		b.WriteByte(r.tag)
		binary.Write(&b, binary.LittleEndian, uint32(len(r.name)))
		b.WriteString(r.name)
	}
	b.WriteByte('s')
	binary.Write(&b, binary.LittleEndian, uint64(1<<30))
	b.WriteByte('w')
	binary.Write(&b, binary.LittleEndian, [2]uint64{4096, 3})
	b.WriteString("abc")
	b.WriteByte('e')
	return b.Bytes()
}

func TestRenameDiff(t *testing.T) {
	for _, c := range []struct {
		name, from, to, newFrom, newTo, wantFrom, wantTo string
	}{
		{"both", "snapshot-a", "snapshot-b", "backup.x", "backup.y", "backup.x", "backup.y"},
		{"to only", "snapshot-a", "snapshot-b", "", "backup.y", "snapshot-a", "backup.y"},
		{"full diff", "", "snapshot-b", "backup.x", "backup.y", "", "backup.y"},
		{"unchanged", "a", "b", "", "", "a", "b"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := io.ReadAll(RenameDiff(bytes.NewReader(diffStream(c.from, c.to)), c.newFrom, c.newTo))
			if err != nil {
				t.Fatal(err)
			}
			if want := diffStream(c.wantFrom, c.wantTo); !bytes.Equal(got, want) {
				t.Errorf("got %q\nwant %q", got, want)
			}
		})
	}
	if _, err := io.ReadAll(RenameDiff(bytes.NewReader([]byte("rbd diff v2\n")), "", "x")); !errors.Is(err, ErrInvalid) {
		t.Errorf("a v2 stream: %v, want ErrInvalid", err)
	}
}
