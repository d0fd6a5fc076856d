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
// with a draw that always takes the second of the two best left, the
// peer ranked second (b) is offered first and takes the job, and the best
// (c) is never offered it.
func TestOfferWalksTheSpreadOrder(t *testing.T) {
	c := newCluster(t)
	one := []devices.Device{{ID: "GPU-1", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}}}
	two := append(one, devices.Device{ID: "GPU-2", Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}})
	a := c.start("a", &fakeHost{cpu: 4000}, nil)
	c.start("b", &fakeHost{cpu: 8000, gpus: two}, nil, a.GossipAddr())
	c.start("c", &fakeHost{cpu: 8000, gpus: one}, nil, a.GossipAddr()) // ranked first
	eventually(t, "loads", func() bool { return len(loads(a)) == 3 })
	drawWith(a, constSource(^uint64(0)))
	h, err := a.Offer(context.Background(), "7#1", api.Job{ID: "7", Spec: gpuSpec(), Owner: api.Owner{User: "root"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.Peer != "b" || !strings.Contains(h.Why, "peer b ranked 2 of 2") || !strings.Contains(h.Why, "picked by the spread choice (at random among the best 2 not yet offered)") {
		t.Fatalf("handover %+v", h)
	}
	if c.jobs[1].offers != 1 || c.jobs[2].offers != 0 {
		t.Fatalf("offers reached b %d, c %d times", c.jobs[1].offers, c.jobs[2].offers)
	}
	// b full: c, now the only one left, is offered next, and its
	// explanation needs no spread.
	c.jobs[1].refuse = "full"
	h, err = a.Offer(context.Background(), "8#1", api.Job{ID: "8", Spec: gpuSpec(), Owner: api.Owner{User: "root"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.Peer != "c" || strings.Contains(h.Why, "spread choice") || !strings.Contains(h.Why, "b refused (full (test))") {
		t.Fatalf("handover %+v", h)
	}
}
