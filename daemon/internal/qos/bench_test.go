package qos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/ebpf"
)

// BenchmarkInterference is the interference experiment behind docs/qos.md,
// in three set-ups run one after the other: the interferer is best-effort
// work (two CPU hogs per CPU in the best-effort tier, given the burstable
// tier's CPU weight: at its own weight best-effort preempts nothing), load
// outside fusiond's cgroups (two hogs per CPU in a cgroup of their own,
// beside one best-effort hog per CPU at the tier's weight), or both (hogs
// of each kind, best-effort at equal weight); besteffort-busy is the first
// with a protected job that works 400 µs after each wake-up instead of
// sleeping at once. In each, a
// latency-sensitive job (waking every millisecond, burstable tier) runs
// alone, beside the interferers with the QoS loop off, with the loop on
// (SLO: 1.5 × the solo p99), and alone again. It reports the job's
// run-queue p99 in each phase, the ratio to solo, the share of their
// loop-off work rate the best-effort hogs keep with the loop on, and with
// the loop off the share of the job's wait best-effort and outside tasks
// held the CPU for.
//
//	go test -run '^$' -bench Interference -benchtime 1x ./daemon/internal/qos/
func BenchmarkInterference(b *testing.B) {
	for _, setup := range []struct {
		name          string
		svc           string // the protected job's helper mode
		outside, hogs bool   // outside hogs; best-effort hogs that interfere
	}{{"besteffort", "wake", false, true}, {"besteffort-busy", "busy", false, true}, {"outside", "wake", true, false}, {"both", "wake", true, true}} {
		b.Run(setup.name, func(b *testing.B) {
			for b.Loop() {
				interference(b, setup.svc, setup.outside, setup.hogs)
			}
		})
	}
}

func interference(b *testing.B, svcMode string, outsideLoad, beInterferes bool) {
	const phase = 4 * time.Second
	e := newKernelEnv(b, time.Second)
	id := mustID(b, e)
	if err := e.probe.Register(id, TierNumber(api.TierBurstable)); err != nil {
		b.Fatal(err)
	}
	// With the loop off too, the probe knows the tiers.
	for _, t := range api.Tiers {
		tid, err := e.host.TierCgroupID(t)
		if err == nil {
			err = e.probe.RegisterClass(tid, TierNumber(t))
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if beInterferes {
		e.host.equal = true
		if err := e.host.equalTierWeights(); err != nil {
			b.Fatal(err)
		}
	}
	window := func(d time.Duration) ebpf.Histogram {
		h0, err := e.probe.Histogram(id)
		if err != nil {
			b.Fatal(err)
		}
		time.Sleep(d)
		h1, err := e.probe.Histogram(id)
		if err != nil {
			b.Fatal(err)
		}
		return h1.Sub(h0)
	}
	startProc(b, e.svc, svcMode)
	time.Sleep(300 * time.Millisecond)
	solo := window(phase).Quantile(0.99)

	// Best-effort hogs run in every set-up: what the loop may take from
	// them is the cost of its decisions. Where they are not the
	// interferer, outside hogs hold the CPUs and they run at the tier's
	// weight behind everything else.
	ncpu := int(e.pool / 1000)
	var hogs []*proc
	for range 2 * ncpu {
		hogs = append(hogs, startProc(b, e.be, "hog"))
	}
	var outside []*proc
	if outsideLoad {
		out := newOutsideCgroup(b)
		for range 2 * ncpu {
			outside = append(outside, startOutsideHog(b, out))
		}
	}
	if !beInterferes {
		// Only a few best-effort hogs: they run where the outside load
		// leaves room, and the job's waits are the outside load's.
		for _, h := range hogs[ncpu:] {
			_ = h.cmd.Process.Kill()
		}
		hogs = hogs[:ncpu]
	}
	work := func() uint64 {
		var n uint64
		for _, h := range hogs {
			n += h.work()
		}
		return n
	}
	time.Sleep(300 * time.Millisecond)
	w0 := work()
	offH := window(phase)
	off := offH.Quantile(0.99)
	offRate := float64(work() - w0)

	slo := max(solo*3/2, 10*time.Microsecond)
	_ = e.probe.Unregister(id) // the loop registers the job itself
	e.setSLO(slo)
	p := Params{MinMilli: 100, Shrink: 0.5, RestoreStep: 250, RestoreAfter: 2 * time.Second, MinEvents: 20, MinBlame: 0.1, BreachWindows: 2}
	l, err := New(Config{Window: 250 * time.Millisecond, Params: p}, e.probe, e.host, testLogger(b))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	time.Sleep(3 * time.Second) // converge
	w1 := work()
	// The loop holds the job's registration: read its histogram through
	// the probe all the same (Register keeps it).
	if err := e.probe.Register(id, TierNumber(api.TierBurstable)); err != nil {
		b.Fatal(err)
	}
	on := window(phase).Quantile(0.99)
	onRate := float64(work() - w1)
	st := l.Status()
	c := l.Counters()
	cancel()
	<-done
	// The host is shared: the solo phase again, interferers gone, shows
	// how much of the latency was theirs and how much the host's own.
	for _, h := range append(hogs, outside...) {
		_ = h.cmd.Process.Kill()
	}
	time.Sleep(300 * time.Millisecond)
	if err := e.probe.Register(id, TierNumber(api.TierBurstable)); err != nil {
		b.Fatal(err)
	}
	after := window(phase).Quantile(0.99)

	var sum uint64
	for _, n := range offH.BlameNs {
		sum += n
	}
	share := func(r ebpf.Runner) float64 {
		if sum == 0 {
			return 0
		}
		return 100 * float64(offH.BlameNs[r]) / float64(sum)
	}
	shrinks := c.Actions[ActionKey{Op: "shrink", Resource: "cpu", Result: "applied"}]
	spares := c.Actions[ActionKey{Op: "spare", Resource: "cpu", Result: "noted"}]
	b.ReportMetric(float64(solo.Microseconds()), "solo_p99_us")
	b.ReportMetric(float64(off.Microseconds()), "off_p99_us")
	b.ReportMetric(float64(on.Microseconds()), "on_p99_us")
	b.ReportMetric(float64(after.Microseconds()), "solo_again_p99_us")
	b.ReportMetric(float64(on)/float64(solo), "on/solo")
	b.ReportMetric(100*onRate/offRate, "be_kept_%")
	b.ReportMetric(share(ebpf.RunnerBestEffort), "off_blame_be_%")
	b.ReportMetric(share(ebpf.RunnerOutside), "off_blame_outside_%")
	b.ReportMetric(float64(shrinks), "shrinks")
	b.ReportMetric(float64(spares), "spares")
	b.Logf("solo p99 %v; interferers, loop off: p99 %v, the wait %s; loop on (SLO %v): p99 %v, best-effort quota %v at the end after %d shrinks and %d spared breaches, hogs kept %.0f%% of their loop-off work; solo again p99 %v",
		solo, off, DescribeBlame(offH.BlameNs), slo, on, st.BestEffortQuota, shrinks, spares, 100*onRate/offRate, after)
}

func mustID(b testing.TB, e *kernelEnv) uint64 {
	id, err := e.host.CgroupID("svc")
	if err != nil {
		b.Fatal(fmt.Errorf("svc cgroup: %w", err))
	}
	return id
}
