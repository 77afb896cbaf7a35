package qemu

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"sync"
)

// portPool hands out the host ports that forward to servers' guest ports.
// A port is taken once for a server and kept in its state.json; the pool
// knows every server's ports, and checks that a port it hands out is free
// on the host by binding it briefly (QEMU binds it for good later).
type portPool struct {
	lo, hi int
	bind   string // the address to test ports on ("" = all)

	mu   sync.Mutex
	used map[int]string // port → server id
}

func newPortPool(lo, hi int, bind string) *portPool {
	return &portPool{lo: lo, hi: hi, bind: bind, used: map[int]string{}}
}

// claim records ports already kept by a server (read at start).
func (p *portPool) claim(id string, ports map[int]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, hp := range ports {
		p.used[hp] = id
	}
}

// release forgets a server's ports.
func (p *portPool) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for hp, owner := range p.used {
		if owner == id {
			delete(p.used, hp)
		}
	}
}

// drop forgets one port.
func (p *portPool) drop(port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.used, port)
}

var errNoPorts = errors.New("qemu: no free host port left in the port range")

// take finds a free port for server id, starting at the server's preferred
// port so that a server placed again (unshelve, a new host with the same
// range) gets the port its owner already knows whenever it is still free.
func (p *portPool) take(id string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.hi - p.lo + 1
	if n <= 0 {
		return 0, errNoPorts
	}
	start := preferredOffset(id, n)
	for i := 0; i < n; i++ {
		port := p.lo + (start+i)%n
		if _, ok := p.used[port]; ok {
			continue
		}
		if !portFree(p.bind, port) {
			continue
		}
		p.used[port] = id
		return port, nil
	}
	return 0, fmt.Errorf("%w (%d-%d)", errNoPorts, p.lo, p.hi)
}

// preferredOffset is where in a range of n ports server id looks first: a
// hash of the id, the same on every host and after every restart.
func preferredOffset(id string, n int) int {
	h := fnv.New64a()
	h.Write([]byte(id))
	return int(h.Sum64() % uint64(n))
}

// portFree reports whether a TCP port can be bound on addr.
func portFree(addr string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
