package jobs

import (
	"sync"

	"github.com/fusiond/fusiond/daemon/api"
)

// broker fans job events out to subscribers. A subscriber that falls
// behind by more than its buffer is dropped (its channel is closed) rather
// than slowing the daemon down.
type broker struct {
	mu   sync.Mutex
	next int
	subs map[int]*subscriber
}

type subscriber struct {
	ch     chan api.Event
	filter func(api.Event) bool
}

const subscriberBuffer = 256

func newBroker() *broker { return &broker{subs: map[int]*subscriber{}} }

func (b *broker) subscribe(filter func(api.Event) bool) (<-chan api.Event, func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.next
	b.next++
	s := &subscriber{ch: make(chan api.Event, subscriberBuffer), filter: filter}
	b.subs[id] = s
	return s.ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.subs[id]; ok {
			delete(b.subs, id)
			close(s.ch)
		}
	}
}

func (b *broker) publish(ev api.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, s := range b.subs {
		if s.filter != nil && !s.filter(ev) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			delete(b.subs, id)
			close(s.ch)
		}
	}
}

func (b *broker) closeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, s := range b.subs {
		delete(b.subs, id)
		close(s.ch)
	}
}
