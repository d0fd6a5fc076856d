package peers

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// A node's load is taken only from that node. memberlist relays messages
// and anyone holding the gossip key can send one naming any node, so the
// key does not say who wrote a message: each load is signed with the
// private key of its node's peer certificate, and a receiver believes a
// load about node N only when N's key verifies it. The receiver learns
// N's key from a mutual-TLS handshake with N's peer API, at the address
// memberlist's member entry for N carries (never the message's own), where
// the certificate must chain to the cluster CA and carry N as a DNS name —
// what the peer API client checks for every hand-over.

// loadSigContext separates these signatures from any other use of the
// key.
const loadSigContext = "fusiond peers load v1\n"

const (
	// keyRetry is the least time between two fetches of one node's key.
	keyRetry = 2 * time.Second
	// keyFetchTimeout bounds one fetch (dial and handshake).
	keyFetchTimeout = 2 * time.Second
	// maxMembers bounds the members this node tracks (and so its views,
	// keys, fetches and pending messages, each kept only for members).
	maxMembers = maxStateLoads
)

// signLoad signs a load message's body.
func signLoad(s crypto.Signer, body []byte) ([]byte, error) {
	msg := append([]byte(loadSigContext), body...)
	if _, ok := s.Public().(ed25519.PublicKey); ok {
		return s.Sign(rand.Reader, msg, crypto.Hash(0))
	}
	d := sha256.Sum256(msg)
	return s.Sign(rand.Reader, d[:], crypto.SHA256)
}

// verifyLoad reports whether sig is pub's signature of body.
func verifyLoad(pub crypto.PublicKey, body, sig []byte) bool {
	msg := append([]byte(loadSigContext), body...)
	d := sha256.Sum256(msg)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, d[:], sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, msg, sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, d[:], sig) == nil
	}
	return false
}

// signerOf is the private key of the peer certificate, for signing.
func signerOf(c *tls.Config) (crypto.Signer, error) {
	if len(c.Certificates) == 0 {
		return nil, errors.New("no peer certificate")
	}
	s, ok := c.Certificates[0].PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("peer private key of type %T cannot sign", c.Certificates[0].PrivateKey)
	}
	switch s.Public().(type) {
	case *ecdsa.PublicKey, ed25519.PublicKey, *rsa.PublicKey:
		return s, nil
	}
	return nil, fmt.Errorf("peer private key of type %T: want ECDSA, Ed25519 or RSA", s.Public())
}

// member is a memberlist member as its events told this node.
type member struct {
	// api is the peer API address its member entry carries.
	api string
	// left is when it left or was declared dead (zero while alive or
	// suspect).
	left time.Time
}

// apiAddr is a member's peer API address from its metadata; an
// unspecified host (0.0.0.0, ::) is the member's gossip address.
func apiAddr(node *memberlist.Node) string {
	md, err := decodeMeta(node.Meta)
	if err != nil || md.API == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(md.API)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); (host == "" || ip != nil && ip.IsUnspecified()) && node.Addr != nil {
		return net.JoinHostPort(node.Addr.String(), port)
	}
	return md.API
}

// NotifyJoin is memberlist's EventDelegate (called under memberlist's
// lock: nothing here calls memberlist). A node seen for the first time,
// or again after it left or died (a restart, a healed partition), starts
// afresh: its view is dropped, so its next load counts whatever its
// sequence number (a restarted daemon's may be lower), and its key is
// fetched again (its certificate may be new; the one known verifies
// meanwhile).
func (n *Node) NotifyJoin(node *memberlist.Node) {
	if node.Name == n.cfg.NodeName {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.members[node.Name]; !ok && len(n.members) >= maxMembers {
		n.dropped.members.Add(1)
		return
	}
	n.members[node.Name] = &member{api: apiAddr(node)}
	delete(n.view, node.Name)
	delete(n.tried, node.Name)
	n.wantKeyLocked(node.Name)
}

// NotifyUpdate is memberlist's EventDelegate: a member's metadata
// changed.
func (n *Node) NotifyUpdate(node *memberlist.Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m, ok := n.members[node.Name]; ok {
		m.api = apiAddr(node)
	}
}

// NotifyLeave is memberlist's EventDelegate: a member left or died. Its
// view is kept for a grace (MaxLoadAge: fusionctl peers shows it gone),
// then pruned with its key.
func (n *Node) NotifyLeave(node *memberlist.Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m, ok := n.members[node.Name]; ok && m.left.IsZero() {
		m.left = time.Now()
	}
}

// wantKeyLocked asks the key loop for name's key, at most once per
// keyRetry (n.mu held). A request the full channel drops is not counted
// as asked: the node's next load, or the key loop's retry of every
// pending load, asks again.
func (n *Node) wantKeyLocked(name string) {
	if t, ok := n.tried[name]; ok && time.Since(t) < keyRetry {
		return
	}
	select {
	case n.want <- name:
		n.tried[name] = time.Now()
	default:
	}
}

// rewantPending asks again for the key of every member whose load waits
// for one (a request dropped or a fetch that failed): the load itself
// may not come again soon, as a quiet member refreshes it rarely and a
// large cluster's refreshes wait behind its changes.
func (n *Node) rewantPending() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name := range n.pending {
		n.wantKeyLocked(name)
	}
}

// keyLoop fetches the keys asked for, one at a time, and then takes the
// message that was waiting for each; every keyRetry it asks again for
// the keys pending loads still wait for.
func (n *Node) keyLoop() {
	defer n.wg.Done()
	retry := time.NewTicker(keyRetry)
	defer retry.Stop()
	for {
		var name string
		select {
		case <-n.stop:
			return
		case <-retry.C:
			n.rewantPending()
			continue
		case name = <-n.want:
		}
		n.mu.Lock()
		m := n.members[name]
		addr := ""
		if m != nil && m.left.IsZero() {
			addr = m.api
		}
		n.mu.Unlock()
		if addr == "" {
			continue
		}
		pub, err := n.fetchKey(name, addr)
		if err != nil {
			n.dropped.keyFetches.Add(1)
			n.log.Debug("fetching a peer's gossip key", "peer", name, "api", addr, "err", err)
			continue
		}
		n.mu.Lock()
		if m := n.members[name]; m == nil || !m.left.IsZero() {
			n.mu.Unlock()
			continue
		}
		old, had := n.keys[name]
		n.keys[name] = pub
		p, ok := n.pending[name]
		delete(n.pending, name)
		n.mu.Unlock()
		if had && sameKey(old, pub) {
			ok = false // what waited failed this very key already
		}
		if ok && n.merge(p) {
			n.relay(p)
		}
	}
}

func sameKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}

// fetchKey is the public key of the certificate node name presents at
// addr, after a mutual-TLS handshake that verified it: chained to the
// cluster CA, with name as a DNS name.
func (n *Node) fetchKey(name, addr string) (crypto.PublicKey, error) {
	if n.cfg.model != nil {
		return n.cfg.model.key(name)
	}
	cfg := n.transport.TLSClientConfig.Clone()
	cfg.ServerName = name
	ctx, cancel := context.WithTimeout(context.Background(), keyFetchTimeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	st := c.(*tls.Conn).ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return nil, errors.New("no verified certificate")
	}
	return st.VerifiedChains[0][0].PublicKey, nil
}

// dropCounts count the gossip this node dropped, by why (the message
// itself is logged at debug).
type dropCounts struct {
	invalid, notMember, unsigned, keyFetches, members atomic.Uint64
}

func (d *dropCounts) snapshot() map[string]uint64 {
	out := map[string]uint64{}
	for _, c := range []struct {
		why string
		c   *atomic.Uint64
	}{{"invalid", &d.invalid}, {"not a member", &d.notMember}, {"not signed by its node", &d.unsigned},
		{"key fetch failed", &d.keyFetches}, {"members over the bound", &d.members}} {
		if v := c.c.Load(); v > 0 {
			out[c.why] = v
		}
	}
	return out
}
