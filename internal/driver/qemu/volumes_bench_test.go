package qemu_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/blockexport"
	"nimbus/internal/driver"
)

// ioResult is one line of the guest's iobench (test/guest/iobench).
type ioResult struct {
	iops  float64
	ops   int64
	latUS int64
	line  string
}

// parseIOBench reads iobench's key=value line.
func parseIOBench(out string) (ioResult, error) {
	r := ioResult{line: strings.TrimSpace(out)}
	lines := strings.Split(r.line, "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "iobench ") {
		return r, fmt.Errorf("no iobench line in %q", out)
	}
	r.line = last
	seen := 0
	for _, f := range strings.Fields(last)[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return r, fmt.Errorf("bad field %q in %q", f, last)
		}
		var err error
		switch k {
		case "iops":
			r.iops, err = strconv.ParseFloat(v, 64)
			seen++
		case "ops":
			r.ops, err = strconv.ParseInt(v, 10, 64)
			seen++
		case "lat_us":
			r.latUS, err = strconv.ParseInt(v, 10, 64)
		}
		if err != nil {
			return r, fmt.Errorf("field %q in %q: %v", f, last, err)
		}
	}
	if seen != 2 {
		return r, fmt.Errorf("no iops or ops in %q", last)
	}
	return r, nil
}

func TestParseIOBench(t *testing.T) {
	for _, c := range []struct {
		in   string
		iops float64
		ok   bool
	}{
		{"iobench mode=randread bs=4096 qd=4 seconds=5.00 ops=6000 iops=1200.0 lat_us=3300\n", 1200, true},
		{"warning\niobench mode=randwrite bs=4096 qd=1 seconds=1.00 ops=0 iops=0.0 lat_us=0", 0, true},
		{"iobench: open /dev/vdq: no such file or directory", 0, false},
		{"iobench mode=randread iops=x ops=1", 0, false},
		{"iobench mode=randread ops=1", 0, false},
		{"", 0, false},
	} {
		r, err := parseIOBench(c.in)
		if (err == nil) != c.ok || (c.ok && r.iops != c.iops) {
			t.Errorf("%q: %+v %v, want iops %v ok %v", c.in, r, err, c.iops, c.ok)
		}
	}
}

// iobench runs iobench in the guest on its disk dev.
func (g *volumeGuest) iobench(tb testing.TB, dev, mode string, qd int, d time.Duration) ioResult {
	tb.Helper()
	out := g.run(tb, fmt.Sprintf("iobench -dev /dev/%s -mode %s -qd %d -t %s", dev, mode, qd, d))
	r, err := parseIOBench(out)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// dataFile makes a volume file of size bytes, all of it written (so that
// reads reach the disk, not holes).
func dataFile(tb testing.TB, dir string, size int64) string {
	tb.Helper()
	path := filepath.Join(dir, "bench-"+uuid.NewString()[:8]+".raw")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := f.WriteAt(chunk, off); err != nil {
			tb.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		tb.Fatal(err)
	}
	return path
}

// median is the middle of xs (the mean of the two middle ones).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// BenchmarkVolumeIOPS measures, on one booted test guest, 4 KiB random
// reads and writes (O_DIRECT, the guest's iobench) on one volume file
// attached (a) locally as a file and (b) over NBD with TLS-PSK from a
// qemu-storage-daemon export (internal/blockexport), both at once as two
// disks, measured in turns (rounds of NIMBUS_BENCH_SECONDS, default 2 s,
// five of each at queue depth 4) so that the load of a shared machine
// weighs on both alike; and (c) the file with a QoS throttle of 300 read
// and 200 write IOPS (10 s at queue depth 32). It reports each one's
// median iops, the NBD's pct-of-local (the median of the rounds' ratios;
// target ≥ 70) and the throttled pct-of-limit, which must be within 5 %
// of 100. Skipped without QEMU.
func BenchmarkVolumeIOPS(b *testing.B) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "qemu-storage-daemon"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is not installed", tool)
		}
	}
	round := 2 * time.Second
	if s, err := strconv.Atoi(os.Getenv("NIMBUS_BENCH_SECONDS")); err == nil && s > 0 {
		round = time.Duration(s) * time.Second
	}
	const rounds = 5
	ctx := context.Background()
	g := bootVolumeGuest(b)
	file := dataFile(b, b.TempDir(), 256<<20)
	exp, err := blockexport.New(blockexport.Config{Dir: b.TempDir(), Addr: "127.0.0.1", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { exp.Close() })
	local := driver.VolumeConn{Driver: driver.VolumeFile, Path: file}

	// attach gives the guest the file through conn and returns its disk.
	attach := func(b *testing.B, conn driver.VolumeConn, t driver.Throttle) (string, func()) {
		vol := driver.Volume{ID: uuid.NewString(), Conn: conn, Throttle: t}
		if err := g.d.AttachVolume(ctx, g.id, vol); err != nil {
			b.Fatalf("AttachVolume: %v", err)
		}
		dev := g.waitDisk(b, vol.ID, false)
		return dev, func() {
			if err := g.d.DetachVolume(ctx, g.id, vol.ID); err != nil {
				b.Fatalf("DetachVolume: %v", err)
			}
		}
	}
	for _, mode := range []string{"randread", "randwrite"} {
		b.Run("file-vs-nbd-tls/"+mode, func(b *testing.B) {
			nbd, err := exp.Export(ctx, "bench", file, false)
			if err != nil {
				b.Fatalf("Export: %v", err)
			}
			// The same file twice: the export opens it without a lock.
			fdev, detachFile := attach(b, local, driver.Throttle{})
			defer detachFile()
			ndev, detachNBD := attach(b, nbd, driver.Throttle{})
			defer detachNBD()
			b.ResetTimer()
			var fs, ns, ratios []float64
			for range b.N {
				for range rounds {
					f := g.iobench(b, fdev, mode, 4, round)
					n := g.iobench(b, ndev, mode, 4, round)
					b.Logf("file: %s\nnbd:  %s", f.line, n.line)
					fs, ns = append(fs, f.iops), append(ns, n.iops)
					if f.iops > 0 {
						ratios = append(ratios, 100*n.iops/f.iops)
					}
				}
			}
			b.StopTimer()
			pct := median(ratios)
			b.ReportMetric(median(fs), "file-iops")
			b.ReportMetric(median(ns), "nbd-iops")
			b.ReportMetric(pct, "pct-of-local")
			if pct < 70 {
				b.Logf("NBD %s: %.0f %% of local: below the 70 %% target", mode, pct)
			}
		})
	}
	qos := driver.Throttle{ReadIOPS: 300, WriteIOPS: 200}
	for _, mode := range []string{"randread", "randwrite"} {
		b.Run("file-qos/"+mode, func(b *testing.B) {
			dev, detach := attach(b, local, qos)
			defer detach()
			limit := qos.ReadIOPS
			if mode == "randwrite" {
				limit = qos.WriteIOPS
			}
			b.ResetTimer()
			var got []float64
			for range b.N {
				// Long enough that the burst the throttle's bucket lets
				// through first (a tenth of a second's worth) weighs
				// under 1 %; deep enough that the throttle's queue does
				// not run dry (a tenth of a second's worth, too) while
				// a loaded host does not schedule the guest's vCPU.
				r := g.iobench(b, dev, mode, 32, 10*time.Second)
				b.Logf("%s", r.line)
				got = append(got, r.iops)
			}
			b.StopTimer()
			iops := median(got)
			pct := 100 * iops / float64(limit)
			b.ReportMetric(iops, "iops")
			b.ReportMetric(pct, "pct-of-limit")
			if pct < 95 || pct > 105 {
				b.Errorf("QoS %s limit %d IOPS: measured %.1f (%.1f %%), not within 5 %%", mode, limit, iops, pct)
			}
		})
	}
}
