package qemu

import (
	"context"
	"testing"

	"nimbus/internal/driver"
)

// What the external tests (e2e_test.go, package qemu_test, which may import
// testenv and through it the whole cloud) need of the driver's insides.

// NeedQEMU skips (or fails, with NIMBUS_REQUIRE_QEMU=1) without QEMU.
func NeedQEMU(t *testing.T) { needQEMU(t) }

// ThisHost is this machine with CPU 0 reserved.
func ThisHost() driver.Host { return testHost() }

// Pid is the pid of a server's QEMU (0 when it has none).
func (d *Driver) Pid(t *testing.T, id string) int { return pidOf(t, d, id) }

// VCPUThreads are the thread ids of a server's vCPUs.
func (d *Driver) VCPUThreads(ctx context.Context, id string) ([]int, error) {
	return d.lookup(id).current().mon.VCPUThreads(ctx)
}

// Gone reports whether a process has exited and been reaped.
func Gone(pid int) bool { return gone(pid) }

// Affinity is a thread's Cpus_allowed_list.
func Affinity(t *testing.T, tid int) string { return affinity(t, tid) }

// MemStore is the tests' image service.
type MemStore = memStore

// NewMemStore makes an empty one.
func NewMemStore(t *testing.T) *MemStore { return newMemStore(t) }

// Add serves path as image id.
func (s *memStore) Add(id, path string) { s.add(id, path) }

// Uploaded is the file and disk format an upload stored, "" when none.
func (s *memStore) Uploaded(id string) (path, format string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.uploads[id]
	if !ok {
		return "", ""
	}
	return s.files[id], f
}

// RefOf describes a file as the image service would.
func RefOf(t *testing.T, id, format, path string) driver.ImageRef { return refOf(t, id, format, path) }

// PowerEvents records what a power listener heard.
type PowerEvents = powerEvents

// NewPowerEvents makes one; pass its Listen to SetPowerListener.
func NewPowerEvents() *PowerEvents { return newPowerEvents() }

// Listen is the listener.
func (e *powerEvents) Listen(id string, p driver.PowerState) { e.listen(id, p) }

// Of is what was heard of a server.
func (e *powerEvents) Of(id string) []driver.PowerState { return e.of(id) }

// NewTestDriver makes a driver on dataDir for tests.
func NewTestDriver(t *testing.T, dataDir string, store driver.ImageStore, mod func(*Config)) *Driver {
	return newTestDriver(t, dataDir, store, mod)
}
