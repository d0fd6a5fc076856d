package peers

import (
	"crypto"
	"encoding/base64"
	"fmt"
	"maps"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// The gossip's trust model (docs/peers.md, Gossip): a member holding the
// gossip key, with a certificate of its own, lies about itself, forges
// loads of another member and floods names; real memberlist nodes on
// loopback.

// forge is a load message m signed by signer.
func forge(t *testing.T, signer crypto.Signer, m loadMsg) []byte {
	t.Helper()
	b, err := encodeLoad(m, func(body []byte) ([]byte, error) { return signLoad(signer, body) })
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendTo delivers b from n to the member named to as a user message
// (memberlist's reliable stream; to's NotifyMsg takes it).
func sendTo(t *testing.T, n *Node, to string, b []byte) {
	t.Helper()
	var dst *memberlist.Node
	for _, m := range n.ml.Members() {
		if m.Name == to {
			dst = m
		}
	}
	if dst == nil {
		t.Fatalf("%s does not know %s", n.cfg.NodeName, to)
	}
	if err := n.ml.SendReliable(dst, b); err != nil {
		t.Fatal(err)
	}
}

// pushState makes n push the envelopes raws (with its own view) to the
// member at addr in a push/pull exchange.
func pushState(t *testing.T, n *Node, addr string, raws map[string][]byte) {
	t.Helper()
	n.mu.Lock()
	for name, r := range raws {
		n.view[name] = &peerView{raw: r, received: time.Now()}
	}
	n.mu.Unlock()
	_, err := n.ml.Join([]string{addr})
	n.mu.Lock()
	for name := range raws {
		delete(n.view, name)
	}
	n.mu.Unlock()
	if err != nil {
		// A stream closed at accept (the transport's limit per source):
		// resend, which calls this, sends again until its deadline.
		t.Logf("push/pull to %s: %v (sent again)", addr, err)
	}
}

// resend sends until cond holds (a stream over the gossip transport's
// limit of 2 per source is closed at accept, and every node here is
// 127.0.0.1), for up to 10 s.
func resend(t *testing.T, what string, send func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		send()
		for wait := time.Now().Add(500 * time.Millisecond); time.Now().Before(wait); time.Sleep(10 * time.Millisecond) {
			if cond() {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func viewOf(n *Node, name string) (loadMsg, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.view[name]
	if !ok {
		return loadMsg{}, false
	}
	return v.msg, true
}

func gpus(model string, k int) []devices.Device {
	var out []devices.Device
	for i := range k {
		out = append(out, devices.Device{ID: fmt.Sprintf("GPU-%s-%d", model, i), Kind: devices.GPU, Model: model, Health: devices.Health{Healthy: true}})
	}
	return out
}

// cloneLoad copies a load's maps, so that a lie made of it leaves the
// view it came from alone.
func cloneLoad(l api.PeerLoad) api.PeerLoad {
	l.GPUs, l.MIG, l.NVLink = maps.Clone(l.GPUs), maps.Clone(l.MIG), maps.Clone(l.NVLink)
	return l
}

// TestGossipLiesAreDroppedAndRankingHolds: a T4 peer signs, with its own
// key, loads claiming a queue of −1000 (which once ranked it first), a
// negative wait, CPU or share, more GPUs or memory than a host has, load
// fractions outside [0, 1]. Each is dropped on arrival and counted; the
// view keeps the T4's honest load (its own later messages still count)
// and the H200 peer still ranks first for a GPU job.
func TestGossipLiesAreDroppedAndRankingHolds(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("h200", &fakeHost{cpu: 64000, gpus: gpus("NVIDIA H200", 8)}, nil, a.GossipAddr())
	t4 := c.start("t4", &fakeHost{cpu: 64000, gpus: gpus("Tesla T4", 8)}, nil, a.GossipAddr())
	eventually(t, "loads", func() bool { return len(loads(a)) == 3 })
	spec := api.JobSpec{Name: "train", Class: api.ClassTraining, Command: []string{"true"},
		Resources: api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}}}
	rank := func() []candidate {
		r, _ := a.ranker().rank(spec, a.candidates())
		return r
	}
	honestRank := rank()
	if len(honestRank) != 2 || honestRank[0].name != "h200" {
		t.Fatalf("honest ranking %v", names(honestRank))
	}
	honest, _ := viewOf(a, "t4")
	lies := []struct {
		what string
		lie  func(*api.PeerLoad)
	}{
		{"queue -1000", func(l *api.PeerLoad) { l.Queue = -1000 }},
		{"wait -1h", func(l *api.PeerLoad) { l.Wait = api.Duration(-time.Hour) }},
		{"cpu -1", func(l *api.PeerLoad) { l.CPU = -1 }},
		{"memory 2 PiB", func(l *api.PeerLoad) { l.Memory = 2 << 50 }},
		{"1000 GPUs", func(l *api.PeerLoad) { l.GPUs["Tesla T4"] = 1000 }},
		{"-1 GPUs", func(l *api.PeerLoad) { l.GPUs["Tesla T4"] = -1 }},
		{"gpu_load -5", func(l *api.PeerLoad) { l.GPULoad = -5 }},
		{"cpu_load 7", func(l *api.PeerLoad) { l.CPULoad = 7 }},
		{"gpu_share_milli -1", func(l *api.PeerLoad) { l.GPUShareMilli = -1 }},
		{"fpga_free 10000", func(l *api.PeerLoad) { l.FPGAFree = 10000 }},
		{"mig -3", func(l *api.PeerLoad) { l.MIG = map[string]int{"1g.10gb": -3} }},
		{"energy -1 W", func(l *api.PeerLoad) { l.EnergyHeadroomWatts = -1 }},
		{"health is a story", func(l *api.PeerLoad) { l.Health = "trust me" }},
	}
	before := a.dropped.invalid.Load()
	for i, lie := range lies {
		l := cloneLoad(honest.Load)
		lie.lie(&l)
		if err := validateLoad(l); err == nil {
			t.Fatalf("%s: validateLoad takes it", lie.what)
		}
		// Newer than anything the T4 will send: believed, it would stay.
		b := forge(t, t4.signer, loadMsg{Node: "t4", Seq: math.MaxUint64 - uint64(i), API: t4.APIAddr(), Load: l})
		resend(t, "a to drop the lie "+lie.what, func() { sendTo(t, t4, "a", b) },
			func() bool { return a.dropped.invalid.Load()-before >= uint64(i+1) })
	}
	if got := a.Peers().GossipDropped["invalid"]; got < uint64(len(lies)) {
		t.Errorf("fusionctl peers counts %d invalid, want at least %d", got, len(lies))
	}
	v, _ := viewOf(a, "t4")
	if v.Seq > math.MaxUint64-uint64(len(lies)) || v.Load.Queue != 0 || v.Load.GPUs["Tesla T4"] != 8 {
		t.Fatalf("a's view of t4 took a lie: seq %d, %+v", v.Seq, v.Load)
	}
	eventually(t, "t4's honest loads to count still", func() bool { v, _ := viewOf(a, "t4"); return v.Seq > honest.Seq })
	after := rank()
	// The engine's score is the honest one's, and the penalty is only the
	// view's age (never a bonus).
	if len(after) != 2 || after[0].name != "h200" || after[1].engine != honestRank[1].engine || after[1].penalty < 0 || after[1].penalty > agePenalty {
		t.Fatalf("ranking after the lies: %v (t4: %s; honest: %s)", names(after), after[1].explain(), honestRank[1].explain())
	}
}

// TestForgedLoadAboutAnotherNodeIsDropped: m, a member with the right
// gossip key and a certificate of its own, forges b's load — seq
// MaxUint64 (which once pinned b's view for good), a signature of m's,
// b's own signature on another body — by message, relayed gossip and
// push/pull, and a load of a name that is no member. a drops all of it,
// relays none, and goes on taking b's own loads. a learns b's key anew
// while the first forgery waits, from b's member entry (the forgery names
// m's API address).
func TestForgedLoadAboutAnotherNodeIsDropped(t *testing.T) {
	c := newCluster(t)
	k := []string{key('k')}
	a := c.start("a", &fakeHost{cpu: 4000}, k)
	bh := &changingHost{}
	bh.cpu.Store(1000)
	b := c.add("b", bh, k, a.GossipAddr())
	b.Start()
	m := c.start("m", &fakeHost{cpu: 1000}, k, a.GossipAddr())
	w := c.start("w", &fakeHost{cpu: 1000}, k, a.GossipAddr()) // a witness: a must relay nothing forged to it
	eventually(t, "loads", func() bool { return len(loads(a)) == 4 && len(loads(w)) == 4 })

	big := okLoad(64000, map[string]int{"NVIDIA H200": 8})
	pinned := forge(t, m.signer, loadMsg{Node: "b", Seq: math.MaxUint64, API: m.APIAddr(), Load: big})
	a.mu.Lock()
	delete(a.keys, "b")
	delete(a.tried, "b")
	a.mu.Unlock()
	resend(t, "the pinning forgery to be dropped once b's key is known", func() { sendTo(t, m, "a", pinned) },
		func() bool { return a.dropped.unsigned.Load() >= 1 })
	bh.cpu.Store(2000)
	eventually(t, "b's own newer load at a", func() bool { v, _ := viewOf(a, "b"); return v.Load.CPU == 2000 })

	// b's genuine envelope with another body under b's signature.
	a.mu.Lock()
	genuine := a.view["b"].raw
	a.mu.Unlock()
	env, err := decodeEnvelope(genuine)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(string(env.body), `"cpu":"2"`, `"cpu":"64"`, 1)
	if body == string(env.body) {
		t.Fatalf("body %s has no cpu 2 to change", env.body)
	}
	body = strings.Replace(body, `"seq":`+strconv.FormatUint(env.Seq, 10), `"seq":18446744073709551615`, 1)
	stolen := append([]byte{kindLoad}, `{"body":`+body+`,"sig":"`+base64.StdEncoding.EncodeToString(env.sig)+`"}`...)
	if _, err := decodeLoad(stolen); err != nil {
		t.Fatalf("the stolen-signature forgery does not even decode: %v", err)
	}
	unsigned := append([]byte{kindLoad}, `{"body":`+body+`,"sig":"AAAA"}`...)

	u0 := a.dropped.unsigned.Load()
	for i, f := range [][]byte{pinned, stolen, unsigned} {
		resend(t, "a forgery by message dropped", func() { sendTo(t, m, "a", f) },
			func() bool { return a.dropped.unsigned.Load()-u0 >= uint64(i+1) })
	}
	u1 := a.dropped.unsigned.Load()
	resend(t, "the forgery by push/pull dropped", func() { pushState(t, m, a.GossipAddr(), map[string][]byte{"b": pinned[1:]}) },
		func() bool { return a.dropped.unsigned.Load() > u1 })
	m.queue.QueueBroadcast(&broadcast{node: "forged-b", msg: pinned}) // and by m's gossip, as a relay

	n0 := a.dropped.notMember.Load()
	ghost := forge(t, m.signer, loadMsg{Node: "ghost", Seq: 1, API: m.APIAddr(), Load: big})
	resend(t, "the ghost's load dropped", func() { sendTo(t, m, "a", ghost) }, func() bool { return a.dropped.notMember.Load() > n0 })
	if _, ok := viewOf(a, "ghost"); ok {
		t.Fatal("a keeps a view of a name that is no member")
	}

	bh.cpu.Store(3000)
	eventually(t, "b's own loads still count at a and w", func() bool {
		va, _ := viewOf(a, "b")
		vw, _ := viewOf(w, "b")
		return va.Load.CPU == 3000 && vw.Load.CPU == 3000
	})
	time.Sleep(300 * time.Millisecond) // let m's gossip round go out
	for _, n := range []*Node{a, w} {
		v, _ := viewOf(n, "b")
		if v.Seq == math.MaxUint64 || v.Load.CPU != 3000 || v.API != b.APIAddr() {
			t.Fatalf("%s's view of b: seq %d, cpu %v, api %s", n.cfg.NodeName, v.Seq, v.Load.CPU, v.API)
		}
	}
}

// TestRestartedNodeIsBelievedAgain: b restarts with a new certificate
// (a new key) and a clock that went back (its sequence numbers below the
// old daemon's); memberlist sees it leave and join again, and a takes its
// new loads.
func TestRestartedNodeIsBelievedAgain(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	b := c.start("b", &fakeHost{cpu: 1000}, nil, a.GossipAddr())
	eventually(t, "b's load at a", func() bool { _, ok := viewOf(a, "b"); return ok })
	old, _ := viewOf(a, "b")
	b.Close()
	b2 := c.add("b", &fakeHost{cpu: 3000}, nil, a.GossipAddr())
	b2.mu.Lock()
	b2.seq = 1
	b2.mu.Unlock()
	b2.Start()
	eventually(t, "the restarted b's load at a", func() bool { v, _ := viewOf(a, "b"); return v.Load.CPU == 3000 })
	if v, _ := viewOf(a, "b"); v.Seq >= old.Seq {
		t.Fatalf("the restarted b's seq %d is not below the old one's %d: the test tests nothing", v.Seq, old.Seq)
	}
}

// TestDepartedNodesArePruned: a member that left is listed gone for a
// grace (MaxLoadAge), then forgotten with its key.
func TestDepartedNodesArePruned(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	b := c.start("b", &fakeHost{cpu: 1000}, nil, a.GossipAddr())
	eventually(t, "b's load and key at a", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.view["b"] != nil && a.keys["b"] != nil
	})
	b.Close()
	eventually(t, "b to be pruned", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.view["b"] == nil && a.members["b"] == nil && a.keys["b"] == nil && a.tried["b"].IsZero()
	})
	for _, p := range a.Peers().Peers {
		if p.Name == "b" {
			t.Fatalf("a still lists b: %+v", p)
		}
	}
}

// TestExpiredLeasesAreBounded: the keys whose lease ended are at most
// maxExpired (the oldest forgotten first) and each for expiredKeep.
func TestExpiredLeasesAreBounded(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 1000}, nil)
	now := time.Now()
	a.mu.Lock()
	for i := range maxExpired + 100 {
		a.expireLocked(fmt.Sprintf("b/%d#1", i), now.Add(time.Duration(i)*time.Millisecond-2*expiredKeep))
	}
	_, first := a.expired["b/0#1"]
	size := len(a.expired)
	a.expireLocked("b/new#1", now)
	a.mu.Unlock()
	if size != maxExpired || first {
		t.Fatalf("%d expired keys kept (the first: %v), want %d without the first", size, first, maxExpired)
	}
	a.prune(now)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.expired["b/new#1"]; len(a.expired) != 1 || !ok {
		t.Fatalf("after expiredKeep %d keys are left, want only the recent one", len(a.expired))
	}
}

// TestFakeNamesStayBounded: m pushes loads of 100,000 made-up node names
// (each signed by m, valid otherwise) to a in push/pull states over
// memberlist's TCP. a keeps nothing of them: its view holds its members
// only, and its heap after GC is flat.
//
//	go test -count=1 -run TestFakeNamesStayBounded -v ./daemon/internal/peers/
func TestFakeNamesStayBounded(t *testing.T) {
	const fakes = 100_000
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 1000}, nil, a.GossipAddr())
	m := c.start("m", &fakeHost{cpu: 1000}, nil, a.GossipAddr())
	eventually(t, "loads", func() bool { return len(loads(a)) == 3 })

	// The attacker's messages are made before the first reading, so only
	// what a keeps of them shows.
	load := okLoad(64000, map[string]int{"NVIDIA H200": 8})
	batches := []map[string][]byte{}
	for i := range fakes {
		if i%(maxStateLoads-8) == 0 {
			batches = append(batches, map[string][]byte{})
		}
		name := fmt.Sprintf("fake-%06d", i)
		batches[len(batches)-1][name] = forge(t, m.signer, loadMsg{Node: name, Seq: math.MaxUint64, API: m.APIAddr(), Load: load})[1:]
	}
	before, rssBefore := heap(), rss()
	n0 := a.dropped.notMember.Load()
	sent := 0
	for _, batch := range batches {
		sent += len(batch)
		resend(t, "a to drop the batch", func() { pushState(t, m, a.GossipAddr(), batch) },
			func() bool { return a.dropped.notMember.Load()-n0 >= uint64(sent) })
	}
	after, rssAfter := heap(), rss()
	runtime.KeepAlive(batches) // held through both readings

	a.mu.Lock()
	sizes := []int{len(a.view), len(a.members), len(a.keys), len(a.tried), len(a.pending)}
	a.mu.Unlock()
	t.Logf("%d fake names pushed: a's view %d entries (members %d, keys %d); heap after GC %.1f MiB before, %.1f MiB after (%+.2f MiB); process RSS %.1f → %.1f MiB (three nodes and the attacker in one process)",
		fakes, sizes[0], sizes[1], sizes[2], mib(before), mib(after), mib(after)-mib(before), rssBefore, rssAfter)
	if sizes[0] != 3 || sizes[1] != 2 || sizes[2] > 2 || sizes[3] > 2 || sizes[4] > 2 {
		t.Fatalf("a keeps view %d, members %d, keys %d, tried %d, pending %d: want its 3 nodes' view and 2 members", sizes[0], sizes[1], sizes[2], sizes[3], sizes[4])
	}
	if len(a.Peers().Peers) != 3 {
		t.Fatalf("a lists %d peers", len(a.Peers().Peers))
	}
	// Kept, 100,000 views took tens of MiB.
	if grew := int64(after) - int64(before); grew > 8<<20 {
		t.Fatalf("a's heap grew by %.1f MiB", float64(grew)/(1<<20))
	}
}

func heap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// rss is the process's resident set in MiB (Linux).
func rss() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
