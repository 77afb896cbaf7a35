package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/doctor"
	"nimbus/internal/store"
)

// backupCommands is "nimbus admin backup": one command.
var backupCommands = map[string]adminCommand{"": {args: "<directory|file.tar|file.tar.gz>", nargs: 1,
	help: "Copies what a restore of the controller needs while it serves: a consistent copy of its SQLite database\n" +
		"(one instant, taken without stopping it), the CA and its key, the server certificate, secrets.json,\n" +
		"clouds.yaml and the openrc files, the local agent's identity, and the file stores' images/, volumes/\n" +
		"and backups/. Not copied: the database's WAL files (the copy is whole), exports/, and the local host's\n" +
		"VMs (qemu/, fake-fleet.json, the agent's op journal): a VM belongs to its host. With --database-url\n" +
		"postgres://… the database is PostgreSQL's to copy (pg_basebackup, pg_dump) and the rest is copied.\n" +
		"<directory> is made and is itself a data directory; a .tar, .tar.gz or .tgz file holds the same\n" +
		"entries (restore: tar -xf FILE -C NEW-DATA-DIR). Neither may exist yet. The list of what was copied\n" +
		"and what was not, and why, is nimbus-backup.json in the backup.",
	setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
		var o cloud.BackupOptions
		fs.BoolVar(&o.SkipImages, "no-images", false, "leave out images/ (image data copied otherwise)")
		fs.BoolVar(&o.SkipVolumes, "no-volumes", false, "leave out volumes/ and backups/ (volume data copied otherwise)")
		return func(ctx context.Context, args []string) error {
			o.Dest = args[0]
			return a.backup(ctx, o)
		}
	}}}

func (a *adminRun) backup(ctx context.Context, o cloud.BackupOptions) error {
	o.DataDir, o.DatabaseURL = a.dataDir, a.dbURL
	if err := a.sqliteExists(); err != nil {
		return err
	}
	m, err := cloud.Backup(ctx, o)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(m)
	}
	rows := make([][]string, 0, len(m.Copied)+len(m.NotCopied))
	for _, e := range m.Copied {
		rows = append(rows, []string{e.Path, "copied", strconv.Itoa(e.Files), strconv.FormatInt(e.Bytes, 10), e.Why})
	}
	for _, e := range m.NotCopied {
		rows = append(rows, []string{e.Path, "not copied", "-", "-", e.Why})
	}
	if err := a.table([]string{"ENTRY", "", "FILES", "BYTES", "WHY"}, rows); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "backup %s: %d files, %d bytes of data, database %s\n", o.Dest, m.Files, m.Bytes, m.Database)
	return err
}

// sqliteExists refuses an SQLite database that is not there, as open
// does: it is almost always a wrong --data-dir.
func (a *adminRun) sqliteExists() error {
	url := cloud.DatabaseURL(a.dataDir, a.dbURL)
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		return nil
	}
	path := strings.TrimPrefix(url, "sqlite://")
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no Nimbus database at %s: give the controller's --data-dir or --database-url", path)
	} else if err != nil {
		return err
	}
	return nil
}

// doctorCommands is "nimbus admin doctor": one command.
var doctorCommands = map[string]adminCommand{"": {
	help: "Checks the region's invariants on its database, read-only (it runs no migration and the database\n" +
		"refuses its writes), in one snapshot, paging through every table; safe while the controllers serve,\n" +
		"and on a PostgreSQL standby. For each invariant broken it prints what is wrong and how to mend it,\n" +
		"and exits with status 1. The invariants:\n" + doctorList(),
	setup: func(a *adminRun, fs *flag.FlagSet) func(context.Context, []string) error {
		var cfg doctor.Config
		fs.DurationVar(&cfg.SilentAfter, "silent-after", 10*time.Minute, "name a host whose agent has not reported for this long")
		fs.DurationVar(&cfg.Settle, "settle", 5*time.Minute, "name a VM without a server only once its record is this old")
		fs.IntVar(&cfg.BillingHours, "billing-hours", 48, "complete hours of the ledger checked against usage, back from billing's last")
		max := fs.Int("max", 20, "findings printed per invariant (all are counted)")
		return func(ctx context.Context, _ []string) error { return a.doctor(ctx, cfg, *max) }
	}}}

func doctorList() string {
	var b strings.Builder
	for _, c := range doctor.Checks {
		fmt.Fprintf(&b, "  %-30s %s\n", c.Name, c.Invariant)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// doctorCheck is one invariant as doctor prints it.
type doctorCheck struct {
	doctor.Check
	Problems int              `json:"problems"`
	Findings []doctor.Finding `json:"findings"` // at most --max
}

func (a *adminRun) doctor(ctx context.Context, cfg doctor.Config, max int) error {
	switch {
	case cfg.SilentAfter <= 0 || cfg.Settle <= 0:
		return errors.New("--silent-after and --settle must be positive")
	case cfg.BillingHours < 1 || cfg.BillingHours > doctor.MaxBillingHours:
		return fmt.Errorf("--billing-hours must be between 1 and %d", doctor.MaxBillingHours)
	case max < 0:
		return errors.New("--max must not be negative")
	}
	if err := a.sqliteExists(); err != nil {
		return err
	}
	db, err := store.OpenReadOnly(ctx, cloud.DatabaseURL(a.dataDir, a.dbURL))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.SchemaCurrent(ctx); err != nil {
		return err
	}
	checks := make([]doctorCheck, len(doctor.Checks))
	at := map[string]*doctorCheck{}
	for i, c := range doctor.Checks {
		checks[i] = doctorCheck{Check: c, Findings: []doctor.Finding{}}
		at[c.Name] = &checks[i]
	}
	// Findings are kept up to --max per check, so that memory stays small
	// however broken the region, and printed grouped by check.
	rep, err := doctor.Run(ctx, db, cfg, func(f doctor.Finding) {
		c := at[f.Check]
		c.Problems++
		if len(c.Findings) < max {
			c.Findings = append(c.Findings, f)
		}
	})
	if err != nil {
		return err
	}
	if a.json {
		if err := a.printJSON(map[string]any{"checks": checks, "problems": rep.Total}); err != nil {
			return err
		}
	} else if err := a.printDoctor(checks, rep.Total); err != nil {
		return err
	}
	if rep.Total > 0 {
		return fmt.Errorf("%d problem(s) found", rep.Total)
	}
	return nil
}

func (a *adminRun) printDoctor(checks []doctorCheck, total int) error {
	w := a.stdout
	for _, c := range checks {
		if c.Problems == 0 {
			fmt.Fprintf(w, "ok      %s: %s\n", c.Name, c.Invariant)
			continue
		}
		fmt.Fprintf(w, "BROKEN  %s: %s (%d)\n", c.Name, c.Invariant, c.Problems)
		for _, f := range c.Findings {
			fmt.Fprintf(w, "  %s\n    problem: %s\n    mend: %s\n", f.Subject, f.Problem, f.Repair)
		}
		if more := c.Problems - len(c.Findings); more > 0 {
			fmt.Fprintf(w, "  … and %d more (--max, or --json)\n", more)
		}
	}
	if total == 0 {
		_, err := fmt.Fprintln(w, "no problems found")
		return err
	}
	_, err := fmt.Fprintf(w, "%d problem(s) found\n", total)
	return err
}
