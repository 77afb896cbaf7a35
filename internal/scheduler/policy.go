package scheduler

import "fmt"

// Weigher names that ParsePolicy accepts.
const (
	// Spread puts a server on the host with the most free vCPUs and RAM, so
	// that load stays even.
	Spread = "spread"
	// Pack puts a server on the fullest host that still fits, so that
	// whole hosts stay free for large servers.
	Pack = "pack"
)

// Policy is how the operator wants hosts chosen.
type Policy struct {
	// Weigher is "spread" (default: the host with most free vCPUs and RAM
	// wins, so load is even) or "pack" (the fullest host that still fits
	// wins, so whole hosts stay free).
	Weigher string
	// KeepGPUHosts keeps hosts that have GPUs for requests that ask for
	// GPUs: a request without GPUs goes to a GPU host only when no other
	// host fits. Compute sets it true by default.
	KeepGPUHosts bool
}

// ParsePolicy checks an operator's weigher name ("" is Spread) and returns
// the policy.
func ParsePolicy(weigher string, keepGPU bool) (Policy, error) {
	switch weigher {
	case "", Spread:
		return Policy{Weigher: Spread, KeepGPUHosts: keepGPU}, nil
	case Pack:
		return Policy{Weigher: Pack, KeepGPUHosts: keepGPU}, nil
	}
	return Policy{}, fmt.Errorf("scheduler: unknown weigher %q (want %q or %q)", weigher, Spread, Pack)
}
