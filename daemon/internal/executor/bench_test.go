package executor

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/topology"
)

// BenchmarkCPUIsolation measures a CPU-bound job's throughput (loop
// iterations per second, 2 s runs) alone and beside two best-effort CPU
// hogs: as a guaranteed job on its exclusive core, and for contrast as a
// burstable job on the shared pool the hogs run on.
//
//	go test -run '^$' -bench CPUIsolation -benchtime 3x ./daemon/internal/executor/
func BenchmarkCPUIsolation(b *testing.B) {
	r := newTestRunner(b)
	host, err := topology.Discover(context.Background())
	cores := cgroups.CoresOf(host)
	if err != nil {
		b.Fatal(err)
	}
	if len(cores) < 2 {
		b.Fatalf("need 2 cores, host has %d", len(cores))
	}
	mine := cores[len(cores)-1].CPUs
	var shared []int
	for _, c := range cores[:len(cores)-1] {
		shared = append(shared, c.CPUs...)
	}
	if err := r.cg.SetSharedCPUs(shared); err != nil {
		b.Fatal(err)
	}
	r.cfg.SharedCPUs = func() []int { return shared }
	n := 0
	spin := func(tier api.Tier) float64 {
		n++
		req := r.helperRequest(fmt.Sprintf("spin%d", n), tier, 1000, 64<<20, "spin", "2")
		if tier == api.TierGuaranteed {
			req.Allocation.CPUSet = cgroups.FormatCPUList(mine)
		}
		p := r.start(req)
		if e := waitExit(b, p, 60*time.Second); e.Code != 0 {
			b.Fatalf("spin exit %+v", e)
		}
		f := strings.Fields(readLog(b, req))
		if len(f) != 2 {
			b.Fatalf("spin output %q", f)
		}
		it, _ := strconv.ParseFloat(f[1], 64)
		return it / 2
	}
	var alone, beside, sharedAlone, sharedBeside float64
	for b.Loop() {
		alone += spin(api.TierGuaranteed)
		sharedAlone += spin(api.TierBurstable)
		var hogs []jobs.Process
		for i := range 2 {
			hogs = append(hogs, r.start(r.request(fmt.Sprintf("hog%d-%d", n, i), api.TierBestEffort, 1000, 64<<20, "sh", "-c", "while :; do :; done")))
		}
		beside += spin(api.TierGuaranteed)
		sharedBeside += spin(api.TierBurstable)
		for _, h := range hogs {
			_ = h.Signal(9)
			waitExit(b, h, 20*time.Second)
		}
	}
	k := float64(b.N)
	b.ReportMetric(alone/k, "guaranteed-alone-it/s")
	b.ReportMetric(beside/k, "guaranteed-beside-hogs-it/s")
	b.ReportMetric(100*beside/alone, "guaranteed-kept-%")
	b.ReportMetric(100*sharedBeside/sharedAlone, "burstable-shared-kept-%")
}

// BenchmarkStart measures MonitorRunner.Start of a process job, from the
// call until the job's process runs in its cgroup, and the wait for its end.
//
//	go test -run '^$' -bench 'Start$' -benchtime 20x ./daemon/internal/executor/
func BenchmarkStart(b *testing.B) {
	r := newTestRunner(b)
	n := 0
	for b.Loop() {
		n++
		p := r.start(r.request(fmt.Sprintf("s%d", n), api.TierBurstable, 100, 32<<20, "true"))
		waitExit(b, p, 20*time.Second)
	}
}
