package nvidia

import (
	"context"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// openSim opens a manager over a fresh simulated host.
func openSim(t testing.TB, name string, opts ...Option) (*Manager, *SimHost) {
	t.Helper()
	h, err := NewSimHost(name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open(append([]Option{WithNVML(h)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, h
}

func mustState(t testing.TB, m *Manager, busy Busy) State {
	t.Helper()
	st, err := m.State(context.Background(), busy)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
