package region

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Server is a PostgreSQL server of the test's own, on a port of its own,
// that the test may stop and start (the shared test server on 5432 is
// left alone).
type Server struct {
	Dir  string // data directory
	Port int
	as   As
	t    testing.TB
}

// StartServer makes a new cluster with initdb (local trust
// authentication: the test's alone, on loopback) and starts it.
func StartServer(t testing.TB) *Server {
	t.Helper()
	Need(t, "NIMBUS_REQUIRE_POSTGRES", pgBin("initdb"), pgBin("pg_ctl"))
	as := Postgres(t)
	root := OwnedDir(t, as, "nimbus-pg-")
	s := &Server{Dir: filepath.Join(root, "data"), Port: FreePort(t, "127.0.0.1"), as: as, t: t}
	run(t, as, nil, pgBin("initdb"), "-D", s.Dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	conf := fmt.Sprintf("listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nfsync = off\nmax_connections = 200\n", s.Port, root)
	f, err := os.OpenFile(filepath.Join(s.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(conf)
	f.Close()
	s.Start()
	t.Cleanup(func() { s.stop("immediate") })
	return s
}

// URL is a database URL on the server as its superuser.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// Start starts the server and waits until it takes connections.
func (s *Server) Start() {
	s.t.Helper()
	run(s.t, s.as, nil, pgBin("pg_ctl"), "-D", s.Dir, "-l", filepath.Join(filepath.Dir(s.Dir), "server.log"), "-w", "start")
}

// Crash stops the server as a crash would (immediate mode: no checkpoint,
// every connection cut).
func (s *Server) Crash() {
	s.t.Helper()
	if err := s.stop("immediate"); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Server) stop(mode string) error {
	out, err := cmdAs(s.as, pgBin("pg_ctl"), "-D", s.Dir, "-m", mode, "-w", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// CreateDatabase makes a database on the server.
func (s *Server) CreateDatabase(name string) {
	s.t.Helper()
	run(s.t, s.as, nil, pgBin("psql"), "-h", "127.0.0.1", "-p", fmt.Sprint(s.Port), "-U", "postgres", "-qc", "CREATE DATABASE "+name)
}
