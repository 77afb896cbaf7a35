// Package region starts the parts of a Nimbus region as real processes for
// tests: PostgreSQL (a single server to stop and start, or a Patroni
// cluster on etcd), HAProxy and nimbus serve controllers, each from the
// files in deploy/region that docs/operator.md gives operators. A test that
// lacks a part's Debian package skips, unless NIMBUS_REQUIRE_PGHA=1 says
// the package must be there.
package region

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Proc is a process a test started, with its output in a log file.
type Proc struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// As names the user a process runs as (nil: the test's own).
type As *syscall.Credential

// Postgres is the credential of Debian's postgres user, which PostgreSQL
// and Patroni run as: PostgreSQL refuses to run as root.
func Postgres(t testing.TB) As {
	t.Helper()
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("no postgres user (Debian's postgresql package makes it): %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// Start runs bin with args and env added to the test's environment. The
// process is killed when the test ends.
func Start(t testing.TB, name string, as As, env []string, bin string, args ...string) *Proc {
	t.Helper()
	dir := t.TempDir()
	logFile := filepath.Join(dir, name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if as != nil {
		// The test's directories are the test user's alone: start where
		// anyone may be.
		cmd.SysProcAttr.Credential, cmd.Dir = as, os.TempDir()
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &Proc{Name: name, Log: logFile, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() { p.Kill() })
	return p
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited tells whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill ends the process and its process group at once (kill -9) and
// waits for it.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Process.Kill()
	<-p.done
}

// Stop sends sig and waits up to 30 s for the process to end, then kills it.
func (p *Proc) Stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if p.Exited() {
		return
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.Kill()
		t.Errorf("%s did not stop on %v", p.Name, sig)
	}
}

// Tail is the end of the process's log, for failure messages.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return p.Name + ":\n  " + strings.Join(lines[max(0, len(lines)-20):], "\n  ")
}

// Tails joins the logs' ends of procs.
func Tails(procs ...*Proc) string {
	var out []string
	for _, p := range procs {
		if p != nil {
			out = append(out, p.Tail())
		}
	}
	return strings.Join(out, "\n")
}

// WaitFor polls cond every 100 ms for up to d; on failure it shows the
// processes' logs.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool, procs ...*Proc) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s\n%s", what, d, Tails(procs...))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// FreePort is a TCP port free on addr now.
func FreePort(t testing.TB, addr string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Build builds the nimbus binary into the test's temporary directory.
func Build(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nimbus")
	if out, err := exec.Command("go", "build", "-o", bin, "nimbus/cmd/nimbus").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// RepoFile is the path of a file in the repository, from this source file.
func RepoFile(t testing.TB, rel string) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	p := filepath.Join(filepath.Dir(self), "..", "..", "..", rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("repository file %s: %v", rel, err)
	}
	return p
}

// Need skips the test when a command is missing, or fails it when env
// is "1" (the README's test command sets it, so nothing skips there).
func Need(t testing.TB, env string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			if os.Getenv(env) == "1" {
				t.Fatalf("%s is required (%s=1) but not installed: %v", c, env, err)
			}
			t.Skipf("%s not installed (scripts/test-all installs it; set %s=1 to fail instead)", c, env)
		}
	}
}

// OwnedDir is a new directory that the user as owns, removed when the
// test ends. It is made outside the test's own temporary directory, which
// no other user may enter.
func OwnedDir(t testing.TB, as As, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := (*syscall.Credential)(as)
	if err := os.Chown(dir, int(c.Uid), int(c.Gid)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// run runs a command as the user as and fails the test on error.
func run(t testing.TB, as As, env []string, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	if as != nil {
		cmd.SysProcAttr, cmd.Dir = &syscall.SysProcAttr{Credential: as}, os.TempDir()
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func pgBin(name string) string {
	return filepath.Join("/usr/lib/postgresql", pgVersion(), "bin", name)
}

// pgVersion is the newest PostgreSQL installed from Debian's packages.
func pgVersion() string {
	ents, _ := os.ReadDir("/usr/lib/postgresql")
	best := 0
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > best {
			best = n
		}
	}
	return fmt.Sprint(best)
}

// cmdAs runs a command as the user as and returns its output.
func cmdAs(as As, bin string, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	if as != nil {
		cmd.SysProcAttr, cmd.Dir = &syscall.SysProcAttr{Credential: as}, os.TempDir()
	}
	return cmd.CombinedOutput()
}

// Lines are the lines of the process's log that hold substr, at most n.
func (p *Proc) Lines(substr string, n int) string {
	b, _ := os.ReadFile(p.Log)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, substr) && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
