package qmp

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// startQEMU runs a paused (-S) diskless q35 under TCG, optionally with a 1 MiB
// raw virtio-blk disk (drive disk0, device disk0-dev), and dials its QMP
// socket. exited is closed once cmd.Wait has returned, with its result in
// *waitErr; cleanup kills QEMU and always reaps it.
func startQEMU(t *testing.T, smp int, disk bool) (m *Monitor, exited <-chan struct{}, waitErr *error) {
	t.Helper()
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		if os.Getenv("NIMBUS_REQUIRE_QEMU") == "1" {
			t.Fatalf("qemu-system-x86_64 not found and NIMBUS_REQUIRE_QEMU=1: %v", err)
		}
		t.Skip("qemu-system-x86_64 not in PATH (apt-get install qemu-system-x86); set NIMBUS_REQUIRE_QEMU=1 to fail instead")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	args := []string{"-machine", "q35", "-accel", "tcg", "-m", "64", "-smp", strconv.Itoa(smp),
		"-nodefaults", "-display", "none", "-S", "-qmp", "unix:" + sock + ",server=on,wait=off"}
	if disk {
		img := filepath.Join(dir, "d.raw")
		if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-drive", "file="+img+",if=none,id=disk0,format=raw",
			"-device", "virtio-blk-pci,drive=disk0,id=disk0-dev")
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	waitErr = new(error)
	go func() { *waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	m, err = Dial(ctxT(t, 20*time.Second), sock) // retries until QEMU has made the socket
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m, done, waitErr
}

func TestRealQEMU(t *testing.T) {
	t.Run("lifecycle", func(t *testing.T) {
		m, exited, waitErr := startQEMU(t, 2, true)
		ctx := ctxT(t, 30*time.Second)

		if s, running, err := m.Status(ctx); err != nil || s != "prelaunch" || running {
			t.Fatalf("Status = %q %v %v, want prelaunch, not running", s, running, err)
		}
		if on, err := m.KVMEnabled(ctx); err != nil || on {
			t.Fatalf("KVMEnabled = %v %v, want false under tcg", on, err)
		}
		tids, err := m.VCPUThreads(ctx)
		if err != nil || len(tids) != 2 || tids[0] <= 0 || tids[1] <= 0 {
			t.Fatalf("VCPUThreads = %v %v, want 2 positive thread ids", tids, err)
		}

		// QEMU sends RESUME/STOP before its reply: subscribe first.
		sub, cancel := m.Subscribe("RESUME", "STOP")
		defer cancel()
		if err := m.Cont(ctx); err != nil {
			t.Fatal(err)
		}
		if ev, err := WaitEvent(ctx, sub, "RESUME"); err != nil || ev.Time.IsZero() {
			t.Fatalf("RESUME: %+v %v", ev, err)
		}
		if s, running, err := m.Status(ctx); err != nil || s != "running" || !running {
			t.Fatalf("Status after cont = %q %v %v", s, running, err)
		}
		if err := m.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := WaitEvent(ctx, sub, "STOP"); err != nil {
			t.Fatal(err)
		}
		if s, running, err := m.Status(ctx); err != nil || s != "paused" || running {
			t.Fatalf("Status after stop = %q %v %v", s, running, err)
		}

		if err := m.SetIOThrottle(ctx, "disk0-dev", 50, 20); err != nil {
			t.Fatalf("SetIOThrottle: %v", err)
		}
		var blocks []struct {
			QDev     string `json:"qdev"`
			Inserted struct {
				IOPSRd int `json:"iops_rd"`
				IOPSWr int `json:"iops_wr"`
			} `json:"inserted"`
		}
		if err := m.Execute(ctx, "query-block", nil, &blocks); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, b := range blocks {
			if b.QDev == "/machine/peripheral/disk0-dev/virtio-backend" {
				found = b.Inserted.IOPSRd == 50 && b.Inserted.IOPSWr == 20
			}
		}
		if !found {
			t.Fatalf("query-block does not show iops 50/20 on disk0-dev: %+v", blocks)
		}
		var qerr *Error
		if err := m.SetIOThrottle(ctx, "nope", 1, 1); !errors.As(err, &qerr) || qerr.Class != "DeviceNotFound" {
			t.Fatalf("SetIOThrottle on a missing device = %v", err)
		}

		if err := m.Quit(ctx); err != nil {
			t.Fatalf("Quit: %v", err)
		}
		select {
		case <-m.Done():
		default:
			t.Fatal("Done not closed after Quit")
		}
		select {
		case <-exited:
			if *waitErr != nil {
				t.Fatalf("QEMU exited with %v", *waitErr)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("QEMU did not exit after quit")
		}
		// The last thing QEMU said was SHUTDOWN (host-qmp-quit); Events delivers it, then closes.
		var last Event
		for ev := range m.Events() {
			last = ev
		}
		var d struct{ Reason string }
		if json.Unmarshal(last.Data, &d); last.Name != "SHUTDOWN" || d.Reason != "host-qmp-quit" {
			t.Fatalf("last event %q %s, want SHUTDOWN host-qmp-quit", last.Name, last.Data)
		}
	})

	t.Run("one vCPU and getfd", func(t *testing.T) {
		m, _, _ := startQEMU(t, 1, false)
		ctx := ctxT(t, 10*time.Second)
		tids, err := m.VCPUThreads(ctx)
		if err != nil || len(tids) != 1 || tids[0] <= 0 {
			t.Fatalf("VCPUThreads = %v %v, want 1 positive thread id", tids, err)
		}
		// getfd without a descriptor fails; with one, QEMU holds it under
		// its name until closefd.
		if err := m.Execute(ctx, "getfd", map[string]string{"fdname": "p"}, nil); err == nil {
			t.Fatal("getfd without a file succeeded")
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := m.ExecuteWithFile(ctx, "getfd", map[string]string{"fdname": "p"}, nil, w); err != nil {
			t.Fatalf("getfd: %v", err)
		}
		w.Close()
		if err := m.Execute(ctx, "closefd", map[string]string{"fdname": "p"}, nil); err != nil {
			t.Fatalf("closefd of the file sent: %v", err)
		}
		// QEMU closed the only other copy of the write end.
		if n, err := r.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Fatalf("read from the pipe after closefd: %d, %v; want EOF", n, err)
		}
		if err := m.Execute(ctx, "closefd", map[string]string{"fdname": "p"}, nil); err == nil {
			t.Fatal("closefd twice succeeded")
		}
	})
}
