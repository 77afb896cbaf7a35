package compute

import (
	"testing"
	"time"
)

// QuotaLock is the advisory lock class of a project's quota checks.
const QuotaLock = quotaLock

// SetPlaceBudget sets how long a placement may take, until the test ends.
func SetPlaceBudget(t testing.TB, d time.Duration) {
	old := placeBudget
	placeBudget = d
	t.Cleanup(func() { placeBudget = old })
}
