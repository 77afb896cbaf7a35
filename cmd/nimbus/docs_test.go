package main

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"
)

// TestFlagReference regenerates docs/reference/flags.md from the flag sets
// the commands parse and fails when the file says otherwise: a flag added,
// removed or changed without its reference fails the suite.
func TestFlagReference(t *testing.T) {
	for _, v := range docEnv {
		t.Setenv(v, "")
	}
	var b bytes.Buffer
	if err := writeFlagReference(&b); err != nil {
		t.Fatal(err)
	}
	const file = "../../docs/reference/flags.md"
	have, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, b.Bytes()) {
		hl, wl := strings.Split(string(have), "\n"), strings.Split(b.String(), "\n")
		for i := 0; i < max(len(hl), len(wl)); i++ {
			var h, w string
			if i < len(hl) {
				h = hl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if h != w {
				t.Errorf("docs/reference/flags.md line %d:\n have %q\n want %q", i+1, h, w)
				break
			}
		}
		t.Fatal("docs/reference/flags.md is out of date: run go generate ./cmd/nimbus (nimbus docs flags -o docs/reference/flags.md)")
	}
}

// TestFlagUsage fails for a flag of any command without a usage string:
// the reference would say nothing about it.
func TestFlagUsage(t *testing.T) {
	cmds := docCommands()
	if len(cmds) < 4 {
		t.Fatalf("docCommands lists %d commands, want serve, agent, bench and the admin commands", len(cmds))
	}
	for _, c := range cmds {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			n := 0
			c.flags.VisitAll(func(f *flag.Flag) {
				n++
				if _, usage := flag.UnquoteUsage(f); strings.TrimSpace(usage) == "" {
					t.Errorf("%s --%s has no usage string", c.name, f.Name)
				}
			})
			if n == 0 {
				t.Errorf("%s has no flags", c.name)
			}
		})
	}
}
