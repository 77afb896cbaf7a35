package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dev")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_DIRECT, 0); errors.Is(err, syscall.EINVAL) {
		t.Skip("the temporary directory's file system has no O_DIRECT")
	} else if err == nil {
		f.Close()
	}
	for _, c := range []struct {
		name, dev, mode string
		bs, qd          int
		ok              bool
	}{
		{"randread", file, "randread", 4096, 2, true},
		{"randwrite", file, "randwrite", 4096, 4, true},
		{"64k reads", file, "randread", 65536, 1, true},
		{"no device", "", "randread", 4096, 1, false},
		{"missing device", file + ".none", "randread", 4096, 1, false},
		{"unknown mode", file, "seqread", 4096, 1, false},
		{"unaligned size", file, "randread", 1000, 1, false},
		{"no queue", file, "randread", 4096, 0, false},
		{"block beyond the device", file, "randread", 2 << 20, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := run(c.dev, c.mode, c.bs, c.qd, 100*time.Millisecond, 0)
			if (err == nil) != c.ok {
				t.Fatalf("err %v, want ok %v", err, c.ok)
			}
			if !c.ok {
				return
			}
			if r.ops == 0 || r.elapsed < 100*time.Millisecond {
				t.Errorf("%d ops in %v", r.ops, r.elapsed)
			}
			if s := r.String(); !strings.HasPrefix(s, "iobench mode="+c.mode+" ") || !strings.Contains(s, " iops=") {
				t.Errorf("line %q", s)
			}
		})
	}
	if b, _ := os.ReadFile(file); strings.Trim(string(b), "\x00") == "" {
		t.Error("randwrite wrote nothing")
	}
}
