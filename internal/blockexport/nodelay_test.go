package blockexport

import (
	"syscall"
	"testing"
)

// TestListenNoDelay: the socket a daemon accepts its clients from has
// Nagle's algorithm off, which its connections inherit.
func TestListenNoDelay(t *testing.T) {
	e := &Exporter{addr: "127.0.0.1", log: quietLog()}
	ln, err := e.listen(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := ln.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	raw.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY) })
	if gerr != nil || v == 0 {
		t.Errorf("TCP_NODELAY = %d (%v), want on", v, gerr)
	}
}
