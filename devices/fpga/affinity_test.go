package fpga_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fusiond/fusiond/devices/fpga"
)

// policy picks a region for a job that needs bitstream id.
type policy func(m *fpga.Manager, regions []fpga.RegionStatus, id string) string

// firstFit ignores bitstreams: the first healthy, idle region.
func firstFit(_ *fpga.Manager, rs []fpga.RegionStatus, _ string) string { return rs[0].ID }

// blind picks a uniformly random region (a bitstream-blind spread).
func blind(r *rand.Rand) policy {
	return func(_ *fpga.Manager, rs []fpga.RegionStatus, _ string) string { return rs[r.IntN(len(rs))].ID }
}

// affinity prefers a region already holding the bitstream, then an empty
// region, then the one with the lowest programming-time estimate: what the
// scheduler does with RegionStatus.LoadedBitstream and Manager.Estimate.
func affinity(m *fpga.Manager, rs []fpga.RegionStatus, id string) string {
	best, bestCost := "", time.Duration(-1)
	for _, r := range rs {
		if r.LoadedBitstream == id {
			return r.ID
		}
		c, _ := m.Estimate(r.ID, id)
		if r.LoadedBitstream != "" {
			c += time.Hour // evicting a known bitstream costs its next reload
		}
		if bestCost < 0 || c < bestCost {
			best, bestCost = r.ID, c
		}
	}
	return best
}

type workloadResult struct {
	reprograms int
	progTime   time.Duration
}

// runWorkload places n jobs alternating over the given bitstreams on the
// simulated host's two DFL cards, programming where the policy says.
// Simulated PR time is charged on a fake clock at 20 MB/s plus 1.5 s
// (typical of a PAC partial reconfiguration), so figures are deterministic.
func runWorkload(t *testing.T, pick policy, n int, names []string) workloadResult {
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	r := newRig(t, fpga.WithClock(clk.now))
	r.pr.hook = func() { clk.add(1500*time.Millisecond + time.Duration(float64(40<<20)/20e6*float64(time.Second))) }
	ctx := context.Background()
	var res workloadResult
	for i := range n {
		all, err := r.m.Regions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var dfl []fpga.RegionStatus
		for _, s := range all {
			if s.Kind == fpga.KindDFL && s.Health.Healthy && !s.Busy {
				dfl = append(dfl, s)
			}
		}
		want := r.ids[names[i%len(names)]]
		out, err := r.m.Program(ctx, pick(r.m, dfl, want), want)
		if err != nil {
			t.Fatal(err)
		}
		if !out.AlreadyLoaded {
			res.reprograms++
			res.progTime += out.Duration
		}
	}
	return res
}

// TestAffinityFigure is the bitstream-affinity figure of docs/fpga.md:
// go test -run TestAffinityFigure -v ./devices/fpga/
func TestAffinityFigure(t *testing.T) {
	const n = 100
	for _, names := range [][]string{{"nlb0", "dma"}} {
		ff := runWorkload(t, firstFit, n, names)
		bl := runWorkload(t, blind(rand.New(rand.NewPCG(1, 2))), n, names)
		af := runWorkload(t, affinity, n, names)
		t.Logf("%d jobs alternating %v over 2 DFL regions:", n, names)
		t.Logf("  first-fit : %3d reprogrammings, %v programming", ff.reprograms, ff.progTime)
		t.Logf("  random    : %3d reprogrammings, %v programming", bl.reprograms, bl.progTime)
		t.Logf("  affinity  : %3d reprogrammings, %v programming (saves %v vs first-fit)", af.reprograms, af.progTime, ff.progTime-af.progTime)
		if af.reprograms > len(names) || af.reprograms >= bl.reprograms || bl.reprograms >= ff.reprograms {
			t.Errorf("affinity %d, random %d, first-fit %d reprogrammings: affinity must program each bitstream at most once and beat both",
				af.reprograms, bl.reprograms, ff.reprograms)
		}
	}
}
