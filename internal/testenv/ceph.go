package testenv

import (
	"testing"

	"nimbus/internal/cephtest"
)

// Ceph is a one-node Ceph cluster for tests (cephtest.Ceph).
type Ceph = cephtest.Ceph

// The pools every test cluster has.
const (
	VolumesPool = cephtest.VolumesPool
	BackupsPool = cephtest.BackupsPool
	ImagesPool  = cephtest.ImagesPool
)

// StartCeph brings up a cluster of the test's own (cephtest.StartCeph).
func StartCeph(t testing.TB) *Ceph {
	t.Helper()
	return cephtest.StartCeph(t)
}

// SharedCeph is the test binary's one cluster (cephtest.SharedCeph).
func SharedCeph(t testing.TB) *Ceph {
	t.Helper()
	return cephtest.SharedCeph(t)
}

// CephMain runs a test binary's tests and tears down its shared cluster
// (cephtest.CephMain).
func CephMain(m *testing.M) int { return cephtest.CephMain(m) }
