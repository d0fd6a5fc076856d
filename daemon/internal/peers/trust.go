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
	mu     sync.Mutex
	offers keyedBuckets // per peer
}

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
	if n.cfg.OfferRate <= 0 {
		return true
	}
	n.trust.mu.Lock()
	defer n.trust.mu.Unlock()
	return n.trust.offers.take(peer, time.Now())
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
