package identity

import (
	"container/list"
	"context"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"nimbus/internal/api"
)

// Limits bound what one client can make identity do. The zero value limits
// nothing but the password hashes; DefaultLimits are nimbus serve's.
type Limits struct {
	// LockoutFailureAttempts locks a user after this many failed password
	// checks in a row, for LockoutDuration after the last one (0: until
	// an admin enables the user again), as Keystone's [security_compliance]
	// lockout_failure_attempts and lockout_duration do. 0 never locks.
	LockoutFailureAttempts int
	LockoutDuration        time.Duration
	// LoginFailuresPerAddress failed logins from one client address within
	// LoginFailureWindow make its further logins 429 (0: no limit).
	LoginFailuresPerAddress int
	LoginFailureWindow      time.Duration
	// TokenRate (per second) and TokenBurst bound the tokens issued to one
	// user, as a token bucket (TokenRate 0: no limit).
	TokenRate  float64
	TokenBurst int
	// MaxTokensPerUser bounds a user's live tokens: issuing one more
	// revokes the oldest (0: no limit).
	MaxTokensPerUser int
	// PasswordHashes bounds concurrent argon2id computations, each 19 MiB
	// (0: one per CPU).
	PasswordHashes int
	// ReceiptsPerAddress bounds the auth receipts (sign-ins waiting for a
	// second factor) live at once for one client address; more wait for
	// one to expire (0: no limit). Each user holds at most three anyway.
	ReceiptsPerAddress int
}

// DefaultLimits are generous enough for Tempest and the openstack CLI, which
// log in many times a minute from one address as one user.
var DefaultLimits = Limits{
	LockoutFailureAttempts: 10, LockoutDuration: 15 * time.Minute,
	LoginFailuresPerAddress: 50, LoginFailureWindow: 5 * time.Minute,
	TokenRate: 10, TokenBurst: 50, MaxTokensPerUser: 1000,
	ReceiptsPerAddress: 50,
}

// maxTracked bounds the addresses and users the in-memory limiters keep; the
// least recently seen is forgotten first.
const maxTracked = 100_000

// hashesInFlight is the process's password hashes running now.
var hashesInFlight = prometheus.NewGauge(prometheus.GaugeOpts{
	Namespace: "nimbus", Subsystem: "identity", Name: "password_hashes_in_flight",
	Help: "Password hashes (argon2id, 19 MiB each) being computed now.",
})

func init() { prometheus.MustRegister(hashesInFlight) }

// SetLimits sets the service's limits; call it before serving.
func (s *Service) SetLimits(l Limits) {
	n := l.PasswordHashes
	if n <= 0 {
		n = runtime.NumCPU()
	}
	s.limits = l
	s.hashSlots = make(chan struct{}, n)
	s.failures = newLRU[*failureLog](maxTracked)
	s.buckets = newLRU[*bucket](maxTracked)
	slotOwner.Store(s)
}

// PasswordHashes reports how many password hashes run now and the most that
// ever ran at once.
func (s *Service) PasswordHashes() (inFlight, peak int64) {
	return s.hashing.Load(), s.hashPeak.Load()
}

// withHashSlot runs f while holding one of the service's hash slots, so that
// memory for argon2id has a ceiling however many logins arrive; waiting ends
// with the request.
func (s *Service) withHashSlot(ctx context.Context, f func() error) error {
	select {
	case s.hashSlots <- struct{}{}:
	case <-ctx.Done():
		return retryLater(http.StatusServiceUnavailable, time.Second, "The service is busy checking passwords; retry later.")
	}
	defer func() { <-s.hashSlots }()
	n := s.hashing.Add(1)
	for p := s.hashPeak.Load(); n > p && !s.hashPeak.CompareAndSwap(p, n); p = s.hashPeak.Load() {
	}
	hashesInFlight.Inc()
	defer func() { s.hashing.Add(-1); hashesInFlight.Dec() }()
	return f()
}

// turn is one user's place in the password-check queue: one check per
// user at a time, so that a flood of guesses at one account queues behind
// itself, holding at most one hash slot, and every other user's login
// still finds a slot soon.
type turn struct {
	ch      chan struct{} // holds a token while a check for the user runs
	waiting int           // requests holding or waiting for it; under turnMu
}

// userTurn waits for userID's turn to have a password checked and returns
// the function that ends it; waiting ends with the request.
func (s *Service) userTurn(ctx context.Context, userID string) (func(), error) {
	s.turnMu.Lock()
	t := s.turns[userID]
	if t == nil {
		if s.turns == nil {
			s.turns = map[string]*turn{}
		}
		t = &turn{ch: make(chan struct{}, 1)}
		s.turns[userID] = t
	}
	t.waiting++
	s.turnMu.Unlock()
	leave := func() {
		s.turnMu.Lock()
		if t.waiting--; t.waiting == 0 {
			delete(s.turns, userID)
		}
		s.turnMu.Unlock()
	}
	select {
	case t.ch <- struct{}{}:
		return func() { <-t.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, retryLater(http.StatusServiceUnavailable, time.Second, "The service is busy checking passwords; retry later.")
	}
}

// hashPassword is hashArgon2id under a hash slot.
func (s *Service) hashPassword(ctx context.Context, pw string) (hash string, err error) {
	err = s.withHashSlot(ctx, func() error { hash = hashArgon2id(pw); return nil })
	return hash, err
}

// retryLater is an error with a Retry-After of at least one second.
func retryLater(status int, wait time.Duration, msg string) *api.Error {
	e := api.Errorf(status, "%s", msg)
	secs := int64(math.Ceil(wait.Seconds()))
	e.Header = http.Header{"Retry-After": {strconv.FormatInt(max(secs, 1), 10)}}
	return e
}

// failureLog is a ring of the times of an address's last failed logins.
type failureLog struct {
	at   []int64 // unix nanoseconds
	next int     // the oldest entry once the ring is full
}

// addressWait is how long addr must wait before its next login, 0 if it may
// go on. An empty addr (an in-process caller) is never limited.
func (s *Service) addressWait(addr string) time.Duration {
	n, window := s.limits.LoginFailuresPerAddress, s.limits.LoginFailureWindow
	if n <= 0 || addr == "" {
		return 0
	}
	s.limitMu.Lock()
	defer s.limitMu.Unlock()
	f, ok := s.failures.get(addr)
	if !ok || len(f.at) < n {
		return 0
	}
	return time.Unix(0, f.at[f.next]).Add(window).Sub(s.now())
}

// addressFailed records a failed login from addr.
func (s *Service) addressFailed(addr string) {
	n := s.limits.LoginFailuresPerAddress
	if n <= 0 || addr == "" {
		return
	}
	s.limitMu.Lock()
	defer s.limitMu.Unlock()
	f, ok := s.failures.get(addr)
	if !ok {
		f = &failureLog{}
		s.failures.put(addr, f)
	}
	now := s.now().UnixNano()
	if len(f.at) < n {
		f.at = append(f.at, now)
		return
	}
	f.at[f.next] = now
	f.next = (f.next + 1) % n
}

// bucket is a user's token bucket for token issue.
type bucket struct {
	tokens float64
	last   time.Time
}

// allowIssue takes one token from the user's bucket, or says how long to
// wait for one.
func (s *Service) allowIssue(userID string) error {
	rate, burst := s.limits.TokenRate, float64(max(s.limits.TokenBurst, 1))
	if rate <= 0 {
		return nil
	}
	now := s.now()
	s.limitMu.Lock()
	defer s.limitMu.Unlock()
	b, ok := s.buckets.get(userID)
	if !ok {
		b = &bucket{tokens: burst, last: now}
		s.buckets.put(userID, b)
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return nil
	}
	wait := time.Duration((1 - b.tokens) / rate * float64(time.Second))
	return retryLater(http.StatusTooManyRequests, wait,
		"Too many tokens requested for user "+userID+"; retry after "+strconv.Itoa(int(math.Ceil(wait.Seconds())))+" seconds.")
}

// lru is a map that keeps at most max entries, forgetting the least
// recently used first. Its owner locks it.
type lru[V any] struct {
	max   int
	order *list.List // of lruEntry, most recent first
	m     map[string]*list.Element
}

type lruEntry[V any] struct {
	key string
	val V
}

func newLRU[V any](max int) *lru[V] {
	return &lru[V]{max: max, order: list.New(), m: map[string]*list.Element{}}
}

func (l *lru[V]) get(key string) (V, bool) {
	e, ok := l.m[key]
	if !ok {
		var zero V
		return zero, false
	}
	l.order.MoveToFront(e)
	return e.Value.(lruEntry[V]).val, true
}

func (l *lru[V]) put(key string, v V) {
	if len(l.m) >= l.max {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.m, old.Value.(lruEntry[V]).key)
	}
	l.m[key] = l.order.PushFront(lruEntry[V]{key, v})
}
