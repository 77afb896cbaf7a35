package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Response is what a handler returns: a status, an optional body and headers.
// A Body that is an io.Reader or []byte is sent as is (set Content-Type in
// Header); anything else is encoded as JSON.
type Response struct {
	Status int
	Body   any
	Header http.Header
}

// JSON is a response with a JSON body.
func JSON(status int, body any) *Response { return &Response{Status: status, Body: body} }

// Empty is a response with no body, such as 202 or 204.
func Empty(status int) *Response { return &Response{Status: status} }

// WithHeader sets a response header and returns the response.
func (r *Response) WithHeader(k, v string) *Response {
	if r.Header == nil {
		r.Header = http.Header{}
	}
	r.Header.Set(k, v)
	return r
}

// HandlerFunc serves one route. It returns a response or an error; it never
// writes to a ResponseWriter itself, so every error leaves through the
// service's ErrorRenderer.
type HandlerFunc func(r *http.Request) (*Response, error)

// Route is one endpoint declared as data.
type Route struct {
	// Pattern is a net/http ServeMux pattern with a method, e.g.
	// "GET /v2.1/servers/{id}".
	Pattern string
	Handler HandlerFunc
	// Public routes need no token (version documents, token issue).
	Public bool
	// AdminOnly routes answer 403 to callers without the admin role.
	AdminOnly bool
	// Policy names the rule in the 403 message of an AdminOnly route.
	Policy string
	// MaxBody overrides the default request body limit (bytes).
	MaxBody int64
}

// Authenticator validates a token from X-Auth-Token.
type Authenticator interface {
	Validate(ctx context.Context, token string) (*Caller, error)
}

// Service is one OpenStack service (identity, compute, …) on its own listener.
type Service struct {
	Name   string
	Render ErrorRenderer
	Auth   Authenticator
	// Prefix hooks run on every request before routing, e.g. to strip Nova's
	// optional project id or to parse microversions. They may answer an
	// error, which is rendered by the service.
	Before []func(r *http.Request) (*http.Request, error)
	// AfterAuth hooks run on authenticated routes once the caller is known.
	AfterAuth []func(r *http.Request) error
	// AuthURL is sent in WWW-Authenticate on 401 answers.
	AuthURL string
	// Log gets one line per request.
	Log *slog.Logger
	// Decorate adds headers to every response (microversion echoes).
	Decorate func(w http.ResponseWriter, r *http.Request)
	// Deadline, when set, ends a request's context after this long, so
	// that a database that stops answering (a primary frozen rather than
	// dead) holds a request and its pooled connection no longer than the
	// listener could still send the answer; the request answers 503.
	Deadline time.Duration

	mux *http.ServeMux
}

// DefaultMaxBody is the request body limit for JSON APIs, the size of Nova's
// osapi_max_request_body_size.
const DefaultMaxBody = 114688

// NewService makes a service with an empty route table.
func NewService(name string, render ErrorRenderer, auth Authenticator) *Service {
	return &Service{Name: name, Render: render, Auth: auth, mux: http.NewServeMux(), Log: slog.Default()}
}

// Handle registers routes.
func (s *Service) Handle(routes ...Route) {
	for _, rt := range routes {
		s.mux.Handle(rt.Pattern, s.wrap(rt))
	}
}

type requestIDKey struct{}

// RequestID is the request id of the request that ctx belongs to.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// ServeHTTP runs the request through the service's hooks and routes.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := "req-" + uuid.NewString()
	w.Header().Set("X-Openstack-Request-Id", rid)
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, rid))
	rec := &statusRecorder{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			s.Log.Error("panic", "service", s.Name, "request_id", rid, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if rec.status == 0 {
				s.renderError(rec, r, AsError(fmt.Errorf("panic")))
			}
		}
		observe(s.Name, r, rec.status, time.Since(start))
		s.Log.Info("request", "service", s.Name, "request_id", rid, "client", ClientAddress(r), "method", r.Method,
			"path", r.URL.Path, "status", rec.status, "duration_ms", float64(time.Since(start).Microseconds())/1000)
	}()
	if !ValidText(r.URL.Path) {
		s.renderError(rec, r, NotFound("The resource could not be found."))
		return
	}
	for _, hook := range s.Before {
		nr, err := hook(r)
		if err != nil {
			s.renderError(rec, r, AsError(err))
			return
		}
		r = nr
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		// No route: ServeMux would answer in plain text. Answer in the
		// service's shape, 405 when the path exists for another method.
		probe := httptestRecorder{}
		h.ServeHTTP(&probe, r)
		if probe.status == http.StatusMethodNotAllowed {
			rec.Header().Set("Allow", probe.header.Get("Allow"))
			s.renderError(rec, r, Errorf(http.StatusMethodNotAllowed, "The method is not allowed for the requested URL."))
			return
		}
		s.renderError(rec, r, NotFound("The resource could not be found."))
		return
	}
	// Serve through the mux, not h, so that r.PathValue works in handlers.
	s.mux.ServeHTTP(rec, r)
}

func (s *Service) renderError(w http.ResponseWriter, r *http.Request, e *Error) {
	if s.Decorate != nil {
		s.Decorate(w, r)
	}
	for k, v := range e.Header {
		w.Header()[k] = v
	}
	if e.Status == http.StatusUnauthorized {
		if s.AuthURL != "" {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf("Keystone uri=%q", s.AuthURL))
		}
		// keystonemiddleware answers 401 in Keystone's shape on every service.
		RenderKeystone(w, r, e)
		return
	}
	if e.Status >= 500 {
		args := []any{"service", s.Name, "request_id", RequestID(r.Context()), "error", e.Message}
		if e.Cause != nil {
			args = append(args, "cause", e.Cause.Error())
		}
		if e.Status == http.StatusServiceUnavailable {
			s.Log.Warn("service unavailable", args...)
		} else {
			s.Log.Error("server error", args...)
		}
	}
	s.Render(w, r, e)
}

func (s *Service) wrap(rt Route) http.Handler {
	maxBody := rt.MaxBody
	if maxBody == 0 {
		maxBody = DefaultMaxBody
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.Deadline > 0 {
			ctx, cancel := context.WithTimeout(r.Context(), s.Deadline)
			defer cancel()
			r = r.WithContext(ctx)
		}
		if !rt.Public {
			caller, err := s.authenticate(r)
			if err != nil {
				s.renderError(w, r, AsError(err))
				return
			}
			if rt.AdminOnly && !caller.IsAdmin() {
				policy := rt.Policy
				if policy == "" {
					policy = s.Name + ":admin"
				}
				s.renderError(w, r, PolicyForbidden(policy))
				return
			}
			r = r.WithContext(WithCaller(r.Context(), caller))
			for _, hook := range s.AfterAuth {
				if err := hook(r); err != nil {
					s.renderError(w, r, AsError(err))
					return
				}
			}
		}
		orig := r.Body
		body := &overLimitBody{ReadCloser: http.MaxBytesReader(w, r.Body, maxBody)}
		defer func() {
			if r.ContentLength > maxBody || body.hit {
				drain(w, orig, r.ContentLength)
			}
		}()
		if r.ContentLength > maxBody {
			s.renderError(w, r, OverLimit("Request is too large."))
			return
		}
		r.Body = body
		if err := checkText(r, maxBody <= DefaultMaxBody*16); err != nil {
			s.renderError(w, r, err)
			return
		}
		resp, err := rt.Handler(r)
		if err != nil {
			s.renderError(w, r, AsError(err))
			return
		}
		if s.Decorate != nil {
			s.Decorate(w, r)
		}
		writeResponse(w, resp)
	})
}

func (s *Service) authenticate(r *http.Request) (*Caller, error) {
	token := r.Header.Get("X-Auth-Token")
	if token == "" || s.Auth == nil {
		return nil, Unauthorized()
	}
	return s.Auth.Validate(r.Context(), token)
}

func writeResponse(w http.ResponseWriter, resp *Response) {
	if resp == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	status := resp.Status
	if status == 0 {
		status = http.StatusOK
	}
	switch b := resp.Body.(type) {
	case nil:
		if status != http.StatusNoContent && status != http.StatusNotModified && w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "0")
		}
		w.WriteHeader(status)
	case []byte:
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(status)
		w.Write(b)
	case io.Reader:
		w.WriteHeader(status)
		io.Copy(w, b)
		if c, ok := b.(io.Closer); ok {
			c.Close()
		}
	default:
		WriteJSON(w, status, b)
	}
}

// WriteJSON writes v as a JSON body.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"code":500,"message":"response encoding failed"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (deadlines).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush lets streaming bodies reach the client.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// httptestRecorder captures what ServeMux's own not-found handler would do,
// to tell 404 from 405.
type httptestRecorder struct {
	header http.Header
	status int
}

func (h *httptestRecorder) Header() http.Header {
	if h.header == nil {
		h.header = http.Header{}
	}
	return h.header
}
func (h *httptestRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (h *httptestRecorder) WriteHeader(code int)        { h.status = code }

// BaseURL is the scheme and host the client used, for links in bodies.
func BaseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if p := r.Header.Get("X-Forwarded-Proto"); p == "http" || p == "https" {
		scheme = p
	}
	return scheme + "://" + r.Host
}

// TrimSlash removes one trailing slash from a path.
func TrimSlash(p string) string {
	if len(p) > 1 && strings.HasSuffix(p, "/") {
		return p[:len(p)-1]
	}
	return p
}
