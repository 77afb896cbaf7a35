package netplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"nimbus/internal/fleet/wire"
)

// The metadata proxy takes guests' requests to 169.254.169.254 in a
// network's DHCP namespace and relays each to the controller's metadata
// service with the network and the guest's source address, as Neutron's
// metadata proxy does; the controller identifies the server and decides
// what it may read.

const (
	// maxMetadataBody bounds a POST (a Windows guest's password).
	maxMetadataBody = 256 << 10
	// metadataTimeout bounds the controller's answer to one request.
	metadataTimeout = 15 * time.Second
)

type metadataProxy struct {
	srv  *http.Server
	done chan struct{}
}

type metadataHandler struct {
	networkID string
	data      *atomic.Pointer[dhcpData]
	src       MetadataSource
	log       *slog.Logger
}

// startMetadataProxy listens on 169.254.169.254:80 in namespace path.
func startMetadataProxy(path, networkID string, data *atomic.Pointer[dhcpData], src MetadataSource, log *slog.Logger) (*metadataProxy, error) {
	var ln net.Listener
	err := inNS(path, func() error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(metadataAddr.Addr().String(), "80"))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("metadata proxy: %w", err)
	}
	p := &metadataProxy{
		srv: &http.Server{
			Handler: &metadataHandler{networkID: networkID, data: data, src: src, log: log},
			// A guest that sends or reads slowly holds a connection no
			// longer than this.
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      metadataTimeout + 30*time.Second,
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    32 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(p.done)
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metadata proxy", "err", err)
		}
	}()
	return p, nil
}

func (p *metadataProxy) close() error {
	err := p.srv.Close()
	<-p.done
	return err
}

func (h *metadataHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	src, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		http.Error(w, "bad source address", http.StatusBadRequest)
		return
	}
	var body []byte
	if r.Method == http.MethodPost {
		if body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxMetadataBody)); err != nil {
			http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), metadataTimeout)
	defer cancel()
	resp, err := h.src.Metadata(ctx, wire.MetadataRequest{
		Host:      h.data.Load().host,
		NetworkID: h.networkID,
		SourceIP:  src.Addr().Unmap().String(),
		Method:    r.Method,
		Path:      r.URL.RequestURI(),
		Body:      body,
	})
	if err != nil || resp.Status < 100 || resp.Status > 999 {
		h.log.Warn("metadata request", "source", src.Addr(), "path", r.URL.Path, "err", err, "status", resp.Status)
		http.Error(w, "metadata service unavailable", http.StatusBadGateway)
		return
	}
	// The service's answer as it is: no content type sniffed for it.
	if resp.ContentType != "" {
		w.Header().Set("Content-Type", resp.ContentType)
	} else {
		w.Header()["Content-Type"] = nil
	}
	hasBody := resp.Status >= 200 && resp.Status != http.StatusNoContent && resp.Status != http.StatusNotModified
	if hasBody {
		// Told for HEAD too, where no body follows.
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if hasBody && r.Method != http.MethodHead {
		_, _ = w.Write(resp.Body)
	}
}
