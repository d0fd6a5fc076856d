package peers

import (
	"crypto"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport is a member's modelled-network transport, counting
// the bytes it sends: packets, and what it writes on streams, dialled or
// answered. The mock hands a packet over only when its receiver reads it,
// and memberlist answers a packet (an ack) from the goroutine that reads
// them, so two members writing to each other would wait on each other
// for ever: packets go out from their own goroutine, at most sendBuffer
// at once per member, and beyond that are dropped (counted), as a full
// UDP socket buffer would.
type countingTransport struct {
	memberlist.NodeAwareTransport
	sent, dropped *atomic.Int64
	inflight      chan struct{}
	streams       chan net.Conn
	stop          chan struct{}
}

const sendBuffer = 256

func newCountingTransport(t memberlist.NodeAwareTransport, sent, dropped *atomic.Int64) *countingTransport {
	c := &countingTransport{NodeAwareTransport: t, sent: sent, dropped: dropped, inflight: make(chan struct{}, sendBuffer),
		streams: make(chan net.Conn), stop: make(chan struct{})}
	go func() {
		for {
			select {
			case <-c.stop:
				return
			case conn := <-t.StreamCh():
				select {
				case c.streams <- countingConn{conn, sent}:
				case <-c.stop:
					conn.Close()
					return
				}
			}
		}
	}()
	return c
}

func (t *countingTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *countingTransport) Shutdown() error {
	close(t.stop)
	return t.NodeAwareTransport.Shutdown()
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	select {
	case t.inflight <- struct{}{}:
	default:
		t.dropped.Add(1)
		return now, nil
	}
	t.sent.Add(int64(len(b)))
	b = slices.Clone(b)
	go func() {
		defer func() { <-t.inflight }()
		_, _ = t.NodeAwareTransport.WriteToAddress(b, a)
	}()
	return now, nil
}

func (t *countingTransport) DialTimeout(addr string, d time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, d)
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialAddressTimeout(a, d)
	if err != nil {
		return nil, err
	}
	return countingConn{c, t.sent}, nil
}

// countingConn counts what is written on a stream.
type countingConn struct {
	net.Conn
	sent *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	k, err := c.Conn.Write(b)
	c.sent.Add(int64(k))
	return k, err
}

// modelSlowdown is how many times slower than memberlist's LAN profile
// (and the 1 s load broadcast) the modelled members run, so that two
// shared cores keep up with N members: every interval and timeout is
// multiplied by it, and the figures are divided by it back into the
// model's time. FUSIOND_MODEL_SLOWDOWN overrides it.
func modelSlowdown(b *testing.B, n int) int {
	if s := os.Getenv("FUSIOND_MODEL_SLOWDOWN"); s != "" {
		f, err := strconv.Atoi(s)
		if err != nil || f < 1 {
			b.Fatalf("FUSIOND_MODEL_SLOWDOWN=%q: want a whole number ≥ 1", s)
		}
		return f
	}
	switch {
	case n <= 10:
		return 1
	case n <= 100:
		return 4
	}
	return 20
}

// slow multiplies memberlist's timing by f.
func slow(mc *memberlist.Config, f time.Duration) {
	for _, d := range []*time.Duration{&mc.TCPTimeout, &mc.PushPullInterval, &mc.ProbeInterval, &mc.ProbeTimeout,
		&mc.GossipInterval, &mc.GossipToTheDeadTime} {
		*d *= f
	}
}

// BenchmarkModelledConvergence runs N members in one process over
// memberlist's MockNetwork (LAN profile, load broadcast every second, all
// slowed by modelSlowdown): the real gossip, NotifyMsg, merge with the
// signature check and relay, with only the key fetch's TLS handshake
// stubbed (Config.model). Each op changes member 0's free CPU, gossips it
// and waits until every member holds it. It reports, in the model's time,
// the p50 and max of that wait, the same in gossip rounds (GossipInterval),
// and the bytes each member sent per second at its transport.
//
//	nice -n 10 go test -run '^$' -bench ModelledConvergence -benchtime 5x -timeout 20m ./daemon/internal/peers/
//
// It runs 10 and 100 members; FUSIOND_MODEL_MEMBERS=1000 (a comma list)
// runs others: 1,000 members take about 15 minutes and 5 GB at
// FUSIOND_MODEL_SLOWDOWN=10 (most of it the join's membership gossip
// settling; docs/peers.md), so that size is not run by default.
func BenchmarkModelledConvergence(b *testing.B) {
	sizes := []int{10, 100}
	if s := os.Getenv("FUSIOND_MODEL_MEMBERS"); s != "" {
		sizes = sizes[:0]
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 || n > 5000 {
				b.Fatalf("FUSIOND_MODEL_MEMBERS=%q: want member counts between 2 and 5000", s)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) { modelledConvergence(b, n) })
	}
}

// roomDelegate is a member's delegate as memberlist sees it in the
// model: the member itself, noting when memberlist last left its loads
// room in a gossip packet. memberlist's own messages (a member alive,
// suspect, dead) go first, and after a join of many members at once they
// fill the packets until every member has heard of every other: loads
// wait meanwhile (memberlist does not ask for them).
type roomDelegate struct {
	memberlist.Delegate
	roomy *atomic.Int64 // when (UnixNano) memberlist last left at least half a packet
	full  int
}

func (d *roomDelegate) GetBroadcasts(overhead, limit int) [][]byte {
	if 2*limit >= d.full {
		d.roomy.Store(time.Now().UnixNano())
	}
	return d.Delegate.GetBroadcasts(overhead, limit)
}

func modelledConvergence(b *testing.B, n int) {
	f := time.Duration(modelSlowdown(b, n))
	ca := newTestCA(b, b.TempDir())
	network := &memberlist.MockNetwork{}
	var sent, dropped atomic.Int64
	hosts := make([]*changingHost, n)
	nodes := make([]*Node, n)
	byName := map[string]*Node{}
	var gossipInterval time.Duration
	roomy := make([]atomic.Int64, n)
	configured := 0
	model := &modelled{
		config: func(mc *memberlist.Config) {
			slow(mc, f)
			gossipInterval = mc.GossipInterval / f
			mc.Transport = newCountingTransport(network.NewTransport(mc.Name), &sent, &dropped)
			mc.Delegate = &roomDelegate{Delegate: mc.Delegate, roomy: &roomy[configured], full: mc.UDPBufferSize}
			configured++
		},
		// The key the member's certificate carries, as the handshake
		// would have verified it.
		key: func(name string) (crypto.PublicKey, error) {
			nd, ok := byName[name]
			if !ok {
				return nil, fmt.Errorf("no member %q", name)
			}
			return nd.signer.Public(), nil
		},
	}
	for i := range n {
		name := fmt.Sprintf("n%04d", i)
		cert, key := ca.issue(b, name)
		cfg := Config{NodeName: name, Gossip: "127.0.0.1:0", API: "127.0.0.1:0", Profile: "lan", InsecureGossip: true,
			CertFile: cert, KeyFile: key, CAFile: filepath.Join(ca.dir, "ca.pem"), Broadcast: f * time.Second, model: model}
		if i > 0 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		hosts[i] = &changingHost{}
		hosts[i].cpu.Store(1000)
		nd, err := New(cfg, newFakeJobs(), hosts[i], nil)
		if err != nil {
			b.Fatal(err)
		}
		nodes[i], byName[name] = nd, nd
	}
	// Close all at once: a closed member's mock transport takes no
	// more packets, so members closed one by one would wait on it.
	defer func() {
		var wg sync.WaitGroup
		for _, nd := range nodes {
			wg.Go(nd.Close)
		}
		wg.Wait()
	}()
	for _, nd := range nodes {
		nd.Start()
	}
	first := nodes[0].cfg.NodeName
	sees := func(nd *Node, cpu int64) bool {
		nd.mu.Lock()
		defer nd.mu.Unlock()
		v, ok := nd.view[first]
		return ok && int64(v.msg.Load.CPU) == cpu
	}
	all := func(cpu int64) bool {
		return !slices.ContainsFunc(nodes, func(nd *Node) bool { return !sees(nd, cpu) })
	}
	// held says how far a load got: the members holding it, those
	// holding it pending (waiting for member 0's key), and the packets
	// dropped so far.
	held := func(cpu int64) string {
		var have, pending int
		for _, nd := range nodes {
			if sees(nd, cpu) {
				have++
			}
			nd.mu.Lock()
			if p, ok := nd.pending[first]; ok && int64(p.Load.CPU) == cpu {
				pending++
			}
			nd.mu.Unlock()
		}
		return fmt.Sprintf("%d of %d members hold it, %d more pending; %d packets dropped", have, n, pending, dropped.Load())
	}
	t0 := time.Now()
	for !all(1000) {
		if time.Since(t0) > 120*f*time.Second {
			b.Fatalf("the members did not converge at all in %v: %s", 120*f*time.Second, held(1000))
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Logf("%d members: joined and first load everywhere after %v (%.1f s modelled)", n, time.Since(t0).Round(time.Millisecond), time.Since(t0).Seconds()/float64(f))
	// The join's membership gossip first: until every member was left
	// room for loads within the last five rounds, a change would wait
	// behind it, and the figures would be the join's, not the change's.
	for {
		recent := time.Now().Add(-5 * gossipInterval * f).UnixNano()
		starved := 0
		for i := range roomy {
			if roomy[i].Load() < recent {
				starved++
			}
		}
		if starved == 0 {
			break
		}
		if time.Since(t0) > 300*f*time.Second {
			b.Fatalf("the join's membership gossip did not settle in %v: %d members left no room for loads", 300*f*time.Second, starved)
		}
		time.Sleep(100 * time.Millisecond)
	}
	settled := time.Since(t0) / f
	b.Logf("%d members: membership gossip settled after %.1f s modelled", n, settled.Seconds())
	start, sent0, dropped0 := time.Now(), sent.Load(), dropped.Load()
	var took []time.Duration
	// b.Loop, not b.N: the members are set up once for all the changes
	// (a 1,000-member join takes minutes), not again per b.N.
	for i := 0; b.Loop(); i++ {
		cpu := int64(2000 + i)
		hosts[0].cpu.Store(cpu)
		t0 := time.Now()
		nodes[0].gossip(localLoad(nodes[0].host, nodes[0].jobs))
		logged := t0
		for !all(cpu) {
			if time.Since(logged) > time.Minute {
				b.Logf("load change %d after %v (%.1f s modelled): %s", i, time.Since(t0).Round(time.Second), time.Since(t0).Seconds()/float64(f), held(cpu))
				logged = time.Now()
			}
			if time.Since(t0) > 30*f*time.Second {
				b.Fatalf("load change %d did not reach every member in %v: %s", i, 30*f*time.Second, held(cpu))
			}
			time.Sleep(5 * time.Millisecond)
		}
		took = append(took, time.Since(t0)/f)
	}
	b.StopTimer()
	slices.Sort(took)
	p50, top := took[len(took)/2], took[len(took)-1]
	b.ReportMetric(float64(p50.Milliseconds()), "ms-p50")
	b.ReportMetric(float64(top.Milliseconds()), "ms-max")
	b.ReportMetric(float64(p50)/float64(gossipInterval), "rounds-p50")
	b.ReportMetric(float64(top)/float64(gossipInterval), "rounds-max")
	b.ReportMetric(float64(sent.Load()-sent0)/(time.Since(start).Seconds()/float64(f))/float64(n), "B/s/member")
	b.ReportMetric(float64(dropped.Load()-dropped0)/float64(b.N), "dropped-pkts/op")
	b.ReportMetric(float64(f), "slowdown")
	b.ReportMetric(settled.Seconds(), "s-settled")
}
