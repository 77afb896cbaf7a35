package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"nimbus/internal/fleet/wire"
)

// journal records, for each op the agent ran, its result until the
// controller has accepted it: an append-only file of JSON lines (a result,
// later an "acked" line), compacted on open and when it grows. Once
// accepted, the op is no longer pending at the controller and cannot come
// back. An op delivered again (after a lost answer, a
// network cut, an agent or controller restart) is answered from here
// instead of being run twice.
//
// Lines are not synced to disk one by one: a crash of the agent process
// loses nothing (the kernel has them), and should a power cut lose the
// last lines, those ops run again, which the driver's idempotent calls
// make harmless.
type journal struct {
	path string

	mu      sync.Mutex
	f       *os.File
	entries map[string]*journalEntry
	lines   int
}

// journalEntry is one op in the journal; one line holds it as it became.
type journalEntry struct {
	ID     string       `json:"id"`
	Key    string       `json:"key,omitempty"`
	Server string       `json:"server,omitempty"`
	Kind   string       `json:"kind,omitempty"`
	Result *wire.Result `json:"result,omitempty"`
	Acked  bool         `json:"acked,omitempty"`
	At     int64        `json:"at"` // unix seconds of the line
}

func openJournal(path string) (*journal, error) {
	j := &journal{path: path, entries: map[string]*journalEntry{}}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("agent: journal: %w", err)
	default:
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
		for n := 1; sc.Scan(); n++ {
			var e journalEntry
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.ID == "" {
				// A torn last line (a crash mid-write) is dropped; the op it
				// would have recorded runs again.
				continue
			}
			if e.Acked {
				delete(j.entries, e.ID)
			} else {
				j.entries[e.ID] = &e
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("agent: journal %s: %w", path, err)
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.compactLocked(); err != nil {
		return nil, err
	}
	return j, nil
}

// compactLocked rewrites the journal with the entries still needed, the
// results the controller has not accepted (temp file and rename), and
// reopens it for appending.
func (j *journal) compactLocked() error {
	var buf []byte
	for _, e := range j.entries {
		b, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("agent: journal: %w", err)
		}
		buf = append(append(buf, b...), '\n')
	}
	tmp := j.path + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o600); err != nil {
		return fmt.Errorf("agent: journal: %w", err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return fmt.Errorf("agent: journal: %w", err)
	}
	if j.f != nil {
		j.f.Close()
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("agent: journal: %w", err)
	}
	j.f, j.lines = f, len(j.entries)
	return nil
}

// get answers the recorded result of an op, if it finished.
func (j *journal) get(id string) (*journalEntry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.entries[id]
	if !ok {
		return nil, false
	}
	c := *e
	return &c, true
}

// done records an op's result before it is posted.
func (j *journal) done(op wire.Op, r wire.Result) error {
	return j.write(&journalEntry{ID: op.ID, Key: op.Key, Server: op.ServerID, Kind: op.Kind, Result: &r})
}

// acked records that the controller has the op's result: the journal
// forgets it.
func (j *journal) acked(id string) error {
	j.mu.Lock()
	_, ok := j.entries[id]
	j.mu.Unlock()
	if !ok {
		return nil
	}
	return j.write(&journalEntry{ID: id, Acked: true})
}

func (j *journal) write(e *journalEntry) error {
	e.At = time.Now().Unix()
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return errors.New("agent: journal closed")
	}
	// A write cut short (a full disk) is cut off again, so that the next
	// line does not run on from a torn one and tear it too.
	end, serr := j.f.Seek(0, io.SeekEnd)
	if _, err := j.f.Write(append(b, '\n')); err != nil {
		if serr == nil {
			j.f.Truncate(end)
		}
		return fmt.Errorf("agent: journal: %w", err)
	}
	if e.Acked {
		delete(j.entries, e.ID)
	} else {
		j.entries[e.ID] = e
	}
	j.lines++
	if j.lines > 1000 && j.lines > 4*len(j.entries) {
		return j.compactLocked()
	}
	return nil
}

// unacked lists the finished ops whose results the controller has not
// accepted, to post again after a restart.
func (j *journal) unacked() []wire.Result {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []wire.Result
	for _, e := range j.entries {
		if e.Result != nil {
			out = append(out, *e.Result)
		}
	}
	return out
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
