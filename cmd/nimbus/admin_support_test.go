package main

import (
	"context"
	"strings"
	"testing"

	"nimbus/internal/panel"
	"nimbus/internal/store/storetest"
)

// TestAdminSupport: "support set" changes the contacts it is given and
// keeps the others, "show" prints them, the panel reads the same, and a
// contact the panel would refuse is refused here too.
func TestAdminSupport(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		var got supportView
		f.adminJSON(t, &got, "support", "show")
		if got != (supportView{}) {
			t.Fatalf("contacts before any set: %+v", got)
		}
		for _, tt := range []struct {
			name    string
			args    []string
			want    supportView
			wantErr string
		}{
			{"all", []string{"--messenger", "https://t.me/nimbus", "--email", "help@example.net", "--phone", "+7 495 000-00-00", "--hours", "24/7"},
				supportView{"https://t.me/nimbus", "help@example.net", "+7 495 000-00-00", "24/7"}, ""},
			{"one kept others", []string{"--hours=Mon-Fri 9-18"},
				supportView{"https://t.me/nimbus", "help@example.net", "+7 495 000-00-00", "Mon-Fri 9-18"}, ""},
			{"empty removes", []string{"--phone", ""},
				supportView{"https://t.me/nimbus", "help@example.net", "", "Mon-Fri 9-18"}, ""},
			{"two lines", []string{"--email", "a@example.net\nb@example.net"}, supportView{}, "one line"},
			{"too long", []string{"--messenger", strings.Repeat("x", 201)}, supportView{}, "at most 200"},
			{"nothing", nil, supportView{}, "give at least one"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				before, err := panel.LoadSupport(context.Background(), f.db)
				if err != nil {
					t.Fatal(err)
				}
				if tt.wantErr != "" {
					_, err := f.admin(t, append([]string{"support", "set"}, tt.args...)...)
					if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
						t.Fatalf("error %v, want %q", err, tt.wantErr)
					}
					if after, _ := panel.LoadSupport(context.Background(), f.db); after != before {
						t.Fatalf("a refused set changed the contacts: %+v → %+v", before, after)
					}
					return
				}
				var set supportView
				f.adminJSON(t, &set, append([]string{"support", "set"}, tt.args...)...)
				f.adminJSON(t, &got, "support", "show")
				if set != tt.want || got != tt.want {
					t.Fatalf("set printed %+v, show %+v, want %+v", set, got, tt.want)
				}
				s, err := panel.LoadSupport(context.Background(), f.db)
				if err != nil || (supportView{s.Messenger, s.Email, s.Phone, s.Hours}) != tt.want {
					t.Fatalf("the panel reads %+v (%v), want %+v", s, err, tt.want)
				}
			})
		}
		out, err := f.admin(t, "support", "show")
		if err != nil || !strings.Contains(out, "help@example.net") || !strings.Contains(out, "CONTACT") {
			t.Fatalf("show table: %v\n%s", err, out)
		}
	})
}
