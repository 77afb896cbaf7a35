package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"nimbus/internal/store"
	regiontest "nimbus/internal/testenv/region"
)

// smallDisk mounts a tmpfs of size (e.g. "48m") at a new directory, unmounted
// when the test ends. It needs root: the test skips without it, or fails
// when NIMBUS_REQUIRE_MOUNT=1 (scripts/test-all sets it).
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	fail := t.Skipf
	if os.Getenv("NIMBUS_REQUIRE_MOUNT") == "1" {
		fail = t.Fatalf
	}
	if os.Geteuid() != 0 {
		fail("mounting a small tmpfs needs root (NIMBUS_REQUIRE_MOUNT=1 makes this a failure)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		fail("mount -t tmpfs: %v %s (NIMBUS_REQUIRE_MOUNT=1 makes this a failure)", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// fill takes every free byte of the file system path is on with one
// file, in 1 MB then 4 KB steps (the controller writes meanwhile), and
// answers how many it took.
func fill(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var size int64
	for _, step := range []int64{1 << 20, 4 << 10} {
		for {
			err := syscall.Fallocate(int(f.Fd()), 0, size, step)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatalf("fallocate: %v", err)
			}
			size += step
		}
	}
	return size
}

// requestDeadline is how long a client of the fault tests waits for any
// answer: a request still unanswered then has hung.
const requestDeadline = 10 * time.Second

// TestDataDirFull fills the data directory of a controller on SQLite (a
// small tmpfs) while clients create keypairs, security groups, servers,
// volumes and images through the API. Requests meanwhile answer 2xx or
// 503 in their service's error shape with Retry-After, none 500, none
// hangs, and the controller does not die; once the space is freed it
// serves again by itself, without a restart. Then, and again after a
// restart: the database passes PRAGMA integrity_check, and every create
// the API acknowledged is there (an acknowledged upload with its data).
func TestDataDirFull(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nimbus serve as a process")
	}
	began := time.Now()
	dir := smallDisk(t, "48m")
	ctl := regiontest.StartController(t, "controller", regiontest.ControllerConfig{Bin: buildNimbus(t), DatabaseURL: "",
		Dir: filepath.Join(dir, "nimbus"), Args: []string{"--fake-delay", "50ms", "--billing-credit-limit", "100000000000"}})
	cl := regiontest.Connect(t, ctl.URL("identity")+"/v3", ctl.CACert(), requestDeadline)
	cl.Unlimit(t)
	image, flavor, network := cl.BootChoice(t)
	load := &regiontest.Load{Compute: cl.Compute, Network: cl.Network, Volumes: cl.Volume, Images: cl.Image,
		Image: image, Flavor: flavor, Net: network, ImageBytes: 256 << 10,
		Deadline: requestDeadline, Every: 50 * time.Millisecond}
	stop := load.Run(4)
	time.Sleep(2 * time.Second)

	filler := filepath.Join(dir, "filler")
	took := fill(t, filler)
	full := time.Now()
	t.Logf("the data directory's file system full (%d MB taken)", took>>20)
	time.Sleep(8 * time.Second)
	if ctl.Exited() {
		t.Fatalf("the controller died of a full disk\n%s", ctl.Tail())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	time.Sleep(6 * time.Second)
	reqs := stop()

	s := regiontest.Summarize(t, reqs)
	t.Logf("disk full %.1f s: %s", freed.Sub(full).Seconds(), s)
	byOp := map[string]map[int]int{}
	messages := map[string]int{}
	var firstWrite time.Duration = -1
	for _, r := range reqs {
		if byOp[r.Op] == nil {
			byOp[r.Op] = map[int]int{}
		}
		byOp[r.Op][r.Status]++
		if r.Status == http.StatusServiceUnavailable {
			messages[serviceMessage(r.Body)]++
		}
		if r.Start.After(freed) && r.Status/100 == 2 && r.Op != "list" && firstWrite < 0 {
			firstWrite = r.End.Sub(freed)
		}
	}
	t.Logf("statuses by request: %v; 503 messages: %v", byOp, messages)
	t.Logf("first create acknowledged %.2f s after the space was freed", firstWrite.Seconds())
	if s.Unavailable == 0 {
		t.Errorf("no request answered 503 while the disk was full")
	}
	if s.Hung > 0 || s.NoAnswer > 0 || len(s.Other) > 0 {
		t.Errorf("want only 2xx and 503: %s\n%s", s, ctl.Lines(`"level":"ERROR"`, 10))
	}
	if !s.LastFailure.IsZero() {
		if d := s.LastFailure.Sub(freed); d > 0 {
			t.Logf("the last failed request ended %.2f s after the space was freed", d.Seconds())
		} else {
			t.Logf("no request failed once the space was freed")
		}
		if s.LastFailure.After(freed.Add(5 * time.Second)) {
			t.Errorf("requests still failed %s after the space was freed", s.LastFailure.Sub(freed).Round(100*time.Millisecond))
		}
	}
	if l := ctl.Lines("panic", 5); l != "" {
		t.Errorf("the controller panicked:\n%s", l)
	}
	check := func(when string) {
		t.Helper()
		integrity(t, filepath.Join(ctl.Dir, "nimbus.db"), when)
		if lost := load.Missing(t, reqs); len(lost) == 0 {
			t.Logf("%s: all %d acknowledged creates found", when, s.Created)
		} else {
			t.Errorf("%s: %d acknowledged creates lost, such as %s %s", when, len(lost), lost[0].Op, lost[0].ID)
		}
	}
	check("after the space was freed")

	ctl.Stop(t, syscall.SIGTERM)
	ctl.Restart(t, "controller")
	cl = regiontest.Connect(t, ctl.URL("identity")+"/v3", ctl.CACert(), requestDeadline)
	load.Compute, load.Network, load.Volumes, load.Images = cl.Compute, cl.Network, cl.Volume, cl.Image
	check("after a restart")
	t.Logf("after a restart: acknowledged creates now %v", states(t, cl, reqs))
	if code := cl.Writes(t); code != http.StatusCreated {
		t.Errorf("a write after the restart: %d", code)
	}
	t.Logf("test took %.1f s", time.Since(began).Seconds())
}

// states counts what the servers and volumes the API acknowledged, and
// the images whose upload failed, are now: op and status.
func states(t *testing.T, cl *regiontest.Clients, reqs []regiontest.Request) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, r := range reqs {
		var sc *gophercloud.ServiceClient
		var url, obj string
		switch {
		case r.Op == "server" && r.Status/100 == 2:
			sc, url, obj = cl.Compute, cl.Compute.ServiceURL("servers", r.ID), "server"
		case r.Op == "volume" && r.Status/100 == 2:
			sc, url, obj = cl.Volume, cl.Volume.ServiceURL("volumes", r.ID), "volume"
		case r.Op == "image data" && r.Status/100 != 2:
			sc, url = cl.Image, cl.Image.ServiceURL("images", r.ID)
		default:
			continue
		}
		var body map[string]any
		if _, err := sc.Get(context.Background(), url, &body, nil); err != nil {
			t.Fatalf("%s %s: %v", r.Op, r.ID, err)
		}
		if obj != "" {
			body, _ = body[obj].(map[string]any)
		}
		out[fmt.Sprint(r.Op, " ", body["status"])]++
		if body["status"] == "ERROR" {
			t.Logf("%s %s in ERROR: %v", r.Op, r.ID, body["fault"])
		}
	}
	return out
}

// serviceMessage is an OpenStack error body's message, whatever its
// service's shape.
func serviceMessage(body []byte) string {
	var flat struct{ Message string }
	var nested map[string]struct{ Message string }
	if json.Unmarshal(body, &flat) == nil && flat.Message != "" {
		return flat.Message
	}
	if json.Unmarshal(body, &nested) == nil {
		for _, v := range nested {
			return v.Message
		}
	}
	return string(body)
}

// integrity runs PRAGMA integrity_check on the SQLite database at path
// through the store, beside the controller that has it open.
func integrity(t *testing.T, path, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := store.OpenReadOnly(ctx, path)
	if err != nil {
		t.Fatalf("%s: open %s: %v", when, path, err)
	}
	defer db.Close()
	rows, err := db.Query(ctx, "PRAGMA integrity_check")
	if err != nil {
		t.Fatalf("%s: integrity_check: %v", when, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if got := strings.Join(out, "\n"); got != "ok" {
		t.Errorf("%s: integrity_check: %s", when, got)
	} else {
		t.Logf("%s: integrity_check ok", when)
	}
}
