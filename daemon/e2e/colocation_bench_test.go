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
// compressed day: every 10 ms it works a fraction f(t) of the slot and
// sleeps the rest, f rising from 10% to 90% of a core and back over
// COLO_DAY seconds.
const serviceLoad = `import math, os, time
D = float(os.environ["COLO_DAY"]); t0 = time.time()
while True:
    t = time.time() - t0
    f = 0.1 + 0.8 * (1 - math.cos(2 * math.pi * t / D)) / 2
    end = time.time() + 0.01 * f
    while time.time() < end:
        pass
    time.sleep(0.01 * (1 - f))
`

// BenchmarkColocation runs a colocation day on the real daemon: a
// burstable service (1 CPU reserved) whose use follows a diurnal curve,
// and a best-effort batch job (200m requested, two spinning threads),
// once with reclaimed capacity on and once off. It reports the CPU-seconds
// the batch job got, how many of them were reclaimed (its use beyond its
// request, on CPU lent from the service's reservation), and the service's run-queue p99 per QoS window
// (median and worst) against its SLO.
//
//	go test -run '^$' -bench Colocation -benchtime 1x ./daemon/e2e/
func BenchmarkColocation(b *testing.B) {
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		b.Fatal("python3 missing: the service's load generator is a Python script")
	}
	const day = 60 * time.Second
	// The SLO is loose enough for a shared development VM, where other
	// work alone puts the service's run-queue p99 at several ms: the QoS
	// loop would otherwise hold the batch job at its floor in both runs.
	const slo = 50 * time.Millisecond
	for b.Loop() {
		for _, reclaim := range []bool{true, false} {
			name := "reclaim-off"
			if reclaim {
				name = "reclaim-on"
			}
			b.Run(name, func(b *testing.B) {
				dir, err := os.MkdirTemp("", "fusiond-colo-")
				if err != nil {
					b.Fatal(err)
				}
				defer os.RemoveAll(dir)
				os.Chmod(dir, 0o755)
				d := newBenchDaemon(b, filepath.Join(dir, name), fmt.Sprintf("leave_jobs_on_shutdown: false\nreclaim: {enabled: %v}\nqos: {classes: {service: {runqueue_p99: %v}}}\n", reclaim, slo))
				c := api.NewClient(d.socket)
				defer c.Close()
				ctx := context.Background()
				svc, err := c.Submit(ctx, api.JobSpec{Name: "svc", Class: api.ClassService, Tier: api.TierBurstable,
					Command: []string{python, "-c", serviceLoad}, Env: map[string]string{"COLO_DAY": fmt.Sprint(day.Seconds())},
					Resources: api.Resources{CPU: 1000, Memory: 64 << 20}})
				if err != nil {
					b.Fatal(err)
				}
				batch, err := c.Submit(ctx, api.JobSpec{Name: "batch", Class: api.ClassBatch,
					Command:   []string{"sh", "-c", "while :; do :; done & while :; do :; done"},
					Resources: api.Resources{CPU: 200, Memory: 32 << 20}})
				if err != nil {
					b.Fatal(err)
				}
				waitState(b, c, svc.ID, api.StateRunning)
				waitState(b, c, batch.ID, api.StateRunning)
				var reclaimed, beCPU float64
				var p99s []time.Duration
				start := time.Now()
				for next := start.Add(time.Second); time.Since(start) < day; next = next.Add(time.Second) {
					time.Sleep(time.Until(next))
					n, err := c.Node(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if r := n.Reclaim; r != nil {
						reclaimed += float64(r.ReclaimedCPU) / 1000 // one second at this rate
					}
					if j, err := c.Get(ctx, svc.ID); err == nil && j.Latency != nil && j.Latency.Count > 0 {
						p99s = append(p99s, time.Duration(j.Latency.P99))
					}
				}
				j, err := c.Get(ctx, batch.ID)
				if err != nil || j.Usage == nil {
					b.Fatalf("batch job's usage: %+v, %v", j.Usage, err)
				}
				beCPU = j.Usage.CPUSeconds
				slices.Sort(p99s)
				var med, worst time.Duration
				if len(p99s) > 0 {
					med, worst = p99s[len(p99s)/2], p99s[len(p99s)-1]
				}
				b.ReportMetric(beCPU, "batch-cpu-s")
				b.ReportMetric(reclaimed, "reclaimed-cpu-s")
				b.ReportMetric(float64(med)/1e6, "svc-p99-median-ms")
				b.ReportMetric(float64(worst)/1e6, "svc-p99-worst-ms")
				b.Logf("%s: batch %.1f CPU-s (%.1f reclaimed) over a %v day; service run-queue p99 per window: median %v, worst %v (%d windows)",
					name, beCPU, reclaimed, day, med, worst, len(p99s))
				for _, id := range []string{svc.ID, batch.ID} {
					if _, err := c.Cancel(ctx, id); err != nil && !strings.Contains(err.Error(), "finished") {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
