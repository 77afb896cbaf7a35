// Package storetest gives tests fresh databases on every engine Nimbus
// runs on: an SQLite file and, where PostgreSQL is reachable, a new
// PostgreSQL database, both removed when the test ends.
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver for the admin connection
)

// Engine is one database to run a test on.
type Engine struct {
	Name string // "sqlite" or "postgres"
	URL  string
}

// PostgresAdminURL is the PostgreSQL server tests make their databases on.
func PostgresAdminURL() string {
	if u := os.Getenv("NIMBUS_TEST_POSTGRES"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Engines returns a fresh SQLite database and, when PostgreSQL is reachable,
// a fresh PostgreSQL database, both removed when the test ends. With
// NIMBUS_REQUIRE_POSTGRES=1 (as .ci/run sets) an unreachable PostgreSQL fails
// the test; otherwise PostgreSQL is skipped with a message.
func Engines(t testing.TB) []Engine {
	t.Helper()
	out := []Engine{{Name: "sqlite", URL: filepath.Join(t.TempDir(), "nimbus.db")}}
	if u, err := FreshPostgres(t); err == nil {
		out = append(out, Engine{Name: "postgres", URL: u})
	} else if os.Getenv("NIMBUS_REQUIRE_POSTGRES") == "1" {
		t.Fatalf("PostgreSQL is required (NIMBUS_REQUIRE_POSTGRES=1) but not usable: %v", err)
	} else {
		t.Logf("skipping PostgreSQL: %v", err)
	}
	return out
}

// ForEachEngine runs f as a subtest on every engine.
func ForEachEngine(t *testing.T, f func(t *testing.T, dbURL string)) {
	for _, e := range Engines(t) {
		t.Run(e.Name, func(t *testing.T) { f(t, e.URL) })
	}
}

// FreshPostgres creates an empty PostgreSQL database for the test and drops
// it when the test ends.
func FreshPostgres(t testing.TB) (string, error) {
	admin := PostgresAdminURL()
	db, err := sql.Open("pgx", admin)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return "", err
	}
	b := make([]byte, 6)
	rand.Read(b)
	name := "nimbus_t_" + hex.EncodeToString(b)
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		db.Close()
		return "", err
	}
	t.Cleanup(func() {
		db.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
		db.Close()
	})
	i := strings.LastIndex(admin, "/")
	q := ""
	if j := strings.Index(admin[i:], "?"); j >= 0 {
		q = admin[i+j:]
	}
	return admin[:i] + "/" + name + q, nil
}
