package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"nimbus/internal/agent"
	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
)

// defaultAgentDataDir is where an agent keeps its identity and journals: a
// directory of its own, so that an agent beside a controller does not take
// the controller's local agent's files.
func defaultAgentDataDir() string { return dataDirFor("NIMBUS_AGENT_DATA_DIR", "nimbus-agent") }

// agentFlags are the values of nimbus agent's flags, read once parsed.
type agentFlags struct {
	cfg                                    agent.Config
	qf                                     qemuFlags
	nf                                     netFlags
	drv, hostIP, zone, fleetFile, logLevel *string
	fakeDelay                              *time.Duration
}

// newAgentFlags defines nimbus agent's flags on a new flag set: agentCmd
// parses it, and the flag reference (nimbus docs flags) lists it.
func newAgentFlags() (*flag.FlagSet, *agentFlags) {
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	af := &agentFlags{}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: nimbus agent --controller https://HOST:8790 --ca-cert ca.pem [--token TOKEN] [flags]

Runs the host agent: it enrols with the controller (the first time, with a
token from "nimbus admin host token"), registers this host's hypervisor,
and runs the controller's work on it. Later starts reuse the credential
saved in the data directory.

Flags:
`)
		fs.PrintDefaults()
	}
	cfg := &af.cfg
	fs.StringVar(&cfg.ControllerURL, "controller", os.Getenv("NIMBUS_CONTROLLER"), "the controller's agent API, https://host:8790 (env NIMBUS_CONTROLLER)")
	fs.StringVar(&cfg.CACertFile, "ca-cert", os.Getenv("NIMBUS_CA_CERT"), "the CA that signed the controller's certificate (its data directory's ca.pem); default the system's roots (env NIMBUS_CA_CERT)")
	fs.StringVar(&cfg.Token, "token", "", "one-time enrolment token, needed on first start only (prefer env NIMBUS_AGENT_TOKEN: flags show in ps)")
	fs.StringVar(&cfg.DataDir, "data-dir", defaultAgentDataDir(), "directory for the agent's credential and journals (env NIMBUS_AGENT_DATA_DIR)")
	fs.StringVar(&cfg.Name, "name", "", "how the operator sees this agent, and the qemu driver's host name (default: this machine's host name, plus for the agent a short id kept in the data directory's "+agent.NameFile+")")
	af.drv = fs.String("driver", "fake", "hypervisor driver: fake (a simulated host) or qemu (real VMs)")
	af.qf.register(fs)
	af.nf.register(fs, false)
	af.hostIP = fs.String("host-ip", "", "qemu driver: the address the controller and users reach this host on, in bridged mode its IPv4 address on the underlay (default: this machine's first non-loopback address)")
	af.zone = fs.String("zone", "nova", "qemu driver: the host's availability zone")
	af.fleetFile = fs.String("fleet", "", "JSON list of the hosts the fake driver presents (default: one host named after this machine)")
	af.fakeDelay = fs.Duration("fake-delay", 500*time.Millisecond, "how long the fake driver takes per step")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", 10*time.Second, "how often to report to the controller")
	af.logLevel = fs.String("log-level", "info", "debug, info, warn or error")
	return fs, af
}

// agentCmd is "nimbus agent": one per hypervisor host.
func agentCmd(args []string) error {
	fs, af := newAgentFlags()
	hostname, _ := os.Hostname()
	fs.Parse(args)
	cfg, qf, nf := af.cfg, af.qf, af.nf
	drv, hostIP, zone, fleetFile, fakeDelay, logLevel := af.drv, af.hostIP, af.zone, af.fleetFile, af.fakeDelay, af.logLevel
	if fs.NArg() > 0 {
		return fmt.Errorf("agent: unexpected arguments %v", fs.Args())
	}
	if cfg.Token == "" {
		cfg.Token = os.Getenv("NIMBUS_AGENT_TOKEN")
	}
	if cfg.ControllerURL == "" {
		return errors.New("agent: --controller is required (the controller's agent API, https://host:8790)")
	}
	if cfg.Heartbeat <= 0 {
		return errors.New("agent: --heartbeat must be positive")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	cfg.Log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	slog.SetDefault(cfg.Log)

	netOpts, err := nf.options(*drv, *hostIP)
	if err != nil {
		return err
	}
	switch *drv {
	case "fake":
		hosts := []driver.Host{{Name: hostname, IP: "192.0.2.100", VCPUs: 64, MemoryMB: 256 * 1024, DiskGB: 4000, Zone: "nova",
			Hypervisor: "fake", Version: 1000, Up: true}}
		if *fleetFile != "" {
			var err error
			if hosts, err = fake.LoadFleet(*fleetFile); err != nil {
				return err
			}
		}
		// The fake's VMs live in the agent's data directory, as a real
		// hypervisor's live on its host.
		d, err := fake.New(fake.Config{Hosts: hosts, Delay: *fakeDelay, StateFile: filepath.Join(cfg.DataDir, "fake-fleet.json")})
		if err != nil {
			return err
		}
		cfg.Driver = d
	case "qemu":
		o, err := qf.options()
		if err != nil {
			return err
		}
		o.DataDir, o.Name, o.IP, o.Zone, o.Log = cfg.DataDir, cmp.Or(cfg.Name, hostname), *hostIP, *zone, cfg.Log
		if o.IP == "" {
			o.IP = firstAddress()
		}
		o.Network = netOpts
		np, err := cloud.NewNetPlane(o)
		if err != nil {
			return err
		}
		if np != nil {
			defer np.Close()
			o.Wiring, cfg.Net = np, np
		}
		d, err := cloud.NewQEMUDriver(o)
		if err != nil {
			return err
		}
		defer d.Close()
		cfg.Driver = d
	default:
		return fmt.Errorf("agent: unknown driver %q (this build has: fake, qemu)", *drv)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, cfg)
}
