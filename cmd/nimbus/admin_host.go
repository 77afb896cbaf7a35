package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"time"
	"unicode/utf8"

	"nimbus/internal/api"
	"nimbus/internal/compute"
	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/store"
)

// hostCommands are "nimbus admin host …": enrolling host agents and seeing
// the fleet.
var hostCommands = map[string]adminCommand{
	"token": {args: "[--ttl 24h]",
		help: "Prints a one-time enrolment token. Give it to \"nimbus agent --token\" (or NIMBUS_AGENT_TOKEN) on the\n" +
			"new hypervisor host: the agent trades it for its own credential on first start, after which the\n" +
			"token is spent. Only a hash of the token is stored.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			ttl := fs.Duration("ttl", 24*time.Hour, "how long the token may be used")
			return func(ctx context.Context, _ []string) error { return a.hostToken(ctx, *ttl) }
		}},
	"list": {help: "Lists the hypervisor hosts the agents registered: the agent presenting each, whether it is up\n" +
		"(heard from within --down-after and healthy), when it was last heard from, and its servers.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			down := fs.Duration("down-after", fleet.DefaultDownAfter, "the controller's --down-after")
			return func(ctx context.Context, _ []string) error { return a.hostList(ctx, *down) }
		}},
	"disable": {args: "<host> [--reason TEXT]", nargs: 1,
		help: "Disables the host's nova-compute service, as \"openstack compute service set --disable\": no new servers\n" +
			"are placed there; those it has keep running. Both show in \"compute service list\" and \"host list\".",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			reason := fs.String("reason", "", "why, shown as the service's disabled_reason (at most 255 bytes)")
			return func(ctx context.Context, args []string) error {
				return a.hostSetStatus(ctx, args[0], compute.HostStatus{Disabled: true, Reason: *reason})
			}
		}},
	"enable": {args: "<host>", nargs: 1,
		help: "Enables the host's nova-compute service again, as \"openstack compute service set --enable\".",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				return a.hostSetStatus(ctx, args[0], compute.HostStatus{})
			}
		}},
	"remove": {args: "<host>", nargs: 1,
		help: "Forgets a host: its fleet entry, its nova-compute service and its aggregate memberships, as\n" +
			"\"openstack compute service delete\". Refused while servers live there: migrate, shelve or delete\n" +
			"them first. Stop the host's agent (or take the host out of its --fleet) first, else it registers\n" +
			"the host again.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error { return a.hostRemove(ctx, args[0]) }
		}},
}

// hostRow is one host of "host list": the fleet's view and its compute
// service's status.
type hostRow struct {
	fleet.HostInfo
	Status         string `json:"status"`
	DisabledReason string `json:"disabled_reason,omitempty"`
}

func (a *adminRun) hostToken(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return errors.New("--ttl must be positive")
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	tok, err := a.fleet.CreateToken(ctx, ttl)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(map[string]any{"token": tok, "expires_at": time.Now().Add(ttl).UTC().Format(time.RFC3339)})
	}
	_, err = fmt.Fprintln(a.stdout, tok)
	return err
}

func (a *adminRun) hostList(ctx context.Context, downAfter time.Duration) error {
	if downAfter <= 0 {
		return errors.New("--down-after must be positive")
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	a.fleet = fleet.New(a.db, fleet.Config{DownAfter: downAfter, Log: slog.New(slog.NewTextHandler(a.stderr, nil))})
	infos, err := a.fleet.HostInfos(ctx)
	if err != nil {
		return err
	}
	statuses, err := compute.HostStatuses(ctx, a.db)
	if err != nil {
		return err
	}
	hosts := make([]hostRow, len(infos))
	for i, h := range infos {
		st := statuses[h.Name]
		hosts[i] = hostRow{HostInfo: h, Status: serviceStatus(st), DisabledReason: st.Reason}
	}
	if a.json {
		return a.printJSON(map[string]any{"hosts": hosts})
	}
	rows := make([][]string, len(hosts))
	for i, h := range hosts {
		state, seen := "up", "-"
		if !h.Up {
			state = "down"
		}
		if !h.LastSeen.IsZero() {
			seen = h.LastSeen.UTC().Format(time.RFC3339)
		}
		agent := "-"
		if h.AgentID != "" {
			agent = fmt.Sprintf("%s (%s)", orDash(h.AgentName), h.AgentID[:min(8, len(h.AgentID))])
		}
		status := h.Status
		if h.DisabledReason != "" {
			status += " (" + oneLine(h.DisabledReason, 40) + ")"
		}
		rows[i] = []string{h.Name, agent, state, status, seen, strconv.Itoa(h.Servers), orDash(oneLine(h.Health, 60))}
	}
	return a.table([]string{"NAME", "AGENT", "STATE", "STATUS", "LAST SEEN", "SERVERS", "HEALTH"}, rows)
}

func serviceStatus(st compute.HostStatus) string {
	if st.Disabled {
		return "disabled"
	}
	return "enabled"
}

// maxReason is Nova's bound on a service's disabled_reason.
const maxReason = 255

func (a *adminRun) hostSetStatus(ctx context.Context, host string, st compute.HostStatus) error {
	if len(st.Reason) > maxReason || !utf8.ValidString(st.Reason) {
		return fmt.Errorf("--reason must be valid UTF-8 of at most %d bytes", maxReason)
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	err := compute.SetHostStatus(ctx, a.db, host, st)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no compute service for host %q (nimbus admin host list shows the hosts; a newly registered one gets its service within seconds of the controller seeing it)", host)
	}
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(map[string]any{"host": host, "status": serviceStatus(st), "disabled_reason": st.Reason})
	}
	_, err = fmt.Fprintf(a.stdout, "%s: %s\n", host, serviceStatus(st))
	return err
}

// hostRemove removes the host's compute service and fleet entry in one
// transaction, refused while servers are placed there or VMs reported.
func (a *adminRun) hostRemove(ctx context.Context, host string) error {
	if err := a.open(ctx); err != nil {
		return err
	}
	infos, err := a.fleet.HostInfos(ctx)
	if err != nil {
		return err
	}
	statuses, err := compute.HostStatuses(ctx, a.db)
	if err != nil {
		return err
	}
	var info *fleet.HostInfo
	for i := range infos {
		if infos[i].Name == host {
			info = &infos[i]
		}
	}
	if _, ok := statuses[host]; !ok && info == nil {
		return fmt.Errorf("no host %q (nimbus admin host list shows them)", host)
	}
	err = a.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := compute.RemoveComputeHost(ctx, tx, host); err != nil {
			return err
		}
		_, err := a.fleet.RemoveHost(ctx, tx, host)
		return err
	})
	var apiErr *api.Error
	if errors.As(err, &apiErr) || errors.Is(err, driver.ErrHostInUse) {
		return fmt.Errorf("host %q still has servers: migrate, shelve or delete them first (%v)", host, err)
	}
	if err != nil {
		return err
	}
	if info != nil && info.Up {
		fmt.Fprintf(a.stderr, "warning: the agent %s still presents %s and will register it again: stop it, or take the host out of its --fleet\n",
			orDash(info.AgentName), host)
	}
	if a.json {
		return a.printJSON(map[string]any{"removed": host})
	}
	_, err = fmt.Fprintf(a.stdout, "%s: removed\n", host)
	return err
}
