// Package version says which build of Nimbus this is: the release stamped
// at build time, else what the Go toolchain recorded of the source (the
// commit, its time, whether the tree had changes). Controllers, agents,
// the banner, `nimbus version` and the metrics all report it from here.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// Release is set at build time for a release:
//
//	go build -ldflags "-X nimbus/internal/version.Release=v1.2.0" ./cmd/nimbus
var Release string

// Info is what this build is.
type Info struct {
	Release  string // "" when not stamped
	Commit   string // the source's commit, "" when unknown
	Time     string // the commit's time (RFC 3339)
	Modified bool   // built from a tree with changes
	Go       string // the toolchain
}

// Get reads this build's information once.
var Get = sync.OnceValue(func() Info {
	i := Info{Release: Release, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.time":
				i.Time = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
		// A module version that is not a pseudo-version (which Go makes
		// from the commit) is a release: go install nimbus@v1.2.0.
		if v := bi.Main.Version; i.Release == "" && v != "" && v != "(devel)" && !strings.HasPrefix(v, "v0.0.0-") {
			i.Release = v
		}
	}
	return i
})

// String is the version as people read it: the release, else the short
// commit ("dev-1a2b3c4d5e6f", "+changes" when the tree had them), else
// "dev".
func String() string { return Get().String() }

func (i Info) String() string {
	switch {
	case i.Release != "":
		return i.Release
	case i.Commit != "":
		s := "dev-" + i.Commit[:min(12, len(i.Commit))]
		if i.Modified {
			s += "+changes"
		}
		return s
	}
	return "dev"
}

// Long is String with the commit, its time and the toolchain.
func (i Info) Long() string {
	s := i.String()
	if i.Commit != "" {
		s += fmt.Sprintf(" (commit %s", i.Commit)
		if i.Time != "" {
			s += " of " + i.Time
		}
		if i.Modified {
			s += ", with changes"
		}
		s += ")"
	}
	return s + ", " + i.Go
}
