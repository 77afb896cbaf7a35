package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Identity is what an enrolled agent keeps in DataDir/agent.json (mode
// 0600): who it is to the controller.
type Identity struct {
	AgentID    string `json:"agent_id"`
	Credential string `json:"credential"`
	Controller string `json:"controller,omitempty"`
}

// IdentityFile is the identity's file name in the data directory.
const IdentityFile = "agent.json"

// LoadIdentity reads the identity saved in dir; os.ErrNotExist when the
// agent has not enrolled yet.
func LoadIdentity(dir string) (Identity, error) {
	var id Identity
	b, err := os.ReadFile(filepath.Join(dir, IdentityFile))
	if err != nil {
		return id, err
	}
	if err := json.Unmarshal(b, &id); err != nil || id.AgentID == "" || id.Credential == "" {
		return Identity{}, fmt.Errorf("agent: %s is damaged: remove it and enrol again with a new token", filepath.Join(dir, IdentityFile))
	}
	return id, nil
}

// SaveIdentity writes the identity to dir, readable by its owner only.
func SaveIdentity(dir string, id Identity) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("agent: data directory: %w", err)
	}
	b, _ := json.MarshalIndent(id, "", "  ")
	path := filepath.Join(dir, IdentityFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

func notEnrolled(err error) bool { return errors.Is(err, os.ErrNotExist) }
