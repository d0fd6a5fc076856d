package peers

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// constSource draws the same number every time: 0 makes every spread pick
// the best left (rank order), ^0 the second of the two best left.
type constSource uint64

func (s constSource) Uint64() uint64 { return uint64(s) }

// drawWith makes n's spread choice of offers draw from src.
func drawWith(n *Node, src rand.Source) {
	n.spreadRand = func() *rand.Rand { return rand.New(src) }
}

// TestOfferWalksTheSpreadOrder checks that Offer offers in the spread
// choice's order, not always to the best-ranked peer first, and says so:
// of two peers the engine scores alike (b and c, the view's ages
// deciding which ranks first), a draw that always takes the second of the
// two best left offers to the one ranked second, which takes the job, and
// the other is not offered it; a draw that always takes the best left
// offers in rank order and names no spread.
func TestOfferWalksTheSpreadOrder(t *testing.T) {
	c := newCluster(t)
	two := []devices.Device{{ID: "GPU-1", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}},
		{ID: "GPU-2", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}}}
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 8000, gpus: two}, nil, a.GossipAddr())
	c.start("c", &fakeHost{cpu: 8000, gpus: two}, nil, a.GossipAddr())
	eventually(t, "loads", func() bool { return len(loads(a)) == 3 })
	drawWith(a, constSource(^uint64(0)))
	h, err := a.Offer(context.Background(), "7#1", api.Job{ID: "7", Spec: gpuSpec(), Owner: api.Owner{User: "root"}})
	if err != nil {
		t.Fatal(err)
	}
	took, other := 1, 2 // indices in c.jobs of b and c
	if h.Peer == "c" {
		took, other = 2, 1
	}
	if !strings.Contains(h.Why, "peer "+h.Peer+" ranked 2 of 2") || !strings.Contains(h.Why, "picked by the spread choice (at random among the best 2 not yet offered)") {
		t.Fatalf("handover %+v", h)
	}
	if c.jobs[took].offers != 1 || c.jobs[other].offers != 0 {
		t.Fatalf("offers reached the peer that took it %d, the other %d times", c.jobs[took].offers, c.jobs[other].offers)
	}
	// A draw that always takes the best left is rank order, and the
	// explanation names no spread.
	drawWith(a, constSource(0))
	h2, err := a.Offer(context.Background(), "8#1", api.Job{ID: "8", Spec: gpuSpec(), Owner: api.Owner{User: "root"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(h2.Why, "peer "+h2.Peer+" ranked 1 of 2") || strings.Contains(h2.Why, "spread choice") {
		t.Fatalf("handover %+v", h2)
	}
}

// TestSpreadKeepsAClearlyBetterPeerFirst: the daemon's spread choice
// draws only among peers scored within spreadWithin of the best left, so
// a 4-GPU training job is offered first to the peer whose free GPUs are
// NVLinked, and to the more capable model, whatever the draw; between
// two equal peers the draw decides.
func TestSpreadKeepsAClearlyBetterPeerFirst(t *testing.T) {
	spec := api.JobSpec{Class: api.ClassTraining, Resources: api.Resources{CPU: 4000, Memory: 8 << 30, GPU: &api.GPURequest{Count: 4}}}
	plain, linked := okLoad(64000, map[string]int{"NVIDIA H100 80GB HBM3": 8}), okLoad(64000, map[string]int{"NVIDIA H100 80GB HBM3": 8})
	plain.NVLink, linked.NVLink = map[string]int{"NVIDIA H100 80GB HBM3": 1}, map[string]int{"NVIDIA H100 80GB HBM3": 8}
	a100, h200 := okLoad(64000, map[string]int{"NVIDIA A100-SXM4-80GB": 8}), okLoad(64000, map[string]int{"NVIDIA H200": 8})
	a100.NVLink, h200.NVLink = map[string]int{"NVIDIA A100-SXM4-80GB": 8}, map[string]int{"NVIDIA H200": 8}
	for _, tc := range []struct {
		name        string
		cands       []candidate
		firstAlways string
	}{
		{"nvlink", []candidate{{name: "a-pcie", load: plain}, {name: "b-nvlink", load: linked}}, "b-nvlink"},
		{"model", []candidate{{name: "a-a100", load: a100}, {name: "b-h200", load: h200}}, "b-h200"},
		{"equal", []candidate{{name: "a", load: linked}, {name: "b", load: linked}}, ""},
	} {
		firsts := map[string]int{}
		for seed := range uint64(64) {
			rk := ranker{spread: offerSpread(), rng: rand.New(rand.NewPCG(seed, 1))}
			ranked, _ := rk.rank(spec, tc.cands)
			firsts[ranked[rk.offerOrder(ranked)[0]].name]++
		}
		switch {
		case tc.firstAlways != "" && firsts[tc.firstAlways] != 64:
			t.Errorf("%s: offered first %v, want %s every time", tc.name, firsts, tc.firstAlways)
		case tc.firstAlways == "" && (firsts["a"] < 16 || firsts["b"] < 16):
			t.Errorf("%s: offered first %v, want both often", tc.name, firsts)
		}
	}
}
