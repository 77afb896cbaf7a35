package main

import (
	"slices"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	cases := []struct {
		in   string
		want []int
		err  bool
	}{
		{"", nil, false},
		{"none", []int{}, false},
		{"0", []int{0}, false},
		{"0,2-4", []int{0, 2, 3, 4}, false},
		{" 1 , 3 ", []int{1, 3}, false},
		{"a", nil, true},
		{"3-1", nil, true},
		{"-1", nil, true},
		{"0-99999", nil, true},
	}
	for _, c := range cases {
		got, err := parseCPUList(c.in)
		if (err != nil) != c.err || !slices.Equal(got, c.want) || (c.want != nil && got == nil) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.err)
		}
	}
}

func TestQEMUFlagsAccel(t *testing.T) {
	for _, a := range []string{"auto", "kvm", "tcg"} {
		if _, err := (&qemuFlags{accel: a}).options(); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
	if _, err := (&qemuFlags{accel: "xen"}).options(); err == nil {
		t.Error("xen accepted")
	}
}
