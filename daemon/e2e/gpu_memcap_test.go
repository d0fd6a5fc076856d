package e2e

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestGPUMemoryCapTimeSliced runs a shared job (250 milli, 1Gi cap) on a
// time-sliced GPU of the simulated DGX H200 and makes the GPU report its
// real PID holding 2 GiB, beside a process of no job (the test's own)
// holding far more. Under gpu.sharing.over_cap: kill the job is stopped,
// failed with a reason naming its use, its cap and the GPU; under warn it
// keeps running with one event per episode, shown by fusionctl show, and
// an event when it is back under its cap.
func TestGPUMemoryCapTimeSliced(t *testing.T) {
	for _, policy := range []string{"kill", "warn"} {
		t.Run(policy, func(t *testing.T) {
			d := newDaemon(t, publicTempDir(t), "telemetry: {interval: 50ms, job_interval: 100ms}\n"+
				"gpu: {sharing: {over_cap: "+policy+", timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}}\n")
			d.args = []string{"--simulate", "dgxh200"}
			d.start()
			c := d.client()
			ctx := context.Background()
			j, err := c.Submit(ctx, api.JobSpec{Command: []string{"sleep", "600"},
				Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Share: 250, Memory: 1 << 30}}})
			if err != nil {
				t.Fatal(err)
			}
			j = waitFor(t, c, j.ID, api.StateRunning)
			if j.Allocation == nil || j.Allocation.GPUShare == nil || j.PID <= 0 {
				t.Fatalf("shared job: allocation %+v pid %d", j.Allocation, j.PID)
			}
			uuid := j.Allocation.GPUShare.GPU
			gpus, err := c.GPUs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			index := -1
			for _, g := range gpus.GPUs {
				if g.UUID == uuid {
					index = g.Index
				}
			}
			if index < 0 {
				t.Fatalf("GPU %s not listed", uuid)
			}
			set := func(ps ...api.GPUProcess) {
				t.Helper()
				if err := c.SetGPUProcesses(ctx, index, api.GPUProcessesRequest{Processes: ps}); err != nil {
					t.Fatal(err)
				}
			}
			// Under its cap, and a process of no job over everything: left alone.
			set(api.GPUProcess{PID: uint32(j.PID), Memory: 512 << 20}, api.GPUProcess{PID: uint32(os.Getpid()), Memory: 60 << 30})
			time.Sleep(600 * time.Millisecond)
			if j, _ = c.Get(ctx, j.ID); j.State != api.StateRunning {
				t.Fatalf("job under its cap is %s (%s)", j.State, j.Reason)
			}

			set(api.GPUProcess{PID: uint32(j.PID), Memory: 2 << 30}, api.GPUProcess{PID: uint32(os.Getpid()), Memory: 60 << 30})
			want := "GPU memory 2 GiB over its cap of 1 GiB on " + uuid + " (time-sliced share; processes " + strconv.Itoa(j.PID) + ")"
			if policy == "kill" {
				end := waitFor(t, c, j.ID, api.StateFailed)
				if !strings.Contains(end.Reason, "stopped: "+want) || !strings.Contains(end.Reason, "(killed by signal TERM)") {
					t.Fatalf("stopped job's reason %q, want it to contain %q", end.Reason, want)
				}
				if r := d.ctl(nil, "", "show", j.ID); r.code != 0 || !strings.Contains(r.stdout, want+"; stopping: SIGTERM, SIGKILL after 2s") {
					t.Errorf("fusionctl show:\n%s%s", r.stdout, r.stderr)
				}
				// Its share is released: the GPU is free for others.
				l, _ := c.GPUs(ctx)
				if s := l.GPUs[index].Sharing; s != nil && len(s.Shares) != 0 {
					t.Errorf("stopped job's share still admitted: %+v", s.Shares)
				}
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				if j, err = c.Get(ctx, j.ID); err != nil {
					t.Fatal(err)
				}
				if strings.Contains(j.Reason, want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no over-cap reason on the job: %s %q\n%s", j.State, j.Reason, d.log)
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(600 * time.Millisecond) // several checks more: still one event
			if j, _ = c.Get(ctx, j.ID); j.State != api.StateRunning {
				t.Fatalf("warned job is %s (%s)", j.State, j.Reason)
			}
			count := func(s string) int {
				n := 0
				for _, e := range j.Events {
					if strings.Contains(e.Reason, s) {
						n++
					}
				}
				return n
			}
			if n := count(want + "; over_cap: warn, left running"); n != 1 {
				t.Errorf("%d over-cap events, want 1: %+v", n, j.Events)
			}
			if r := d.ctl(nil, "", "show", j.ID); r.code != 0 || !strings.Contains(r.stdout, "over_cap: warn, left running") {
				t.Errorf("fusionctl show:\n%s%s", r.stdout, r.stderr)
			}
			set(api.GPUProcess{PID: uint32(j.PID), Memory: 512 << 20})
			deadline = time.Now().Add(10 * time.Second)
			for count("GPU memory back under its cap: 0.5 GiB of 1 GiB on "+uuid) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("no back-under event: %+v", j.Events)
				}
				time.Sleep(50 * time.Millisecond)
				j, _ = c.Get(ctx, j.ID)
			}
			if _, err := c.Cancel(ctx, j.ID); err != nil {
				t.Fatal(err)
			}
			waitFor(t, c, j.ID, api.StateCancelled)
		})
	}
}
