package fake

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/driver"
)

func newFleet(t *testing.T, delay time.Duration) (*Driver, string) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "fleet.json")
	d, err := New(Config{Hosts: DefaultFleet(), Delay: delay, StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	return d, state
}

func spec(id string) driver.Spec {
	return driver.Spec{ServerID: id, Name: "vm-" + id, Hostname: "vm-" + id, Host: "fake-host-1",
		VCPUs: 2, MemoryMB: 2048, DiskGB: 20, KeyName: "k", FixedIPs: []string{"10.0.0.5"}, AdminPass: "s3cret"}
}

func mustState(t *testing.T, d *Driver, id string, want driver.PowerState) {
	t.Helper()
	got, err := d.State(context.Background(), id)
	if err != nil || got != want {
		t.Fatalf("state of %s = %d, %v; want %d", id, got, err, want)
	}
}

func TestDefaultFleet(t *testing.T) {
	hosts := DefaultFleet()
	if len(hosts) != 5 {
		t.Fatalf("%d hosts, want 5", len(hosts))
	}
	models := map[string]int{}
	for _, h := range hosts {
		if !h.Up || h.Zone != "nova" || h.Hypervisor != "fake" || h.VCPUs <= 0 {
			t.Errorf("host %+v", h)
		}
		for _, g := range h.GPUs {
			models[g.Model]++
		}
	}
	if models["A100 80GB"] != 4 || models["L4"] != 2 {
		t.Errorf("GPUs %v", models)
	}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	d, _ := newFleet(t, 0)
	steps := []struct {
		name string
		do   func() error
		want driver.PowerState
	}{
		{"spawn", func() error { return d.Spawn(ctx, spec("a")) }, driver.Running},
		{"spawn again", func() error { return d.Spawn(ctx, spec("a")) }, driver.Running},
		{"power off", func() error { return d.PowerOff(ctx, "a", true) }, driver.Shutdown},
		{"power off again", func() error { return d.PowerOff(ctx, "a", false) }, driver.Shutdown},
		{"power on", func() error { return d.PowerOn(ctx, "a") }, driver.Running},
		{"pause", func() error { return d.Pause(ctx, "a") }, driver.Paused},
		{"pause again", func() error { return d.Pause(ctx, "a") }, driver.Paused},
		{"unpause", func() error { return d.Unpause(ctx, "a") }, driver.Running},
		{"suspend", func() error { return d.Suspend(ctx, "a") }, driver.Suspended},
		{"resume", func() error { return d.Resume(ctx, "a") }, driver.Running},
		{"soft reboot", func() error { return d.Reboot(ctx, "a", false) }, driver.Running},
		{"resize", func() error { s := spec("a"); s.VCPUs = 4; s.DiskGB = 40; return d.Resize(ctx, s) }, driver.Running},
		{"power off for hard reboot", func() error { return d.PowerOff(ctx, "a", false) }, driver.Shutdown},
		{"hard reboot starts", func() error { return d.Reboot(ctx, "a", true) }, driver.Running},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		mustState(t, d, "a", s.want)
	}
	if err := d.Pause(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := d.Reboot(ctx, "a", false); err == nil {
		t.Error("soft reboot of a paused server succeeded")
	}
	out, err := d.ConsoleOutput(ctx, "a", 0)
	if err != nil || !strings.Contains(out, "vm-a login:") || !strings.Contains(out, "Linux version") {
		t.Fatalf("console: %q %v", out, err)
	}
	last, _ := d.ConsoleOutput(ctx, "a", 2)
	if n := strings.Count(last, "\n"); n != 2 {
		t.Errorf("last 2 lines gave %d lines: %q", n, last)
	}
	size, err := d.Snapshot(ctx, "a", "")
	if err != nil || size <= 0 || size > 40<<30 {
		t.Errorf("snapshot %d %v", size, err)
	}
	if err := d.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(ctx, "a"); err != nil {
		t.Fatalf("destroy of a gone server: %v", err)
	}
}

func TestUnknownIsNotFound(t *testing.T) {
	ctx := context.Background()
	d, _ := newFleet(t, 0)
	calls := map[string]func() error{
		"power off": func() error { return d.PowerOff(ctx, "x", true) },
		"power on":  func() error { return d.PowerOn(ctx, "x") },
		"reboot":    func() error { return d.Reboot(ctx, "x", true) },
		"pause":     func() error { return d.Pause(ctx, "x") },
		"unpause":   func() error { return d.Unpause(ctx, "x") },
		"suspend":   func() error { return d.Suspend(ctx, "x") },
		"resume":    func() error { return d.Resume(ctx, "x") },
		"resize":    func() error { return d.Resize(ctx, spec("x")) },
		"snapshot":  func() error { _, err := d.Snapshot(ctx, "x", ""); return err },
		"console":   func() error { _, err := d.ConsoleOutput(ctx, "x", 0); return err },
		"state":     func() error { _, err := d.State(ctx, "x"); return err },
	}
	for name, f := range calls {
		if err := f(); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", name, err)
		}
	}
	s := spec("y")
	s.Host = "no-such-host"
	if err := d.Spawn(ctx, s); err == nil {
		t.Error("spawn on an unknown host succeeded")
	}
	d.SetHostUp("fake-host-1", false)
	if err := d.Spawn(ctx, spec("z")); err == nil {
		t.Error("spawn on a down host succeeded")
	}
}

func TestRestartKeepsVMs(t *testing.T) {
	ctx := context.Background()
	d, state := newFleet(t, 0)
	for _, id := range []string{"a", "b"} {
		if err := d.Spawn(ctx, spec(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.PowerOff(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	d2, err := New(Config{Hosts: DefaultFleet(), StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	list, err := d2.List(ctx)
	if err != nil || len(list) != 2 || list[0].Power != driver.Running || list[1].Power != driver.Shutdown ||
		list[0].Host != "fake-host-1" {
		t.Fatalf("after restart: %+v %v", list, err)
	}
	if out, _ := d2.ConsoleOutput(ctx, "a", 0); !strings.Contains(out, "login:") {
		t.Errorf("console lost on restart: %q", out)
	}
	if err := d2.Destroy(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(state)
	if strings.Contains(string(b), "s3cret") {
		t.Error("the admin password was persisted")
	}
	d3, err := New(Config{Hosts: DefaultFleet(), StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	if list, _ := d3.List(ctx); len(list) != 1 || list[0].ID != "a" {
		t.Errorf("after destroy and restart: %+v", list)
	}
	// A restart compacts the journal to one line per VM.
	if b, _ := os.ReadFile(state); strings.Count(string(b), "\n") != 1 {
		t.Errorf("journal not compacted:\n%s", b)
	}
	f, err := os.OpenFile(state, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("{nope\n")
	f.Close()
	if _, err := New(Config{StateFile: state}); err == nil {
		t.Error("a corrupt record was accepted")
	}
}

func TestFailNextAndDelay(t *testing.T) {
	ctx := context.Background()
	d, _ := newFleet(t, 20*time.Millisecond)
	boom := errors.New("boom")
	d.FailNext(OpSpawn, boom)
	if err := d.Spawn(ctx, spec("a")); !errors.Is(err, boom) {
		t.Fatalf("spawn: %v, want boom", err)
	}
	if _, err := d.State(ctx, "a"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("failed spawn left a VM: %v", err)
	}
	start := time.Now()
	if err := d.Spawn(ctx, spec("a")); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 60*time.Millisecond {
		t.Errorf("spawn took %v, want >= 3 delays", el)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	if err := d.Reboot(cctx, "a", true); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("reboot with an ending ctx: %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	ctx := context.Background()
	d, _ := newFleet(t, time.Millisecond)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := string(rune('a' + i))
			if err := d.Spawn(ctx, spec(id)); err != nil {
				t.Error(err)
			}
			if err := d.PowerOff(ctx, id, true); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	list, _ := d.List(ctx)
	if len(list) != 16 {
		t.Fatalf("%d VMs, want 16", len(list))
	}
}

func TestLoadFleet(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`[{"name":"h1","vcpus":8,"memory_mb":16384,"disk_gb":100},
		{"name":"h2","vcpus":8,"memory_mb":16384,"disk_gb":100,"up":false,"gpus":[{"address":"0000:01:00.0","vendor":"NVIDIA","model":"L4"}]}]`), 0o600)
	hosts, err := LoadFleet(good)
	if err != nil || len(hosts) != 2 || !hosts[0].Up || hosts[1].Up || len(hosts[1].GPUs) != 1 {
		t.Fatalf("%+v %v", hosts, err)
	}
	for _, c := range []struct{ name, body, want string }{
		{"notjson", `{`, "want a JSON list of hosts"},
		{"noname", `[{"vcpus":1,"memory_mb":1}]`, "host 1 has no name"},
		{"dup", `[{"name":"a","vcpus":1,"memory_mb":1},{"name":"a","vcpus":1,"memory_mb":1}]`, `host "a" listed twice`},
		{"nocpu", `[{"name":"a","memory_mb":1}]`, `host "a" needs vcpus`},
		// A misspelt key is named with its host, not dropped silently.
		{"disk", `[{"name":"ok","vcpus":1,"memory_mb":1},{"name":"hv-2","vcpus":8,"memory_mb":1024,"disk":100}]`,
			`host "hv-2": json: unknown field "disk"`},
		{"nested", `[{"name":"g","vcpus":8,"memory_mb":1024,"gpus":[{"address":"0000:01:00.0","modle":"L4"}]}]`,
			`host "g": json: unknown field "modle"`},
		{"unnamed", `[{"vcpu":8}]`, `host #1: json: unknown field "vcpu"`},
		{"wrongtype", `[{"name":"t","vcpus":"8","memory_mb":1}]`, `host "t": json: cannot unmarshal string`},
	} {
		p := filepath.Join(dir, c.name)
		os.WriteFile(p, []byte(c.body), 0o600)
		if _, err := LoadFleet(p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

func TestOddIDsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	d, state := newFleet(t, 0)
	id := "../../escape\n\"odd\""
	if err := d.Spawn(ctx, spec(id)); err != nil {
		t.Fatal(err)
	}
	d2, err := New(Config{Hosts: DefaultFleet(), StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := d2.State(ctx, id); err != nil || p != driver.Running {
		t.Fatalf("after restart: %v %v", p, err)
	}
}

// TestJournalCompactsWhileRunning checks that a long-running fleet does not
// grow its journal without bound and loses nothing when it compacts.
func TestJournalCompactsWhileRunning(t *testing.T) {
	ctx := context.Background()
	d, state := newFleet(t, 0)
	for i := range 50 {
		id := "vm-" + strconv.Itoa(i)
		if err := d.Spawn(ctx, spec(id)); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		for i := range 50 {
			id := "vm-" + strconv.Itoa(i)
			if err := d.PowerOff(ctx, id, false); err != nil {
				t.Fatal(err)
			}
			if err := d.PowerOn(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, _ := os.ReadFile(state)
	if n := strings.Count(string(b), "\n"); n > 1200 {
		t.Errorf("journal has %d lines for 50 VMs after 2000 changes", n)
	}
	d2, err := New(Config{Hosts: DefaultFleet(), StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	list, _ := d2.List(ctx)
	if len(list) != 50 {
		t.Fatalf("after restart: %d VMs, want 50", len(list))
	}
	for _, v := range list {
		if v.Power != driver.Running {
			t.Errorf("%s: power %v after restart, want running", v.ID, v.Power)
		}
	}
}
