// Package agent is the host side of Nimbus: the process ("nimbus agent")
// that runs on each hypervisor host, presents the host to a controller and
// runs the controller's work on it through the host's driver.
//
// An agent enrols once with a token from "nimbus admin host token" and
// keeps the credential it gets in DataDir/agent.json. It then registers its
// driver's hosts, heartbeats their health and its VMs' power states,
// long-polls for ops and runs each through the driver — concurrently, but
// one at a time per server and in the order the controller made them — and
// posts their results. A journal in DataDir keeps each result until the
// controller has accepted it, so that an op delivered again after a network
// cut or a restart of either side is answered, not run twice. Errors are
// retried with capped exponential backoff, forever: an agent outlives its
// controller's restarts.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
)

// Config is what an agent needs.
type Config struct {
	// ControllerURL is the controller's agent API, https://host:8790.
	ControllerURL string
	// CACertFile is the CA that signed the controller's certificate (the
	// controller's ca.pem); empty means the system's roots.
	CACertFile string
	// DataDir keeps the agent's identity and op journal.
	DataDir string
	// Token is the one-time enrolment token, needed only on first start.
	Token string
	// Name is how the operator sees the agent (default: DefaultName).
	Name string
	// Driver runs the servers.
	Driver driver.Driver
	// Heartbeat is how often the agent reports (default 10 s).
	Heartbeat time.Duration
	// Concurrency bounds the ops run at once (default 16).
	Concurrency int
	// MaxBackoff caps the wait between retries after errors (default 10 s).
	MaxBackoff time.Duration
	// Net is the host's bridged data plane (netplane.go), nil for
	// user-mode networking.
	Net *NetPlane
	Log *slog.Logger
}

// JournalFile is the op journal's file name in the data directory.
const JournalFile = "agent-ops.jsonl"

// pollWait is how long a long-poll may wait at the controller.
const pollWait = 25 * time.Second

// Agent is one running agent.
type Agent struct {
	cfg Config
	log *slog.Logger
	c   *client
	drv driver.Driver
	j   *journal

	mu      sync.Mutex
	have    map[string]bool        // ops held: queued, running, or finished and not accepted
	queues  map[string][]wire.Op   // per server: ops not yet started; a key means a runner works
	results map[string]wire.Result // finished, not yet accepted
	// accepted remembers ops whose results the controller took, for a
	// while: a poll answered just before it recorded one may still bring
	// the op, which must not run again.
	accepted map[string]time.Time
	pruned   time.Time
	kick     chan struct{}
	sem      chan struct{}
	wg       sync.WaitGroup

	hbMu       sync.Mutex
	registered string // the inventory last registered
	refused    string // hosts the controller refused, last logged

	ready     chan struct{}
	readyOnce sync.Once
	failing   atomic.Bool // an error has been logged and not yet recovered from
}

// New checks cfg and makes an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if cfg.ControllerURL == "" {
		return nil, errors.New("agent: no controller URL")
	}
	if cfg.Driver == nil {
		return nil, errors.New("agent: no driver")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("agent: no data directory")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	c, err := newClient(cfg.ControllerURL, cfg.CACertFile)
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, log: cfg.Log, c: c, drv: cfg.Driver, have: map[string]bool{}, queues: map[string][]wire.Op{},
		results: map[string]wire.Result{}, accepted: map[string]time.Time{}, kick: make(chan struct{}, 1), sem: make(chan struct{}, cfg.Concurrency),
		ready: make(chan struct{})}, nil
}

// Run runs an agent until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	a, err := New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// Ready is closed once the agent's hosts are registered and its first
// heartbeat accepted.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Run enrols if needed, then registers, heartbeats, polls and runs ops
// until ctx ends. It returns early only for what retrying cannot fix: no
// identity and no (or a refused) token, or a data directory it cannot use.
func (a *Agent) Run(ctx context.Context) error {
	if err := os.MkdirAll(a.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("agent: data directory: %w", err)
	}
	id, err := LoadIdentity(a.cfg.DataDir)
	if notEnrolled(err) {
		if id, err = a.enrol(ctx); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	a.c.cred = id.Credential
	if u, ok := a.drv.(driver.ImageUser); ok {
		u.SetImageStore(imageStore{a.c})
	}
	if a.j, err = openJournal(filepath.Join(a.cfg.DataDir, JournalFile)); err != nil {
		return err
	}
	defer a.j.close()
	// Results finished before a restart and never accepted go out first.
	for _, r := range a.j.unacked() {
		a.have[r.OpID] = true
		a.results[r.OpID] = r
	}
	a.log.Info("agent started", "agent", id.AgentID, "controller", a.cfg.ControllerURL, "unsent_results", len(a.results))

	a.wg.Add(3)
	go func() { defer a.wg.Done(); a.heartbeatLoop(ctx) }()
	go func() { defer a.wg.Done(); a.pollLoop(ctx) }()
	go func() { defer a.wg.Done(); a.postLoop(ctx) }()
	if a.cfg.Net != nil {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.netLoop(ctx, a.cfg.Net) }()
	}
	<-ctx.Done()
	a.wg.Wait()
	a.sayStopped()
	a.log.Info("agent stopped")
	return nil
}

// stopTimeout bounds telling the controller of a clean stop: a controller
// that does not answer must not hold the agent's exit.
const stopTimeout = 5 * time.Second

// sayStopped tells the controller that the agent stops, so that its hosts
// are down at once rather than after the controller's --down-after. A
// controller that cannot be told finds out by the missing heartbeats.
func (a *Agent) sayStopped() {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	var resp wire.StopResponse
	if err := a.c.do(ctx, "POST", wire.PathStop, stopTimeout, wire.StopRequest{Observed: time.Now().UnixNano()}, &resp); err != nil {
		a.log.Warn("agent: could not tell the controller of the stop; its hosts go down after its --down-after", "error", err)
		return
	}
	a.log.Info("agent: the controller marked its hosts down", "hosts", len(resp.Hosts))
}

// enrol trades the token for an identity and saves it. Network errors are
// retried; a refused token is final.
func (a *Agent) enrol(ctx context.Context) (Identity, error) {
	if a.cfg.Token == "" {
		return Identity{}, fmt.Errorf("agent: not enrolled yet (no %s in %s): give an enrolment token from \"nimbus admin host token\"",
			IdentityFile, a.cfg.DataDir)
	}
	if a.cfg.Name == "" {
		name, err := DefaultName(a.cfg.DataDir)
		if err != nil {
			return Identity{}, err
		}
		a.cfg.Name = name
	}
	bo := a.backoff()
	for {
		var resp wire.EnrolResponse
		err := a.c.do(ctx, "POST", wire.PathEnrol, 30*time.Second, wire.EnrolRequest{Token: a.cfg.Token, Name: a.cfg.Name}, &resp)
		if err == nil {
			if resp.AgentID == "" || resp.Credential == "" {
				err = errors.New("the controller's enrolment answer has no credential")
			} else {
				id := Identity{AgentID: resp.AgentID, Credential: resp.Credential, Controller: a.cfg.ControllerURL}
				if err := SaveIdentity(a.cfg.DataDir, id); err != nil {
					return Identity{}, err
				}
				a.log.Info("agent enrolled", "agent", id.AgentID, "name", a.cfg.Name)
				return id, nil
			}
		}
		var se *statusError
		if errors.As(err, &se) && se.status < 500 {
			return Identity{}, fmt.Errorf("agent: enrolment refused: %w", err)
		}
		if ctx.Err() != nil {
			return Identity{}, ctx.Err()
		}
		a.log.Warn("agent: enrolment failed, retrying", "error", err)
		if !sleep(ctx, bo.next()) {
			return Identity{}, ctx.Err()
		}
	}
}

// backoff is capped exponential backoff with jitter.
type backoff struct {
	cur, max time.Duration
}

func (a *Agent) backoff() *backoff { return &backoff{max: a.cfg.MaxBackoff} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = 200 * time.Millisecond
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	// Up to a quarter less, so that agents cut off together do not all
	// come back in the same instant.
	return b.cur - time.Duration(rand.Int64N(int64(b.cur/4)+1))
}

func (b *backoff) reset() { b.cur = 0 }

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// trouble logs an error once until recovered, so that a long outage does
// not fill the log; recovered logs the end of it.
func (a *Agent) trouble(what string, err error) {
	if !a.failing.Swap(true) {
		a.log.Warn("agent: cannot reach the controller, retrying", "doing", what, "error", err)
	} else {
		a.log.Debug("agent: still failing", "doing", what, "error", err)
	}
}

func (a *Agent) recovered() {
	if a.failing.Swap(false) {
		a.log.Info("agent: reconnected to the controller")
	}
}

func (a *Agent) heartbeatLoop(ctx context.Context) {
	bo := a.backoff()
	for {
		err := a.Heartbeat(ctx)
		delay := a.cfg.Heartbeat
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			a.trouble("heartbeat", err)
			delay = min(bo.next(), a.cfg.Heartbeat)
		} else {
			bo.reset()
			a.recovered()
			a.readyOnce.Do(func() { close(a.ready) })
		}
		if !sleep(ctx, delay) {
			return
		}
	}
}

// inventoryKey is what, in the hosts, calls for registering again: all but
// their health, which heartbeats carry.
func inventoryKey(hosts []driver.Host) string {
	cp := make([]driver.Host, len(hosts))
	for i, h := range hosts {
		h.Up, h.Health = false, ""
		cp[i] = h
	}
	sort.Slice(cp, func(i, j int) bool { return cp[i].Name < cp[j].Name })
	b, _ := json.Marshal(cp)
	return string(b)
}

// Heartbeat reports now: registers the hosts if their inventory changed,
// then sends their health and the VMs' power states. The periodic loop
// calls it; tests call it to make a change seen at once.
func (a *Agent) Heartbeat(ctx context.Context) error {
	a.hbMu.Lock()
	defer a.hbMu.Unlock()
	observed := time.Now().UnixNano()
	hosts, err := a.drv.Hosts(ctx)
	if err != nil {
		return fmt.Errorf("agent: driver hosts: %w", err)
	}
	a.cfg.Net.describe(hosts)
	if inv := inventoryKey(hosts); inv != a.registered {
		var resp wire.HostsResponse
		if err := a.c.do(ctx, "PUT", wire.PathHosts, 30*time.Second, wire.HostsRequest{Hosts: hosts}, &resp); err != nil {
			return fmt.Errorf("registering hosts: %w", err)
		}
		a.registered = inv
		refused := ""
		for _, r := range resp.Refused {
			refused += r.Name + ": " + r.Reason + "; "
		}
		if refused != a.refused {
			if refused != "" {
				a.log.Warn("agent: the controller refused hosts", "refused", strings.TrimSuffix(refused, "; "))
			}
			a.refused = refused
		}
		if len(resp.Refused) == 0 {
			a.log.Info("agent: hosts registered", "hosts", len(hosts))
		}
	}
	insts, err := a.drv.List(ctx)
	if err != nil {
		return fmt.Errorf("agent: driver list: %w", err)
	}
	hb := wire.Heartbeat{Observed: observed, Hosts: make([]wire.HostStatus, len(hosts)), Instances: make([]wire.Instance, len(insts))}
	for i, h := range hosts {
		hb.Hosts[i] = wire.HostStatus{Name: h.Name, Up: h.Up, Health: h.Health}
	}
	for i, in := range insts {
		hb.Instances[i] = wire.Instance{ID: in.ID, Host: in.Host, Power: in.Power}
	}
	var resp wire.HeartbeatResponse
	if err := a.c.do(ctx, "POST", wire.PathHeartbeat, 30*time.Second, hb, &resp); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	// The controller no longer has all our hosts as ours (a database
	// restored, a host taken over): register again next time.
	mine := map[string]bool{}
	for _, h := range resp.Hosts {
		mine[h] = true
	}
	for _, h := range hosts {
		if !mine[h.Name] {
			a.registered = ""
			break
		}
	}
	return nil
}

func (a *Agent) haveList() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.have))
	for id := range a.have {
		out = append(out, id)
	}
	return out
}

func (a *Agent) pollLoop(ctx context.Context) {
	// Nothing can come for hosts not registered yet.
	select {
	case <-a.ready:
	case <-ctx.Done():
		return
	}
	bo := a.backoff()
	for ctx.Err() == nil {
		started := time.Now()
		var resp wire.PollResponse
		err := a.c.do(ctx, "POST", wire.PathPoll, pollWait+15*time.Second, wire.PollRequest{Have: a.haveList(), WaitMS: int(pollWait / time.Millisecond)}, &resp)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			a.trouble("poll", err)
			sleep(ctx, bo.next())
			continue
		}
		bo.reset()
		for _, op := range resp.Ops {
			if op.ID == "" || op.ServerID == "" || op.Kind == "" {
				a.log.Warn("agent: malformed op ignored", "op", op.ID)
				continue
			}
			a.accept(ctx, op)
		}
		if len(resp.Ops) == 0 && time.Since(started) < 100*time.Millisecond {
			// An empty answer at once: the controller is shutting down or
			// has no hosts of ours. Do not spin.
			sleep(ctx, time.Second)
		}
	}
}

// accept takes an op delivered by the controller: one already held or
// just accepted is ignored, one finished before is answered from the
// journal, any other is queued behind its server's earlier ops.
func (a *Agent) accept(ctx context.Context, op wire.Op) {
	a.mu.Lock()
	if _, done := a.accepted[op.ID]; done || a.have[op.ID] {
		a.mu.Unlock()
		return
	}
	a.have[op.ID] = true
	if e, ok := a.j.get(op.ID); ok {
		a.results[op.ID] = *e.Result
		a.mu.Unlock()
		a.log.Info("agent: op delivered again, answered from the journal", "op", op.ID, "kind", op.Kind, "server", op.ServerID)
		a.kickPoster()
		return
	}
	q, running := a.queues[op.ServerID]
	a.queues[op.ServerID] = append(q, op)
	a.mu.Unlock()
	if !running {
		a.wg.Add(1)
		go a.runServer(ctx, op.ServerID)
	}
}

// runServer runs one server's queued ops in order.
func (a *Agent) runServer(ctx context.Context, server string) {
	defer a.wg.Done()
	for {
		a.mu.Lock()
		q := a.queues[server]
		if len(q) == 0 || ctx.Err() != nil {
			delete(a.queues, server)
			a.mu.Unlock()
			return
		}
		op := q[0]
		a.queues[server] = q[1:]
		a.mu.Unlock()
		select {
		case a.sem <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		r, ok := a.execute(ctx, op)
		<-a.sem
		if !ok {
			continue // stopping: the op is delivered again after the restart
		}
		if err := a.j.done(op, r); err != nil {
			a.log.Error("agent: journal write failed", "op", op.ID, "error", err)
		}
		a.mu.Lock()
		a.results[op.ID] = r
		a.mu.Unlock()
		a.kickPoster()
	}
}

// powerAfter are the kinds after which the server's power state is read
// and sent with the result.
var powerAfter = map[string]bool{
	wire.KindSpawn: true, wire.KindPowerOff: true, wire.KindPowerOn: true, wire.KindReboot: true, wire.KindPause: true,
	wire.KindUnpause: true, wire.KindSuspend: true, wire.KindResume: true, wire.KindResize: true,
}

// execute runs one op through the driver; ok is false when the agent is
// stopping and the op was cut short.
func (a *Agent) execute(ctx context.Context, op wire.Op) (r wire.Result, ok bool) {
	start := time.Now()
	out, err := a.call(ctx, op)
	if ctx.Err() != nil {
		return wire.Result{}, false
	}
	r = wire.Result{OpID: op.ID, Observed: time.Now().UnixNano()}
	if powerAfter[op.Kind] {
		if p, perr := a.drv.State(ctx, op.ServerID); perr == nil {
			r.Power = &p
		}
	}
	if err != nil {
		code := wire.CodeFailed
		switch {
		case errors.Is(err, driver.ErrNotFound):
			code = wire.CodeNotFound
		case errors.Is(err, driver.ErrHostDown):
			code = wire.CodeHostDown
		case errors.Is(err, driver.ErrNoConsole):
			code = wire.CodeNoConsole
		case errors.Is(err, driver.ErrNotRunning):
			code = wire.CodeNotRunning
		}
		r.Error = &wire.Error{Code: code, Message: err.Error()}
		a.log.Info("agent: op failed", "op", op.ID, "kind", op.Kind, "server", op.ServerID, "error", err,
			"duration_ms", time.Since(start).Milliseconds())
		return r, true
	}
	r.OK = true
	if out != nil {
		r.Result, _ = json.Marshal(out)
	}
	a.log.Debug("agent: op done", "op", op.ID, "kind", op.Kind, "server", op.ServerID, "duration_ms", time.Since(start).Milliseconds())
	return r, true
}

// call maps an op onto its driver call (opCalls). A driver that panics
// fails the op rather than the agent.
func (a *Agent) call(ctx context.Context, op wire.Op) (out any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("agent: driver panicked on %s: %v", op.Kind, p)
		}
	}()
	f, ok := opCalls[op.Kind]
	if !ok {
		return nil, fmt.Errorf("agent: unknown op kind %q (a newer controller?)", op.Kind)
	}
	args := func(v any) error {
		if len(op.Args) == 0 {
			return nil
		}
		if err := json.Unmarshal(op.Args, v); err != nil {
			return fmt.Errorf("agent: %s: bad arguments: %w", op.Kind, err)
		}
		return nil
	}
	return f(ctx, a.drv, op, args)
}

// opCall runs one kind of op on d; args decodes the op's arguments.
type opCall func(ctx context.Context, d driver.Driver, op wire.Op, args func(any) error) (any, error)

// none is an op call without arguments or result.
func none(f func(d driver.Driver, ctx context.Context, id string) error) opCall {
	return func(ctx context.Context, d driver.Driver, op wire.Op, _ func(any) error) (any, error) {
		return nil, f(d, ctx, op.ServerID)
	}
}

// withArgs is an op call that decodes arguments of type A and has no result.
func withArgs[A any](f func(ctx context.Context, d driver.Driver, id string, a A) error) opCall {
	return func(ctx context.Context, d driver.Driver, op wire.Op, args func(any) error) (any, error) {
		var a A
		if err := args(&a); err != nil {
			return nil, err
		}
		return nil, f(ctx, d, op.ServerID, a)
	}
}

// specCall is spawn's and resize's: a spec for the op's own server.
func specCall(f func(d driver.Driver, ctx context.Context, spec driver.Spec) error) opCall {
	return func(ctx context.Context, d driver.Driver, op wire.Op, args func(any) error) (any, error) {
		var spec driver.Spec
		if err := args(&spec); err != nil {
			return nil, err
		}
		if spec.ServerID != op.ServerID {
			return nil, fmt.Errorf("agent: %s: the spec is for server %q, not %q", op.Kind, spec.ServerID, op.ServerID)
		}
		return nil, f(d, ctx, spec)
	}
}

// opCalls are the driver calls of each kind of op.
var opCalls = map[string]opCall{
	wire.KindSpawn:   specCall(driver.Driver.Spawn),
	wire.KindResize:  specCall(driver.Driver.Resize),
	wire.KindDestroy: none(driver.Driver.Destroy),
	wire.KindConfirm: none(driver.Driver.ConfirmResize),
	wire.KindPowerOn: none(driver.Driver.PowerOn),
	wire.KindPause:   none(driver.Driver.Pause),
	wire.KindUnpause: none(driver.Driver.Unpause),
	wire.KindSuspend: none(driver.Driver.Suspend),
	wire.KindResume:  none(driver.Driver.Resume),
	wire.KindPowerOff: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.PowerOffArgs) error {
		return d.PowerOff(ctx, id, p.Graceful)
	}),
	wire.KindReboot: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.RebootArgs) error {
		return d.Reboot(ctx, id, p.Hard)
	}),
	wire.KindAttachPort: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.PortArgs) error {
		return d.AttachPort(ctx, id, p.Port)
	}),
	wire.KindDetachPort: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.PortArgs) error {
		return d.DetachPort(ctx, id, p.PortID)
	}),
	wire.KindAttachVolume: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.VolumeArgs) error {
		return d.AttachVolume(ctx, id, p.Volume)
	}),
	wire.KindDetachVolume: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.VolumeArgs) error {
		return d.DetachVolume(ctx, id, p.VolumeID)
	}),
	wire.KindExtendVolume: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.VolumeArgs) error {
		return d.ExtendVolume(ctx, id, p.VolumeID, p.SizeBytes)
	}),
	wire.KindCopyVolume: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.VolumeArgs) error {
		c, ok := d.(driver.VolumeCopier)
		if !ok {
			return driver.ErrNotRunning // no live copy here: the caller copies the file
		}
		return c.CopyVolume(ctx, id, p.VolumeID, p.Target)
	}),
	wire.KindSwapVolume: withArgs(func(ctx context.Context, d driver.Driver, id string, p wire.VolumeArgs) error {
		sw, ok := d.(driver.VolumeSwapper)
		if !ok {
			return errors.New("this host's driver cannot swap volumes")
		}
		return sw.SwapVolume(ctx, id, p.VolumeID, p.Volume)
	}),
	wire.KindSnapshot: func(ctx context.Context, d driver.Driver, op wire.Op, args func(any) error) (any, error) {
		var p wire.SnapshotArgs
		if err := args(&p); err != nil {
			return nil, err
		}
		size, err := d.Snapshot(ctx, op.ServerID, p.ImageID)
		if err != nil {
			return nil, err
		}
		return wire.SnapshotResult{SizeBytes: size}, nil
	},
	wire.KindAccess: func(ctx context.Context, d driver.Driver, op wire.Op, _ func(any) error) (any, error) {
		acc, err := d.Access(ctx, op.ServerID)
		if err != nil {
			return nil, err
		}
		return wire.AccessResult{Access: acc}, nil
	},
	wire.KindVNC: func(ctx context.Context, d driver.Driver, op wire.Op, _ func(any) error) (any, error) {
		ep, err := d.Console(ctx, op.ServerID)
		if err != nil {
			return nil, err
		}
		return wire.VNCResult{Endpoint: ep}, nil
	},
	wire.KindConsole: func(ctx context.Context, d driver.Driver, op wire.Op, args func(any) error) (any, error) {
		var p wire.ConsoleArgs
		if err := args(&p); err != nil {
			return nil, err
		}
		s, err := d.ConsoleOutput(ctx, op.ServerID, p.Lines)
		if err != nil {
			return nil, err
		}
		return wire.ConsoleResult{Output: s}, nil
	},
}

func (a *Agent) kickPoster() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// acceptedMemory is how long accepted ops are remembered: far longer than
// a poll answer can be on its way.
const acceptedMemory = 5 * time.Minute

// forgetAccepted drops what is old enough, at most every few seconds.
func (a *Agent) forgetAccepted(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.pruned) < 10*time.Second {
		return
	}
	a.pruned = now
	for id, t := range a.accepted {
		if now.Sub(t) > acceptedMemory {
			delete(a.accepted, id)
		}
	}
}

// maxBatch bounds the results posted at once.
const maxBatch = 500

// postLoop posts finished ops' results, batching what finished while the
// last post was on its way, until the controller accepts them.
func (a *Agent) postLoop(ctx context.Context) {
	bo := a.backoff()
	for {
		a.mu.Lock()
		batch := make([]wire.Result, 0, min(len(a.results), maxBatch))
		for _, r := range a.results {
			if len(batch) == maxBatch {
				break
			}
			batch = append(batch, r)
		}
		a.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-a.kick:
				continue
			case <-ctx.Done():
				return
			}
		}
		var resp wire.ResultsResponse
		err := a.c.do(ctx, "POST", wire.PathResults, 30*time.Second, wire.ResultsRequest{Results: batch}, &resp)
		var se *statusError
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return
		case errors.As(err, &se) && (se.status == 400 || se.status == 413):
			// The controller will never take these: drop them rather than
			// retry forever; their ops time out there.
			a.log.Error("agent: results refused, dropped", "results", len(batch), "error", err)
			for _, r := range batch {
				resp.Done = append(resp.Done, r.OpID)
			}
		default:
			a.trouble("posting results", err)
			sleep(ctx, bo.next())
			continue
		}
		bo.reset()
		if len(resp.Done) == 0 {
			sleep(ctx, bo.next()) // should not happen: do not spin on it
		}
		now := time.Now()
		for _, id := range resp.Done {
			if err := a.j.acked(id); err != nil {
				a.log.Error("agent: journal write failed", "op", id, "error", err)
			}
			a.mu.Lock()
			delete(a.results, id)
			delete(a.have, id)
			a.accepted[id] = now
			a.mu.Unlock()
		}
		a.forgetAccepted(now)
	}
}
