package main

import (
	"os/exec"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestServeDriverLine: the start banner says what runs the servers, and
// for qemu its accelerator and why it was chosen.
func TestServeDriverLine(t *testing.T) {
	c := testenv.StartCloud(t, "")
	if got := driverLine(c, c.Config); !strings.HasPrefix(got, "fake: ") {
		t.Errorf("fake driver: %q", got)
	}
	alone := testenv.StartCloud(t, "", func(cfg *cloud.Config) { cfg.NoLocalAgent = true })
	if got := driverLine(alone, alone.Config); !strings.Contains(got, "--no-local-agent") {
		t.Errorf("no local agent: %q", got)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed")
	}
	q := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.Driver = "qemu"
		cfg.QEMU = cloud.QEMUOptions{Accel: "tcg", ReservedCPUs: []int{}, ReservedMemoryMB: -1, AccessHost: "127.0.0.1"}
	})
	if got := driverLine(q, q.Config); got != "qemu, QEMU (tcg forced by configuration)" {
		t.Errorf("qemu driver: %q", got)
	}
}
