package cloud

import "path/filepath"

// DatabaseURL is the database a controller on dataDir uses: url when given,
// else the SQLite file nimbus.db in dataDir. nimbus admin calls it too, so
// that it opens the very store the controller runs on.
func DatabaseURL(dataDir, url string) string {
	if url != "" {
		return url
	}
	return filepath.Join(dataDir, "nimbus.db")
}
