package qmp

import (
	"context"
	"sync"
)

// sink is one event consumer (the Events stream or a subscription): an
// unbounded queue the reader appends to, and a pump goroutine that hands the
// queue over to ch. Each consumer has its own pump, so one that is not read
// holds up neither the reader nor the others.
type sink struct {
	names map[string]bool // nil: every event
	ch    chan Event

	mu    sync.Mutex
	queue []Event
	ended bool          // the connection ended: close ch once drained
	wake  chan struct{} // 1-buffered: "queue or ended changed"
	quit  chan struct{} // closed by stop: close ch now, drop the queue
	once  sync.Once
}

// newSink registers a sink and starts its pump; on a closed monitor the
// channel is closed at once. Callers must not hold m.mu.
func (m *Monitor) newSink(names []string) *sink {
	s := &sink{ch: make(chan Event), wake: make(chan struct{}, 1), quit: make(chan struct{})}
	if len(names) > 0 {
		s.names = make(map[string]bool, len(names))
		for _, n := range names {
			s.names[n] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		close(s.ch)
		s.once.Do(func() { close(s.quit) })
		return s
	}
	m.sinks[s] = struct{}{}
	m.wg.Add(1) // under m.mu with m.err nil: ordered before Close's Wait
	go s.pump(&m.wg)
	return s
}

func (s *sink) pump(wg *sync.WaitGroup) {
	defer wg.Done()
	defer close(s.ch)
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			ended := s.ended
			s.queue = nil // let the old backing array go
			s.mu.Unlock()
			if ended {
				return
			}
			select {
			case <-s.wake:
				continue
			case <-s.quit:
				return
			}
		}
		ev := s.queue[0]
		s.queue[0] = Event{}
		s.queue = s.queue[1:]
		s.mu.Unlock()
		select {
		case s.ch <- ev:
		case <-s.quit:
			return
		}
	}
}

func (s *sink) push(ev Event) {
	if s.names != nil && !s.names[ev.Name] {
		return
	}
	s.mu.Lock()
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	s.signal()
}

func (s *sink) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.signal()
}

func (s *sink) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sink) stop() { s.once.Do(func() { close(s.quit) }) }

func (m *Monitor) dispatch(ev Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return
	}
	for s := range m.sinks {
		s.push(ev)
	}
}

// Events returns a channel that receives every event, in order, from the
// moment of Dial. It is fed from an unbounded queue by its own goroutine, so
// not reading it never blocks the monitor — but the queue then grows until
// Close. The channel is closed once the connection has ended and the queue is
// drained (at once on Close). Every call returns the same channel.
func (m *Monitor) Events() <-chan Event { return m.events.ch }

// Subscribe returns a channel that receives, in order, the events named (all
// events if none are named) from now on, independently of Events and of other
// subscriptions. Subscribe before issuing the command whose event you want:
// QEMU sends e.g. RESUME before the reply to "cont". The channel is closed
// when the connection ended and it is drained, or at once by cancel or Close.
// Call cancel when done with it; it is idempotent.
func (m *Monitor) Subscribe(names ...string) (events <-chan Event, cancel func()) {
	s := m.newSink(names)
	return s.ch, func() {
		m.mu.Lock()
		delete(m.sinks, s)
		m.mu.Unlock()
		s.stop()
	}
}

// WaitEvent reads events (typically a Subscribe channel) until one named in
// names arrives (any event if none are named). It returns ErrClosed when the
// channel closes first and ctx.Err() when ctx ends first.
func WaitEvent(ctx context.Context, events <-chan Event, names ...string) (Event, error) {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return Event{}, ErrClosed
			}
			if len(names) == 0 {
				return ev, nil
			}
			for _, n := range names {
				if ev.Name == n {
					return ev, nil
				}
			}
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}
