package sim

import (
	"context"
	"runtime"
	"syscall"
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
// It reports each policy's wall seconds per run and fusiond÷FGD, the ratio
// the speed target is stated in (≤ 1.0 on one core: GOMAXPROCS=1), and the
// same ratio of the process's CPU time (user + system), which other
// processes on a loaded machine disturb less.
func BenchmarkDefaultRunRatio(b *testing.B) {
	specs, pods := loadTrace(b, "openb_pod_list_default")
	wl := Workload(pods, 42, 130, 6212*sched.MilliPerGPU)
	frag := ShapeModel(wl, 0.95)
	pols := [2]string{"fusiond", "fgd"}
	var wall, cpu [2]time.Duration
	run := func(k int) {
		runtime.GC()
		c0, t0 := cpuTime(b), time.Now()
		if _, err := RunProtocol(context.Background(), specs, wl, pols[k], 42, frag, []float64{100, 130}, sched.TieRanked); err != nil {
			b.Fatal(err)
		}
		wall[k] += time.Since(t0)
		cpu[k] += cpuTime(b) - c0
	}
	i := 0
	for b.Loop() {
		run(i % 2)
		run(1 - i%2)
		i++
	}
	n := float64(i)
	b.ReportMetric(wall[0].Seconds()/n, "fusiond-s")
	b.ReportMetric(wall[1].Seconds()/n, "fgd-s")
	b.ReportMetric(float64(wall[0])/float64(wall[1]), "fusiond/fgd")
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "cpu-fusiond/fgd")
}

// cpuTime is the CPU time (user + system) the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
