package ebpf

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// BenchmarkProbeCost reports the probe's cost per event from the kernel's
// own accounting (what kernel.bpf_stats_enabled=1 turns on): run_time_ns /
// run_cnt of each program while a job wakes up 1000 times per iteration
// beside everything else the host runs (an unrelated task costs a cached
// classification, a timed one a map update, a histogram increment and its
// attribution). In the same run, programs that do nothing sit on the same
// tracepoints (bpf/floor.c): their cost per event is the floor of any
// tp_btf program here, and ratio the probe's cost over it, which a noisy
// host moves less than either figure.
//
// In "untimed" nothing is registered, so every event is the cost any task
// on the host pays; in "timed" the job's cgroup is registered.
//
//	go test -run '^$' -bench ProbeCost -benchtime 3x ./ebpf/
func BenchmarkProbeCost(b *testing.B) {
	b.Run("untimed", func(b *testing.B) { benchmarkProbeCost(b, false) })
	b.Run("timed", func(b *testing.B) { benchmarkProbeCost(b, true) })
}

func benchmarkProbeCost(b *testing.B, timed bool) {
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf stats: %v", err)
	}
	defer stats.Close()
	var floor floorObjects
	if err := loadFloorObjects(&floor, nil); err != nil {
		b.Fatalf("load the floor programs: %v", err)
	}
	defer floor.Close()
	floorProgs := []*ebpf.Program{floor.FloorWakeup, floor.FloorWakeupNew, floor.FloorSwitch}
	for _, prog := range floorProgs {
		l, err := link.AttachTracing(link.TracingOptions{Program: prog})
		if err != nil {
			b.Fatalf("attach the floor: %v", err)
		}
		defer l.Close()
	}
	p := loadProbe(b)
	job := newTestCgroup(b, "cost")
	if timed {
		if err := p.Register(job.id, 1); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		w := startHelper(b, "wake:1000", "", job)
		w.start(b)
		w.wait(b)
	}
	st, err := p.Stats()
	if err != nil {
		b.Fatal(err)
	}
	var runs, ns uint64
	for _, s := range st {
		if s.RunCount > 0 {
			b.ReportMetric(float64(s.RunTimeNs)/float64(s.RunCount), "ns/"+s.Name)
		}
		runs += s.RunCount
		ns += s.RunTimeNs
	}
	if runs == 0 {
		b.Fatal("the kernel counted no program runs")
	}
	var fruns, fns uint64
	for _, prog := range floorProgs {
		st, err := prog.Stats()
		if err != nil {
			b.Fatal(err)
		}
		fruns += st.RunCount
		fns += uint64(st.Runtime.Nanoseconds())
	}
	if fruns == 0 {
		b.Fatal("the kernel counted no runs of the floor")
	}
	probe, floorNs := float64(ns)/float64(runs), float64(fns)/float64(fruns)
	b.ReportMetric(probe, "ns/event")
	b.ReportMetric(floorNs, "floor-ns/event")
	b.ReportMetric(probe/floorNs, "ratio")
	b.ReportMetric(float64(runs), "events")
}
