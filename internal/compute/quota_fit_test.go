package compute

import (
	"math"
	"strings"
	"testing"
)

func TestFitQuota(t *testing.T) {
	f := &Flavor{VCPUs: 2, RAM: 2048}
	q := Quota{Instances: 10, Cores: 20, RAM: 51200}
	tests := []struct {
		name              string
		q                 Quota
		insts, cores, ram int
		least, most       int
		want              int
		wantErr           string
	}{
		{"all fit", q, 0, 0, 0, 1, 3, 3, ""},
		{"capped by instances", q, 1, 2, 2048, 1, math.MaxInt, 9, ""},
		{"capped by cores", Quota{Instances: -1, Cores: 7, RAM: -1}, 0, 0, 0, 1, 100, 3, ""},
		{"least over quota", q, 1, 2, 2048, 11, 20_000_000_000, 0, "Quota exceeded for instances: Requested 11, but already used 1 of 10 instances"},
		{"huge least reports without overflow", Quota{Instances: -1, Cores: 20, RAM: -1}, 0, 0, 0, math.MaxInt/2 + 1, math.MaxInt, 0, "Requested 9223372036854775807, but already used 0 of 20 cores"},
		{"over-used project", q, 12, 0, 0, 1, 1, 0, "Quota exceeded for instances"},
		{"unlimited", Quota{Instances: -1, Cores: -1, RAM: -1}, 5, 5, 5, 1, math.MaxInt, math.MaxInt, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fitQuota(tt.q, tt.insts, tt.cores, tt.ram, f, tt.least, tt.most)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("fitQuota = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}
