package sched

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func snapshot(nodes []*Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = fmt.Sprintf("%d/%d/%v", n.CPUFreeMilli, n.MemFreeMiB, n.GPUs)
	}
	return out
}

// Property: a gang is placed whole or leaves the cluster untouched.
func TestPropertyGangAllOrNothing(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for trial := range 200 {
		nodes := randomCluster(r, 4)
		e := NewEngine(Options{Seed: uint64(trial)})
		gang := make([]Request, 1+r.IntN(6))
		for i := range gang {
			gang[i] = Request{ID: fmt.Sprint("m", i), CPUMilli: 2000, MemMiB: 1024, GPUs: 1 + r.IntN(4), GPUMilli: 1000}
		}
		before := snapshot(nodes)
		a, err := e.PlaceGang(gang, nodes)
		if err != nil {
			if !slices.Equal(before, snapshot(nodes)) {
				t.Fatalf("trial %d: failed gang left allocations behind", trial)
			}
			continue
		}
		if len(a) != len(gang) {
			t.Fatalf("trial %d: %d of %d members placed", trial, len(a), len(gang))
		}
	}
}

// Property: with aging, a low-priority large job is eventually placed even
// under a steady stream of higher-priority small jobs.
func TestPropertyNoStarvation(t *testing.T) {
	nodes := []*Node{NewNode("a", 16000, 1<<16, 4, "T4"), NewNode("b", 16000, 1<<16, 4, "T4")}
	e := NewEngine(Options{Seed: 2})
	q := &Queue{Aging: 1}
	q.Push(Request{ID: "big", Priority: 0, CPUMilli: 1000, GPUs: 4, GPUMilli: 1000}, 0)
	type run struct {
		req Request
		a   Assignment
		end int64
	}
	var running []run
	bigAt := int64(-1)
	for now := int64(0); now < 200 && bigAt < 0; now++ {
		for i := 0; i < len(running); i++ {
			if running[i].end <= now {
				e.Release(&running[i].req, &running[i].a, nodes)
				running = slices.Delete(running, i, i+1)
				i--
			}
		}
		q.Push(Request{ID: fmt.Sprint("s", now), Priority: 50, CPUMilli: 1000, GPUs: 1, GPUMilli: 1000}, now)
		placed, waiting := q.Schedule(now, e, nodes)
		for _, p := range placed {
			if p.Request.ID == "big" {
				bigAt = now
			}
			running = append(running, run{p.Request, p.Decision.Assignment, now + 3})
		}
		for _, w := range waiting {
			if w.ID == "big" && w.Reason == "" {
				t.Fatal("waiting job without a reason")
			}
		}
	}
	if bigAt < 0 {
		t.Fatal("large job starved")
	}
}

func TestBackfillRespectsReservation(t *testing.T) {
	a := NewNode("a", 16000, 1<<16, 4, "T4")
	b := NewNode("b", 16000, 1<<16, 4, "T4")
	a.GPUs[0].MilliFree = 0 // a has 3 free, b has 4 free minus one below
	b.GPUs[0].MilliFree, b.GPUs[1].MilliFree = 0, 0
	nodes := []*Node{a, b}
	e := NewEngine(Options{Seed: 1, Policy: BestFit{}})
	q := &Queue{}
	q.Push(Request{ID: "big", Priority: 10, GPUs: 4, GPUMilli: 1000}, 0)
	q.Push(Request{ID: "small", Priority: 1, GPUs: 1, GPUMilli: 1000}, 0)
	placed, waiting := q.Schedule(0, e, nodes)
	if len(placed) != 1 || placed[0].Request.ID != "small" {
		t.Fatalf("placed %+v", placed)
	}
	if placed[0].Decision.Assignment.Node == waiting[0].Reserved {
		t.Fatalf("backfill used the node reserved for the big job (%s)", waiting[0].Reserved)
	}
	if waiting[0].ID != "big" || waiting[0].Reserved != "a" || waiting[0].Ahead != 0 {
		t.Fatalf("waiting %+v", waiting)
	}
}

func TestPreemptionPicksMinimalVictims(t *testing.T) {
	n := NewNode("a", 32000, 1<<16, 4, "T4")
	n2 := NewNode("b", 32000, 1<<16, 4, "T4")
	nodes := []*Node{n, n2}
	var running []Running
	add := func(node int, id string, tier Tier, gpus []int, cost float64) {
		req := Request{ID: id, Tier: tier, GPUs: len(gpus), GPUMilli: 1000}
		a := Assignment{Node: nodes[node].Name, NodeIdx: node, GPUs: gpus, GPUMilli: 1000, FPGA: -1}
		if err := nodes[node].Apply(&a); err != nil {
			t.Fatal(err)
		}
		running = append(running, Running{Request: req, Assignment: a, Cost: cost})
	}
	// Node a: four 1-GPU best-effort jobs. Node b: one 2-GPU and two 1-GPU burstable jobs.
	add(0, "be0", TierBestEffort, []int{0}, 1)
	add(0, "be1", TierBestEffort, []int{1}, 1)
	add(0, "be2", TierBestEffort, []int{2}, 1)
	add(0, "be3", TierBestEffort, []int{3}, 1)
	add(1, "bu0", TierBurstable, []int{0, 1}, 5)
	add(1, "bu1", TierBurstable, []int{2}, 1)
	add(1, "crit", TierGuaranteed, []int{3}, 0) // equal tier: never a victim
	req := Request{ID: "new", Tier: TierGuaranteed, GPUs: 2, GPUMilli: 1000}
	p, err := PlanPreemption(&req, nodes, running, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Fewest victims: one (bu0 on b) beats two best-effort jobs on a.
	if p.Node != 1 || !slices.Equal(p.Victims, []string{"bu0"}) {
		t.Fatalf("plan %+v", p)
	}
	// With a cheaper equal-size option the cheaper wins.
	running[4].Cost = 50
	p, _ = PlanPreemption(&req, nodes, running, 3)
	if len(p.Victims) != 1 || p.Victims[0] != "bu0" {
		t.Fatalf("plan %+v", p)
	}
	// A budget of zero forbids preemption; nothing of a higher or equal tier is touched.
	if _, err := PlanPreemption(&req, nodes, running, 0); !errors.Is(err, ErrNoPreemption) {
		t.Fatalf("budget 0: %v", err)
	}
	low := Request{ID: "low", Tier: TierBestEffort, GPUs: 1, GPUMilli: 1000}
	if _, err := PlanPreemption(&low, nodes, running, 3); !errors.Is(err, ErrNoPreemption) {
		t.Fatalf("best-effort request preempted: %v", err)
	}
	if n.FullyFreeGPUs() != 0 || n2.FullyFreeGPUs() != 0 {
		t.Fatal("planning changed the nodes")
	}
}

func TestWaitingExplains(t *testing.T) {
	n := migNode()
	n.GPUs[7].MIG.Instances = []MIGInstance{{Profile: "7g.40gb", Start: 0, Slices: 7, InUse: true}}
	e := NewEngine(Options{Seed: 1})
	q := &Queue{}
	q.Push(Request{ID: "a", Priority: 5, MIGProfile: "1g.5gb", MIGSlices: 1}, 0)
	q.Push(Request{ID: "b", Priority: 1, MIGProfile: "1g.5gb", MIGSlices: 1}, 0)
	_, waiting := q.Schedule(0, e, []*Node{n})
	if len(waiting) != 2 {
		t.Fatalf("waiting %+v", waiting)
	}
	if got := waiting[1].String(); !strings.HasPrefix(got, "waiting: no GPU with a free 1g.5gb; 1 job ahead") {
		t.Fatalf("got %q", got)
	}
}
