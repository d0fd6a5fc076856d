package sim

import (
	"context"
	"math"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

// TestOpenBDecentralised replays the default openb trace (seed 42) over
// 1213 daemons that hand pods over to peers ranked on a gossiped view 10
// and 50 arrivals old, with the daemon's spread choice of offers and the
// fresh load carried back by every answer, and compares the GPU
// allocation at 130 % arrived with the centralised policy's: a daemon
// that ranks itself with its peers stays within the 0.5 point of
// it at both ages. A daemon that keeps what fits locally (the daemon's
// behaviour within its wait budget) loses a few points; with the poor-fit
// rule (the daemon's peers.rank_self defaults) it offers the pods that fit
// poorly here and does better than without. Every pod is accounted for
// (placed locally, handed over, or failed), and the refused offers are
// logged.
func TestOpenBDecentralised(t *testing.T) {
	specs, pods := loadTrace(t, "openb_pod_list_default")
	if len(specs) != 1213 {
		t.Fatalf("%d nodes, want openb's 1213", len(specs))
	}
	var capMilli int64
	for _, s := range specs {
		capMilli += int64(s.GPUs) * sched.MilliPerGPU
	}
	th := []float64{100, 110, 120, 130}
	wl := Workload(pods, 42, 130, capMilli)
	frag := ShapeModel(wl, 0.95)
	const pol = "fusiond"
	central, err := RunProtocol(context.Background(), specs, wl, pol, 42, frag, th, sched.TieRanked)
	if err != nil {
		t.Fatal(err)
	}
	c := central.AllocPct[3]
	run := func(o DecentralOptions) DecentralResult {
		t.Helper()
		o.Choice = sched.DefaultSpread()
		dec, err := RunDecentralised(context.Background(), specs, wl, pol, 42, frag, th, sched.TieRanked, o)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Local+dec.HandedOver+dec.Failed != len(wl) || dec.HandedOver == 0 || dec.RankedSelf > dec.Local+dec.HandedOver {
			t.Errorf("%s: local %d + handed over %d + failed %d != %d pods (ranked against peers %d)", o.describe(), dec.Local, dec.HandedOver, dec.Failed, len(wl), dec.RankedSelf)
		}
		t.Logf("%s: %.2f%% at 130%% arrived (centralised %.2f%%): local %d, handed over %d, refused offers %d, ranked against peers %d, failed %d (centralised %d)",
			o.describe(), dec.AllocPct[3], c, dec.Local, dec.HandedOver, dec.Refusals, dec.RankedSelf, dec.Failed, central.Failed)
		return dec
	}
	for _, delay := range []int{10, 50} {
		spread := run(DecentralOptions{Delay: delay, Spread: true})
		if d := spread.AllocPct[3]; math.IsNaN(d) || math.Abs(c-d) > 0.5 {
			t.Errorf("delay %d: decentralised allocation (ranked with peers) %.2f%% is more than 0.5 point from the centralised %.2f%%", delay, d, c)
		}
		if spread.Refusals == 0 {
			t.Errorf("delay %d: no offer refused on a stale view", delay)
		}
	}
	local := run(DecentralOptions{Delay: 50})
	rule := run(DecentralOptions{Delay: 50, RankSelfBelow: 0.5, RankSelfMargin: 0.1})
	if d := local.AllocPct[3]; math.IsNaN(d) || d > c || c-d > 10 {
		t.Errorf("local-first allocation %.2f%% beside the centralised %.2f%%", d, c)
	}
	if rule.RankedSelf == 0 || !(rule.AllocPct[3] > local.AllocPct[3]) {
		t.Errorf("the poor-fit rule offered %d fitting pods to peers: %.2f%%, local-first without it %.2f%%", rule.RankedSelf, rule.AllocPct[3], local.AllocPct[3])
	}
}
