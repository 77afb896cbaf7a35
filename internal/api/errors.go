// Package api holds the HTTP plumbing every Nimbus service shares: routes as
// data, handlers that return a value, one error type mapped to each
// service's OpenStack error body, request ids, token authentication,
// body limits and JSON decoding.
package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"nimbus/internal/store"
)

// Error is an error with an HTTP status that a client may see.
type Error struct {
	Status  int
	Message string
	// Type is the service-specific error name where one exists, such as
	// Neutron's "NetworkNotFound".
	Type string
	// Header adds response headers, such as Retry-After.
	Header http.Header
	// Cause is the error a 5xx stands for, logged and never shown.
	Cause error
}

func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// Errorf builds an Error with the given status.
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// BadRequest is a 400.
func BadRequest(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, format, args...)
}

// Unauthorized is a 401 with Keystone's message.
func Unauthorized() *Error {
	return Errorf(http.StatusUnauthorized, "The request you have made requires authentication.")
}

// Forbidden is a 403.
func Forbidden(format string, args ...any) *Error {
	return Errorf(http.StatusForbidden, format, args...)
}

// NotFound is a 404.
func NotFound(format string, args ...any) *Error {
	return Errorf(http.StatusNotFound, format, args...)
}

// Conflict is a 409.
func Conflict(format string, args ...any) *Error {
	return Errorf(http.StatusConflict, format, args...)
}

// OverLimit is a 413, as Nova answers for quota and size limits.
func OverLimit(format string, args ...any) *Error {
	return Errorf(http.StatusRequestEntityTooLarge, format, args...)
}

// PolicyForbidden is the 403 OpenStack services give for admin-only calls.
func PolicyForbidden(rule string) *Error {
	return Forbidden("Policy doesn't allow %s to be performed.", rule)
}

// AsError turns any error into an *Error. Errors that carry no status become
// 404 for store.ErrNotFound, 409 for store.ErrConflict, 503 when the
// database is away (store.IsUnavailable: down, restarting, failing over)
// or the request's deadline passed, 503 when the disk it writes to is
// full (store.IsFull), 503 when it waited too long for other requests'
// locks (store.IsBusy), and 500 otherwise; the 5xx messages
// never leak the internal error text.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return NotFound("Resource could not be found.")
	case errors.Is(err, store.ErrConflict):
		return Conflict("Conflict.")
	case store.IsFull(err):
		u := StorageFull()
		u.Cause = err
		return u
	case store.IsBusy(err):
		u := Busy()
		u.Cause = err
		return u
	case store.IsUnavailable(err), errors.Is(err, context.DeadlineExceeded):
		// The database is away, or the request outlived its deadline
		// waiting for it (Service.Deadline).
		u := Unavailable()
		u.Cause = err
		return u
	}
	return &Error{Status: http.StatusInternalServerError, Cause: err,
		Message: "Unexpected API Error. Please report this at the operator's support channel and attach the request id if possible."}
}

// RetryAfter is the Retry-After, in seconds, of a 503 for a database that
// is away: about the time a PostgreSQL failover takes.
const RetryAfter = 5

// Unavailable is the 503 of a request the service cannot serve now because
// its database is away. A client may send it again after Retry-After.
func Unavailable() *Error {
	return &Error{Status: http.StatusServiceUnavailable,
		Message: "The service is temporarily unavailable: its database cannot be reached. Please retry.",
		Header:  http.Header{"Retry-After": {strconv.Itoa(RetryAfter)}}}
}

// RetryAfterFull is the Retry-After, in seconds, of a 503 for storage
// that is full: freeing space takes the operator a while.
const RetryAfterFull = 30

// StorageFull is the 503 of a request the service cannot serve now
// because the disk it writes to is full (store.IsFull). A client may send
// it again after Retry-After; reads go on meanwhile.
func StorageFull() *Error {
	return &Error{Status: http.StatusServiceUnavailable,
		Message: "The service is temporarily unavailable: its storage is full. Please retry later.",
		Header:  http.Header{"Retry-After": {strconv.Itoa(RetryAfterFull)}}}
}

// Busy is the 503 of a request that waited too long for what other
// requests were changing (store.IsBusy): the service is busy, not away,
// and the client may send it again at once.
func Busy() *Error {
	return &Error{Status: http.StatusServiceUnavailable,
		Message: "The service is busy with other requests for the same resources. Please retry.",
		Header:  http.Header{"Retry-After": {"1"}}}
}

// ErrorRenderer writes an *Error in one service's wire shape.
type ErrorRenderer func(w http.ResponseWriter, r *http.Request, e *Error)

// NovaFaultName is the body key Nova uses for a status code
// (nova/api/openstack/wsgi.py Fault._fault_names).
func NovaFaultName(status int) string {
	switch status {
	case 400:
		return "badRequest"
	case 401:
		return "unauthorized"
	case 403:
		return "forbidden"
	case 404:
		return "itemNotFound"
	case 405:
		return "badMethod"
	case 409:
		return "conflictingRequest"
	case 413, 429:
		return "overLimit"
	case 415:
		return "badMediaType"
	case 501:
		return "notImplemented"
	case 503:
		return "serviceUnavailable"
	}
	return "computeFault"
}

// RenderNova writes {"<faultName>": {"code": N, "message": "..."}}.
func RenderNova(w http.ResponseWriter, r *http.Request, e *Error) {
	WriteJSON(w, e.Status, map[string]any{
		NovaFaultName(e.Status): map[string]any{"code": e.Status, "message": e.Message},
	})
}

// RenderKeystone writes {"error": {"code": N, "title": "...", "message": "..."}}.
func RenderKeystone(w http.ResponseWriter, r *http.Request, e *Error) {
	WriteJSON(w, e.Status, map[string]any{
		"error": map[string]any{"code": e.Status, "title": http.StatusText(e.Status), "message": e.Message},
	})
}

// RenderNeutron writes {"NeutronError": {"type": "...", "message": "...", "detail": ""}}.
func RenderNeutron(w http.ResponseWriter, r *http.Request, e *Error) {
	typ := e.Type
	if typ == "" {
		typ = neutronTypes[e.Status]
	}
	WriteJSON(w, e.Status, map[string]any{
		"NeutronError": map[string]any{"type": typ, "message": e.Message, "detail": ""},
	})
}

var neutronTypes = map[int]string{
	400: "HTTPBadRequest", 401: "HTTPUnauthorized", 403: "HTTPForbidden", 404: "HTTPNotFound",
	409: "HTTPConflict", 413: "HTTPRequestEntityTooLarge", 500: "HTTPInternalServerError",
	503: "HTTPServiceUnavailable",
}

// RenderGlance writes Glance's error shape. Glance answers webob errors, which
// clients read only for the status; we send the same JSON shape as Keystone
// so a human can read the reason.
func RenderGlance(w http.ResponseWriter, r *http.Request, e *Error) {
	WriteJSON(w, e.Status, map[string]any{
		"code": e.Status, "title": http.StatusText(e.Status), "message": e.Message,
	})
}
