package store

import (
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"
)

// How long PostgreSQL may keep a controller waiting, so that a database
// that is away costs a request seconds, never minutes, and the pool finds
// the new primary by itself after a failover:
//   - pgConnectTimeout bounds each connection attempt, per host of a
//     multi-host URL (pgx tries the next host after it), unless the URL
//     sets connect_timeout;
//   - TCP keepalives probe an idle or waiting connection every
//     pgKeepAlive and give it up after pgKeepAliveProbes unanswered: a
//     primary whose host died (no RST) is dropped, and the query on it
//     fails, within about 20 s rather than the kernel's two hours;
//   - TCP_USER_TIMEOUT fails a connection whose sent data stays
//     unacknowledged for pgUserTimeout.
const (
	pgConnectTimeout  = 5 * time.Second
	pgKeepAlive       = 5 * time.Second
	pgKeepAliveProbes = 3
	pgUserTimeout     = 20 * time.Second
)

// withDeadlines sets those on a pgx configuration.
func withDeadlines(cfg *pgx.ConnConfig) *pgx.ConnConfig {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = pgConnectTimeout
	}
	d := &net.Dialer{
		Timeout:         cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: pgKeepAlive, Interval: pgKeepAlive, Count: pgKeepAliveProbes},
		Control: func(network, _ string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil // a Unix socket
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(pgUserTimeout.Milliseconds()))
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
	// Every host of a multi-host URL dials through cfg.DialFunc.
	cfg.DialFunc = d.DialContext
	return cfg
}
