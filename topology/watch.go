package topology

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Period between automatic re-discoveries in Run; 0 means only on
	// demand (Refresh).
	Period time.Duration
	// Options are passed to Discover.
	Options []Option
	// Discover replaces topology.Discover (tests, or a caller with its
	// own source of Host values).
	Discover func(ctx context.Context) (*Host, error)
	// Logger defaults to a discarding logger.
	Logger *slog.Logger
	// Buffer is each subscriber's channel capacity (default 64).
	Buffer int
}

// Watcher holds the current Host, re-discovers it on demand and
// periodically, and publishes the differences to subscribers.
type Watcher struct {
	cfg       WatcherConfig
	log       *slog.Logger
	refreshMu sync.Mutex // serialises Refresh
	mu        sync.Mutex // guards current and subs
	current   *Host
	subs      map[chan Event]struct{}
}

// NewWatcher returns a Watcher; call Refresh or Run to populate it.
func NewWatcher(cfg WatcherConfig) *Watcher {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 64
	}
	if cfg.Discover == nil {
		opts := cfg.Options
		cfg.Discover = func(ctx context.Context) (*Host, error) { return Discover(ctx, opts...) }
	}
	return &Watcher{cfg: cfg, log: cfg.Logger, subs: map[chan Event]struct{}{}}
}

// Current returns the latest Host, or nil before the first Refresh. The
// Host must be treated as read-only.
func (w *Watcher) Current() *Host {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// Subscribe returns a channel of change events and a cancel function that
// closes it. A subscriber that falls more than the buffer behind loses
// events (logged) and should re-read Current.
func (w *Watcher) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, w.cfg.Buffer)
	w.mu.Lock()
	w.subs[ch] = struct{}{}
	w.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			w.mu.Lock()
			delete(w.subs, ch)
			w.mu.Unlock()
			close(ch)
		})
	}
}

// Refresh re-discovers the host, replaces Current and publishes the
// changes, which it also returns. The first successful Refresh sets the
// baseline and publishes nothing. On error Current is kept.
func (w *Watcher) Refresh(ctx context.Context) ([]Event, error) {
	w.refreshMu.Lock()
	defer w.refreshMu.Unlock()
	h, err := w.cfg.Discover(ctx)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.current
	w.current = h
	if old == nil {
		return nil, nil
	}
	events := Diff(old, h)
	for _, e := range events {
		for ch := range w.subs {
			select {
			case ch <- e:
			default:
				w.log.Warn("topology: subscriber too slow, event dropped", "event", e.String())
			}
		}
	}
	return events, nil
}

// Run refreshes once, then every Period until ctx is done; it returns
// nil when ctx is cancelled. Refresh errors are logged and retried at the
// next period.
func (w *Watcher) Run(ctx context.Context) error {
	if _, err := w.Refresh(ctx); err != nil && ctx.Err() == nil {
		w.log.Error("topology: discovery failed", "err", err)
	}
	if w.cfg.Period <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(w.cfg.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := w.Refresh(ctx); err != nil && ctx.Err() == nil {
				w.log.Error("topology: discovery failed", "err", err)
			}
		}
	}
}
