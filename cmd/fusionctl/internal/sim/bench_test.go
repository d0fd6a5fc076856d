package sim

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/sched"
)

// BenchmarkDefaultRun130 is one 130% run (seed 42) of the default openb
// trace on its 1213 nodes, per policy; it reports decisions per second.
func BenchmarkDefaultRun130(b *testing.B) {
	specs, pods := loadTrace(b, "openb_pod_list_default")
	wl := Workload(pods, 42, 130, 6212*sched.MilliPerGPU)
	frag := ShapeModel(wl, 0.95)
	for _, pol := range []string{"fusiond", "fgd", "bestfit"} {
		b.Run(pol, func(b *testing.B) {
			for b.Loop() {
				if _, err := RunProtocol(context.Background(), specs, wl, pol, 42, frag, []float64{100, 130}, sched.TieRanked); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(wl)*b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// BenchmarkDefaultRunRatio times fusiond's and FGD's run of
// BenchmarkDefaultRun130 side by side: each iteration runs both, in
// alternating order, each after a garbage collection (not timed) so that
// neither pays for the other's garbage and machine noise hits both alike.
// It reports each policy's seconds per run and fusiond÷FGD, the ratio the
// speed target is stated in (≤ 1.0 on one core: GOMAXPROCS=1).
func BenchmarkDefaultRunRatio(b *testing.B) {
	specs, pods := loadTrace(b, "openb_pod_list_default")
	wl := Workload(pods, 42, 130, 6212*sched.MilliPerGPU)
	frag := ShapeModel(wl, 0.95)
	pols := [2]string{"fusiond", "fgd"}
	var took [2]time.Duration
	run := func(k int) {
		runtime.GC()
		t0 := time.Now()
		if _, err := RunProtocol(context.Background(), specs, wl, pols[k], 42, frag, []float64{100, 130}, sched.TieRanked); err != nil {
			b.Fatal(err)
		}
		took[k] += time.Since(t0)
	}
	i := 0
	for b.Loop() {
		run(i % 2)
		run(1 - i%2)
		i++
	}
	n := float64(i)
	b.ReportMetric(took[0].Seconds()/n, "fusiond-s")
	b.ReportMetric(took[1].Seconds()/n, "fgd-s")
	b.ReportMetric(float64(took[0])/float64(took[1]), "fusiond/fgd")
}
