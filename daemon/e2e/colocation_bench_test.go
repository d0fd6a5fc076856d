package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// serviceLoad is a latency-sensitive service whose CPU use follows a
// compressed day: two worker processes each work a fraction f(t) of every
// 10 ms slot and sleep the rest, f rising from 10% at night to 80% at
// midday and back over COLO_DAY seconds (so the service uses 0.2 to 1.6
// cores of the 1.8 it reserved).
const serviceLoad = `import math, os, time
D = float(os.environ["COLO_DAY"]); t0 = time.time()
os.fork()
while True:
    t = time.time() - t0
    f = 0.1 + 0.7 * (1 - math.cos(2 * math.pi * t / D)) / 2
    end = time.time() + 0.01 * f
    while time.time() < end:
        pass
    time.sleep(0.01 * (1 - f))
`

// batchLoad is a batch job: two processes that spin for BATCH_SECS of
// wall time, holding 32 MiB, then exit 0.
const batchLoad = `import os, time
m = bytearray(32 << 20)
end = time.time() + float(os.environ["BATCH_SECS"])
os.fork()
while time.time() < end:
    pass
`

// colocationDay is the compressed day; batchSecs how long a batch job
// runs; batchJobs how many are queued at dawn.
const (
	colocationDay = 90 * time.Second
	batchSecs     = 15
	batchJobs     = 8
)

// BenchmarkColocation runs a colocation day on the real daemon, once with
// reclaimed capacity on and once off: a burstable service that reserves
// all but 200m CPU and 256 MiB of the host and whose use follows a
// diurnal curve, and a queue of best-effort batch jobs of 500m CPU and
// 512 MiB each, which fit only on capacity reclaimed from the service. It
// reports the CPU-seconds the batch jobs got (and the CPU-hours that is
// over a day at this rate), how many were placed on reclaimed capacity,
// held below their requests by the reclaim loop (throttled), evicted and
// restarted, and the service's run-queue p99 per QoS window (median and
// worst) against its SLO, and its own CPU throttling.
//
//	go test -run '^$' -bench Colocation -benchtime 1x -count 3 ./daemon/e2e/
func BenchmarkColocation(b *testing.B) {
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		b.Fatal("python3 missing: the service's and batch jobs' loads are Python scripts")
	}
	// The SLO is loose enough for a shared development VM, where other
	// work alone puts the service's run-queue p99 at several ms: the QoS
	// loop would otherwise hold the batch jobs at its floor.
	const slo = 50 * time.Millisecond
	for _, reclaim := range []bool{true, false} {
		name := "reclaim-off"
		if reclaim {
			name = "reclaim-on"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				colocationRun(b, python, name, reclaim, slo)
			}
		})
	}
}

// batchAttempt is what one start of a batch job got.
type batchAttempt struct {
	cpuSeconds float64
	reclaimed  bool
}

func colocationRun(b *testing.B, python, name string, reclaim bool, slo time.Duration) {
	dir, err := os.MkdirTemp("", "fusiond-colo-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	// The reclaim loop's lookback and evict_after are scaled down with
	// the day: its default minute of history is two thirds of this one.
	d := newBenchDaemon(b, filepath.Join(dir, name), fmt.Sprintf("leave_jobs_on_shutdown: false\nreclaim: {enabled: %v, lookback: 10s, evict_after: 5s}\nqos: {classes: {service: {runqueue_p99: %v}}}\n", reclaim, slo))
	c := api.NewClient(d.socket)
	defer c.Close()
	ctx := context.Background()
	n, err := c.Node(ctx)
	if err != nil {
		b.Fatal(err)
	}
	const freeCPU, freeMem = 200, 256 << 20 // left unreserved by the service
	svc, err := c.Submit(ctx, api.JobSpec{Name: "svc", Class: api.ClassService, Tier: api.TierBurstable,
		Command: []string{python, "-c", serviceLoad}, Env: map[string]string{"COLO_DAY": fmt.Sprint(colocationDay.Seconds())},
		Resources: api.Resources{CPU: n.Capacity.CPU - freeCPU, Memory: n.Capacity.Memory - freeMem}})
	if err != nil {
		b.Fatal(err)
	}
	waitState(b, c, svc.ID, api.StateRunning)
	var ids []string
	for i := range batchJobs {
		j, err := c.Submit(ctx, api.JobSpec{Name: fmt.Sprintf("batch-%d", i), Class: api.ClassBatch,
			Command: []string{python, "-c", batchLoad}, Env: map[string]string{"BATCH_SECS": fmt.Sprint(batchSecs)},
			Restart:   &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 10},
			Resources: api.Resources{CPU: 500, Memory: 512 << 20}})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	attempts := map[string]map[int]*batchAttempt{}
	throttled, restarted := map[string]bool{}, map[string]bool{}
	var p99s []time.Duration
	var over, evictions int
	var maxReclaimable api.MilliCPU
	start := time.Now()
	for next := start.Add(time.Second); time.Since(start) < colocationDay; next = next.Add(time.Second) {
		time.Sleep(time.Until(next))
		n, err := c.Node(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var budget api.MilliCPU
		if r := n.Reclaim; r != nil {
			budget, evictions = r.BudgetCPU, r.Evictions
			maxReclaimable = max(maxReclaimable, r.ReclaimableCPU)
		}
		var running []string
		var requested api.MilliCPU
		for _, id := range ids {
			j, err := c.Get(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			if attempts[id] == nil {
				attempts[id] = map[int]*batchAttempt{}
			}
			a := attempts[id][j.Attempt]
			if a == nil && j.Allocation != nil {
				a = &batchAttempt{}
				attempts[id][j.Attempt] = a
			}
			if a != nil {
				if j.Allocation != nil && (j.Allocation.ReclaimedCPU > 0 || j.Allocation.ReclaimedMemory > 0) {
					a.reclaimed = true
				}
				if j.Usage != nil {
					a.cpuSeconds = max(a.cpuSeconds, j.Usage.CPUSeconds)
				}
			}
			if j.State == api.StateRunning {
				running = append(running, id)
				requested += j.Spec.Resources.CPU
				if j.Preemptions > 0 {
					restarted[id] = true
				}
			}
		}
		if budget > 0 && budget < requested {
			for _, id := range running {
				throttled[id] = true
			}
		}
		if j, err := c.Get(ctx, svc.ID); err == nil && j.Latency != nil && j.Latency.Count > 0 {
			p99s = append(p99s, time.Duration(j.Latency.P99))
			if time.Duration(j.Latency.P99) > slo {
				over++
			}
		}
	}
	var cpuS float64
	var placed, starts int
	for _, as := range attempts {
		for _, a := range as {
			cpuS += a.cpuSeconds
			starts++
			if a.reclaimed {
				placed++
			}
		}
	}
	var done int
	for _, id := range ids {
		j, err := c.Get(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		switch j.State {
		case api.StateSucceeded:
			done++
		case api.StateFailed:
			b.Errorf("batch job %s failed: %s", id, j.Reason)
		}
	}
	sj, err := c.Get(ctx, svc.ID)
	if err != nil {
		b.Fatal(err)
	}
	var svcThrottled float64
	if sj.Usage != nil {
		svcThrottled = sj.Usage.ThrottledSeconds
	}
	slices.Sort(p99s)
	var med, worst time.Duration
	if len(p99s) > 0 {
		med, worst = p99s[len(p99s)/2], p99s[len(p99s)-1]
	}
	cpuHoursPerDay := cpuS / 3600 * (24 * time.Hour).Seconds() / colocationDay.Seconds()
	b.ReportMetric(cpuS, "batch-cpu-s")
	b.ReportMetric(cpuHoursPerDay, "batch-cpu-h/day")
	b.ReportMetric(float64(done), "batch-done")
	b.ReportMetric(float64(placed), "placed-reclaimed")
	b.ReportMetric(float64(len(throttled)), "throttled")
	b.ReportMetric(float64(evictions), "evicted")
	b.ReportMetric(float64(len(restarted)), "restarted")
	b.ReportMetric(float64(med)/1e6, "svc-p99-median-ms")
	b.ReportMetric(float64(worst)/1e6, "svc-p99-worst-ms")
	b.ReportMetric(svcThrottled, "svc-throttled-s")
	b.Logf("%s: batch %.1f CPU-s over a %v day (%.1f CPU-hours a day at this rate) in %d starts of %d jobs (%d done), %d on reclaimed capacity (reclaimable CPU up to %v), %d held below their requests, %d evicted, %d restarted; service run-queue p99 per window: median %v, worst %v, %d of %d windows over the %v SLO; service throttled %.2fs",
		name, cpuS, colocationDay, cpuHoursPerDay, starts, batchJobs, done, placed, maxReclaimable, len(throttled), evictions, len(restarted), med, worst, over, len(p99s), slo, svcThrottled)
	for _, id := range append(ids, svc.ID) {
		if _, err := c.Cancel(ctx, id); err != nil && !strings.Contains(err.Error(), "finished") && !strings.Contains(err.Error(), "already") {
			b.Fatal(err)
		}
	}
}
