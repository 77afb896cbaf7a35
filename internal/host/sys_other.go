//go:build !linux

package host

import "errors"

var errNotLinux = errors.New("host: needs Linux")

func filesystemGB(string) (int, error) { return 0, errNotLinux }

// Memlock reports the RLIMIT_MEMLOCK of this process; on this system it
// only returns an error, as VFIO is Linux's.
func Memlock() (int64, error) { return 0, errNotLinux }
