package cgroups

import (
	"bufio"
	"io"
	"testing"
	"time"
)

// BenchmarkCPUIsolation measures one fixed unit of CPU work done by a job
// process (ns/op), alone and beside best-effort CPU hogs (no quota, one per
// shared CPU). "guaranteed" runs the worker on an exclusive core carved out
// of the shared pool; "burstable" runs it in the shared pool with the hogs,
// protected by its CPU weight only; "besteffort" runs it in the hogs' own
// cgroup tier with their weight, the unprotected baseline. Needs root and at
// least 2 CPUs. The cpu/wall metric is the worker's CPU time over the wall
// time of the measured ops.
func BenchmarkCPUIsolation(b *testing.B) {
	for _, sc := range []struct {
		name string
		tier Tier
		hogs bool
	}{
		{"guaranteed/alone", Guaranteed, false},
		{"guaranteed/besteffort-hogs", Guaranteed, true},
		{"burstable/alone", Burstable, false},
		{"burstable/besteffort-hogs", Burstable, true},
		{"besteffort/besteffort-hogs", BestEffort, true},
	} {
		b.Run(sc.name, func(b *testing.B) { benchIsolation(b, sc.tier, sc.hogs) })
	}
}

func benchIsolation(b *testing.B, tier Tier, hogs bool) {
	cpus := onlineCPUs(b)
	if len(cpus) < 2 {
		b.Fatalf("need 2 CPUs, have %v", cpus)
	}
	shared := cpus
	m := newKernelManager(b)
	p := Placement{Tier: Burstable, CPURequestMilli: 1000, SharedCPUs: cpus, MemoryRequest: 64 * mib, MemoryLimit: 128 * mib}
	switch tier {
	case BestEffort:
		p = Placement{Tier: BestEffort, SharedCPUs: cpus}
	case Guaranteed:
		// The worker's exclusive CPU is the last one; the rest stay shared.
		var excl []int
		excl, shared = cpus[len(cpus)-1:], cpus[:len(cpus)-1]
		p = Placement{Tier: Guaranteed, CPURequestMilli: 1000, ExclusiveCPUs: excl, MemoryRequest: 64 * mib}
	}
	if err := m.SetSharedCPUs(shared); err != nil {
		b.Fatal(err)
	}
	if hogs {
		be := mustCreate(b, m, "hogs", Placement{Tier: BestEffort, SharedCPUs: shared})
		for range cpus {
			startHelper(b, be, "hog")
		}
	}
	worker := mustCreate(b, m, "worker", p)
	pr, pw := io.Pipe()
	h := startHelperWith(b, worker.AddProc, "work", pw)
	replies := bufio.NewReader(pr)
	op := func() {
		if _, err := h.stdin.Write([]byte("x\n")); err != nil {
			b.Fatal(err)
		}
		if _, err := replies.ReadString('\n'); err != nil {
			b.Fatal(err)
		}
	}
	op() // warm up
	time.Sleep(100 * time.Millisecond)
	before, err := worker.Stats()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		op()
	}
	b.StopTimer()
	after, err := worker.Stats()
	if err != nil {
		b.Fatal(err)
	}
	// The share of wall time the worker was on a CPU: 1 when nothing
	// competes with it, about 1/3 when it shares two CPUs with two hogs of
	// equal weight. Less sensitive to a noisy host than ns/op.
	b.ReportMetric(float64(after.CPUUsage-before.CPUUsage)/float64(time.Since(start)), "cpu/wall")
	_ = worker.Kill()
	_ = pw.Close()
}
