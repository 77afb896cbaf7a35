package cloud

import (
	"os"
	"strings"
	"testing"
)

// TestDataDirReference checks docs/reference/data-dir.md against the
// data directory's entries as the code names them: every entry the
// backup rules know, the database and the controller's lease name must
// have a row, so that a file added to the data directory is documented.
func TestDataDirReference(t *testing.T) {
	b, err := os.ReadFile("../../docs/reference/data-dir.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	names := []string{backupDB, controllerIDFile}
	for _, r := range dataRules {
		names = append(names, r.name)
	}
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			if !strings.Contains(doc, "`"+n+"`") && !strings.Contains(doc, "`"+n+"/`") {
				t.Errorf("docs/reference/data-dir.md has no row for %s, an entry of the data directory", n)
			}
		})
	}
}
