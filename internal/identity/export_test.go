package identity

import "time"

// SetClock makes s read the time from now, so that tests can step through
// TOTP windows and lockouts.
func SetClock(s *Service, now func() time.Time) { s.now = now }
