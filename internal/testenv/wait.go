package testenv

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"
)

// Log is a test's logger: it discards, unless NIMBUS_TEST_LOG is set, when
// it writes everything to stderr.
func Log() *slog.Logger {
	if os.Getenv("NIMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Eventually polls cond every 20 ms until it holds, failing the test when d
// passes first.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
