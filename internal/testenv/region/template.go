package region

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var templateVar = regexp.MustCompile(`\$\{([A-Z0-9_]+)\}`)

// Render expands a template of deploy/region as envsubst does, from vars
// alone, into dir, and returns the file's path. A variable the template
// names and vars lacks fails the test: docs/operator.md's set-up would leave it
// empty too.
func Render(t testing.TB, rel, dir string, vars map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(RepoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	out := templateVar.ReplaceAllStringFunc(string(b), func(m string) string {
		name := templateVar.FindStringSubmatch(m)[1]
		v, ok := vars[name]
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		t.Fatalf("%s: no value for %s", rel, strings.Join(missing, ", "))
	}
	path := filepath.Join(dir, filepath.Base(rel))
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
