package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/doctor"
	"nimbus/internal/identity"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// dump reads the rows of query as text lines, one per row.
func dump(t *testing.T, db *store.DB, query string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i, v := range vals {
			if i > 0 {
				b.WriteString(" | ")
			}
			if bs, ok := v.([]byte); ok {
				v = string(bs)
			}
			fmt.Fprint(&b, v)
		}
		out = append(out, b.String())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// backupTables are what a restore must bring back, as rows: accounts,
// servers, the ledger, images.
var backupTables = []string{
	"SELECT id, name, domain_id, enabled FROM projects ORDER BY id",
	"SELECT id, name, password_hash FROM users ORDER BY id",
	"SELECT project_id, credit_limit FROM billing_accounts ORDER BY project_id",
	// What a server is, not its state, which moves on after the copy.
	"SELECT id, project_id, user_id, name, flavor_id, image_ref, created_at FROM compute_servers ORDER BY id",
	"SELECT id, project_id, kind, amount, resource_id, period_start, created_at, reference FROM billing_ledger ORDER BY id",
	"SELECT id, name, owner, status, size, checksum FROM images ORDER BY id",
}

// subset fails the test unless every line of want is in got.
func subset(t *testing.T, what string, want, got []string) {
	t.Helper()
	have := map[string]bool{}
	for _, g := range got {
		have[g] = true
	}
	missing := 0
	for _, w := range want {
		if !have[w] {
			if missing < 5 {
				t.Errorf("%s: %s is missing", what, w)
			}
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%s: %d of %d rows missing", what, missing, len(want))
	}
}

// TestAdminBackupRestore fills a cloud (a project and its user, credit,
// servers, an image, a volume made from it, charges), backs it up with
// nimbus admin backup while it serves creates, restores the tar on a new
// data directory, starts a cloud there and compares: every account,
// server, ledger entry and image of before the backup is back, nothing
// the original never had is, the customer signs in with their password
// and reads their image's data, and doctor finds the restored region in
// order.
func TestAdminBackupRestore(t *testing.T) {
	clearOpenStackEnv(t)
	t.Setenv("NIMBUS_DATABASE_URL", "")
	ctx := context.Background()
	c := testenv.StartCloud(t, "")
	hc := testenv.HTTPClient(t, c)
	call := func(method, url, tok, body string, want int, hdr ...string) map[string]any {
		t.Helper()
		resp, raw := testenv.Do(t, hc, method, url, tok, body, hdr...)
		testenv.MustStatus(t, resp, raw, want)
		var out map[string]any
		if raw != "" && strings.HasPrefix(raw, "{") {
			if err := json.Unmarshal([]byte(raw), &out); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}

	// Fill.
	if err := c.Identity.Bootstrap(ctx, identity.Account{User: "alice", Password: "alice-pw-1", Project: "acme", Role: "member"}); err != nil {
		t.Fatal(err)
	}
	acme, err := c.Identity.ProjectByName(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Billing.CreditManual(ctx, acme.ID, 500000, "bank transfer 1"); err != nil {
		t.Fatal(err)
	}
	alice, err := c.Identity.Issue(ctx, "alice", "alice-pw-1", "acme")
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("nimbus image data "), 4096)
	img := call("POST", c.ImageURL+"/v2/images", alice, `{"name":"mine","disk_format":"raw","container_format":"bare"}`, 201)["id"].(string)
	call("PUT", c.ImageURL+"/v2/images/"+img+"/file", alice, string(data), 204, "Content-Type", "application/octet-stream")
	var servers []string
	for i := range 3 {
		body := fmt.Sprintf(`{"server":{"name":"acme-%d","imageRef":%q,"flavorRef":"d1.2g.local","networks":"auto"}}`, i, img)
		servers = append(servers, call("POST", c.ComputeURL+"/servers", alice, body, 202, "OpenStack-API-Version", "compute 2.74")["server"].(map[string]any)["id"].(string))
	}
	vol := call("POST", c.VolumeURL+"/volumes", alice, fmt.Sprintf(`{"volume":{"size":1,"imageRef":%q}}`, img), 202)["volume"].(map[string]any)["id"].(string)
	testenv.Eventually(t, 30*time.Second, "servers ACTIVE and the volume available", func() bool {
		for _, id := range servers {
			if call("GET", c.ComputeURL+"/servers/"+id, alice, "", 200)["server"].(map[string]any)["status"] != "ACTIVE" {
				return false
			}
		}
		return call("GET", c.VolumeURL+"/volumes/"+vol, alice, "", 200)["volume"].(map[string]any)["status"] == "available"
	})
	if _, err := c.Billing.ChargeUntil(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	before := map[string][]string{}
	for _, q := range backupTables {
		before[q] = dump(t, c.DB, q)
	}
	if n := len(before[backupTables[4]]); n < 5 {
		t.Fatalf("the ledger holds %d entries: the fill charged nothing", n)
	}

	// Back up while the demo project creates servers.
	demo := testenv.Token(t, c, cloud.DemoUser)
	demoProject, err := c.Identity.ProjectByName(ctx, cloud.DemoProject)
	if err != nil {
		t.Fatal(err)
	}
	call("PUT", c.ComputeURL+"/os-quota-sets/"+demoProject.ID, testenv.Token(t, c, cloud.AdminUser),
		`{"quota_set":{"instances":-1,"cores":-1,"ram":-1}}`, 200)
	var public string
	if err := c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = 'Debian 12'").Scan(&public); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var during, created atomic.Int64
	var backingUp atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := fmt.Sprintf(`{"server":{"name":"load-%d","imageRef":%q,"flavorRef":"2","networks":"none"}}`, i, public)
			resp, raw := testenv.Do(t, hc, "POST", c.ComputeURL+"/servers", demo, body, "OpenStack-API-Version", "compute 2.74")
			if resp.StatusCode != 202 {
				t.Errorf("create during the backup: %d %s", resp.StatusCode, raw)
				return
			}
			created.Add(1)
			if backingUp.Load() {
				during.Add(1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "load running", func() bool { return created.Load() >= 3 })
	out := t.TempDir()
	archive := filepath.Join(out, "nimbus.tgz")
	var stdout, stderr bytes.Buffer
	backingUp.Store(true)
	err = runAdmin(ctx, []string{"backup", archive, "--data-dir", c.Config.DataDir}, &stdout, &stderr)
	// Keep serving until a create has landed while the copy ran, or past it.
	testenv.Eventually(t, 30*time.Second, "a create during the backup", func() bool { return during.Load() > 0 })
	backingUp.Store(false)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("backup: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"nimbus.db", "ca-key.pem", "secrets.json", "images", "volumes", "not copied", "fake-fleet.json"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("backup output lacks %q:\n%s", want, stdout.String())
		}
	}
	after := map[string][]string{}
	for _, q := range backupTables {
		after[q] = dump(t, c.DB, q)
	}

	// Restore on a new data directory, as an operator would.
	restored := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(restored, 0o700); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("tar", "-xzf", archive, "-C", restored).CombinedOutput(); err != nil {
		t.Fatalf("tar -xzf: %v\n%s", err, b)
	}
	var m cloud.BackupManifest
	if b, err := os.ReadFile(filepath.Join(restored, cloud.BackupManifestFile)); err != nil || json.Unmarshal(b, &m) != nil {
		t.Fatalf("manifest: %v", err)
	}
	if m.Database != "sqlite" || m.Files < 8 {
		t.Errorf("manifest %+v", m)
	}
	// The restored tables, read before any controller starts on them.
	rdb, err := store.OpenReadOnly(ctx, filepath.Join(restored, "nimbus.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range backupTables {
		got := dump(t, rdb, q)
		subset(t, "before the backup ⊆ restored: "+q, before[q], got)
		subset(t, "restored ⊆ after the backup: "+q, got, after[q])
	}
	ro, err := store.OpenReadOnly(ctx, filepath.Join(restored, "nimbus.db"))
	if err != nil {
		t.Fatal(err)
	}
	var findings []doctor.Finding
	if _, err := doctor.Run(ctx, ro, doctor.Config{}, func(f doctor.Finding) { findings = append(findings, f) }); err != nil {
		t.Fatal(err)
	}
	ro.Close()
	rdb.Close()
	for _, f := range findings {
		t.Errorf("doctor on the restored database: %s %s: %s", f.Check, f.Subject, f.Problem)
	}
	orig, err := os.ReadFile(filepath.Join(c.Config.DataDir, "volumes", vol))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(restored, "volumes", vol)); err != nil || !bytes.Equal(got, orig) {
		t.Fatalf("the restored volume's data differs (%v)", err)
	}
	if fi, err := os.Stat(filepath.Join(restored, "volumes", vol)); err != nil || fi.Size() != 1<<30 || allocatedOf(fi) > 8<<20 {
		t.Errorf("the restored 1 GiB volume holds %d bytes on disk: its holes are lost (%v)", allocatedOf(fi), err)
	}

	rc := testenv.StartCloud(t, "", func(cfg *cloud.Config) { cfg.DataDir = restored })
	rhc := testenv.HTTPClient(t, rc) // trusts the restored CA: the same as the original's
	if a, b := readFile(t, rc.CACertFile), readFile(t, c.CACertFile); !bytes.Equal(a, b) {
		t.Error("the restored cloud has a new CA: enrolled agents would refuse it")
	}
	ralice, err := rc.Identity.Issue(ctx, "alice", "alice-pw-1", "acme")
	if err != nil {
		t.Fatalf("alice signs in on the restored cloud: %v", err)
	}
	for _, id := range servers {
		resp, raw := testenv.Do(t, rhc, "GET", rc.ComputeURL+"/servers/"+id, ralice, "")
		testenv.MustStatus(t, resp, raw, 200)
		if !strings.Contains(raw, `"status": "ACTIVE"`) && !strings.Contains(raw, `"status":"ACTIVE"`) {
			t.Errorf("restored server %s: %s", id, raw)
		}
	}
	req, _ := http.NewRequest("GET", rc.ImageURL+"/v2/images/"+img+"/file", nil)
	req.Header.Set("X-Auth-Token", ralice)
	resp, err := rhc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, data) {
		t.Fatalf("the restored image's data: %d, %d bytes, want %d", resp.StatusCode, len(got), len(data))
	}
	var balance, want int64
	if err := rc.DB.QueryRow(ctx, "SELECT COALESCE(SUM(amount), 0) FROM billing_ledger WHERE project_id = ?", acme.ID).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if err := c.DB.QueryRow(ctx, "SELECT COALESCE(SUM(amount), 0) FROM billing_ledger WHERE project_id = ?", acme.ID).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if balance != want {
		t.Errorf("acme's balance restored %d, original %d", balance, want)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAdminBackupDirectory: the directory form is a data directory whose
// volume files keep their holes; what may not be given is refused and
// leaves nothing behind; with PostgreSQL the files are copied and the
// database is said to be PostgreSQL's to copy.
func TestAdminBackupDirectory(t *testing.T) {
	clearOpenStackEnv(t)
	t.Setenv("NIMBUS_DATABASE_URL", "")
	ctx := context.Background()
	c := testenv.StartCloud(t, "")
	// A sparse 64 MiB volume file with 4 KiB of data, as the file backend
	// keeps volumes.
	sparse := filepath.Join(c.Config.DataDir, "volumes", "sparse-vol")
	if err := os.MkdirAll(filepath.Dir(sparse), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 4096), 32<<20); err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 << 20)
	f.Close()
	for _, junk := range []string{"images/x.tmp-1234", "stray.txt"} {
		if err := os.WriteFile(filepath.Join(c.Config.DataDir, junk), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	dest := filepath.Join(t.TempDir(), "backup")
	var out, errOut bytes.Buffer
	if err := runAdmin(ctx, []string{"backup", dest, "--data-dir", c.Config.DataDir, "--json"}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var m cloud.BackupManifest
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	notCopied := map[string]string{}
	for _, e := range m.NotCopied {
		notCopied[e.Path] = e.Why
	}
	for _, p := range []string{"fake-fleet.json", "agent-ops.jsonl", "stray.txt", "nimbus.db-wal"} {
		if notCopied[p] == "" {
			t.Errorf("%s not listed as not copied: %+v", p, m.NotCopied)
		}
	}
	for _, p := range []string{"nimbus.db", "ca.pem", "ca-key.pem", "server.pem", "secrets.json", "clouds.yaml", "agent.json", "volumes/sparse-vol", "nimbus-backup.json"} {
		if _, err := os.Stat(filepath.Join(dest, p)); err != nil {
			t.Errorf("backup lacks %s: %v", p, err)
		}
	}
	for _, p := range []string{"images/x.tmp-1234", "stray.txt", "fake-fleet.json", "nimbus.db-wal"} {
		if _, err := os.Stat(filepath.Join(dest, p)); err == nil {
			t.Errorf("backup holds %s", p)
		}
	}
	fi, err := os.Stat(filepath.Join(dest, "volumes", "sparse-vol"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 64<<20 || allocatedOf(fi) > 1<<20 {
		t.Errorf("the sparse volume's copy: %d bytes, %d allocated", fi.Size(), allocatedOf(fi))
	}
	if fi, err := os.Stat(dest); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("backup directory mode: %v %v", fi.Mode(), err)
	}
	db, err := store.Open(ctx, filepath.Join(dest, "nimbus.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	leftover := filepath.Join(t.TempDir(), "b.tar")
	if err := os.WriteFile(leftover+".partial", []byte("the operator's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"backup", dest, "--data-dir", c.Config.DataDir}, "exists already"},
		{[]string{"backup", leftover, "--data-dir", c.Config.DataDir}, "b.tar.partial exists (a backup that was stopped?)"},
		{[]string{"backup", filepath.Join(c.Config.DataDir, "b"), "--data-dir", c.Config.DataDir}, "inside the data directory"},
		{[]string{"backup", filepath.Join(t.TempDir(), "b"), "--data-dir", t.TempDir()}, "no Nimbus database"},
		{[]string{"backup", "--data-dir", c.Config.DataDir}, "want <directory|file.tar|file.tar.gz>"},
	} {
		if err := runAdmin(ctx, tc.args, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("nimbus admin %v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(c.Config.DataDir, "b")); err == nil {
		t.Error("a refused backup left something in the data directory")
	}
	if b, err := os.ReadFile(leftover + ".partial"); err != nil || string(b) != "the operator's" {
		t.Errorf("a refused backup touched the file in its way: %q %v", b, err)
	}

	pg := filepath.Join(t.TempDir(), "pg.tar")
	out.Reset()
	if err := runAdmin(ctx, []string{"backup", pg, "--data-dir", c.Config.DataDir, "--json",
		"--database-url", "postgres://nimbus@db.invalid/nimbus"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	m = cloud.BackupManifest{}
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m.Database != "postgres" || !strings.Contains(fmt.Sprint(m.NotCopied), "pg_basebackup") || strings.Contains(fmt.Sprint(m.Copied), "nimbus.db ") {
		t.Errorf("a PostgreSQL controller's backup: %+v", m)
	}
	if b, err := exec.Command("tar", "-tf", pg).CombinedOutput(); err != nil || !strings.Contains(string(b), "ca-key.pem") ||
		strings.Contains(string(b), "nimbus.db\n") {
		t.Errorf("tar -tf: %v\n%s", err, b)
	}
}

func allocatedOf(fi os.FileInfo) int64 { return fi.Sys().(*syscall.Stat_t).Blocks * 512 }
