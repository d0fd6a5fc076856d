package sim

import (
	"context"
	"testing"

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

// BenchmarkBound is the allocation bound at 130 % of the default trace
// (seed 42), forced pods included, and ForcedPods alone.
func BenchmarkBound(b *testing.B) {
	specs, pods := loadTrace(b, "openb_pod_list_default")
	wl := Workload(pods, 42, 130, 6212*sched.MilliPerGPU)
	b.Run("bound", func(b *testing.B) {
		for b.Loop() {
			if _, err := Bound(specs, wl, 130); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("forced", func(b *testing.B) {
		for b.Loop() {
			if _, err := ForcedPods(specs, wl, len(wl)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
