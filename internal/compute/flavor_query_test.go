package compute

import (
	"net/url"
	"strings"
	"testing"

	"nimbus/internal/api"
)

// TestParseFlavorQuery: a flavor list's filters in Nova's words: is_public
// read for admins only ("none" for all), minRam and minDisk whole numbers
// from 0, sort_key among the flavor's fields, sort_dir asc or desc.
func TestParseFlavorQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		query  string
		admin  bool
		public string // "all", "true", "false"
		err    string
	}{
		{"", false, "true", ""},
		{"is_public=none", false, "true", ""},
		{"is_public=none", true, "all", ""},
		{"is_public=false&minRam=512&minDisk=0&sort_key=vcpus&sort_dir=desc", true, "false", ""},
		{"is_public=maybe", true, "", "Invalid is_public filter [maybe]"},
		{"minRam=-1", false, "", "Invalid minRam filter [-1]"},
		{"minDisk=x", false, "", "Invalid minDisk filter [x]"},
		{"sort_key=colour", false, "", "sort_key. Value: colour"},
		{"sort_dir=up", false, "", "sort_dir. Value: up"},
	} {
		q, _ := url.ParseQuery(tc.query)
		fq, err := parseFlavorQuery(q, tc.admin)
		if tc.err != "" {
			if ae, ok := err.(*api.Error); !ok || ae.Status != 400 || !strings.Contains(ae.Message, tc.err) {
				t.Errorf("%q: %v, want a 400 saying %q", tc.query, err, tc.err)
			}
			continue
		}
		public := "all"
		if fq.isPublic != nil {
			public = map[bool]string{true: "true", false: "false"}[*fq.isPublic]
		}
		if err != nil || public != tc.public || fq.less == nil {
			t.Errorf("%q: public %s, err %v; want public %s", tc.query, public, err, tc.public)
		}
	}
}
