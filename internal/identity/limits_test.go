package identity_test

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/identity"
	"nimbus/internal/testenv"
)

func withLimits(l identity.Limits) testenv.Options {
	return func(c *cloud.Config) { c.Identity = l }
}

// TestLockout covers Keystone's account lockout: after the allowed failures
// even the right password gets 401 "The account is locked for user: <id>."
// until the duration has passed, or until an admin enables the user.
func TestLockout(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		for _, tc := range []struct {
			name     string
			duration time.Duration
		}{
			{"until the duration passes", time.Second},
			{"until an admin enables the user", 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, dbURL, withLimits(identity.Limits{LockoutFailureAttempts: 3, LockoutDuration: tc.duration}))
				_, m := e.issue(t, passwordAuth("demo", "demo-secret", ""))
				userID := str(m, "token", "user", "id")
				for i := range 3 {
					resp, m, raw := e.do(t, "POST", "/auth/tokens", "", passwordAuth("demo", "wrong-"+strconv.Itoa(i), ""))
					testenv.MustStatus(t, resp, raw, http.StatusUnauthorized)
					keystoneError(t, m, 401, unauthorized)
				}
				locked := "The account is locked for user: " + userID + "."
				start := time.Now()
				resp, m, raw := e.do(t, "POST", "/auth/tokens", "", passwordAuth("demo", "demo-secret", ""))
				testenv.MustStatus(t, resp, raw, http.StatusUnauthorized)
				keystoneError(t, m, 401, locked)
				// Another user is not affected.
				e.issue(t, passwordAuth("admin", "admin-secret", ""))

				if tc.duration > 0 {
					time.Sleep(tc.duration - time.Since(start) + 200*time.Millisecond)
				} else {
					e.must(t, http.StatusOK, "PATCH", "/users/"+userID, e.admin, `{"user":{"enabled":true}}`)
				}
				e.issue(t, passwordAuth("demo", "demo-secret", ""))
				// A good login starts the count again: two failures do not lock.
				for range 2 {
					e.do(t, "POST", "/auth/tokens", "", passwordAuth("demo", "wrong", ""))
				}
				e.issue(t, passwordAuth("demo", "demo-secret", ""))
			})
		}
	})
}

// TestLoginFailuresPerAddress: after the allowed failures from one address,
// its logins get 429 with Retry-After, whatever the user or password.
func TestLoginFailuresPerAddress(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, withLimits(identity.Limits{LoginFailuresPerAddress: 3, LoginFailureWindow: time.Minute}))
		for _, body := range []string{
			passwordAuth("demo", "wrong", ""),
			passwordAuth("nobody", "wrong", ""),
			passwordAuth("admin", "wrong", ""),
		} {
			resp, _, raw := e.do(t, "POST", "/auth/tokens", "", body)
			testenv.MustStatus(t, resp, raw, http.StatusUnauthorized)
		}
		resp, m, raw := e.do(t, "POST", "/auth/tokens", "", passwordAuth("demo", "demo-secret", ""))
		testenv.MustStatus(t, resp, raw, http.StatusTooManyRequests)
		keystoneError(t, m, 429, "")
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
			t.Errorf("Retry-After = %q, want 1..60 seconds", resp.Header.Get("Retry-After"))
		}
		// Tokens already issued keep working.
		e.must(t, http.StatusOK, "GET", "/auth/catalog", e.demo, "")
	})
}

// TestPasswordHashBound: concurrent wrong-password logins never hash more
// passwords at once than the bound, so memory has a ceiling.
func TestPasswordHashBound(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, withLimits(identity.Limits{PasswordHashes: 2}))
		e.client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
		var wg sync.WaitGroup
		statuses := make([]int, 64)
		for i := range statuses {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, _, _ := e.do(t, "POST", "/auth/tokens", "", passwordAuth("demo", "wrong", ""))
				statuses[i] = resp.StatusCode
			}()
		}
		wg.Wait()
		for i, s := range statuses {
			if s != http.StatusUnauthorized {
				t.Errorf("request %d: status %d, want 401", i, s)
			}
		}
		if inFlight, peak := e.c.Identity.PasswordHashes(); peak < 1 || peak > 2 || inFlight != 0 {
			t.Errorf("password hashes: peak %d, in flight %d; want a peak of 1..2 and none left", peak, inFlight)
		}
	})
}

// TestOneUserAtATime: guesses at one account are checked one at a time, so
// that a flood at one user holds a single hash slot and the others stay
// free for everyone else's logins.
func TestOneUserAtATime(t *testing.T) {
	e := newEnv(t, "", withLimits(identity.Limits{PasswordHashes: 4}))
	e.client.Transport.(*http.Transport).MaxIdleConnsPerHost = 32
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.do(t, "POST", "/auth/tokens", "", passwordAuth("demo", "wrong", ""))
		}()
	}
	wg.Wait()
	if _, peak := e.c.Identity.PasswordHashes(); peak != 1 {
		t.Errorf("32 guesses at one user ran %d hashes at once, want 1", peak)
	}
}

// TestTokenIssueRate: a user issued tokens faster than its bucket allows
// gets Keystone-shaped 429s with Retry-After, re-scoping included.
func TestTokenIssueRate(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, withLimits(identity.Limits{TokenRate: 0.5, TokenBurst: 3}))
		// newEnv's in-process logins took one from each user's bucket.
		tok, _ := e.issue(t, passwordAuth("demo", "demo-secret", ""))
		e.issue(t, `{"auth":{"identity":{"methods":["token"],"token":{"id":"`+tok+`"}}}}`)
		for _, body := range []string{
			passwordAuth("demo", "demo-secret", ""),
			`{"auth":{"identity":{"methods":["token"],"token":{"id":"` + tok + `"}}}}`,
		} {
			resp, m, raw := e.do(t, "POST", "/auth/tokens", "", body)
			testenv.MustStatus(t, resp, raw, http.StatusTooManyRequests)
			keystoneError(t, m, 429, "")
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 2 {
				t.Errorf("Retry-After = %q, want 1..2 seconds", resp.Header.Get("Retry-After"))
			}
		}
		// Another user has a bucket of its own.
		e.issue(t, passwordAuth("admin", "admin-secret", ""))
	})
}

// TestLiveTokenCap: issuing beyond a user's live-token cap revokes its
// oldest tokens, which then fail validation as Keystone's revoked tokens do.
func TestLiveTokenCap(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, withLimits(identity.Limits{MaxTokensPerUser: 3}))
		var toks []string
		for range 4 {
			tok, _ := e.issue(t, passwordAuth("demo", "demo-secret", ""))
			toks = append(toks, tok)
			time.Sleep(2 * time.Millisecond) // distinct issue times
		}
		// newEnv's token and the first are the oldest two of five.
		for _, old := range []string{e.demo, toks[0]} {
			resp, m, raw := e.do(t, "GET", "/auth/tokens", e.admin, "", "X-Subject-Token", old)
			testenv.MustStatus(t, resp, raw, http.StatusNotFound)
			keystoneError(t, m, 404, "Could not recognize Fernet token")
			e.must(t, http.StatusUnauthorized, "GET", "/auth/catalog", old, "")
		}
		for _, tok := range toks[1:] {
			e.must(t, http.StatusOK, "GET", "/auth/tokens", e.admin, "", "X-Subject-Token", tok)
		}
		// Other users' tokens are not counted.
		e.must(t, http.StatusOK, "GET", "/auth/catalog", e.admin, "")
	})
}
