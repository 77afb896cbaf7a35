package cloud

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// TestVolumeConfig: an unknown backend is refused, and the rbd backend
// needs its keyring at start, where the operator sees the mistake.
func TestVolumeConfig(t *testing.T) {
	base := Config{DataDir: t.TempDir(), Log: slog.Default()}
	for _, c := range []struct {
		opts VolumeOptions
		want string
	}{
		{VolumeOptions{Backend: "ceph"}, `unknown volume backend "ceph"`},
		{VolumeOptions{Backend: VolumeBackendRBD, RBD: RBDOptions{Keyring: filepath.Join(base.DataDir, "none.keyring")}}, "none.keyring"},
		{VolumeOptions{Backend: VolumeBackendRBD, RBD: RBDOptions{Pool: "bad/pool"}}, "invalid pool name"},
	} {
		cfg := base
		cfg.Volumes = c.opts
		if _, x, err := volumeConfig(cfg); err == nil || !strings.Contains(err.Error(), c.want) || x != nil {
			t.Errorf("%+v: %v, want an error with %q", c.opts, err, c.want)
		}
	}
}
