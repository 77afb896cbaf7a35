package billing

import "strconv"

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// major renders minor units as a decimal with two places (e.g. 10000 →
// "100.00"), for messages only; amounts on the wire stay integers.
func major(n int64) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	return sign + strconv.FormatInt(n/100, 10) + "." + strconv.FormatInt(100+n%100, 10)[1:]
}
