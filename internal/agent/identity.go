package agent

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// NameFile keeps, in the data directory, the agent's default name.
const NameFile = "agent-name"

// DefaultName is the agent's name when none is given: the machine's host
// name and a short random id, so that agents on machines with the same
// host name differ to the operator. It is made once and kept in
// DataDir/NameFile.
func DefaultName(dir string) (string, error) {
	path := filepath.Join(dir, NameFile)
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("agent: %w", err)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "agent"
	}
	id := make([]byte, 3)
	rand.Read(id)
	name := host + "-" + hex.EncodeToString(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("agent: data directory: %w", err)
	}
	if err := os.WriteFile(path, []byte(name+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	return name, nil
}

func notEnrolled(err error) bool { return errors.Is(err, os.ErrNotExist) }
