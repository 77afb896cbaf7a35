package host

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// maxCPUID bounds the ids a CPU list may hold, so that a corrupt "0-4294967295"
// cannot make us allocate gigabytes; Linux's NR_CPUS tops out at 8192.
const maxCPUID = 1 << 16

// parseCPUList parses the kernel's CPU list format ("0-3,8,10-11", as in
// /sys/devices/system/cpu/online; "" is the empty list) into sorted,
// distinct ids.
func parseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var ids []int
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseCPUID(lo)
		if err != nil {
			return nil, fmt.Errorf("bad CPU list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = parseCPUID(hi); err != nil {
				return nil, fmt.Errorf("bad CPU list %q: %w", s, err)
			}
			if b < a {
				return nil, fmt.Errorf("bad CPU list %q: range %q runs backwards", s, part)
			}
		}
		for id := a; id <= b; id++ {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// parseCPUID accepts only plain decimal digits: strconv.Atoi alone would let
// "+1" and " 1" through.
func parseCPUID(s string) (int, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a CPU number", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n >= maxCPUID {
		return 0, fmt.Errorf("CPU number %q out of range", s)
	}
	return n, nil
}
