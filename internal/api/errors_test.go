package api_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// TestAsError: errors without a status map to one, a 503 always with
// Retry-After, and its message says which fault it is.
func TestAsError(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		status     int
		retryAfter string
		message    string
	}{
		{"not found", fmt.Errorf("x: %w", store.ErrNotFound), http.StatusNotFound, "", "Resource could not be found."},
		{"conflict", fmt.Errorf("x: %w", store.ErrConflict), http.StatusConflict, "", "Conflict."},
		{"database away", fmt.Errorf("x: %w", store.ErrUnavailable), http.StatusServiceUnavailable, "5", api.Unavailable().Message},
		{"deadline", context.DeadlineExceeded, http.StatusServiceUnavailable, "5", api.Unavailable().Message},
		{"SQLite full", errors.New("exec: database or disk is full (13)"), http.StatusServiceUnavailable, "30", api.StorageFull().Message},
		{"file system full", fmt.Errorf("image: write: %w", syscall.ENOSPC), http.StatusServiceUnavailable, "30", api.StorageFull().Message},
		{"lock wait too long", fmt.Errorf("x: %w", store.ErrBusy), http.StatusServiceUnavailable, "1", api.Busy().Message},
		{"other", errors.New("boom"), http.StatusInternalServerError, "", ""},
	}
	for _, tt := range tests {
		e := api.AsError(tt.err)
		if e.Status != tt.status || e.Header.Get("Retry-After") != tt.retryAfter || (tt.message != "" && e.Message != tt.message) {
			t.Errorf("%s: %d %q Retry-After %q, want %d %q Retry-After %q", tt.name, e.Status, e.Message,
				e.Header.Get("Retry-After"), tt.status, tt.message, tt.retryAfter)
		}
	}
}
