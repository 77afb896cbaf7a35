package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/store"
)

// tokenPrefix starts every enrolment token, so that one pasted in the
// wrong place is recognisable.
const tokenPrefix = "nimbus-enrol-"

// ErrBadToken is an enrolment token that is unknown, used or expired.
var ErrBadToken = errors.New("fleet: enrolment token is unknown, used or expired")

// ErrBadCredential is an agent credential that does not check out.
var ErrBadCredential = errors.New("fleet: bad agent credential")

func secret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// CreateToken makes a one-time enrolment token valid for ttl, for "nimbus
// agent --token". Only its hash is stored.
func (s *Service) CreateToken(ctx context.Context, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", errors.New("fleet: token lifetime must be positive")
	}
	tok := tokenPrefix + secret()
	now := s.now()
	_, err := s.db.Exec(ctx, "INSERT INTO fleet_tokens (hash, expires_at, created_at) VALUES (?, ?, ?)",
		hashOf(tok), store.FormatTime(now.Add(ttl)), store.FormatTime(now))
	if err != nil {
		return "", fmt.Errorf("fleet: token: %w", err)
	}
	return tok, nil
}

// Enrol trades a token for a new agent's id and credential; the token is
// then used up.
func (s *Service) Enrol(ctx context.Context, token, name string) (id, credential string, err error) {
	now := s.now()
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		var expires, used string
		err := tx.QueryRow(ctx, "SELECT expires_at, used_at FROM fleet_tokens WHERE hash = ?", hashOf(token)).Scan(&expires, &used)
		if store.IsNoRows(err) {
			return ErrBadToken
		}
		if err != nil {
			return err
		}
		if used != "" || !now.Before(store.ParseTime(expires)) {
			return ErrBadToken
		}
		id, credential, err = s.newAgent(ctx, tx, name, now)
		if err != nil {
			return err
		}
		res, err := tx.Exec(ctx, "UPDATE fleet_tokens SET used_at = ?, agent_id = ? WHERE hash = ? AND used_at = ''",
			store.FormatTime(now), id, hashOf(token))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return ErrBadToken // another enrolment won the race
		}
		return nil
	})
	if err != nil {
		return "", "", err
	}
	s.log.Info("fleet: agent enrolled", "agent", id, "name", name)
	return id, credential, nil
}

// NewAgent makes an agent directly, without a token: the controller's own
// local agent.
func (s *Service) NewAgent(ctx context.Context, name string) (id, credential string, err error) {
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		id, credential, err = s.newAgent(ctx, tx, name, s.now())
		return err
	})
	return id, credential, err
}

func (s *Service) newAgent(ctx context.Context, tx *store.Tx, name string, now time.Time) (string, string, error) {
	id := uuid.NewString()
	sec := secret()
	_, err := tx.Exec(ctx, "INSERT INTO fleet_agents (id, name, secret_hash, created_at) VALUES (?, ?, ?, ?)",
		id, name, hashOf(sec), store.FormatTime(now))
	return id, id + "." + sec, err
}

// AgentExists tells whether an agent id is known, for the local agent's
// saved credential (a fresh database does not know it).
func (s *Service) AgentExists(ctx context.Context, id string) (bool, error) {
	var n int
	err := s.db.QueryRow(ctx, "SELECT COUNT(*) FROM fleet_agents WHERE id = ?", id).Scan(&n)
	return n > 0, err
}

// credCache remembers credentials checked recently, sparing a database
// read per agent request.
type credCache struct {
	mu sync.Mutex
	m  map[string]credEntry
}

type credEntry struct {
	agent string
	until time.Time
}

const credCacheTTL = 30 * time.Second

// Authenticate checks an agent credential ("<agent id>.<secret>") and
// answers the agent's id.
func (s *Service) Authenticate(ctx context.Context, credential string) (string, error) {
	sum := hashOf(credential)
	now := s.now()
	s.creds.mu.Lock()
	e, ok := s.creds.m[sum]
	s.creds.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.agent, nil
	}
	id, sec, ok := strings.Cut(credential, ".")
	if !ok || id == "" || sec == "" || len(credential) > 256 {
		return "", ErrBadCredential
	}
	var want string
	err := s.db.QueryRow(ctx, "SELECT secret_hash FROM fleet_agents WHERE id = ?", id).Scan(&want)
	if store.IsNoRows(err) {
		return "", ErrBadCredential
	}
	if err != nil {
		return "", err
	}
	if subtle.ConstantTimeCompare([]byte(hashOf(sec)), []byte(want)) != 1 {
		return "", ErrBadCredential
	}
	s.creds.mu.Lock()
	if len(s.creds.m) > 10000 {
		clear(s.creds.m)
	}
	s.creds.m[sum] = credEntry{agent: id, until: now.Add(credCacheTTL)}
	s.creds.mu.Unlock()
	return id, nil
}

// HostInfo is one host as the operator sees it.
type HostInfo struct {
	Name      string    `json:"name"`
	AgentID   string    `json:"agent_id"`
	AgentName string    `json:"agent_name"`
	Up        bool      `json:"up"`
	Health    string    `json:"health,omitempty"`
	LastSeen  time.Time `json:"last_seen"`
	Servers   int       `json:"servers"`
}

// HostInfos lists the hosts with their agents, state and server counts,
// for "nimbus admin host list".
func (s *Service) HostInfos(ctx context.Context) ([]HostInfo, error) {
	hs, err := s.loadHosts(ctx, s.db)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	rows, err := s.db.Query(ctx, "SELECT id, name FROM fleet_agents")
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, name string
		if err := rows.Scan(&id, &name); err != nil {
			rows.Close()
			return nil, err
		}
		names[id] = name
	}
	rows.Close()
	counts := map[string]int{}
	rows, err = s.db.Query(ctx, "SELECT host, COUNT(*) FROM fleet_instances WHERE gone = 0 GROUP BY host")
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var host string
		var n int
		if err := rows.Scan(&host, &n); err != nil {
			rows.Close()
			return nil, err
		}
		counts[host] = n
	}
	rows.Close()
	now := s.now()
	out := make([]HostInfo, len(hs))
	for i, h := range hs {
		v := s.view(h, now)
		out[i] = HostInfo{Name: h.Name, AgentID: h.AgentID, AgentName: names[h.AgentID], Up: v.Up, Health: v.Health,
			LastSeen: h.Seen, Servers: counts[h.Name]}
	}
	return out, nil
}
