package netplane

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

// testNS makes a fresh named namespace for one test, named with a random
// prefix so that parallel tests and packages never collide, and removes
// it at the end. It skips where namespaces cannot be made, unless
// NIMBUS_REQUIRE_NETNS=1.
func testNS(t testing.TB) string {
	t.Helper()
	path, err := ensureNamedNS(testName(t, "h"))
	if err != nil {
		if os.Getenv("NIMBUS_REQUIRE_NETNS") == "1" {
			t.Fatalf("cannot make a network namespace (NIMBUS_REQUIRE_NETNS=1): %v", err)
		}
		t.Skipf("cannot make a network namespace (needs root and CAP_NET_ADMIN): %v", err)
	}
	name := path[len(namedNSDir)+1:]
	t.Cleanup(func() { _ = deleteNamedNS(name) })
	return path
}

// testName is a unique name for a test's namespaces and devices:
// "nt" + 6 hex digits + kind.
func testName(t testing.TB, kind string) string {
	t.Helper()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "nt" + hex.EncodeToString(b[:]) + kind
}
