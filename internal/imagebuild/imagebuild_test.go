package imagebuild

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRecipe writes a small "image" and counts its runs in runs.
func fakeRecipe(t *testing.T, body string) (Recipe, string) {
	runs := filepath.Join(t.TempDir(), "runs")
	script := `set -eu
echo run >>` + runs + `
out=$1; mkdir -p "$out"
` + body + `
printf 'image data\n' >"$out/disk.qcow2"
sha256sum "$out/disk.qcow2" | cut -d' ' -f1 >"$out/sha256"
echo "size 11 bytes, virtual 1048576 bytes" >"$out/manifest"
echo "$out"
`
	return Recipe{Name: "fake", Image: "Fake", Script: []byte(script)}, runs
}

func countRuns(t *testing.T, runs string) int {
	b, err := os.ReadFile(runs)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run\n")
}

// TestBuildCache: the first build runs the script, the second answers the
// cached image, --rebuild and a corrupted image run it again; a script
// exiting 3 is ErrMissingTools, another failure says what it printed.
func TestBuildCache(t *testing.T) {
	ctx := context.Background()
	r, runs := fakeRecipe(t, "")
	cache := t.TempDir()
	steps := []struct {
		name    string
		before  func(dir string)
		rebuild bool
		cached  bool
		runs    int
	}{
		{"cold", nil, false, false, 1},
		{"cached", nil, false, true, 1},
		{"rebuild", nil, true, false, 2},
		{"corrupted", func(dir string) { os.WriteFile(filepath.Join(dir, "disk.qcow2"), []byte("bad"), 0o644) }, false, false, 3},
		{"cached again", nil, false, true, 3},
	}
	dir := filepath.Join(cache, "images", "fake-"+r.Stamp())
	for _, s := range steps {
		if s.before != nil {
			s.before(dir)
		}
		res, err := Build(ctx, r, Options{Cache: cache, Rebuild: s.rebuild})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if res.Cached != s.cached || countRuns(t, runs) != s.runs || res.Dir != dir || res.Size != 11 || res.VirtualSize != 1<<20 {
			t.Fatalf("%s: %+v after %d runs; want cached %v after %d runs in %s", s.name, res, countRuns(t, runs), s.cached, s.runs, dir)
		}
	}
	if _, err := os.Stat(dir + ".sh"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the script was left behind: %v", err)
	}

	for _, c := range []struct{ body, want string }{
		{"echo no mmdebstrap >&2; exit 3", "host tools"},
		{"echo mirror unreachable >&2; exit 1", "mirror unreachable"},
	} {
		r, _ := fakeRecipe(t, c.body)
		_, err := Build(ctx, r, Options{Cache: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), c.want) || (c.want == "host tools") != errors.Is(err, ErrMissingTools) {
			t.Errorf("script %q: %v, want an error saying %q", c.body, err, c.want)
		}
	}
}

// TestRecipes: debian-12 is known, replaces "Debian 12", and its stamp
// follows its script.
func TestRecipes(t *testing.T) {
	r, ok := Lookup("debian-12")
	if !ok || r.Image != "Debian 12" || len(r.Script) == 0 || strings.Join(Names(), ",") != "debian-12" {
		t.Fatalf("debian-12: %+v, %v; names %v", r.Name, ok, Names())
	}
	other := r
	other.Script = append([]byte("#\n"), r.Script...)
	if len(r.Stamp()) != 12 || r.Stamp() == other.Stamp() {
		t.Errorf("stamps %s and %s", r.Stamp(), other.Stamp())
	}
}
