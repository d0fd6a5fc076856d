package peers

import (
	"net/http"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/internal/audit"
)

// Auditor records the peer API's requests (audit.Log is one).
type Auditor interface {
	Record(audit.Record)
}

// trust is the peer API's gate on each calling peer, after its
// certificate: only a current member is served, and each peer's offers
// are rate-limited (docs/peers.md, "Trust").
type trust struct {
	mu      sync.Mutex
	buckets map[string]*offerBucket
}

// offerBucket is one peer's allowance of offers.
type offerBucket struct {
	tokens float64
	at     time.Time
}

// maxBuckets bounds the peers whose allowances are remembered; past it
// the full ones (idle peers) are forgotten.
const maxBuckets = 4096

// member reports whether name is a current member of the gossip pool (one
// memberlist has seen join and not leave or die): a certificate from the
// cluster's CA is not enough to be served.
func (n *Node) member(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.members[name]
	return m != nil && m.left.IsZero()
}

// allowOffer takes one offer from peer's allowance (OfferRate a second,
// OfferBurst at once) and reports whether there was one.
func (n *Node) allowOffer(peer string) bool {
	rate, burst := n.cfg.OfferRate, float64(n.cfg.OfferBurst)
	if rate <= 0 {
		return true
	}
	burst = max(burst, 1)
	t := &n.trust
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.buckets == nil {
		t.buckets = map[string]*offerBucket{}
	}
	b, ok := t.buckets[peer]
	if !ok {
		if len(t.buckets) >= maxBuckets {
			for k, o := range t.buckets {
				if o.tokens+now.Sub(o.at).Seconds()*rate >= burst {
					delete(t.buckets, k)
				}
			}
		}
		if len(t.buckets) >= maxBuckets {
			return false
		}
		b = &offerBucket{tokens: burst, at: now}
		t.buckets[peer] = b
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// audit records one peer API request by peer (its certificate's name, ""
// when it had none) answered with status.
func (n *Node) audit(r *http.Request, peer, action, target string, status int, message string) {
	if n.cfg.Audit == nil {
		return
	}
	rec := audit.Record{UID: -1, GID: -1, Peer: peer, Action: action, Method: r.Method, Path: r.URL.Path,
		Target: target, Status: status, Outcome: audit.OK, Message: message}
	switch {
	case status >= 500:
		rec.Outcome = audit.Failed
	case status >= 400:
		rec.Outcome = audit.Refused
	}
	n.cfg.Audit.Record(rec)
}
