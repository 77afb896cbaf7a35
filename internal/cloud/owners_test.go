package cloud_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestOperatorOwnsSharedResources: the public network and the catalog
// images belong to the operator's project, which network and image learn
// from identity's service.
func TestOperatorOwnsSharedResources(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		admin, err := c.Identity.ProjectID(context.Background(), cloud.AdminProject)
		if err != nil {
			t.Fatal(err)
		}
		tok := testenv.Token(t, c, cloud.AdminUser)
		client := testenv.HTTPClient(t, c)
		tests := []struct {
			name, url, list, owner string
		}{
			{"public network", c.NetworkURL + "/v2.0/networks?name=public", "networks", "project_id"},
			{"catalog images", c.ImageURL + "/v2/images?visibility=public", "images", "owner"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				resp, body := testenv.Do(t, client, "GET", tc.url, tok, "")
				testenv.MustStatus(t, resp, body, http.StatusOK)
				var out map[string]json.RawMessage
				var items []map[string]any
				if err := json.Unmarshal([]byte(body), &out); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(out[tc.list], &items); err != nil || len(items) == 0 {
					t.Fatalf("no %s in %s (%v)", tc.list, body, err)
				}
				for _, item := range items {
					if item[tc.owner] != admin {
						t.Errorf("%v has %s %v, want the admin project %s", item["name"], tc.owner, item[tc.owner], admin)
					}
				}
			})
		}
	})
}
