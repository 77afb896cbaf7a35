package network

import "time"

// SetReleasingWait shortens the wait for ports being released, for a test;
// it returns the undo.
func SetReleasingWait(d time.Duration) func() {
	old := releasingWait
	releasingWait = d
	return func() { releasingWait = old }
}
