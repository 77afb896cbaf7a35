package flavorspec

import (
	"strings"
	"testing"
)

func TestGPUsOf(t *testing.T) {
	for _, tc := range []struct {
		specs map[string]string
		want  GPUs
		err   string
	}{
		{map[string]string{}, GPUs{}, ""},
		{map[string]string{AliasKey: "a100:2"}, GPUs{}, ""}, // no model: not Nimbus's GPUs
		{map[string]string{GPUModelKey: "L4"}, GPUs{"L4", 1}, ""},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:1"}, GPUs{"L4", 1}, ""},
		{map[string]string{GPUModelKey: "A100 80GB", AliasKey: "a100-80gb:4"}, GPUs{"A100 80GB", 4}, ""},
		// The audit's case: the scheduler counted three, billing two.
		{map[string]string{GPUModelKey: "A100 80GB", AliasKey: "a100:2,l4"}, GPUs{"A100 80GB", 3}, ""},
		{map[string]string{GPUModelKey: "A100 80GB", AliasKey: "a100:2 , a100:1"}, GPUs{"A100 80GB", 3}, ""},
		{map[string]string{GPUModelKey: "L4", AliasKey: ""}, GPUs{}, "empty"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:0"}, GPUs{}, "from 1 to 64"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:-1"}, GPUs{}, "from 1 to 64"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:x"}, GPUs{}, "whole number"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:02"}, GPUs{}, "whole number"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:99999999999999999999"}, GPUs{}, "whole number"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:65"}, GPUs{}, "from 1 to 64"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:40,l4:40"}, GPUs{}, "more than 64"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "l4:1,"}, GPUs{}, "not alias:count"},
		{map[string]string{GPUModelKey: "L4", AliasKey: ":2"}, GPUs{}, "not alias:count"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "a:b:2"}, GPUs{}, "whole number"},
		{map[string]string{GPUModelKey: "L4", AliasKey: "my l4:2"}, GPUs{}, "not alias:count"},
	} {
		got, err := GPUsOf(tc.specs)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.specs, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one saying %q", tc.specs, err, tc.err)
		case got != tc.want:
			t.Errorf("%v = %+v, want %+v", tc.specs, got, tc.want)
		}
	}
}

func FuzzParseAlias(f *testing.F) {
	for _, s := range []string{"a100:2", "a:1,b:2", "l4", " x : 3 ", "a:99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		es, err := ParseAlias(s)
		if err != nil {
			return
		}
		n := 0
		for _, e := range es {
			if e.Count < 1 || e.Alias == "" {
				t.Fatalf("%q gave %+v", s, es)
			}
			n += e.Count
		}
		if n > MaxGPUs {
			t.Fatalf("%q asks for %d", s, n)
		}
	})
}
