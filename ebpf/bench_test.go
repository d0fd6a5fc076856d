package ebpf

import (
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkProbeCost reports the probe's cost per event from the kernel's
// own accounting (what kernel.bpf_stats_enabled=1 turns on): run_time_ns /
// run_cnt of each program while a job wakes up 1000 times per iteration
// beside everything else the host runs (unrelated tasks cost a cgroup walk
// and a lookup, timed ones a map update and a histogram increment).
//
//	go test -run '^$' -bench ProbeCost -benchtime 3x ./ebpf/
func BenchmarkProbeCost(b *testing.B) {
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf stats: %v", err)
	}
	defer stats.Close()
	p := loadProbe(b)
	job := newTestCgroup(b, "cost")
	if err := p.Register(job.id, 1); err != nil {
		b.Fatal(err)
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
	b.ReportMetric(float64(ns)/float64(runs), "ns/event")
	b.ReportMetric(float64(runs), "events")
}
