package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/fleet"
	"nimbus/internal/identity"
	"nimbus/internal/store"
)

// admin is "nimbus admin": the operator's commands. The billing, host,
// support, backup and doctor commands run on the controller's own database
// rather than through the API, so they need no token and work while the
// controller is down: whoever can open the database is the operator. The
// image commands go through the image API, and need a running controller.
func admin(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runAdmin(ctx, args, os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // usage printed on request
	}
	return err
}

const adminUsage = `Usage: nimbus admin billing <command> [arguments] [flags]
       nimbus admin host <command> [flags]
       nimbus admin image <command> <arguments> [flags]
       nimbus admin backup <directory|file.tar|file.tar.gz> [flags]
       nimbus admin doctor [flags]

The operator's commands. Billing and host commands work on the
controller's database (the same --data-dir or --database-url as nimbus
serve; no API token needed). Image commands go through the image API
as the openstack CLI does: cloud nimbus-admin of the clouds.yaml in
--data-dir, or the OS_* variables of a sourced openrc file.

Billing commands:
  run                                 run one charging pass now, as the hourly job does
  accounts                            every account: balance, credit limit, trial credit
  credit <project> <amount> --reference TEXT
                                      record money received (manual top-up)
  credit-limit <project> <amount>     set how far below zero the balance may go
  adjust <project> <amount> --reference TEXT
                                      correct a balance (amount signed)
  prices                              the price list
  prices set <key>=<rate> ...         change rates (rate units per hour, see prices)
  trials [--status S]                 trial requests (default: pending)
  trials approve <id> --credit <amount> --until <date>
  trials decline <id> --reason TEXT

Host commands:
  token [--ttl 24h]                   print a one-time token that enrols a host agent
                                      (nimbus agent --token)
  list                                the hypervisor hosts: agent, up or down, enabled or disabled,
                                      last seen, servers
  disable <host> [--reason TEXT]      take no new servers there (compute service set --disable)
  enable <host>                       take new servers there again
  remove <host>                       forget a drained host and its compute service (compute
                                      service delete); refused while servers live there

Image commands:
  import <file> [--name NAME] [--disk-format qcow2|raw|iso|aki|ari] [--property k=v ...]
         [--os-type linux|windows] [--public] [--min-disk GB] [--min-ram MB] [--replace]
                                      upload a cloud image file (disk format detected), with a
                                      progress bar, and check its checksum; --replace swaps it
                                      for the project's images of that name, such as a catalog
                                      placeholder, keeping their properties
  build debian-12 [--rebuild] [--no-import]
                                      build a real Debian 12 cloud image here from Debian's
                                      packages (cached, reproducible) and import it over the
                                      "Debian 12" placeholder

Operations:
  backup <dest> [--no-images] [--no-volumes]
                                      a consistent copy of an SQLite control plane while it
                                      serves, with the CA and keys, secrets, client files and the
                                      file stores' images, volumes and backups: a directory that
                                      is a data directory, or a tar (.tar, .tar.gz, .tgz)
  doctor [--silent-after 10m] [--settle 5m] [--billing-hours 48] [--max 20]
                                      check the region's invariants (claims, ledger, hosts, what
                                      deleted servers left bound), read-only; print what is wrong
                                      and how to mend it; exit status 1 when anything is

<project> is a project id, or a project name in the Default domain.
<amount> is minor units (15000), or major units with a decimal point
(150.00 is the same 15000).

Every command takes --data-dir and --json; billing, host, backup and
doctor commands also --database-url, billing commands --billing-currency and
--billing-credit-limit, image commands --os-cloud and --clouds (see
"nimbus admin <group> <command> -h").
`

// adminCommand is one "nimbus admin <group>" command.
type adminCommand struct {
	args, help string
	nargs      int // positional arguments wanted; -1: at least one
	// setup adds the command's own flags to fs and answers the function
	// that runs it, reading them once parsed.
	setup func(a *adminRun, fs *flag.FlagSet) func(ctx context.Context, args []string) error
}

// adminGroups are the command groups: billing, host, image and support,
// and the commands that are a group of their own (backup, doctor: their
// one command is named "").
var adminGroups = map[string]map[string]adminCommand{"billing": adminCommands, "host": hostCommands, "image": imageCommands,
	"support": supportCommands, "backup": backupCommands, "doctor": doctorCommands}

// single reports whether group is a command of its own.
func single(group string) bool { return isCommand(group, "") }

// adminCommands are the billing commands.
var adminCommands = map[string]adminCommand{
	"run": {help: "Runs one charging pass now, the pass the controller runs every hour: each started hour is\n" +
		"charged at most once per resource, so running it again within the hour charges nothing more.\n" +
		"An account it finds run dry is told so at once; its servers are shelved by the controller's\n" +
		"next pass (only the controller drives the hypervisors).",
		setup: func(a *adminRun, _ *flag.FlagSet) func(context.Context, []string) error { return a.run }},
	"accounts": {help: "Lists every billing account.",
		setup: func(a *adminRun, _ *flag.FlagSet) func(context.Context, []string) error { return a.accounts }},
	"credit": {args: "<project> <amount> --reference TEXT", nargs: 2,
		help: "Credits money the operator received (a bank transfer, say) through the manual payment provider.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			ref := fs.String("reference", "", "what the money is, e.g. the bank transfer's reference (required)")
			return func(ctx context.Context, args []string) error { return a.credit(ctx, args, *ref) }
		}},
	"credit-limit": {args: "<project> <amount>", nargs: 2,
		help:  "Sets how far below zero the project's balance may go before its servers are shelved.",
		setup: func(a *adminRun, _ *flag.FlagSet) func(context.Context, []string) error { return a.creditLimit }},
	"adjust": {args: "<project> <amount> --reference TEXT", nargs: 2,
		help: "Appends a correction to the project's ledger: a positive amount credits, a negative one debits.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			ref := fs.String("reference", "", "why, for the ledger (required)")
			return func(ctx context.Context, args []string) error { return a.adjust(ctx, args, *ref) }
		}},
	"prices": {help: "Prints the price list: hourly rates in rate units (1/10000 of a minor unit) and term discounts\nin basis points.",
		setup: func(a *adminRun, _ *flag.FlagSet) func(context.Context, []string) error { return a.prices }},
	"prices set": {args: "<key>=<rate> ...", nargs: -1,
		help: "Changes rates, keyed as \"prices\" lists them (vcpu, ram_gb, disk_gb:<type>, gpu:<model>,\n" +
			"public_ipv4, windows_vcpu, windows_server, volume_gb, backup_gb, image_gb, term:<months>).",
		setup: func(a *adminRun, _ *flag.FlagSet) func(context.Context, []string) error { return a.setPrices }},
	"trials": {help: "Lists trial requests, newest first.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			status := fs.String("status", billing.TrialPending, "pending, approved, declined, expired or all")
			return func(ctx context.Context, _ []string) error { return a.trials(ctx, *status) }
		}},
	"trials approve": {args: "<id> --credit <amount> --until <date>", nargs: 1,
		help: "Approves a pending trial: the credit is spent before the rest of the balance until the end date.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			credit := fs.String("credit", "", "the trial's credit, an <amount> (required)")
			until := fs.String("until", "", "last day of the trial, 2006-01-02 (through 23:59:59 UTC of that day), or an RFC 3339 time (required)")
			return func(ctx context.Context, args []string) error { return a.approveTrial(ctx, args[0], *credit, *until) }
		}},
	"trials decline": {args: "<id> --reason TEXT", nargs: 1,
		help: "Declines a pending trial, telling the customer why.",
		setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
			reason := fs.String("reason", "", "why, shown to the customer (required)")
			return func(ctx context.Context, args []string) error { return a.declineTrial(ctx, args[0], *reason) }
		}},
}

// adminRun is one invocation: its common flags and, once opened, the store.
type adminRun struct {
	stdout, stderr io.Writer
	dataDir, dbURL string
	bcfg           billing.Config
	json           bool

	db    *store.DB
	svc   *billing.Service
	fleet *fleet.Service
}

// runAdmin runs "nimbus admin" with args (those after "admin"); results go
// to stdout, usage and the billing service's log lines to stderr. It
// answers flag.ErrHelp when usage was asked for.
func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	words, rest, help := splitCommand(args)
	var group map[string]adminCommand
	if len(words) > 0 {
		group = adminGroups[words[0]]
	}
	switch {
	case len(words) == 0 || (group != nil && len(words) == 1 && !single(words[0])):
		fmt.Fprint(stderr, adminUsage)
		if help {
			return flag.ErrHelp
		}
		return errors.New("admin: missing command (nimbus admin -h lists them)")
	case group == nil:
		return fmt.Errorf("admin: unknown command %q (nimbus admin -h lists them)", words[0])
	}
	full := strings.Join(words, " ")
	name := strings.Join(words[1:], " ")
	cmd, ok := group[name]
	if !ok {
		return fmt.Errorf("admin %s: unknown command %q (nimbus admin -h lists them)", words[0], name)
	}

	a := &adminRun{stdout: stdout, stderr: stderr}
	fset := flag.NewFlagSet("nimbus admin "+full, flag.ContinueOnError)
	fset.SetOutput(stderr)
	a.commonFlags(fset, words[0])
	runCmd := cmd.setup(a, fset)
	fset.Usage = func() {
		fmt.Fprintf(fset.Output(), "Usage: nimbus admin %s %s\n\n%s\n\nFlags:\n", full, cmd.args, cmd.help)
		fset.PrintDefaults()
	}
	pos, err := parseInterleaved(fset, rest)
	if err != nil {
		return err
	}
	switch {
	case cmd.nargs >= 0 && len(pos) != cmd.nargs:
		return fmt.Errorf("admin %s: want %s, got %d argument(s)", full, wantArgs(cmd), len(pos))
	case cmd.nargs < 0 && len(pos) == 0:
		return fmt.Errorf("admin %s: want %s", full, cmd.args)
	}
	if a.bcfg.DefaultCreditLimit < 0 {
		return errors.New("admin: --billing-credit-limit must not be negative")
	}
	defer func() {
		if a.db != nil {
			a.db.Close()
		}
	}()
	if err := runCmd(ctx, pos); err != nil {
		return fmt.Errorf("admin %s: %w", full, err)
	}
	return nil
}

// commonFlags are those of every command of group: where the store is
// (image commands, which use the API, take only the data directory, for
// its clouds.yaml), and, for billing commands, the controller's billing
// settings they act on.
func (a *adminRun) commonFlags(fs *flag.FlagSet, group string) {
	fs.StringVar(&a.dataDir, "data-dir", defaultDataDir(), "the controller's data directory (env NIMBUS_DATA_DIR)")
	if group != "image" {
		fs.StringVar(&a.dbURL, "database-url", os.Getenv("NIMBUS_DATABASE_URL"), "the controller's postgres://… database; default SQLite in the data directory (env NIMBUS_DATABASE_URL)")
	}
	a.bcfg.Currency = "RUB"
	if group == "billing" {
		fs.StringVar(&a.bcfg.Currency, "billing-currency", "RUB", "the controller's --billing-currency")
		fs.Int64Var(&a.bcfg.DefaultCreditLimit, "billing-credit-limit", 0, "the controller's --billing-credit-limit, given to accounts these commands create")
	}
	fs.BoolVar(&a.json, "json", false, "print JSON instead of a table")
}

// splitCommand takes the command words ("billing", "trials", "approve")
// out of args wherever the flags stand, so that "nimbus admin --data-dir d
// billing run" works too, and answers the rest and whether -h was given.
func splitCommand(args []string) (words, rest []string, help bool) {
	// Which flags take a value, learnt from the commands themselves.
	takesValue := map[string]bool{}
	for g, cmds := range adminGroups {
		for _, c := range cmds {
			fs := flag.NewFlagSet("", flag.ContinueOnError)
			a := &adminRun{}
			a.commonFlags(fs, g)
			c.setup(a, fs)
			fs.VisitAll(func(f *flag.Flag) { takesValue[f.Name] = !isBoolFlag(f) })
		}
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return words, append(rest, args[i:]...), help
		case len(a) < 2 || a[0] != '-' || isNumber(a):
			if len(words) == 0 || (len(words) == 1 && !single(words[0])) || (len(words) == 2 && isCommand(words[0], words[1]+" "+a)) {
				words = append(words, a)
			} else {
				rest = append(rest, a)
			}
		default:
			rest = append(rest, a)
			name := strings.TrimLeft(a, "-")
			help = help || name == "h" || name == "help"
			if !strings.Contains(name, "=") && takesValue[name] && i+1 < len(args) {
				i++
				rest = append(rest, args[i])
			}
		}
	}
	return words, rest, help
}

func isCommand(group, name string) bool {
	_, ok := adminGroups[group][name]
	return ok
}

func wantArgs(cmd adminCommand) string {
	if cmd.nargs == 0 {
		return "no arguments"
	}
	return strings.Join(strings.Fields(cmd.args)[:cmd.nargs], " ")
}

// parseInterleaved parses fs's flags wherever they stand among the
// positional arguments (operators type "credit p 100 --reference x"), and
// answers the positional ones. A negative number is an argument, not a
// flag, so "adjust p -500" works; "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos, flags []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case len(a) < 2 || a[0] != '-' || isNumber(a):
			pos = append(pos, a)
		default:
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil && !isBoolFlag(f) && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		}
	}
	if err := fs.Parse(flags); err != nil {
		return nil, err
	}
	return pos, nil
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// parseAmount reads an amount: an integer of minor units ("15000") or a
// decimal of major units with at most two places ("150.00", "150.5"),
// optionally signed. No float is involved.
func parseAmount(s string) (int64, error) {
	bad := fmt.Errorf("invalid amount %q: give minor units (15000) or a decimal with at most two places (150.00)", s)
	t := s
	neg := false
	if rest, ok := strings.CutPrefix(t, "-"); ok {
		t, neg = rest, true
	} else if rest, ok := strings.CutPrefix(t, "+"); ok {
		t = rest
	}
	whole, frac, dot := strings.Cut(t, ".")
	if !digits(whole) || (dot && (len(frac) < 1 || len(frac) > 2 || !digits(frac))) {
		return 0, bad
	}
	n, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("amount %q is too large", s)
	}
	if dot {
		cents, _ := strconv.ParseInt((frac + "0")[:2], 10, 64)
		if n > (1<<63-1-cents)/100 {
			return 0, fmt.Errorf("amount %q is too large", s)
		}
		n = n*100 + cents
	}
	if neg {
		n = -n
	}
	return n, nil
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// money renders minor units as major units with two places.
func money(n int64) string {
	sign, u := "", uint64(n)
	if n < 0 {
		sign, u = "-", -u // two's complement: also right for math.MinInt64
	}
	return fmt.Sprintf("%s%d.%02d", sign, u/100, u%100)
}

// open opens the controller's store and billing service. An SQLite file
// that does not exist is an error rather than a new empty cloud: it is
// almost always a wrong --data-dir.
func (a *adminRun) open(ctx context.Context) error {
	url := cloud.DatabaseURL(a.dataDir, a.dbURL)
	if !strings.HasPrefix(url, "postgres://") && !strings.HasPrefix(url, "postgresql://") {
		path := strings.TrimPrefix(url, "sqlite://")
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no Nimbus database at %s: give the controller's --data-dir or --database-url", path)
		} else if err != nil {
			return err
		}
	}
	db, err := store.Open(ctx, url)
	if err != nil {
		return err
	}
	a.db = db
	cfg := a.bcfg
	cfg.Log = slog.New(slog.NewTextHandler(a.stderr, nil))
	a.svc = billing.New(db, cfg)
	a.fleet = fleet.New(db, fleet.Config{Log: cfg.Log})
	return nil
}

// project resolves ref, a project id or a name in the Default domain, to
// the project's id and name. Refusing unknown projects keeps a typo from
// opening an account nobody owns.
func (a *adminRun) project(ctx context.Context, ref string) (id, name string, err error) {
	p, err := identity.GetProject(ctx, a.db, ref)
	if errors.Is(err, store.ErrNotFound) {
		p, err = identity.New(a.db).ProjectByName(ctx, ref)
	}
	if errors.Is(err, store.ErrNotFound) {
		return "", "", fmt.Errorf("no project %q: give a project id, or a project name in the Default domain", ref)
	}
	if err != nil {
		return "", "", err
	}
	return p.ID, p.Name, nil
}

// projectAmount parses "<project> <amount>" (the amount first, so bad input
// fails before the store is opened), opens the store and resolves the
// project.
func (a *adminRun) projectAmount(ctx context.Context, args []string) (id, name string, amount int64, err error) {
	if amount, err = parseAmount(args[1]); err != nil {
		return "", "", 0, err
	}
	if err = a.open(ctx); err != nil {
		return "", "", 0, err
	}
	id, name, err = a.project(ctx, args[0])
	return id, name, amount, err
}

func (a *adminRun) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table prints rows under header, aligned.
func (a *adminRun) table(header []string, rows [][]string) error {
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	return w.Flush()
}

func (a *adminRun) run(ctx context.Context, _ []string) error {
	if err := a.open(ctx); err != nil {
		return err
	}
	var total billing.Result
	passes := 0
	for {
		// A pass bounded by MaxCatchUpHours leaves the rest to the next:
		// go on until caught up, as the controller's job does.
		res, err := a.svc.ChargeUntil(ctx, time.Now())
		if err != nil {
			return err
		}
		if passes == 0 {
			total.From = res.From
		}
		passes++
		total.To, total.Hours = res.To, total.Hours+res.Hours
		total.Charges, total.Amount = total.Charges+res.Charges, total.Amount+res.Amount
		if res.CaughtUp {
			break
		}
	}
	if a.json {
		return a.printJSON(map[string]any{"passes": passes, "from": total.From, "to": total.To, "hours": total.Hours,
			"charges": total.Charges, "amount": total.Amount, "currency": a.bcfg.Currency})
	}
	hours := "none"
	if total.Hours > 0 {
		hours = fmt.Sprintf("%d, %s to %s", total.Hours, total.From.Format(time.RFC3339), total.To.Format(time.RFC3339))
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "hours processed\t%s\n", hours)
	fmt.Fprintf(w, "charges inserted\t%d\n", total.Charges)
	// What the inserted rows took from balances: the ledger holds them negated.
	fmt.Fprintf(w, "amount charged\t%s %s\n", money(total.Amount), a.bcfg.Currency)
	return w.Flush()
}

func (a *adminRun) accounts(ctx context.Context, _ []string) error {
	if err := a.open(ctx); err != nil {
		return err
	}
	projects, err := identity.New(a.db).Projects(ctx)
	if err != nil {
		return err
	}
	names := map[string]string{}
	ids := make([]string, len(projects))
	for i, p := range projects {
		names[p.ID], ids[i] = p.Name, p.ID
	}
	// Every project has an account from its creation, billed or not.
	accts, err := a.svc.Accounts(ctx, ids)
	if err != nil {
		return err
	}
	type named struct {
		billing.Account
		ProjectName string `json:"project_name"` // "" for a project since deleted
	}
	out := make([]named, len(accts))
	rows := make([][]string, len(accts))
	for i, ac := range accts {
		out[i] = named{ac, names[ac.ProjectID]}
		trial, ends := "-", "-"
		if ac.TrialEndsAt != nil {
			trial, ends = money(ac.TrialCredit), ac.TrialEndsAt.UTC().Format(time.RFC3339)
		}
		rows[i] = []string{ac.ProjectID, orDash(names[ac.ProjectID]), money(ac.PaidBalance), trial, ends,
			money(ac.Balance), money(ac.CreditLimit), ac.Currency}
	}
	if a.json {
		return a.printJSON(map[string]any{"accounts": out})
	}
	// The balance spends trial credit first: show both parts and their sum.
	return a.table([]string{"PROJECT ID", "NAME", "PAID BALANCE", "TRIAL CREDIT", "TRIAL ENDS", "BALANCE (PAID+TRIAL)",
		"CREDIT LIMIT", "CURRENCY"}, rows)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// accountLine prints what a change did and the account as it now stands.
func (a *adminRun) accountLine(ctx context.Context, id, name string, result map[string]any, what string) error {
	acct, err := a.svc.Account(ctx, id)
	if err != nil {
		return err
	}
	if a.json {
		result["account"] = acct
		return a.printJSON(result)
	}
	_, err = fmt.Fprintf(a.stdout, "%s\nproject %s (%s): balance %s %s, credit limit %s %s\n", what, name, id,
		money(acct.Balance), acct.Currency, money(acct.CreditLimit), acct.Currency)
	return err
}

func (a *adminRun) credit(ctx context.Context, args []string, reference string) error {
	reference = strings.TrimSpace(reference)
	if reference == "" || len(reference) > 255 {
		return errors.New("--reference is required (at most 255 characters), e.g. the bank transfer's")
	}
	id, name, amount, err := a.projectAmount(ctx, args)
	if err != nil {
		return err
	}
	if amount <= 0 {
		return errors.New("the amount must be positive")
	}
	t, err := a.svc.CreditManual(ctx, id, amount, reference)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("top-up %s of %s %s: %s", t.ID, money(t.Amount), t.Currency, t.Status)
	return a.accountLine(ctx, id, name, map[string]any{"topup": t}, what)
}

func (a *adminRun) creditLimit(ctx context.Context, args []string) error {
	id, name, amount, err := a.projectAmount(ctx, args)
	if err != nil {
		return err
	}
	if amount < 0 {
		return errors.New("the credit limit must not be negative")
	}
	if err := a.svc.SetCreditLimit(ctx, id, amount); err != nil {
		return err
	}
	return a.accountLine(ctx, id, name, map[string]any{}, "credit limit set")
}

func (a *adminRun) adjust(ctx context.Context, args []string, reference string) error {
	reference = strings.TrimSpace(reference)
	if reference == "" || len(reference) > 255 {
		return errors.New("--reference is required (at most 255 characters): say why")
	}
	id, name, amount, err := a.projectAmount(ctx, args)
	if err != nil {
		return err
	}
	e, err := a.svc.Adjust(ctx, id, amount, reference)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("adjustment %s of %s %s", e.ID, money(e.Amount), a.bcfg.Currency)
	return a.accountLine(ctx, id, name, map[string]any{"adjustment": e}, what)
}

func (a *adminRun) prices(ctx context.Context, _ []string) error {
	if err := a.open(ctx); err != nil {
		return err
	}
	p, err := a.svc.Prices(ctx)
	if err != nil {
		return err
	}
	return a.printPrices(p)
}

func (a *adminRun) setPrices(ctx context.Context, args []string) error {
	rates := map[string]int64{}
	for _, kv := range args {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || k == "" || err != nil {
			return fmt.Errorf("invalid rate %q: want <key>=<integer>, e.g. vcpu=500000", kv)
		}
		rates[k] = n
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	p, err := a.svc.SetPrices(ctx, rates)
	if err != nil {
		return err
	}
	return a.printPrices(p)
}

// printPrices prints p as GET /v1/prices shapes it, or a table of its
// keys with what each rate means.
func (a *adminRun) printPrices(p *billing.PriceList) error {
	if a.json {
		return a.printJSON(map[string]any{"prices": map[string]any{"currency": a.bcfg.Currency,
			"rate_scale": billing.RateScale, "hourly": p}})
	}
	rates := map[string]int64{"vcpu": p.VCPU, "ram_gb": p.RAMGB, "public_ipv4": p.PublicIPv4, "windows_vcpu": p.WindowsVCPU,
		"windows_server": p.WindowsServer, "volume_gb": p.VolumeGB, "snapshot_gb": p.SnapshotGB, "backup_gb": p.BackupGB, "image_gb": p.ImageGB}
	for k, v := range p.DiskGB {
		rates["disk_gb:"+k] = v
	}
	for k, v := range p.GPU {
		rates["gpu:"+k] = v
	}
	for k, v := range p.TermDiscounts {
		rates["term:"+k] = v
	}
	keys := make([]string, 0, len(rates))
	for k := range rates {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rows := make([][]string, 0, len(keys))
	for _, k := range keys {
		v := rates[k]
		meaning := perHour(v) + " " + a.bcfg.Currency + " per hour"
		if strings.HasPrefix(k, "term:") {
			meaning = money(v) + "% discount"
		}
		rows = append(rows, []string{k, strconv.FormatInt(v, 10), meaning})
	}
	return a.table([]string{"KEY", "RATE", "MEANING"}, rows)
}

// perHour renders a rate (1/RateScale of a minor unit) in major units,
// exactly: 5000 is 0.005.
func perHour(rate int64) string {
	const scale = billing.RateScale * 100 // rate units per major unit
	s := fmt.Sprintf("%d.%06d", rate/scale, rate%scale)
	s = strings.TrimRight(s, "0")
	if i := strings.IndexByte(s, '.'); len(s)-i < 3 {
		s += strings.Repeat("0", 3-(len(s)-i))
	}
	return s
}

func (a *adminRun) trials(ctx context.Context, status string) error {
	switch status {
	case billing.TrialPending, billing.TrialApproved, billing.TrialDeclined, billing.TrialExpired:
	case "all":
		status = ""
	default:
		return fmt.Errorf("invalid --status %q: pending, approved, declined, expired or all", status)
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	ts, err := a.svc.ListTrials(ctx, "", status)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(map[string]any{"trials": ts})
	}
	rows := make([][]string, len(ts))
	for i, t := range ts {
		credit, ends := "-", "-"
		if t.Status != billing.TrialPending && t.Status != billing.TrialDeclined {
			credit = money(t.Credit)
		}
		if t.EndsAt != nil {
			ends = t.EndsAt.Format(time.RFC3339)
		}
		rows[i] = []string{t.ID, t.ProjectID, t.Status, t.CreatedAt.Format(time.RFC3339), credit, ends, oneLine(t.Description, 60)}
	}
	return a.table([]string{"ID", "PROJECT ID", "STATUS", "CREATED", "CREDIT", "ENDS", "DESCRIPTION"}, rows)
}

// oneLine shortens a customer's text to its first line, at most n runes,
// so that it cannot break the table.
func oneLine(s string, n int) string {
	s, _, cut := strings.Cut(strings.TrimSpace(s), "\n")
	r := []rune(strings.ReplaceAll(s, "\t", " "))
	if len(r) > n {
		r, cut = r[:n], true
	}
	if cut {
		return string(r) + "…"
	}
	return string(r)
}

func (a *adminRun) approveTrial(ctx context.Context, id, creditArg, untilArg string) error {
	if creditArg == "" || untilArg == "" {
		return errors.New("--credit and --until are required")
	}
	credit, err := parseAmount(creditArg)
	if err != nil {
		return fmt.Errorf("--credit: %w", err)
	}
	until, err := parseUntil(untilArg)
	if err != nil {
		return err
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	t, err := a.svc.ApproveTrial(ctx, id, credit, until)
	if err != nil {
		return trialErr(err, id, t)
	}
	return a.printTrial(t)
}

// parseUntil reads --until: a date means through that day, so the trial
// ends at its last second, 23:59:59 UTC, which is how it is shown back;
// else an RFC 3339 time.
func parseUntil(s string) (time.Time, error) {
	if d, err := time.Parse(time.DateOnly, s); err == nil {
		return d.AddDate(0, 0, 1).Add(-time.Second), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid --until %q: a date (2006-01-02) or an RFC 3339 time", s)
	}
	return t, nil
}

func (a *adminRun) declineTrial(ctx context.Context, id, reason string) error {
	if strings.TrimSpace(reason) == "" {
		return errors.New("--reason is required: it tells the customer why")
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	t, err := a.svc.DeclineTrial(ctx, id, reason)
	if err != nil {
		return trialErr(err, id, t)
	}
	return a.printTrial(t)
}

func trialErr(err error, id string, t *billing.Trial) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("no trial %q", id)
	case errors.Is(err, billing.ErrTrialNotPending) && t != nil:
		return fmt.Errorf("trial %s is %s already", id, t.Status)
	}
	return err
}

func (a *adminRun) printTrial(t *billing.Trial) error {
	if a.json {
		return a.printJSON(map[string]any{"trial": t})
	}
	switch t.Status {
	case billing.TrialApproved:
		_, err := fmt.Fprintf(a.stdout, "trial %s of project %s approved: %s %s until %s\n", t.ID, t.ProjectID,
			money(t.Credit), a.bcfg.Currency, t.EndsAt.UTC().Format(time.RFC3339))
		return err
	default:
		_, err := fmt.Fprintf(a.stdout, "trial %s of project %s %s: %s\n", t.ID, t.ProjectID, t.Status, t.Reason)
		return err
	}
}
