package billing

import (
	"errors"
	"math"
)

// ErrOverflow is an amount that does not fit int64 minor units: money
// arithmetic answers it instead of wrapping around.
var ErrOverflow = errors.New("amount out of range")

// MaxAmount bounds every credit limit and Config.MaxBalance whatever the
// configuration (10^15 minor units), so sums of a few of them stay far
// inside int64.
const MaxAmount = 1_000_000_000_000_000

// addMoney is a+b, or ErrOverflow.
func addMoney(a, b int64) (int64, error) {
	if (b > 0 && a > math.MaxInt64-b) || (b < 0 && a < math.MinInt64-b) {
		return 0, ErrOverflow
	}
	return a + b, nil
}

// mulMoney is a×b, or ErrOverflow.
func mulMoney(a, b int64) (int64, error) {
	if a == 0 || b == 0 {
		return 0, nil
	}
	p := a * b
	if p/b != a || (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) {
		return 0, ErrOverflow
	}
	return p, nil
}

// sumSplit is the divisor of splitSum's two sums.
const sumSplit = 1_000_000_000

// splitSum is SQL for the sum of an integer expression as two sums, of
// its quotient and remainder by sumSplit: neither can overflow in SQL
// (SQLite fails a SUM past int64 with "integer overflow" for the whole
// query, and PostgreSQL's numeric SUM does not scan into int64), so one
// account whose total is out of range cannot break a query over every
// account. joinSum puts the two together.
func splitSum(expr string) string {
	return "COALESCE(SUM((" + expr + ") / 1000000000), 0), COALESCE(SUM((" + expr + ") % 1000000000), 0)"
}

// joinSum is hi×sumSplit + lo, the total splitSum read, or ErrOverflow.
func joinSum(hi, lo int64) (int64, error) {
	v, err := mulMoney(hi, sumSplit)
	if err != nil {
		return 0, err
	}
	return addMoney(v, lo)
}
