// Command iobench measures a block device's random I/O from inside the
// test guest (test/guest/build.sh puts it at /usr/bin/iobench): Q
// goroutines each keep one O_DIRECT read or write of -bs bytes (4 KiB by
// default) in flight at a random aligned offset, for -t, and it prints one
// line of key=value pairs:
//
//	iobench mode=randread bs=4096 qd=4 seconds=10.00 ops=12345 iops=1234.5 lat_us=3240
//
// lat_us is the mean latency of one operation. Writes go to the device's
// data: point it at a scratch volume. It is built static (CGO_ENABLED=0),
// as the guest has no C library of its own.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	dev := flag.String("dev", "", "block device (or file) to measure")
	mode := flag.String("mode", "randread", "randread or randwrite")
	bs := flag.Int("bs", 4096, "bytes per operation (a multiple of 512)")
	qd := flag.Int("qd", 1, "operations in flight (goroutines)")
	dur := flag.Duration("t", 10*time.Second, "how long to measure")
	span := flag.Int64("span", 0, "bytes of the device to use from its start (0: all)")
	flag.Parse()
	r, err := run(*dev, *mode, *bs, *qd, *dur, *span)
	if err != nil {
		fmt.Fprintln(os.Stderr, "iobench:", err)
		os.Exit(1)
	}
	fmt.Println(r)
}

// result is one measurement.
type result struct {
	mode    string
	bs, qd  int
	elapsed time.Duration
	ops     int64
	busy    time.Duration // summed over the operations
}

func (r result) String() string {
	s := r.elapsed.Seconds()
	lat := int64(0)
	if r.ops > 0 {
		lat = r.busy.Microseconds() / r.ops
	}
	return fmt.Sprintf("iobench mode=%s bs=%d qd=%d seconds=%.2f ops=%d iops=%.1f lat_us=%d",
		r.mode, r.bs, r.qd, s, r.ops, float64(r.ops)/s, lat)
}

func run(dev, mode string, bs, qd int, dur time.Duration, span int64) (result, error) {
	res := result{mode: mode, bs: bs, qd: qd}
	if dev == "" {
		return res, errors.New("no -dev")
	}
	write := false
	switch mode {
	case "randread":
	case "randwrite":
		write = true
	default:
		return res, fmt.Errorf("unknown -mode %q", mode)
	}
	if bs <= 0 || bs%512 != 0 || qd <= 0 || dur <= 0 {
		return res, fmt.Errorf("bad -bs %d, -qd %d or -t %v", bs, qd, dur)
	}
	flags := os.O_RDONLY
	if write {
		flags = os.O_RDWR
	}
	f, err := os.OpenFile(dev, flags|syscall.O_DIRECT, 0)
	if err != nil {
		return res, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return res, err
	}
	if span > 0 && span < size {
		size = span
	}
	blocks := size / int64(bs)
	if blocks < 1 {
		return res, fmt.Errorf("%s has %d bytes, less than one block", dev, size)
	}
	var ops, busy atomic.Int64
	var firstErr error
	var once sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range qd {
		// O_DIRECT wants an aligned buffer: a page of its own from mmap.
		buf, err := syscall.Mmap(-1, 0, bs, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			close(stop)
			wg.Wait()
			return res, err
		}
		for i := range buf {
			buf[i] = byte(i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				off := rand.Int64N(blocks) * int64(bs)
				t0 := time.Now()
				var err error
				if write {
					_, err = f.WriteAt(buf, off)
				} else {
					_, err = f.ReadAt(buf, off)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				busy.Add(int64(time.Since(t0)))
				ops.Add(1)
			}
		}()
	}
	select {
	case <-time.After(dur):
	case <-waitCh(&wg):
	}
	close(stop)
	// The operations in flight finish and count, within the time.
	wg.Wait()
	res.elapsed = time.Since(start)
	res.ops, res.busy = ops.Load(), time.Duration(busy.Load())
	return res, firstErr
}

// waitCh is closed once wg is done (every worker failed).
func waitCh(wg *sync.WaitGroup) <-chan struct{} {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	return c
}
