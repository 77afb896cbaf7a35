package metering

import (
	"fmt"
	"testing"
	"time"
)

func at(s string) time.Time {
	t, err := time.Parse("15:04", s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestAssign: each started hour a resource's periods touch is paid once,
// by the earliest period in it.
func TestAssign(t *testing.T) {
	type p struct{ id, start, end string } // end "" = open
	tests := []struct {
		name    string
		periods []p
		from    string
		to      string
		want    string
	}{
		{"open from mid-hour", []p{{"a", "10:20", ""}}, "09:00", "12:00", "a@10 a@11 a@12"},
		{"ends on the hour", []p{{"a", "10:20", "12:00"}}, "09:00", "14:00", "a@10 a@11"},
		{"ends mid-hour", []p{{"a", "10:20", "12:01"}}, "09:00", "14:00", "a@10 a@11 a@12"},
		{"zero length pays its hour", []p{{"a", "10:20", "10:20"}}, "09:00", "14:00", "a@10"},
		{"resize: old price for its hour", []p{{"a", "10:20", "11:40"}, {"b", "11:40", ""}}, "10:00", "13:00", "a@10 a@11 b@12 b@13"},
		{"shelve and unshelve in one hour", []p{{"a", "10:20", "10:30"}, {"b", "10:50", ""}}, "10:00", "11:00", "a@10 b@11"},
		{"clipped to the window", []p{{"a", "08:00", ""}}, "10:00", "11:00", "a@10 a@11"},
		{"gap not charged", []p{{"a", "10:00", "11:00"}, {"b", "13:10", "13:20"}}, "10:00", "15:00", "a@10 b@13"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ps []Period
			for _, x := range tc.periods {
				pd := Period{ID: x.id, ResourceID: "r", Start: at(x.start)}
				if x.end != "" {
					pd.End = at(x.end)
				}
				ps = append(ps, pd)
			}
			SortPeriods(ps)
			got := ""
			Assign(ps, at(tc.from), at(tc.to), func(h Hour) bool {
				if got != "" {
					got += " "
				}
				got += fmt.Sprintf("%s@%02d", h.Period.ID, h.Start.Hour())
				return true
			})
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestServerSpec(t *testing.T) {
	tests := []struct {
		specs map[string]string
		os    string
		want  Spec
	}{
		{nil, "", Spec{Flavor: "f", VCPUs: 2, RAMMB: 2048, DiskGB: 20, DiskType: "local"}},
		{map[string]string{"nimbus:disk_type": "network", "nimbus:public_ipv4": "true"}, "Windows",
			Spec{Flavor: "f", VCPUs: 2, RAMMB: 2048, DiskGB: 20, DiskType: "network", PublicIPv4: true, OSType: "windows"}},
		{map[string]string{"nimbus:gpu_model": "L4", "pci_passthrough:alias": "l4:2,l4b:1"}, "",
			Spec{Flavor: "f", VCPUs: 2, RAMMB: 2048, DiskGB: 20, DiskType: "local", GPUModel: "L4", GPUCount: 3}},
		{map[string]string{"nimbus:gpu_model": "L4", "pci_passthrough:alias": "bad"}, "",
			Spec{Flavor: "f", VCPUs: 2, RAMMB: 2048, DiskGB: 20, DiskType: "local", GPUModel: "L4", GPUCount: 1}},
	}
	for i, tc := range tests {
		if got := ServerSpec("f", 2, 2048, 20, tc.specs, tc.os); got != tc.want {
			t.Errorf("%d: %+v, want %+v", i, got, tc.want)
		}
	}
}
