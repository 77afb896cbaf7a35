package blockexport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nimbus/internal/driver"
)

// needQEMU skips without qemu-storage-daemon and qemu-io, unless
// NIMBUS_REQUIRE_QEMU=1 makes that a failure.
func needQEMU(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"qemu-storage-daemon", "qemu-io"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("NIMBUS_REQUIRE_QEMU") == "1" {
				t.Fatalf("%s not found and NIMBUS_REQUIRE_QEMU=1", bin)
			}
			t.Skipf("%s not found (Debian: apt-get install qemu-system-common qemu-utils): %v", bin, err)
		}
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newExporter(t testing.TB, dir string) *Exporter {
	t.Helper()
	e, err := New(Config{Dir: dir, Addr: "127.0.0.1", Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// volumeFile makes a sparse file of size bytes.
func volumeFile(t testing.TB, dir, name string, size int64) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return p
}

// clientArgs are qemu-io/qemu-img arguments that open conn as a QEMU NBD
// client would on a hypervisor host, with identity and key (which a test
// may take from another export or make up).
func clientArgs(t testing.TB, conn driver.VolumeConn, identity, key string) []string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "keys.psk"), []byte(identity+":"+key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, _ := json.Marshal(map[string]any{
		"driver": "nbd", "export": conn.Export, "tls-creds": "tls0",
		"server": map[string]any{"type": "inet", "host": conn.Host, "port": strconv.Itoa(conn.Port)},
	})
	return []string{
		// As a VM's QEMU has it (internal/driver/qemu, volumeSpec).
		"--object", "tls-creds-psk,id=tls0,endpoint=client,username=" + identity + ",dir=" + dir +
			",priority=" + driver.NBDTLSPriority,
		"json:" + string(opts),
	}
}

// qemuIO runs qemu-io commands on conn and returns the output and whether
// every command succeeded (qemu-io's exit status).
func qemuIO(t testing.TB, conn driver.VolumeConn, identity, key string, cmds ...string) (string, bool) {
	t.Helper()
	return qemuIOFlags(t, conn, identity, key, nil, cmds...)
}

func qemuIOFlags(t testing.TB, conn driver.VolumeConn, identity, key string, flags []string, cmds ...string) (string, bool) {
	t.Helper()
	args := append(flags, clientArgs(t, conn, identity, key)...)
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", args...).CombinedOutput()
	s := string(out)
	// qemu-io 7.2 exits 0 after some failed commands: look at the text too.
	ok := err == nil && !strings.Contains(s, "failed") && !strings.Contains(s, "can't open")
	return s, ok
}

// TestExportTLSPriority: a client with QEMU's default priority (a VM
// started before driver.NBDTLSPriority, or a QEMU built with another
// default) still gets through, and so does one that offers ChaCha20 only.
func TestExportTLSPriority(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	e := newExporter(t, filepath.Join(dir, "state"))
	path := volumeFile(t, dir, "vol-p", 1<<20)
	conn, err := e.Export(context.Background(), "vol-p", path, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, prio := range []string{"", "NORMAL:-CIPHER-ALL:+CHACHA20-POLY1305"} {
		args := clientArgs(t, conn, conn.PSKIdentity, conn.PSKKey)
		args[1], _, _ = strings.Cut(args[1], ",priority=")
		if prio != "" {
			args[1] += ",priority=" + prio
		}
		out, err := exec.Command("qemu-io", append(args, "-c", "read 0 4k")...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "read 4096/4096") {
			t.Errorf("client priority %q: %v\n%s", prio, err, out)
		}
	}
}

func TestExportRoundTrip(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	e := newExporter(t, filepath.Join(dir, "state"))
	path := volumeFile(t, dir, "vol-a", 8<<20)
	// Data written to the file before the export shows through it.
	if err := os.WriteFile(path, bytes.Repeat([]byte{0x5a}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Truncate(path, 8<<20)

	ctx := context.Background()
	conn, err := e.Export(ctx, "vol-a", path, false)
	if err != nil {
		t.Fatal(err)
	}
	if conn.Driver != driver.VolumeNBD || conn.Host != "127.0.0.1" || conn.Port == 0 || conn.Export != "vol-a" ||
		conn.SizeBytes != 8<<20 || len(conn.PSKKey) != 64 || conn.PSKIdentity == "" {
		t.Fatalf("conn = %+v", conn)
	}
	out, ok := qemuIO(t, conn, conn.PSKIdentity, conn.PSKKey,
		"read -P 0x5a 0 1M", "write -P 0xab 4M 64k", "read -P 0xab 4M 64k", "flush")
	if !ok {
		t.Fatalf("qemu-io through the export:\n%s", out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[4<<20:4<<20+64<<10], bytes.Repeat([]byte{0xab}, 64<<10)) {
		t.Fatal("data written through the export is not in the file")
	}

	// Idempotent per name; another mode is a conflict and leaves it running.
	again, err := e.Export(ctx, "vol-a", path, false)
	if err != nil || !reflect.DeepEqual(again, conn) {
		t.Fatalf("second Export = %+v, %v; want %+v", again, err, conn)
	}
	if _, err := e.Export(ctx, "vol-a", path, true); !errors.Is(err, ErrConflict) {
		t.Fatalf("Export read-only over read-write: %v, want ErrConflict", err)
	}
	if got := e.Exports(); !slices.Equal(got, []string{"vol-a"}) {
		t.Fatalf("Exports() = %v", got)
	}
	if fi, err := os.Stat(filepath.Join(dir, "state", "vol-a", "keys.psk")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keys.psk: %v %v", fi, err)
	}
}

// TestExportKeys: only the export's own key opens it, over TLS only.
func TestExportKeys(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	e := newExporter(t, filepath.Join(dir, "state"))
	ctx := context.Background()
	a, err := e.Export(ctx, "vol-a", volumeFile(t, dir, "a", 1<<20), false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Export(ctx, "vol-b", volumeFile(t, dir, "b", 1<<20), false)
	if err != nil {
		t.Fatal(err)
	}
	if a.Port == b.Port || a.PSKKey == b.PSKKey || a.PSKIdentity == b.PSKIdentity {
		t.Fatalf("exports share port, key or identity: %+v %+v", a, b)
	}
	wrong := strings.Repeat("00", 32)
	atB := a
	atB.Port = b.Port // vol-a's name on vol-b's daemon
	tests := []struct {
		name          string
		conn          driver.VolumeConn
		identity, key string
		ok            bool
	}{
		{"own key", a, a.PSKIdentity, a.PSKKey, true},
		{"wrong key", a, a.PSKIdentity, wrong, false},
		{"other export's identity and key", a, b.PSKIdentity, b.PSKKey, false},
		{"other export's key under own identity", a, a.PSKIdentity, b.PSKKey, false},
		{"own key, other export's daemon", atB, a.PSKIdentity, a.PSKKey, false},
		{"other key, own daemon, other name", driver.VolumeConn{Host: a.Host, Port: a.Port, Export: "vol-b"}, b.PSKIdentity, b.PSKKey, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := qemuIO(t, tc.conn, tc.identity, tc.key, "read 0 4k")
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v:\n%s", ok, tc.ok, out)
			}
		})
	}

	// Without TLS the server refuses to talk.
	opts := fmt.Sprintf(`json:{"driver":"nbd","export":"vol-a","server":{"type":"inet","host":"127.0.0.1","port":"%d"}}`, a.Port)
	out, err := exec.Command("qemu-io", "--image-opts", opts, "-c", "read 0 4k").CombinedOutput()
	if err == nil && !strings.Contains(string(out), "can't open") {
		t.Fatalf("plain NBD client was served:\n%s", out)
	}
}

func TestExportReadOnly(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	e := newExporter(t, filepath.Join(dir, "state"))
	path := volumeFile(t, dir, "ro", 1<<20)
	conn, err := e.Export(context.Background(), "vol-ro", path, true)
	if err != nil {
		t.Fatal(err)
	}
	ro := []string{"-r"}
	if out, ok := qemuIOFlags(t, conn, conn.PSKIdentity, conn.PSKKey, ro, "read -P 0 0 64k"); !ok {
		t.Fatalf("read from read-only export:\n%s", out)
	}
	// A read-write open is refused; a read-only one cannot write.
	if out, ok := qemuIO(t, conn, conn.PSKIdentity, conn.PSKKey, "read 0 4k"); ok {
		t.Fatalf("read-write open of a read-only export succeeded:\n%s", out)
	}
	if out, ok := qemuIOFlags(t, conn, conn.PSKIdentity, conn.PSKKey, ro, "write -P 0xcd 0 64k", "flush"); ok {
		t.Fatalf("write to read-only export succeeded:\n%s", out)
	}
	b, _ := os.ReadFile(path)
	if bytes.IndexByte(b, 0xcd) >= 0 {
		t.Fatal("read-only export changed the file")
	}
}

func TestUnexport(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	e := newExporter(t, state)
	ctx := context.Background()
	conn, err := e.Export(ctx, "vol-u", volumeFile(t, dir, "u", 1<<20), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Unexport(ctx, "vol-u"); err != nil {
		t.Fatal(err)
	}
	if got := e.Exports(); len(got) != 0 {
		t.Fatalf("Exports() after Unexport = %v", got)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort(conn.Host, strconv.Itoa(conn.Port))); err == nil {
		c.Close()
		t.Fatal("port still accepts connections after Unexport")
	}
	if _, err := os.Stat(filepath.Join(state, "vol-u")); !os.IsNotExist(err) {
		t.Fatalf("state directory left after Unexport: %v", err)
	}
	if err := e.Unexport(ctx, "vol-u"); err != nil {
		t.Fatalf("Unexport of an unknown name: %v", err)
	}
	// A new export of the name gets a new key.
	again, err := e.Export(ctx, "vol-u", filepath.Join(dir, "u"), false)
	if err != nil {
		t.Fatal(err)
	}
	if again.PSKKey == conn.PSKKey {
		t.Fatal("re-export after Unexport reused the old key")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Export(ctx, "vol-u", filepath.Join(dir, "u"), false); !errors.Is(err, ErrClosed) {
		t.Fatalf("Export after Close: %v", err)
	}
}

// TestExportNoDirectIO: where O_DIRECT is refused (tmpfs before Linux 6.6)
// the export falls back to the page cache and still works.
func TestExportNoDirectIO(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	path := volumeFile(t, dir, "v", 1<<20)
	openDirect = func(string, int) (*os.File, error) { return nil, &os.PathError{Op: "open", Err: syscall.EINVAL} }
	t.Cleanup(func() { openDirect = openDirectReal })
	if direct, _, err := probe(path, false); err != nil || direct {
		t.Fatalf("probe: direct=%v err=%v", direct, err)
	}
	e := newExporter(t, filepath.Join(dir, "state"))
	conn, err := e.Export(context.Background(), "vol-t", path, false)
	if err != nil {
		t.Fatal(err)
	}
	if out, ok := qemuIO(t, conn, conn.PSKIdentity, conn.PSKKey, "write -P 0x11 0 4k", "read -P 0x11 0 4k"); !ok {
		t.Fatalf("qemu-io on the export:\n%s", out)
	}
	args, _ := exec.Command("ps", "-o", "args=", "-C", "qemu-storage-daemon").Output()
	if !strings.Contains(string(args), `"aio":"threads","cache":{"direct":false}`) {
		t.Errorf("daemon not started with aio=threads, cache.direct=off:\n%s", args)
	}
}

// crashHelperEnv makes the test binary a process that exports a file, prints
// the connection and waits to be killed (TestNewAfterCrash).
const crashHelperEnv = "BLOCKEXPORT_CRASH_HELPER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(crashHelperEnv); spec != "" {
		dir, path, _ := strings.Cut(spec, "|")
		e, err := New(Config{Dir: dir, Addr: "127.0.0.1", Log: quietLog()})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		conn, err := e.Export(context.Background(), "vol-c", path, false)
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		b, _ := json.Marshal(conn)
		fmt.Println(string(b))
		select {} // until SIGKILL
	}
	os.Exit(m.Run())
}

func TestNewAfterCrash(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	path := volumeFile(t, dir, "c", 1<<20)

	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), crashHelperEnv+"="+state+"|"+path)
	stdout, _ := helper.StdoutPipe()
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := readLine(stdout)
	if err != nil || !strings.HasPrefix(line, "{") {
		helper.Process.Kill()
		helper.Wait()
		t.Fatalf("helper: %q %v", line, err)
	}
	var conn driver.VolumeConn
	if err := json.Unmarshal([]byte(line), &conn); err != nil {
		t.Fatal(err)
	}
	// The crash: the daemon is orphaned and still serving.
	helper.Process.Kill()
	helper.Wait()
	pidBytes, err := os.ReadFile(filepath.Join(state, "vol-c", "qsd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidBytes)))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) }) // in case New failed to
	if out, ok := qemuIO(t, conn, conn.PSKIdentity, conn.PSKKey, "read 0 4k"); !ok {
		t.Fatalf("orphaned daemon not serving (test premise):\n%s", out)
	}

	e, err := New(Config{Dir: state, Addr: "127.0.0.1", Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); !strings.Contains(string(st), ") Z") {
			t.Fatalf("stale daemon %d still alive after New: %v", pid, err)
		}
	}
	if len(e.Exports()) != 0 {
		t.Fatalf("Exports() after New = %v", e.Exports())
	}
	// The volume service re-exports: same key and port, so the old
	// connection works again.
	again, err := e.Export(context.Background(), "vol-c", path, false)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, conn) {
		t.Fatalf("re-export after restart = %+v, want %+v", again, conn)
	}
	if out, ok := qemuIO(t, conn, conn.PSKIdentity, conn.PSKKey, "read 0 4k"); !ok {
		t.Fatalf("re-export not serving:\n%s", out)
	}
}

func readLine(r io.Reader) (string, error) {
	var b []byte
	buf := make([]byte, 1)
	for {
		n, err := r.Read(buf)
		if n == 1 {
			if buf[0] == '\n' {
				return string(b), nil
			}
			b = append(b, buf[0])
		}
		if err != nil {
			return string(b), err
		}
	}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no dir", Config{Addr: "127.0.0.1"}},
		{"no addr", Config{Dir: t.TempDir()}},
		{"unspecified addr", Config{Dir: t.TempDir(), Addr: "0.0.0.0"}},
		{"host name", Config{Dir: t.TempDir(), Addr: "localhost"}},
		{"missing binary", Config{Dir: t.TempDir(), Addr: "127.0.0.1", Bin: "/nonexistent/qemu-storage-daemon"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("New succeeded")
			}
		})
	}
}

func TestExportBadInput(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	e := newExporter(t, filepath.Join(dir, "state"))
	ctx := context.Background()
	for _, tc := range []struct{ name, export, path string }{
		{"empty name", "", volumeFile(t, dir, "x", 4096)},
		{"colon in name", "a:b", filepath.Join(dir, "x")},
		{"slash in name", "../x", filepath.Join(dir, "x")},
		{"relative path", "ok", "x"},
		{"missing file", "ok", filepath.Join(dir, "missing")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.Export(ctx, tc.export, tc.path, false); err == nil {
				t.Fatal("Export succeeded")
			}
			if len(e.Exports()) != 0 {
				t.Fatalf("Exports() = %v", e.Exports())
			}
		})
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// BenchmarkRandIO4K measures 4 KiB random I/O at queue depth 32 on a 256 MiB
// file, read and write, directly (O_DIRECT, aio=native) and through a TLS
// NBD export on loopback. qemu-img bench cannot open a TLS export (it has no
// --object in QEMU 7.2), so both sides run the same qemu-io script: batches of
// 32 aio requests at random 4 KiB-aligned offsets, each batch ended by
// aio_flush (which waits for them). IOPS = requests / (time of the run -
// time of an empty run), the empty run paying process start, open and the
// TLS handshake. "qemu-img-bench" is qemu-img bench on the file at the same
// depth (a strided, not random, pattern) as a check on the qemu-io figures.
//
//	go test ./internal/blockexport/ -run '^$' -bench RandIO4K -benchtime 3x
func BenchmarkRandIO4K(b *testing.B) {
	needQEMU(b)
	const size, reqs, depth = 256 << 20, 20000, 32
	dir := b.TempDir()
	path := filepath.Join(dir, "bench")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0x77}, 1<<20)
	for range size >> 20 {
		f.Write(chunk)
	}
	f.Sync()
	f.Close()
	e := newExporter(b, filepath.Join(dir, "state"))
	conn, err := e.Export(context.Background(), "bench", path, false)
	if err != nil {
		b.Fatal(err)
	}
	fileArgs := []string{"-f", "raw", "-t", "none", "-i", "native", path}
	nbdArgs := clientArgs(b, conn, conn.PSKIdentity, conn.PSKKey)

	for _, op := range []string{"read", "write"} {
		script := ioScript(op, size, reqs, depth)
		for _, target := range []struct {
			name string
			args []string
		}{{"file", fileArgs}, {"nbd-tls", nbdArgs}} {
			b.Run(op+"/"+target.name, func(b *testing.B) {
				for b.Loop() {
					empty := runQemuIO(b, target.args, "aio_flush\n")
					full := runQemuIO(b, target.args, script)
					b.ReportMetric(float64(reqs)/(full-empty).Seconds(), "IOPS")
				}
			})
		}
		b.Run(op+"/qemu-img-bench", func(b *testing.B) {
			args := []string{"bench", "-f", "raw", "-t", "none", "-n", "-c", strconv.Itoa(reqs),
				"-d", strconv.Itoa(depth), "-s", "4096", "-S", strconv.Itoa(4096 * 2053)}
			if op == "write" {
				args = append(args, "-w")
			}
			args = append(args, path)
			for b.Loop() {
				out, err := exec.Command("qemu-img", args...).CombinedOutput()
				var secs float64
				if i := bytes.Index(out, []byte("Run completed in ")); err != nil || i < 0 {
					b.Fatalf("qemu-img bench: %v\n%s", err, out)
				} else {
					fmt.Sscanf(string(out[i:]), "Run completed in %g seconds.", &secs)
				}
				b.ReportMetric(float64(reqs)/secs, "IOPS")
			}
		})
	}
}

// ioScript is reqs 4 KiB aio requests at random aligned offsets below size,
// depth at a time.
func ioScript(op string, size, reqs, depth int) string {
	var sb strings.Builder
	rnd := uint64(0x9e3779b97f4a7c15)
	for i := range reqs {
		rnd ^= rnd << 13
		rnd ^= rnd >> 7
		rnd ^= rnd << 17
		off := int(rnd%uint64(size/4096)) * 4096
		if op == "read" {
			fmt.Fprintf(&sb, "aio_read -q %d 4k\n", off)
		} else {
			fmt.Fprintf(&sb, "aio_write -q -P 0x%02x %d 4k\n", i%251, off)
		}
		if (i+1)%depth == 0 {
			sb.WriteString("aio_flush\n")
		}
	}
	sb.WriteString("aio_flush\n")
	return sb.String()
}

// runQemuIO runs qemu-io with script on stdin and returns its wall time.
func runQemuIO(b *testing.B, args []string, script string) time.Duration {
	b.Helper()
	cmd := exec.Command("qemu-io", args...)
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		b.Fatalf("qemu-io: %v\n%s", err, stderr.String())
	}
	return time.Since(start)
}
