package main

import (
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"

	"nimbus/internal/cloud"
)

// qemuFlags are the QEMU driver's flags, the same for "nimbus serve" (its
// local agent) and "nimbus agent".
type qemuFlags struct {
	accel, reserved, access, runAs string
	consoleListen                  string
	reservedMemMB                  int
	noSandbox                      bool
}

func (q *qemuFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&q.accel, "accel", "auto", "qemu driver: accelerator, auto (KVM only where it really works), kvm or tcg")
	fs.StringVar(&q.reserved, "reserved-cpus", "", "qemu driver: host CPUs kept for the host and QEMU's emulator threads, e.g. 0,1 or 0-3, or none (default: the first core of each NUMA node, or those isolcpus leaves)")
	fs.IntVar(&q.reservedMemMB, "reserved-memory-mb", 0, "qemu driver: memory kept for the host, MiB (default 1024; -1 for none)")
	fs.StringVar(&q.access, "access-host", "", "qemu driver: the address users reach forwarded SSH/RDP ports on (default: the host's address)")
	fs.StringVar(&q.runAs, "qemu-user", "", "qemu driver: an unprivileged user QEMU drops to when the agent runs as root")
	fs.StringVar(&q.consoleListen, "console-listen", "", "qemu driver: host:port of the VNC relay the controller's console proxy connects to (default: the host's address, any free port)")
	fs.BoolVar(&q.noSandbox, "no-sandbox", false, "qemu driver: run QEMU without its seccomp sandbox")
}

// options turns the flags into the driver's options.
func (q *qemuFlags) options() (cloud.QEMUOptions, error) {
	o := cloud.QEMUOptions{Accel: q.accel, ReservedMemoryMB: q.reservedMemMB, AccessHost: q.access,
		NoSandbox: q.noSandbox, RunAs: q.runAs, ConsoleListen: q.consoleListen}
	switch q.accel {
	case "auto", "kvm", "tcg":
	default:
		return o, fmt.Errorf("--accel: want auto, kvm or tcg, not %q", q.accel)
	}
	cpus, err := parseCPUList(q.reserved)
	if err != nil {
		return o, fmt.Errorf("--reserved-cpus: %w", err)
	}
	o.ReservedCPUs = cpus
	return o, nil
}

// parseCPUList reads "0,2-3" ("" is nil: the default; "none" is empty).
func parseCPUList(s string) ([]int, error) {
	switch s = strings.TrimSpace(s); s {
	case "":
		return nil, nil
	case "none":
		return []int{}, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("%q is not a CPU number or range", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a CPU range", part)
			}
		}
		if b-a > 4096 {
			return nil, fmt.Errorf("%q is too wide a range", part)
		}
		for id := a; id <= b; id++ {
			out = append(out, id)
		}
	}
	return out, nil
}

// firstAddress is this machine's first IPv4 address that is up and not
// loopback, or 127.0.0.1.
func firstAddress() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return "127.0.0.1"
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}
