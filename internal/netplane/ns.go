package netplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// namedNSDir is where named namespaces are bind-mounted (as iproute2's
// "ip netns" does), so that they outlive the process that made them.
const namedNSDir = "/run/netns"

// openNS opens namespace path; "" is the calling process's own.
func openNS(path string) (netns.NsHandle, error) {
	if path == "" {
		return netns.GetFromPid(os.Getpid())
	}
	return netns.GetFromPath(path)
}

// nsHandle is a netlink handle working in namespace path ("" the
// process's own).
func nsHandle(path string) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle()
	}
	ns, err := openNS(path)
	if err != nil {
		return nil, fmt.Errorf("netplane: namespace %s: %w", path, err)
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// inNS runs fn on an OS thread switched into namespace path, for what is
// bound to the namespace it is made in (sockets, nftables connections,
// named namespaces made from there). The thread is put back before it is
// released; if it cannot be, it is never given back to the runtime.
func inNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := openNS(path)
	if err != nil {
		return fmt.Errorf("netplane: namespace %s: %w", path, err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netplane: enter namespace %s: %w", path, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: it dies with its goroutine instead of
		// running other goroutines in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("netplane: leave namespace %s: %w", path, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// ensureNamedNS makes named namespace name unless it exists and returns
// its path. A new namespace starts empty; its loopback is brought up.
func ensureNamedNS(name string) (string, error) {
	path := filepath.Join(namedNSDir, name)
	if h, err := netns.GetFromPath(path); err == nil {
		h.Close()
		return path, nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return "", err
	}
	defer orig.Close()
	h, err := netns.NewNamed(name) // switches this thread into it
	if err != nil {
		_ = netns.Set(orig)
		return "", fmt.Errorf("netplane: make namespace %s: %w", name, err)
	}
	defer h.Close()
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	if err := netns.Set(orig); err != nil {
		runtime.LockOSThread() // never give this thread back
		return "", err
	}
	return path, nil
}

// deleteNamedNS removes named namespace name; a missing one is no error.
func deleteNamedNS(name string) error {
	err := netns.DeleteNamed(name)
	if err != nil && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// namedNS lists the named namespaces whose names start with prefix.
func namedNS(prefix string) ([]string, error) {
	es, err := os.ReadDir(namedNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
