package main

import (
	"flag"
	"testing"
	"time"
)

// TestBenchShortFlags checks that --short sets what the command line left
// alone and nothing it gave.
func TestBenchShortFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		creates int
		wait    time.Duration
		only    string
	}{
		{"short alone", nil, 200, time.Minute, benchShort["only"]},
		{"explicit count kept", []string{"--creates", "7"}, 7, time.Minute, benchShort["only"]},
		{"explicit scenarios kept", []string{"--only", "create", "--wait", "2m"}, 200, 2 * time.Minute, "create"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("bench", flag.ContinueOnError)
			creates := fs.Int("creates", 2000, "")
			wait := fs.Duration("wait", 5*time.Minute, "")
			only := fs.String("only", "tokens", "")
			for name := range benchShort {
				if fs.Lookup(name) == nil {
					fs.String(name, "", "")
				}
			}
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := shortFlags(fs); err != nil {
				t.Fatal(err)
			}
			if *creates != tc.creates || *wait != tc.wait || *only != tc.only {
				t.Errorf("creates %d, wait %s, only %q; want %d, %s, %q", *creates, *wait, *only, tc.creates, tc.wait, tc.only)
			}
		})
	}
}
