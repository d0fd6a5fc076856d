package sim

import (
	"context"
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
