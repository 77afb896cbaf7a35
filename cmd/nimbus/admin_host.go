package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"nimbus/internal/fleet"
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
	hosts, err := a.fleet.HostInfos(ctx)
	if err != nil {
		return err
	}
	if a.json {
		if hosts == nil {
			hosts = []fleet.HostInfo{}
		}
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
		rows[i] = []string{h.Name, agent, state, seen, strconv.Itoa(h.Servers), orDash(oneLine(h.Health, 60))}
	}
	return a.table([]string{"NAME", "AGENT", "STATE", "LAST SEEN", "SERVERS", "HEALTH"}, rows)
}
