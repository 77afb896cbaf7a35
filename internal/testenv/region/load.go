package region

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
)

// Request is one request of a load and how it ended.
type Request struct {
	Op         string // keypair, security group, server, list
	Start, End time.Time
	Status     int // 0: no answer (see Err)
	Err        error
	Body       []byte // an error's body
	RetryAfter string
	ID         string // what a create answered: a keypair's name, an id
}

// Hung tells whether the request had no answer within its deadline.
func (r Request) Hung() bool { return r.Status == 0 && errors.Is(r.Err, context.DeadlineExceeded) }

// Load is a light load of API writes, with a read among them: workers
// that create keypairs (Nova), security groups (Neutron) and servers, and
// list servers, each request with a deadline.
type Load struct {
	Compute, Network *gophercloud.ServiceClient
	// Image, Flavor and Net are what servers boot; no servers when empty.
	Image, Flavor, Net string
	Deadline           time.Duration
	Every              time.Duration // a worker's pause between requests
	// Volumes and Images, when set, add a worker's volume creates (1 GB)
	// and another's image creates, each followed by an upload of
	// ImageBytes of data.
	Volumes, Images *gophercloud.ServiceClient
	ImageBytes      int

	mu   sync.Mutex
	reqs []Request
	n    atomic.Int64
}

// Run starts workers until stop is called; stop returns every request of
// this run.
func (l *Load) Run(workers int) (stop func() []Request) {
	l.mu.Lock()
	l.reqs = nil
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			one := func(op func(context.Context) Request) func(context.Context) []Request {
				return func(ctx context.Context) []Request { return []Request{op(ctx)} }
			}
			ops := []func(context.Context) []Request{one(l.keypair), one(l.securityGroup), one(l.list)}
			if w == 0 && l.Image != "" {
				ops = append(ops, one(l.server))
			}
			if w == 1 && l.Volumes != nil {
				ops = append(ops, one(l.volume))
			}
			if w == 2 && l.Images != nil {
				ops = append(ops, l.image)
			}
			for i := w; ctx.Err() == nil; i++ {
				rctx, rcancel := context.WithTimeout(context.Background(), l.Deadline)
				rs := ops[i%len(ops)](rctx)
				rcancel()
				l.mu.Lock()
				l.reqs = append(l.reqs, rs...)
				l.mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(l.Every):
				}
			}
		}()
	}
	return func() []Request {
		cancel()
		wg.Wait()
		l.mu.Lock()
		defer l.mu.Unlock()
		sort.Slice(l.reqs, func(i, j int) bool { return l.reqs[i].Start.Before(l.reqs[j].Start) })
		return append([]Request(nil), l.reqs...)
	}
}

func (l *Load) do(ctx context.Context, op string, sc *gophercloud.ServiceClient, method, url string, body any, ok int, id func(map[string]any) string) Request {
	r := Request{Op: op, Start: time.Now()}
	var out map[string]any
	opts := &gophercloud.RequestOpts{JSONBody: body, JSONResponse: &out, OkCodes: []int{ok}}
	resp, err := sc.Request(ctx, method, url, opts)
	r.End = time.Now()
	if err == nil {
		r.Status = resp.StatusCode
		if id != nil {
			r.ID = id(out)
		}
		return r
	}
	return Answered(ctx, r, 0, err)
}

// Answered completes r, a request made in ctx, from how gophercloud ended
// it: ok when err is nil, else the status, body and Retry-After of an
// answer, or no answer (Hung when ctx's deadline passed).
func Answered(ctx context.Context, r Request, ok int, err error) Request {
	var ue gophercloud.ErrUnexpectedResponseCode
	switch {
	case err == nil:
		r.Status = ok
	case errors.As(err, &ue):
		r.Status, r.Body, r.RetryAfter = ue.Actual, ue.Body, ue.ResponseHeader.Get("Retry-After")
	default:
		r.Err = err
		if ctx.Err() != nil {
			r.Err = fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
		}
	}
	return r
}

func field(out map[string]any, obj, key string) string {
	o, _ := out[obj].(map[string]any)
	s, _ := o[key].(string)
	return s
}

func (l *Load) keypair(ctx context.Context) Request {
	name := fmt.Sprintf("load-%d", l.n.Add(1))
	return l.do(ctx, "keypair", l.Compute, http.MethodPost, l.Compute.ServiceURL("os-keypairs"),
		map[string]any{"keypair": map[string]any{"name": name}}, http.StatusOK,
		func(out map[string]any) string { return field(out, "keypair", "name") })
}

func (l *Load) securityGroup(ctx context.Context) Request {
	name := fmt.Sprintf("load-%d", l.n.Add(1))
	return l.do(ctx, "security group", l.Network, http.MethodPost, l.Network.ServiceURL("security-groups"),
		map[string]any{"security_group": map[string]any{"name": name}}, http.StatusCreated,
		func(out map[string]any) string { return field(out, "security_group", "id") })
}

func (l *Load) server(ctx context.Context) Request {
	name := fmt.Sprintf("load-%d", l.n.Add(1))
	return l.do(ctx, "server", l.Compute, http.MethodPost, l.Compute.ServiceURL("servers"),
		map[string]any{"server": map[string]any{"name": name, "imageRef": l.Image, "flavorRef": l.Flavor,
			"networks": []map[string]string{{"uuid": l.Net}}}}, http.StatusAccepted,
		func(out map[string]any) string { return field(out, "server", "id") })
}

func (l *Load) volume(ctx context.Context) Request {
	name := fmt.Sprintf("load-%d", l.n.Add(1))
	return l.do(ctx, "volume", l.Volumes, http.MethodPost, l.Volumes.ServiceURL("volumes"),
		map[string]any{"volume": map[string]any{"name": name, "size": 1}}, http.StatusAccepted,
		func(out map[string]any) string { return field(out, "volume", "id") })
}

// image makes an image record and, when that succeeds, uploads its data:
// two requests.
func (l *Load) image(ctx context.Context) []Request {
	name := fmt.Sprintf("load-%d", l.n.Add(1))
	r := l.do(ctx, "image", l.Images, http.MethodPost, l.Images.ServiceURL("images"),
		map[string]any{"name": name, "disk_format": "raw", "container_format": "bare"}, http.StatusCreated,
		func(out map[string]any) string { s, _ := out["id"].(string); return s })
	if r.Status != http.StatusCreated || r.ID == "" {
		return []Request{r}
	}
	u := Request{Op: "image data", Start: time.Now(), ID: r.ID}
	resp, err := l.Images.Request(ctx, http.MethodPut, l.Images.ServiceURL("images", r.ID, "file"), &gophercloud.RequestOpts{
		RawBody: bytes.NewReader(imageData(l.ImageBytes)), MoreHeaders: map[string]string{"Content-Type": "application/octet-stream"},
		OkCodes: []int{http.StatusNoContent}})
	u.End = time.Now()
	var ue gophercloud.ErrUnexpectedResponseCode
	switch {
	case err == nil:
		u.Status = resp.StatusCode
	case errors.As(err, &ue):
		u.Status, u.Body, u.RetryAfter = ue.Actual, ue.Body, ue.ResponseHeader.Get("Retry-After")
	default:
		u.Err = err
		if ctx.Err() != nil {
			u.Err = fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
		}
	}
	return []Request{r, u}
}

// imageData is an upload of n bytes that compress badly.
func imageData(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func (l *Load) list(ctx context.Context) Request {
	return l.do(ctx, "list", l.Compute, http.MethodGet, l.Compute.ServiceURL("servers")+"?limit=5", nil, http.StatusOK, nil)
}

// Missing is the acknowledged creates that do not exist now: a write a
// client saw succeed and the region lost.
func (l *Load) Missing(t testing.TB, reqs []Request) []Request {
	t.Helper()
	var lost []Request
	for _, r := range reqs {
		if r.Status/100 != 2 || r.Op == "list" {
			continue
		}
		if r.ID == "" {
			t.Errorf("%s answered %d without an id", r.Op, r.Status)
			continue
		}
		var sc *gophercloud.ServiceClient
		var url string
		switch r.Op {
		case "keypair":
			sc, url = l.Compute, l.Compute.ServiceURL("os-keypairs", r.ID)
		case "security group":
			sc, url = l.Network, l.Network.ServiceURL("security-groups", r.ID)
		case "server":
			sc, url = l.Compute, l.Compute.ServiceURL("servers", r.ID)
		case "volume":
			sc, url = l.Volumes, l.Volumes.ServiceURL("volumes", r.ID)
		case "image", "image data":
			sc, url = l.Images, l.Images.ServiceURL("images", r.ID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var out map[string]any
		_, err := sc.Get(ctx, url, &out, &gophercloud.RequestOpts{OkCodes: []int{200}})
		cancel()
		if err != nil {
			if !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
				t.Fatalf("check %s %s: %v", r.Op, r.ID, err)
			}
			lost = append(lost, r)
			continue
		}
		// An upload acknowledged has its data: the image is active, of
		// the size sent.
		if r.Op == "image data" && (out["status"] != "active" || fmt.Sprint(out["size"]) != strconv.Itoa(l.ImageBytes)) {
			lost = append(lost, r)
		}
	}
	return lost
}

// Summary counts a load's requests by how they ended.
type Summary struct {
	Total, OK, Unavailable, Hung, NoAnswer int
	Created                                int         // creates that answered 2xx
	Other                                  map[int]int // other statuses
	// FirstFailure and LastFailure bound the requests that did not
	// succeed (zero when all did).
	FirstFailure, LastFailure time.Time
	// Slowest is the longest a request that was answered waited: how
	// close the region came to its clients' deadline.
	Slowest time.Duration
}

// Summarize counts reqs, checking that every 503 has OpenStack's error body
// for its service and a Retry-After.
func Summarize(t testing.TB, reqs []Request) Summary {
	t.Helper()
	s := Summary{Total: len(reqs), Other: map[int]int{}}
	logged := 0
	logf := func(format string, args ...any) {
		if logged++; logged <= 20 {
			t.Logf(format, args...)
		}
	}
	for _, r := range reqs {
		if r.Status != 0 {
			s.Slowest = max(s.Slowest, r.End.Sub(r.Start))
		}
		switch {
		case r.Status/100 == 2:
			s.OK++
			if r.Op != "list" {
				s.Created++
			}
			continue
		case r.Status == http.StatusServiceUnavailable:
			s.Unavailable++
			if err := check503(r); err != nil && logged < 20 {
				logged++
				t.Errorf("%s at %s: %v", r.Op, r.Start.Format("15:04:05.000"), err)
			}
		case r.Hung():
			s.Hung++
			logf("%s at %s: no answer within its deadline", r.Op, r.Start.Format("15:04:05.000"))
		case r.Status == 0:
			s.NoAnswer++
			logf("%s at %s: no answer: %v", r.Op, r.Start.Format("15:04:05.000"), r.Err)
		default:
			s.Other[r.Status]++
			logf("%s at %s: %d %s", r.Op, r.Start.Format("15:04:05.000"), r.Status, r.Body)
		}
		if s.FirstFailure.IsZero() || r.Start.Before(s.FirstFailure) {
			s.FirstFailure = r.Start
		}
		if r.End.After(s.LastFailure) {
			s.LastFailure = r.End
		}
	}
	return s
}

func (s Summary) String() string {
	return fmt.Sprintf("%d requests: %d succeeded (%d creates), %d answered 503, %d hung past their deadline, %d had no answer, others %v; the slowest answer took %.1f s",
		s.Total, s.OK, s.Created, s.Unavailable, s.Hung, s.NoAnswer, s.Other, s.Slowest.Seconds())
}

// check503 holds a 503 to its service's error body: Nova's (and Cinder's)
// {"serviceUnavailable": {"code": 503, ...}}, Neutron's NeutronError,
// Keystone's {"error": {"code": 503}}, Glance's {"code": 503, "title":
// ...}; and a Retry-After in seconds.
func check503(r Request) error {
	if n, err := strconv.Atoi(r.RetryAfter); err != nil || n < 1 {
		return fmt.Errorf("503 with Retry-After %q", r.RetryAfter)
	}
	var glance struct {
		Code  int    `json:"code"`
		Title string `json:"title"`
	}
	if json.Unmarshal(r.Body, &glance) == nil && glance.Code == 503 && glance.Title != "" {
		return nil // Glance's {"code": 503, "title": ..., "message": ...}
	}
	var body map[string]map[string]any
	if err := json.Unmarshal(r.Body, &body); err != nil {
		return fmt.Errorf("503 body %q: %v", r.Body, err)
	}
	switch {
	case body["serviceUnavailable"] != nil:
		if body["serviceUnavailable"]["code"] != float64(503) {
			return fmt.Errorf("503 body %s", r.Body)
		}
	case body["NeutronError"] != nil:
		if body["NeutronError"]["type"] != "HTTPServiceUnavailable" {
			return fmt.Errorf("503 body %s", r.Body)
		}
	case body["error"] != nil:
		if body["error"]["code"] != float64(503) {
			return fmt.Errorf("503 body %s", r.Body)
		}
	default:
		return fmt.Errorf("503 body not in an OpenStack shape: %s", r.Body)
	}
	if want := map[string]string{"security group": "NeutronError"}[r.Op]; want != "" && !strings.Contains(string(r.Body), want) {
		return fmt.Errorf("a Neutron request answered %s", r.Body)
	}
	return nil
}
