package volume

import (
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"nimbus/internal/api"
)

// TestVolumeSpecCheck: a volume asked for in process (Nova's os-volumes)
// is held to the bounds a client's request is: names, references and
// metadata of Cinder's lengths, a size from 1 GB to MaxInt32, the one zone.
func TestVolumeSpecCheck(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	size := func(n int64) *int64 { return &n }
	long := strings.Repeat("é", 256)
	manyMeta := map[string]string{}
	for i := range maxMetadata + 1 {
		manyMeta[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		name string
		spec VolumeSpec
		want string // in the 400's message; "" for none
	}{
		{"empty", VolumeSpec{}, ""},
		{"full", VolumeSpec{Name: str(strings.Repeat("é", 255)), Description: str("d"), Size: size(math.MaxInt32),
			Type: str("t"), Zone: str(AvailabilityZone), SnapshotID: str("s"), Metadata: map[string]string{"k": "v"}}, ""},
		{"empty zone", VolumeSpec{Zone: str("")}, ""},
		{"long name", VolumeSpec{Name: str(long)}, "field/attribute name"},
		{"long description", VolumeSpec{Description: str(long)}, "field/attribute description"},
		{"long type", VolumeSpec{Type: str(long)}, "field/attribute volume_type"},
		{"long image", VolumeSpec{ImageRef: str(long)}, "field/attribute imageRef"},
		{"zero size", VolumeSpec{Size: size(0)}, "less than the minimum of 1"},
		{"huge size", VolumeSpec{Size: size(math.MaxInt32 + 1)}, "greater than the maximum"},
		{"other zone", VolumeSpec{Zone: str("elsewhere")}, "Availability zone 'elsewhere' is invalid."},
		{"empty metadata key", VolumeSpec{Metadata: map[string]string{"": "v"}}, "key must be 1 to 255"},
		{"long metadata value", VolumeSpec{Metadata: map[string]string{"k": long}}, "greater than 255 characters"},
		{"too much metadata", VolumeSpec{Metadata: manyMeta}, "Maximum number of metadata items"},
	} {
		err := tc.spec.check()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		ae, ok := err.(*api.Error)
		if !ok || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, tc.want) {
			t.Errorf("%s: %v, want a 400 saying %q", tc.name, err, tc.want)
		}
	}
}

// TestTrimmed: names and descriptions lose their outer space, nil stays nil.
func TestTrimmed(t *testing.T) {
	t.Parallel()
	if trimmed(nil) != nil {
		t.Error("trimmed(nil) is not nil")
	}
	s := "  a b \t"
	if got := trimmed(&s); *got != "a b" {
		t.Errorf("trimmed(%q) = %q", s, *got)
	}
}

// TestPageSize: limit defaults to and is cut at Cinder's osapi_max_limit;
// limit and offset are whole numbers from 0, with Cinder's 400s.
func TestPageSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		query         string
		limit, offset int
		err           string
	}{
		{"", maxLimit, 0, ""},
		{"limit=5&offset=2", 5, 2, ""},
		{"limit=0", 0, 0, ""},
		{"limit=99999", maxLimit, 0, ""},
		{"limit=x", 0, 0, "limit must be an integer."},
		{"limit=-1", 0, 0, "limit must be >= 0"},
		{"offset=-3", 0, 0, "offset must be >= 0"},
	} {
		q, _ := url.ParseQuery(tc.query)
		limit, offset, err := pageSize(q)
		if tc.err != "" {
			if ae, ok := err.(*api.Error); !ok || ae.Status != http.StatusBadRequest || !strings.HasSuffix(ae.Message, tc.err) {
				t.Errorf("%q: %v, want a 400 %q", tc.query, err, tc.err)
			}
			continue
		}
		if err != nil || limit != tc.limit || offset != tc.offset {
			t.Errorf("%q: %d, %d, %v; want %d, %d", tc.query, limit, offset, err, tc.limit, tc.offset)
		}
	}
}
