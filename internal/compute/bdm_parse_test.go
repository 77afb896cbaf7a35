package compute

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"nimbus/internal/api"
)

// TestParseBDMv2: block_device_mapping_v2 in Nova's schema words and
// BlockDeviceDict.from_api's defaults: the destination follows the source,
// a no_device mapping makes nothing, tag from 2.42 only.
func TestParseBDMv2(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    int
		raw  string
		want string // "source>dest boot size" of each mapping, or the error
	}{
		{2, `[{"source_type": "volume", "uuid": "v", "boot_index": "0"}]`, "volume>volume 0 0"},
		{2, `[{"source_type": "image", "uuid": "i", "destination_type": "volume", "volume_size": 10, "boot_index": 0}]`, "image>volume 0 10"},
		{2, `[{"source_type": "blank", "destination_type": "local", "guest_format": "swap"}]`, "blank>local -1 0"},
		{2, `[{"source_type": "volume", "uuid": "v", "no_device": true}]`, ""},
		{2, `{}`, "is not of type 'array'"},
		{2, `[null]`, "None is not of type 'object'"},
		{2, `[{"source_type": "disk", "uuid": "v"}]`, "is not one of ['volume', 'image', 'snapshot', 'blank']"},
		{2, `[{"uuid": "v"}]`, "Invalid source_type field."},
		{2, `[{"source_type": "image"}]`, "Missing device UUID."},
		{2, `[{"source_type": "volume", "uuid": "v", "boot_index": "first"}]`, "boot_index"},
		{2, `[{"source_type": "volume", "uuid": "v", "tag": "t"}]`, "tag"},
		{42, `[{"source_type": "volume", "uuid": "v", "tag": "a/b"}]`, "does not match"},
		{67, `[{"source_type": "image", "uuid": "i", "destination_type": "local", "volume_type": "fast"}]`, "volume_type with destination_type=local"},
	} {
		got, err := parseBDMv2(api.Version{Major: 2, Minor: tc.v}, json.RawMessage(tc.raw))
		var desc []string
		for _, b := range got {
			desc = append(desc, strings.Join([]string{b.Source + ">" + b.Dest, strconv.Itoa(b.BootIndex), strconv.Itoa(int(b.VolumeSize))}, " "))
		}
		out := strings.Join(desc, ",")
		if err != nil {
			out = err.Error()
		}
		if (err == nil && out != tc.want) || (err != nil && (tc.want == "" || !strings.Contains(out, tc.want))) {
			t.Errorf("2.%d %s: %q, want %q", tc.v, tc.raw, out, tc.want)
		}
	}
}
