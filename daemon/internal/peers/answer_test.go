package peers

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices"
)

// gpuHost is a fakeHost whose GPUs a test changes.
type gpuHost struct {
	mu sync.Mutex
	h  fakeHost
}

func (g *gpuHost) set(gpus []devices.Device) { g.mu.Lock(); g.h.gpus = gpus; g.mu.Unlock() }
func (g *gpuHost) Capacity() api.NodeResources {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.h.Capacity()
}
func (g *gpuHost) Allocated() api.NodeResources { return api.NodeResources{} }
func (g *gpuHost) Hardware() hostplacer.Hardware {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.h.Hardware()
}
func (g *gpuHost) LiveLoad() (float64, map[string]float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.h.LiveLoad()
}
func (g *gpuHost) PowerHeadroom() map[string]float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.h.PowerHeadroom()
}

// TestAnswerCarriesFreshLoad: b gossips 2 free H100s and then stays
// quiet (a broadcast interval of an hour); its GPUs change. Its answer to
// an offer, refused and then accepted, carries its load of that moment:
// a's view of b has the new free GPUs, a newer seq and was received after
// the offer was sent (age reset), without any gossip from b.
func TestAnswerCarriesFreshLoad(t *testing.T) {
	c := newCluster(t)
	a := c.add("a", &fakeHost{cpu: 4000}, nil)
	a.cfg.MaxLoadAge = time.Hour // b's one gossiped load stays a candidate
	a.Start()
	bh := &gpuHost{h: fakeHost{cpu: 8000, gpus: gpus("NVIDIA H100", 2)}}
	b := c.add("b", bh, nil, a.GossipAddr())
	b.cfg.Broadcast = time.Hour // its first load, then nothing
	b.Start()
	eventually(t, "a to see b's 2 GPUs", func() bool { v, ok := viewOf(a, "b"); return ok && v.Load.GPUs["NVIDIA H100"] == 2 })

	view := func() (loadMsg, time.Time) {
		a.mu.Lock()
		defer a.mu.Unlock()
		v := a.view["b"]
		return v.msg, v.received
	}
	seq0, _ := view()
	bh.set(gpus("NVIDIA H100", 1))
	c.jobs[1].refuse = "full"
	sent := time.Now()
	if _, err := a.Offer(context.Background(), "1#1", api.Job{ID: "1", Spec: gpuSpec()}); err == nil {
		t.Fatal("b refused, yet the offer succeeded")
	}
	seq1, at1 := view()
	if seq1.Load.GPUs["NVIDIA H100"] != 1 || seq1.Seq <= seq0.Seq || at1.Before(sent) {
		t.Fatalf("after a refusal a's view of b: %v GPUs, seq %d (was %d), received %v before the offer at %v",
			seq1.Load.GPUs, seq1.Seq, seq0.Seq, at1, sent)
	}

	bh.set(nil)
	c.jobs[1].refuse = ""
	sent = time.Now()
	h, err := a.Offer(context.Background(), "2#1", api.Job{ID: "2", Spec: gpuSpec()})
	if err != nil || h.RemoteID == "" {
		t.Fatalf("offer: %+v, %v", h, err)
	}
	seq2, at2 := view()
	if len(seq2.Load.GPUs) != 0 || seq2.Seq <= seq1.Seq || at2.Before(sent) {
		t.Fatalf("after an acceptance a's view of b: %v GPUs, seq %d (was %d), received %v before %v", seq2.Load.GPUs, seq2.Seq, seq1.Seq, at2, sent)
	}
	if d := a.dropped.snapshot(); len(d) != 0 {
		t.Fatalf("honest answers' loads dropped: %v", d)
	}
	// b's own view is what it answered with (what push/pull passes on).
	if v, _ := viewOf(b, "b"); v.Seq != seq2.Seq {
		t.Fatalf("b's own view is seq %d, its answer's %d", v.Seq, seq2.Seq)
	}

	// Loads in answers a's verification drops, each counted as gossip is:
	// b's name signed by another key (seq 2⁶⁴−1, which would pin the
	// view), another node's load in b's answer, a load out of bounds.
	big := okLoad(64000, map[string]int{"NVIDIA H200": 8})
	forged := forge(t, testSigner, loadMsg{Node: "b", Seq: math.MaxUint64, API: b.APIAddr(), Load: big})
	other := forge(t, testSigner, loadMsg{Node: "a", Seq: math.MaxUint64, API: b.APIAddr(), Load: big})
	neg := okLoad(8000, nil)
	neg.Queue = -1000
	lie, err := encodeLoad(loadMsg{Node: "b", Seq: math.MaxUint64, API: b.APIAddr(), Load: neg},
		func(body []byte) ([]byte, error) { return signLoad(b.signer, body) })
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what, why string
		env       []byte
	}{{"b's load signed by another key", "not signed by its node", forged},
		{"another node's load", "not signed by its node", other},
		{"b's own load with a queue of -1000", "invalid", lie}} {
		before := a.dropped.snapshot()[tc.why]
		body := `{"accepted":true,"remote_id":"9","load":` + string(tc.env[1:]) + `}`
		ans, err := decodeAnswer([]byte(body))
		if err != nil || !ans.Accepted {
			t.Fatalf("%s: the answer itself is lost: %+v, %v", tc.what, ans, err)
		}
		a.takeAnswerLoad("b", ans)
		if got := a.dropped.snapshot()[tc.why]; got != before+1 {
			t.Errorf("%s: %q drops %d → %d", tc.what, tc.why, before, got)
		}
		if v, _ := viewOf(a, "b"); v.Seq != seq2.Seq || len(v.Load.GPUs) != 0 {
			t.Fatalf("%s: a's view of b is now seq %d, GPUs %v", tc.what, v.Seq, v.Load.GPUs)
		}
	}
	if v, ok := viewOf(a, "a"); ok && v.Seq == math.MaxUint64 {
		t.Fatal("a took a load of itself from b's answer")
	}
}

// TestAnswerWithoutLoad: an older peer's answer (no load) decodes as
// before and changes no view; the decoder stays strict otherwise.
func TestAnswerWithoutLoad(t *testing.T) {
	for _, b := range []string{`{"accepted":true,"remote_id":"3"}`, `{"accepted":false,"why":"full"}`} {
		a, err := decodeAnswer([]byte(b))
		if err != nil || a.load != nil || a.loadErr != nil {
			t.Fatalf("%s: %+v, %v", b, a, err)
		}
	}
	for _, b := range []string{`{"accepted":true,"remote_id":"3","loads":{}}`, `{"accepted":false,"load":{"body":{},"sig":"AA=="},"x":1}`} {
		if _, err := decodeAnswer([]byte(b)); err == nil {
			t.Fatalf("%s decoded", b)
		}
	}
	n := &Node{cfg: Config{NodeName: "a"}, view: map[string]*peerView{}}
	a, _ := decodeAnswer([]byte(`{"accepted":true,"remote_id":"3"}`))
	n.takeAnswerLoad("b", a)
	if len(n.view) != 0 || len(n.dropped.snapshot()) != 0 {
		t.Fatalf("an answer without a load: view %v, dropped %v", n.view, n.dropped.snapshot())
	}
}

// TestBestAndOfferAbove: Best names the best-ranked peer with its
// ranking score (the one Offer tries first); OfferAbove offers only to
// peers ranked at least its minimum, naming the others.
func TestBestAndOfferAbove(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 8000, gpus: gpus("NVIDIA H100", 2)}, nil, a.GossipAddr())
	c.start("c", &fakeHost{cpu: 8000, gpus: gpus("NVIDIA H100", 1)}, nil, a.GossipAddr())
	eventually(t, "loads", func() bool { return len(loads(a)) == 3 })
	ranked, _ := a.ranker().rank(gpuSpec(), a.candidates())
	peer, score, ok := a.Best(gpuSpec())
	// (Ranked apart, the two differ by the view's aging between them: a
	// penalty of 0.1 per MaxLoadAge.)
	if !ok || len(ranked) != 2 || peer != ranked[0].name || math.Abs(score-ranked[0].score) > 0.01 || ranked[1].score >= score-0.05 {
		t.Fatalf("Best: %s %.3f %v; ranked %v", peer, score, ok, ranked)
	}
	if _, _, ok := a.Best(api.JobSpec{Command: []string{"x"}, Resources: api.Resources{CPU: 1000, GPU: &api.GPURequest{Count: 8}}}); ok {
		t.Fatal("Best found a peer for 8 GPUs")
	}
	second := ranked[1].name
	c.jobs[map[string]int{"b": 1, "c": 2}[peer]].refuse = "full"
	_, err := a.OfferAbove(context.Background(), "1#1", api.Job{ID: "1", Spec: gpuSpec()}, score-0.02)
	if err == nil || !strings.Contains(err.Error(), peer+" refused") || !strings.Contains(err.Error(), second+": ranks") {
		t.Fatalf("offer above the best's score with the best refusing: %v", err)
	}
	if n := c.jobs[map[string]int{"b": 1, "c": 2}[second]].offers; n != 0 {
		t.Fatalf("%s, ranked below the minimum, was offered the job %d times", second, n)
	}
	if h, err := a.OfferAbove(context.Background(), "2#1", api.Job{ID: "2", Spec: gpuSpec()}, ranked[1].score-0.02); err != nil || h.Peer != second {
		t.Fatalf("offer above the second's score: %+v, %v", h, err)
	}
}
