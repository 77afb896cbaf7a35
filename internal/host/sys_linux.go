package host

import (
	"fmt"
	"math"
	"syscall"
)

// filesystemGB is the size (free and used) of the filesystem holding path, in GiB.
func filesystemGB(path string) (int, error) {
	var s syscall.Statfs_t
	if err := syscall.Statfs(path, &s); err != nil {
		return 0, fmt.Errorf("host: disk %s: %w", path, err)
	}
	// f_blocks counts fragments of f_frsize bytes; old kernels leave it 0.
	unit := uint64(s.Frsize)
	if unit == 0 {
		unit = uint64(s.Bsize)
	}
	return int(uint64(s.Blocks) * unit >> 30), nil
}

// Memlock reports the RLIMIT_MEMLOCK (soft limit) of this process in bytes, or -1 when it is
// unlimited. VFIO pins all of a guest's RAM, so QEMU needs it to be at least the guest's memory;
// this is a helper for the check a host gets when it enrols.
func Memlock() (int64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(rlimitMemlock, &r); err != nil {
		return 0, fmt.Errorf("host: getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	if r.Cur > math.MaxInt64 { // RLIM_INFINITY is all ones
		return -1, nil
	}
	return int64(r.Cur), nil
}
