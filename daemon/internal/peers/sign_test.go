package peers

import (
	"crypto"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestPendingLoadAsksForItsKeyAgain: a's first fetch of b's key fails,
// and b, quiet, sends no load again for an hour (its retransmissions come
// within a second, while the failed fetch still counts as tried). The
// load that waits for b's key must not wait for b's next one: a asks for
// the key again on its own, and takes the load that waited. Before, a
// asked again only when a load of b arrived, which at scale (a 1,000
// member join) left members pending for good.
func TestPendingLoadAsksForItsKeyAgain(t *testing.T) {
	ca := newTestCA(t, t.TempDir())
	network := &memberlist.MockNetwork{}
	var mu sync.Mutex
	nodes := map[string]*Node{}
	fetches := map[string]int{}
	model := &modelled{
		config: func(mc *memberlist.Config) {
			mc.Transport = network.NewTransport(mc.Name)
			mc.PushPullInterval = time.Hour // no push/pull brings b's load again
		},
		key: func(name string) (crypto.PublicKey, error) {
			mu.Lock()
			defer mu.Unlock()
			fetches[name]++
			if name == "b" && fetches[name] == 1 {
				return nil, errors.New("the first handshake with b failed")
			}
			nd, ok := nodes[name]
			if !ok {
				return nil, errors.New("no such member")
			}
			return nd.signer.Public(), nil
		},
	}
	start := func(name string, broadcast time.Duration, join ...string) *Node {
		cert, key := ca.issue(t, name)
		n, err := New(Config{NodeName: name, Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Profile: "local", InsecureGossip: true, Join: join,
			CertFile: cert, KeyFile: key, CAFile: filepath.Join(ca.dir, "ca.pem"), Broadcast: broadcast, MaxLoadAge: time.Hour, model: model},
			newFakeJobs(), &fakeHost{cpu: 1000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		mu.Lock()
		nodes[name] = n
		mu.Unlock()
		n.Start()
		return n
	}
	a := start("a", 50*time.Millisecond)
	start("b", time.Hour, a.GossipAddr())

	eventually(t, "b's first load to wait at a for b's key, whose fetch failed", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, pending := a.pending["b"]
		return pending && a.dropped.keyFetches.Load() >= 1
	})
	eventually(t, "b's load to count at a without a new load of b", func() bool { _, ok := viewOf(a, "b"); return ok })
	mu.Lock()
	defer mu.Unlock()
	if fetches["b"] != 2 {
		t.Errorf("a fetched b's key %d times; want 2 (one failed, one retried)", fetches["b"])
	}
}
