package qos

import (
	"context"
	"testing"
	"time"

	"github.com/fusiond/fusiond/ebpf"
)

// BenchmarkInterference is the interference experiment behind docs/qos.md:
// a latency-sensitive job (waking every millisecond, burstable tier) alone,
// beside best-effort CPU hogs (two per CPU) with the QoS loop off, and with
// the loop on (SLO: 1.5 × the solo p99). It reports the job's run-queue
// p99 in each phase, the ratios to solo, and the share of their loop-off
// work rate the hogs keep with the loop on.
//
//	go test -run '^$' -bench Interference -benchtime 1x ./daemon/internal/qos/
func BenchmarkInterference(b *testing.B) {
	const phase = 4 * time.Second
	for b.Loop() {
		e := newKernelEnv(b, time.Second)
		if err := e.probe.Register(mustID(b, e), 1); err != nil {
			b.Fatal(err)
		}
		id := mustID(b, e)
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
		startProc(b, e.svc, "wake")
		time.Sleep(300 * time.Millisecond)
		solo := window(phase).Quantile(0.99)

		var hogs []*proc
		for range 2 * int(e.pool/1000) {
			hogs = append(hogs, startProc(b, e.be, "hog"))
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
		off := window(phase).Quantile(0.99)
		offRate := float64(work() - w0)

		slo := max(solo*3/2, 10*time.Microsecond)
		_ = e.probe.Unregister(id) // the loop registers the job itself
		e.setSLO(slo)
		p := Params{MinMilli: 100, Shrink: 0.5, RestoreStep: 250, RestoreAfter: 2 * time.Second, MinEvents: 20}
		l, err := New(Config{Window: 250 * time.Millisecond, Params: p}, e.probe, e.host, testLogger(b))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); l.Run(ctx) }()
		time.Sleep(3 * time.Second)                     // converge
		if err := e.probe.Register(id, 1); err != nil { // re-registering keeps the loop's histogram
			b.Fatal(err)
		}
		w1 := work()
		on := window(phase).Quantile(0.99)
		onRate := float64(work() - w1)
		st := l.Status()
		cancel()
		<-done
		// The host is shared: the solo phase again, hogs gone, shows how
		// much of the latency was theirs and how much the host's own load.
		for _, h := range hogs {
			_ = h.cmd.Process.Kill()
		}
		time.Sleep(300 * time.Millisecond)
		if err := e.probe.Register(id, 1); err != nil {
			b.Fatal(err)
		}
		after := window(phase).Quantile(0.99)

		b.ReportMetric(float64(solo.Microseconds()), "solo_p99_us")
		b.ReportMetric(float64(off.Microseconds()), "off_p99_us")
		b.ReportMetric(float64(on.Microseconds()), "on_p99_us")
		b.ReportMetric(float64(after.Microseconds()), "solo_again_p99_us")
		b.ReportMetric(float64(off)/float64(solo), "off/solo")
		b.ReportMetric(float64(on)/float64(solo), "on/solo")
		b.ReportMetric(100*onRate/offRate, "be_kept_%")
		b.Logf("solo p99 %v; hogs, loop off: p99 %v; loop on (SLO %v): p99 %v, best-effort quota %v at the end, hogs kept %.0f%% of their loop-off work; solo again p99 %v",
			solo, off, slo, on, st.BestEffortQuota, 100*onRate/offRate, after)
	}
}

func mustID(b testing.TB, e *kernelEnv) uint64 {
	id, err := e.host.CgroupID("svc")
	if err != nil {
		b.Fatal(err)
	}
	return id
}
