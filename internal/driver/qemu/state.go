package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"nimbus/internal/driver"
)

// The desired power states kept in state.json: what the server should be,
// which an agent restart (or a host reboot) brings back.
const (
	wantRunning   = "running"
	wantShutoff   = "shutoff"
	wantPaused    = "paused"
	wantSuspended = "suspended"
)

// The files of a server's directory.
const (
	stateFile   = "state.json"
	diskFile    = "disk.qcow2"
	keptFile    = "disk.qcow2.resize" // the disk before a resize, until confirm or revert
	seedFile    = "seed.iso"
	qmpSock     = "qmp.sock"
	pidFile     = "qemu.pid"
	serialFile  = "serial.log"
	logFile     = "qemu.log"
	suspendFile = "suspend.state"
	migrateSock = "migrate.sock"
	varsFile    = "ovmf-vars.fd"
)

// state is a server's record on its host (DIR/state.json). It holds no
// secret: the spec's user data and admin password only go into the seed,
// volume keys into files of their own.
type state struct {
	Spec driver.Spec `json:"spec"`
	// Power is the desired power state (wantRunning, …).
	Power string `json:"power"`
	// Forwards maps forwarded guest ports to their host ports, chosen once.
	Forwards map[int]int `json:"forwards,omitempty"`
	// Pinning is the pCPU of each vCPU (empty: floating).
	Pinning []int `json:"pinning,omitempty"`
	// Base is the cached base image the disk's overlay reads, BaseFormat
	// its format; Kernel and Initrd the cached direct-boot files.
	Base       string `json:"base,omitempty"`
	BaseFormat string `json:"base_format,omitempty"`
	Kernel     string `json:"kernel,omitempty"`
	Initrd     string `json:"initrd,omitempty"`
	// Firmware is "bios" or "uefi" (then DIR/ovmf-vars.fd is the server's
	// own UEFI variable store).
	Firmware string    `json:"firmware,omitempty"`
	Created  time.Time `json:"created"`
}

// pinning is the pCPU of each vCPU from a spec's cells, in cell order.
func pinning(spec driver.Spec) []int {
	var p []int
	for _, c := range spec.Cells {
		p = append(p, c.CPUs...)
	}
	if len(p) != spec.VCPUs {
		// Cells that do not cover every vCPU are not a pinning the
		// scheduler made: float.
		return nil
	}
	return p
}

func readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("qemu: %s: %w", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

func writeState(dir string, st state) error {
	st.Spec.UserData, st.Spec.AdminPass = nil, ""
	// Volume keys go into their own files (volumes.go).
	vols, err := stashVolumeKeys(dir, st.Spec.Volumes)
	if err != nil {
		return err
	}
	st.Spec.Volumes = vols
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("qemu: state: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, stateFile), append(b, '\n'), 0o600)
}

// writeFileAtomic writes data to a temporary file next to path, syncs it
// and renames it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("qemu: write %s: %w", path, err)
	}
	return nil
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// validID reports whether id is a UUID in its canonical form, the only
// server ids that become path names.
func validID(id string) bool { return uuidRE.MatchString(id) }

var imageIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// validImageID reports whether an image id is safe in a file name.
func validImageID(id string) bool { return imageIDRE.MatchString(id) }

var errInvalidID = errors.New("qemu: server id is not a UUID")
