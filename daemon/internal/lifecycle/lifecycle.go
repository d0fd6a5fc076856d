// Package lifecycle owns the start and stop order of the daemon's
// long-running parts (the store, the hardware, the job manager, the
// telemetry bus and the loops over it, the peers, the servers). Each part
// is registered with a name, the names of the parts it needs, and its
// Start and Stop; a Group starts them in a topological order of those
// needs (ties broken by registration order), refuses an unknown need or a
// cycle before starting anything, stops them in the reverse of the order
// they started, and when a start fails stops only the parts that started.
// It knows nothing of what the parts are.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Part is one long-running part of the daemon.
type Part struct {
	// Name names the part in Needs, errors and logs; unique in a Group.
	Name string
	// Needs are the parts that must have started before this one starts,
	// and so stop only after it has stopped.
	Needs []string
	// Start starts the part (nil: nothing to start). It returns once the
	// part is up; work that outlives it runs in its own goroutines.
	Start func(ctx context.Context) error
	// Stop stops what Start started (nil: nothing to stop). It is called
	// once, and only when Start returned nil.
	Stop func(ctx context.Context) error
}

// Group is a set of parts started and stopped together. The zero value is
// not usable; call New.
type Group struct {
	log *slog.Logger

	mu      sync.Mutex
	parts   []Part
	names   map[string]int
	started []int // indexes into parts, in start order
	state   state
}

type state int

const (
	idle state = iota
	starting
	running
	stopped
)

// New returns an empty group that logs each start and stop to log (nil:
// discarded).
func New(log *slog.Logger) *Group {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Group{log: log, names: map[string]int{}}
}

// Add registers p. It fails on an empty or repeated name, or once the
// group has started.
func (g *Group) Add(p Part) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch _, dup := g.names[p.Name]; {
	case g.state != idle:
		return fmt.Errorf("lifecycle: part %q added after the start", p.Name)
	case p.Name == "":
		return errors.New("lifecycle: a part without a name")
	case dup:
		return fmt.Errorf("lifecycle: part %q registered twice", p.Name)
	}
	g.names[p.Name] = len(g.parts)
	g.parts = append(g.parts, p)
	return nil
}

// order is the order Start starts the parts in: every part after the
// parts it needs, and among parts free to start, the one registered first.
// It fails on a need no part is registered for, or on a cycle of needs
// (the error names them).
func (g *Group) order() ([]int, error) {
	waiting := make([]int, len(g.parts)) // needs not yet started
	for i, p := range g.parts {
		for _, n := range p.Needs {
			if _, ok := g.names[n]; !ok {
				return nil, fmt.Errorf("lifecycle: part %q needs %q, which is not registered", p.Name, n)
			}
		}
		waiting[i] = len(p.Needs)
	}
	done := make([]bool, len(g.parts))
	out := make([]int, 0, len(g.parts))
	for len(out) < len(g.parts) {
		next := -1
		for i := range g.parts { // the first registered part that is free
			if !done[i] && waiting[i] == 0 {
				next = i
				break
			}
		}
		if next < 0 {
			return nil, fmt.Errorf("lifecycle: cycle of needs: %s", g.cycle(done))
		}
		done[next] = true
		out = append(out, next)
		for i, p := range g.parts {
			for _, n := range p.Needs {
				if n == g.parts[next].Name {
					waiting[i]--
				}
			}
		}
	}
	return out, nil
}

// cycle names one cycle among the parts not done (every one of them is
// on a cycle or waits on one): it follows needs that are not done until a
// part repeats.
func (g *Group) cycle(done []bool) string {
	at := -1
	for i := range g.parts {
		if !done[i] {
			at = i
			break
		}
	}
	seen := map[int]int{} // part → position on the path
	var path []int
	for {
		if pos, ok := seen[at]; ok {
			path = append(path[pos:], at)
			break
		}
		seen[at] = len(path)
		path = append(path, at)
		for _, n := range g.parts[at].Needs {
			if k := g.names[n]; !done[k] {
				at = k
				break
			}
		}
	}
	names := make([]string, len(path))
	for i, k := range path {
		names[i] = g.parts[k].Name
	}
	return strings.Join(names, " → ")
}

// Start starts every part after the parts it needs (among parts free to
// start, the one registered first); an unknown need or a cycle of needs
// fails before any part starts. If a part fails to start, Start stops
// the parts already started, in reverse order, and returns the failure
// wrapped with the part's name. It starts a group once; Stop undoes it.
func (g *Group) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != idle {
		return errors.New("lifecycle: started twice")
	}
	order, err := g.order()
	if err != nil {
		return err
	}
	g.state = starting
	for _, i := range order {
		p := g.parts[i]
		if p.Start != nil {
			t := time.Now()
			if err := p.Start(ctx); err != nil {
				g.log.Warn("part failed to start", "part", p.Name, "duration", time.Since(t), "err", err)
				err = fmt.Errorf("starting %s: %w", p.Name, err)
				return errors.Join(err, g.stop(context.WithoutCancel(ctx)))
			}
			g.log.Info("part started", "part", p.Name, "duration", time.Since(t))
		}
		g.started = append(g.started, i)
	}
	g.state = running
	return nil
}

// Stop stops the started parts in the reverse of their start order, every
// one even when some fail, and returns their errors joined. Calls after
// the first (and a call before Start) stop nothing and return nil.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stop(ctx)
}

func (g *Group) stop(ctx context.Context) error {
	g.state = stopped
	var errs []error
	for k := len(g.started) - 1; k >= 0; k-- {
		p := g.parts[g.started[k]]
		if p.Stop == nil {
			continue
		}
		t := time.Now()
		if err := p.Stop(ctx); err != nil {
			g.log.Warn("part failed to stop", "part", p.Name, "duration", time.Since(t), "err", err)
			errs = append(errs, fmt.Errorf("stopping %s: %w", p.Name, err))
			continue
		}
		g.log.Info("part stopped", "part", p.Name, "duration", time.Since(t))
	}
	g.started = nil
	return errors.Join(errs...)
}
