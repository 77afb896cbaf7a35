package host

import (
	"slices"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "", want: nil},
		{in: "\n", want: nil},
		{in: "0", want: []int{0}},
		{in: "0\n", want: []int{0}},
		{in: "0-3,8,10-11", want: []int{0, 1, 2, 3, 8, 10, 11}},
		{in: "5,32", want: []int{5, 32}},
		{in: "4-5", want: []int{4, 5}},
		{in: "7-7", want: []int{7}},
		{in: "8,0-1,1", want: []int{0, 1, 8}}, // the kernel never writes this, but it means one set
		{in: "2-15,18-31,34-47,50-63", want: append(append(append(seq(2, 15), seq(18, 31)...), seq(34, 47)...), seq(50, 63)...)},
		{in: "a", bad: true},
		{in: "0-", bad: true},
		{in: "-1", bad: true},
		{in: "3-1", bad: true},
		{in: "0,,2", bad: true},
		{in: "0-3,", bad: true},
		{in: ",", bad: true},
		{in: "1 ,2", bad: true},
		{in: "+1", bad: true},
		{in: "0-7:2", bad: true}, // stride syntax is input to the kernel, never its output
		{in: "0x1", bad: true},
		{in: "0-4294967295", bad: true},
		{in: "65536", bad: true},
		{in: "99999999999999999999", bad: true},
	} {
		got, err := parseCPUList(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseCPUList(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// seq is lo..hi inclusive.
func seq(lo, hi int) []int {
	var s []int
	for i := lo; i <= hi; i++ {
		s = append(s, i)
	}
	return s
}
