package sim

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

// TestNodeViewMatchesEngine checks that scoring one node per state group
// (nodeView) changes no decision: every pod lands on the same node index
// with and without it, for the policies it applies to. It also keeps the
// view's copy of the engine's tie ranking in step with the engine's.
func TestNodeViewMatchesEngine(t *testing.T) {
	specs, pods := loadTrace(t, "openb_pod_list_default")
	var capMilli int64
	for _, s := range specs {
		capMilli += int64(s.GPUs) * sched.MilliPerGPU
	}
	for _, seed := range []uint64{42, 47} {
		wl := Workload(pods, seed, 130, capMilli)
		frag := ShapeModel(wl, 0.95)
		// A third of the workload keeps the test short; the groups are
		// largest (and a wrong representative likeliest) early on.
		wl = wl[:len(wl)/3]
		for _, pol := range []string{"fusiond", "fgd", "bestfit", "dotprod"} {
			p, _ := sched.PolicyByName(pol, frag, nil)
			if !dedupable(p, sched.TieRanked) {
				t.Fatalf("%s: not dedupable", pol)
			}
			var plain, deduped []int
			if _, err := runProtocol(context.Background(), specs, wl, p, pol, seed, frag, []float64{10}, sched.TieRanked, replayOpts{placed: &plain}); err != nil {
				t.Fatal(err)
			}
			p, _ = sched.PolicyByName(pol, frag, nil)
			if _, err := runProtocol(context.Background(), specs, wl, p, pol, seed, frag, []float64{10}, sched.TieRanked, replayOpts{dedupe: true, placed: &deduped}); err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(plain, deduped); i >= 0 {
				t.Errorf("%s seed %d: pod %d placed on node %d without the view, %d with it", pol, seed, i, plain[i], deduped[i])
			}
		}
	}
	for _, pol := range []string{"random", "gpuclustering"} {
		p, _ := sched.PolicyByName(pol, nil, nil)
		if dedupable(p, sched.TieRanked) {
			t.Errorf("%s: dedupable, but its scores are not a function of the node", pol)
		}
	}
	if p, _ := sched.PolicyByName("fgd", nil, nil); dedupable(p, sched.TieRandom) {
		t.Error("random tie-breaking must not be deduplicated")
	}
}

func firstDiff(a, b []int) int {
	if slices.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A node that sched.Filter lets through always passes the view's
// summary check (mayFit), and the check does reject: on random nodes
// (up to 12 GPUs, some in MIG mode, more than a summary keeps) and
// requests.
func TestFitSummaryNeverHidesAFit(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	rejected := 0
	for range 20000 {
		n := sched.NewNode("n", int64(r.IntN(8))*1000, int64(r.IntN(8))*1024, r.IntN(13), "G2")
		n.CPUFreeMilli, n.MemFreeMiB = int64(r.IntN(9))*1000, int64(r.IntN(9))*1024
		idle := r.IntN(2) == 0 // every GPU whole and free
		for i := range n.GPUs {
			if idle {
				continue
			}
			n.GPUs[i].MilliFree = int64(r.IntN(11)) * 100
			if r.IntN(8) == 0 {
				n.GPUs[i].MIG = &sched.MIG{TotalSlices: 7}
			}
		}
		req := sched.Request{CPUMilli: int64(r.IntN(5)) * 1000, MemMiB: int64(r.IntN(5)) * 1024}
		switch r.IntN(3) {
		case 1:
			req.GPUs, req.GPUMilli = 1, int64(1+r.IntN(10))*100
		case 2:
			req.GPUs, req.GPUMilli = 1+r.IntN(12), 1000
		}
		s := fitSummaryOf(n)
		fits := sched.Filter(&req, n) == sched.Fits
		if fits && !s.mayFit(&req) {
			t.Fatalf("Filter fits %+v on %+v, the summary %+v says not", req, n, s)
		}
		if !s.mayFit(&req) {
			rejected++
		}
	}
	if rejected == 0 {
		t.Error("the summary rejected nothing")
	}
}

// For a policy that never reads free memory the view groups nodes that
// differ only there and shows, per request, the first-ranked member with
// the memory asked for: on small clusters whose nodes differ mostly in
// free memory, every request lands where the engine puts it without the
// view, and the view does show members other than the representative.
func TestNodeViewMemoryBlind(t *testing.T) {
	notRep := 0
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 11))
		for _, pol := range []string{"fgd", "fusiond", "bestfit"} {
			shapes := []sched.Shape{{CPUMilli: 2000, GPUs: 1, GPUMilli: 500, P: 0.5}, {CPUMilli: 4000, GPUs: 1, GPUMilli: 1000, P: 0.5}}
			p, _ := sched.PolicyByName(pol, sched.NewFragModel(shapes), nil)
			if !memoryBlind(p) {
				t.Fatalf("%s: not memory-blind", pol)
			}
			var plain, viewed []*sched.Node
			for range 12 {
				n := sched.NewNode("n", 32000, 65536, 2, "T4")
				n.MemFreeMiB -= int64(r.IntN(4)) * 16384
				plain = append(plain, n)
				viewed = append(viewed, n.Clone())
			}
			ep := sched.NewEngine(sched.Options{Policy: p, Seed: seed, TieBreak: sched.TieRanked})
			p2, _ := sched.PolicyByName(pol, sched.NewFragModel(shapes), nil)
			ev := sched.NewEngine(sched.Options{Policy: p2, Seed: seed, TieBreak: sched.TieRanked})
			v := newNodeView(viewed, seed, true)
			for k := range 40 {
				req := sched.Request{ID: "r", CPUMilli: int64(1+r.IntN(4)) * 1000, MemMiB: int64(r.IntN(5)) * 12288, GPUs: 1, GPUMilli: []int64{500, 1000}[r.IntN(2)]}
				cand := v.forRequest(&req)
				for _, i := range v.shown {
					if v.repAt[i] < 0 {
						notRep++
					}
				}
				dp, errp := ep.Place(&req, plain)
				dv, errv := ev.Place(&req, cand)
				if (errp == nil) != (errv == nil) || dp.Assignment.NodeIdx != dv.Assignment.NodeIdx {
					t.Fatalf("%s seed %d request %d %+v: node %d (%v) without the view, %d (%v) with it", pol, seed, k, req, dp.Assignment.NodeIdx, errp, dv.Assignment.NodeIdx, errv)
				}
				if errp != nil {
					continue
				}
				if err := ep.Commit(&req, &dp.Assignment, plain); err != nil {
					t.Fatal(err)
				}
				if err := ev.Commit(&req, &dv.Assignment, viewed); err != nil {
					t.Fatal(err)
				}
				v.changed(dv.Assignment.NodeIdx)
			}
		}
	}
	if notRep == 0 {
		t.Error("the view never showed a member other than its group's representative: the memory path is untested")
	}
	t.Logf("%d members shown for their memory", notRep)
}
