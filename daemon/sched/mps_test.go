package sched

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// An MPS GPU serves one user's shares at a time: a second user's share
// goes to another GPU, or waits with the reason when there is none; the
// first user's next share may join; once the first user's last share is
// released the GPU serves whoever comes. Whole GPUs and time-sliced GPUs
// are not affected.
func TestMPSOneUserAtATime(t *testing.T) {
	n := NewNode("n", 16000, 1<<16, 2, "NVIDIA H100")
	for i := range n.GPUs {
		n.GPUs[i].MPS = true
	}
	e := NewEngine(Options{Seed: 1, Explain: 4})
	nodes := []*Node{n}
	share := func(id, owner string) Request {
		return Request{ID: id, Class: ClassInference, CPUMilli: 100, GPUs: 1, GPUMilli: 250, Owner: owner}
	}
	place := func(r Request) (Assignment, error) {
		t.Helper()
		d, err := e.Place(&r, nodes)
		if err != nil {
			return d.Assignment, err
		}
		return d.Assignment, e.Commit(&r, &d.Assignment, nodes)
	}
	a1, err := place(share("a1", "uid:1000"))
	if err != nil {
		t.Fatal(err)
	}
	g := a1.GPUs[0]
	if n.GPUs[g].ShareOwner != "uid:1000" || a1.Owner != "uid:1000" {
		t.Fatalf("GPU %d owner %q after a share of uid:1000", g, n.GPUs[g].ShareOwner)
	}
	a2, err := place(share("a2", "uid:1000"))
	if err != nil || a2.GPUs[0] != g {
		t.Fatalf("uid:1000's second share: %v on %v, want beside its first on GPU %d (packing)", err, a2.GPUs, g)
	}
	b1, err := place(share("b1", "uid:2000"))
	if err != nil || b1.GPUs[0] == g {
		t.Fatalf("uid:2000's share: %v on %v, want the other GPU than uid:1000's %d", err, b1.GPUs, g)
	}
	// Both GPUs serve someone: a third user waits, and says why.
	c := share("c1", "uid:3000")
	if r := Filter(&c, n); r != ReasonMPSOwner {
		t.Fatalf("a third user's share: filter %q, want %q", r, ReasonMPSOwner)
	}
	d, err := e.Place(&c, nodes)
	if !errors.Is(err, ErrUnschedulable) || !strings.Contains(d.Explain(), "MPS") {
		t.Fatalf("a third user's share placed (%v):\n%s", err, d.Explain())
	}
	// A whole GPU is not a share: it still cannot take a GPU with shares,
	// but is not refused for their owner.
	whole := Request{ID: "w", CPUMilli: 100, GPUs: 1, GPUMilli: MilliPerGPU, Owner: "uid:3000"}
	if r := Filter(&whole, n); r != ReasonGPUs {
		t.Fatalf("a whole GPU beside shares: %q, want %q", r, ReasonGPUs)
	}
	// An assignment for another owner does not fit on the GPU, whatever
	// room it has (Commit re-checks).
	bad := a1
	bad.Owner = "uid:3000"
	if err := n.Apply(&bad); !errors.Is(err, ErrDoesNotFit) {
		t.Fatalf("apply for another owner: %v", err)
	}
	// uid:1000's shares leave: the GPU serves uid:3000 now.
	for _, a := range []Assignment{a1, a2} {
		r := share("", "uid:1000")
		e.Release(&r, &a, nodes)
	}
	if n.GPUs[g].ShareOwner != "" {
		t.Fatalf("GPU %d still serves %q with no share left", g, n.GPUs[g].ShareOwner)
	}
	if a3, err := place(c); err != nil || !slices.Equal(a3.GPUs, []int{g}) {
		t.Fatalf("uid:3000 after uid:1000 left: %v on %v, want GPU %d", err, a3.GPUs, g)
	}
	// Time-sliced GPUs have no owner.
	ts := NewNode("ts", 16000, 1<<16, 1, "NVIDIA H100")
	for _, o := range []string{"uid:1", "uid:2"} {
		r := share(o, o)
		if d, err := e.Place(&r, []*Node{ts}); err != nil || e.Commit(&r, &d.Assignment, []*Node{ts}) != nil {
			t.Fatalf("time-sliced share of %s: %v", o, err)
		}
	}
}
