package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"nimbus/internal/fleet/wire"
	"nimbus/internal/netstate"
)

// DataPlane is the controller's side of the bridged data plane, as the
// agent API serves it: each host's desired network state, the change
// feed, and the metadata service behind the agents' proxies.
type DataPlane interface {
	// HostState is host's desired network state now.
	HostState(ctx context.Context, host string) (*netstate.Host, error)
	// WaitHost returns once host's state may differ from held, the last
	// HostState answered for it, or when ctx ends. It may return with
	// nothing new (the caller asks HostState again); it must not sleep
	// through a change of the host's content. A data plane is to find
	// which hosts a change touched without building every host's state
	// once per waiting poll.
	WaitHost(ctx context.Context, host string, held *netstate.Host)
	// Metadata answers a guest's metadata request for the server behind
	// req, one running on one of agentHosts; ErrNoServer when none is.
	Metadata(ctx context.Context, agentHosts []string, req wire.MetadataRequest) (wire.MetadataResponse, error)
}

// ErrNoServer is DataPlane.Metadata's answer when no server on the
// calling agent's hosts has the request's address.
var ErrNoServer = errors.New("fleet: no server of this agent's hosts has that address")

// netStateWait is the longest wait of a PathNetState long-poll;
// maxMetadataBody bounds a metadata request (a Windows password is
// POSTed).
const (
	netStateWait    = 25 * time.Second
	maxMetadataBody = 64 << 10
)

// netServing is the agent API's data plane and what it last told each
// host.
type netServing struct {
	mu     sync.Mutex
	dp     DataPlane
	served map[string]servedState // host → last answer
}

type servedState struct {
	rev int64
	sum [32]byte
}

// SetDataPlane connects the data plane; without it the netstate and
// metadata calls answer 404 (a controller of user-mode hosts only).
func (s *Service) SetDataPlane(dp DataPlane) {
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	s.net.dp = dp
}

func (s *Service) dataPlane() (DataPlane, error) {
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	if s.net.dp == nil {
		return nil, &apiError{http.StatusNotFound, wire.CodeNotFound, "this controller serves no bridged data plane"}
	}
	return s.net.dp, nil
}

// Digest identifies a host state's content, its revision aside.
func Digest(st *netstate.Host) [32]byte {
	c := *st
	c.Revision = 0
	b, _ := json.Marshal(&c)
	return sha256.Sum256(b)
}

// presents refuses a host the agent does not present.
func (s *Service) presents(ctx context.Context, agent, host string) ([]string, error) {
	hosts, err := s.hostsOf(ctx, agent)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(hosts, host) {
		return nil, &apiError{http.StatusForbidden, wire.CodeForbidden, "this agent does not present host " + host}
	}
	return hosts, nil
}

// handleNetState long-polls for the host's state newer than what the
// agent holds. An answer the agent holds already (same content at its
// revision) does not end the wait: every change raises the one revision
// of the whole data plane, and most change nothing on most hosts. When
// the wait ends with nothing new the answer carries the agent's revision.
func (s *Service) handleNetState(ctx context.Context, agent string, body []byte) (int, any, error) {
	var req wire.NetStateRequest
	if err := decode(body, &req); err != nil {
		return 0, nil, err
	}
	dp, err := s.dataPlane()
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.presents(ctx, agent, req.Host); err != nil {
		return 0, nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, netStateWait)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-wctx.Done():
		}
	}()
	for {
		st, err := dp.HostState(ctx, req.Host)
		if err != nil {
			return 0, nil, err
		}
		if s.news(req, st) {
			return http.StatusOK, st, nil
		}
		if wctx.Err() != nil {
			st.Revision = req.After
			return http.StatusOK, st, nil
		}
		dp.WaitHost(wctx, req.Host, st)
	}
}

// news reports whether st is news to an agent holding revision after,
// and if so records it as served.
func (s *Service) news(req wire.NetStateRequest, st *netstate.Host) bool {
	if st.Revision <= req.After {
		return false
	}
	sum := Digest(st)
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	if prev, ok := s.net.served[req.Host]; ok && prev.rev == req.After && prev.sum == sum {
		return false
	}
	if s.net.served == nil {
		s.net.served = map[string]servedState{}
	}
	s.net.served[req.Host] = servedState{st.Revision, sum}
	return true
}

// handleMetadata relays a guest's metadata request for a server on one of
// the agent's hosts.
func (s *Service) handleMetadata(ctx context.Context, agent string, body []byte) (int, any, error) {
	var req wire.MetadataRequest
	if err := decode(body, &req); err != nil {
		return 0, nil, err
	}
	switch {
	case req.Host == "" || req.NetworkID == "" || req.SourceIP == "":
		return 0, nil, badRequest("host, network_id and source_ip are required")
	case req.Method != http.MethodGet && req.Method != http.MethodHead && req.Method != http.MethodPost:
		return 0, nil, badRequest("method must be GET, HEAD or POST")
	case !strings.HasPrefix(req.Path, "/") || len(req.Path) > 1024:
		return 0, nil, badRequest("path must start with / and be at most 1024 bytes")
	}
	dp, err := s.dataPlane()
	if err != nil {
		return 0, nil, err
	}
	hosts, err := s.presents(ctx, agent, req.Host)
	if err != nil {
		return 0, nil, err
	}
	resp, err := dp.Metadata(ctx, hosts, req)
	if errors.Is(err, ErrNoServer) {
		return 0, nil, &apiError{http.StatusNotFound, wire.CodeNotFound, err.Error()}
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, resp, nil
}
