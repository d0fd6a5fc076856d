package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestPreemptionDGXH200 runs fusiond --simulate dgxh200 with preemption on
// (the default): eight best-effort jobs fill the 8 GPUs, then a guaranteed
// 8-GPU job arrives. All eight are preempted for it (SIGTERM) and recorded
// with its ID: the six with restart on-failure (no retries left: a
// preemption is not a retry) go back to pending, the two with restart
// never end preempted. The guaranteed job runs on the 8 GPUs, and when it
// ends the six are placed and run again. The metrics count the eight.
func TestPreemptionDGXH200(t *testing.T) {
	dir := publicTempDir(t)
	msock := filepath.Join(dir, "metrics.sock")
	d := newDaemon(t, dir, "scheduling: {preemption: {enabled: true, max_evictions: 8, window: 10m}}\nmetrics: {listen: \"unix:"+msock+"\"}\n")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()
	ctx := context.Background()
	var victims []api.Job
	for i := range 8 {
		restart := &api.Restart{Policy: api.RestartOnFailure}
		if i >= 6 {
			restart = &api.Restart{Policy: api.RestartNever}
		}
		j, err := c.Submit(ctx, api.JobSpec{Name: fmt.Sprint("be", i), Tier: api.TierBestEffort, Command: []string{"sleep", "600"}, Restart: restart,
			Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		victims = append(victims, j)
	}
	for i, v := range victims {
		victims[i] = waitFor(t, c, v.ID, api.StateRunning)
	}
	g, err := c.Submit(ctx, api.JobSpec{Name: "big", Tier: api.TierGuaranteed, Command: []string{"sleep", "3"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	g = waitFor(t, c, g.ID, api.StateRunning)
	if g.Allocation == nil || len(g.Allocation.GPUs) != 8 {
		t.Fatalf("guaranteed job's allocation %+v: want the 8 GPUs", g.Allocation)
	}
	preemptedEvent := func(j api.Job) bool {
		return slices.ContainsFunc(j.Events, func(e api.Event) bool {
			return strings.Contains(e.Reason, "preempted by job "+g.ID)
		})
	}
	for _, v := range victims[6:] {
		j := waitFor(t, c, v.ID, api.StatePreempted)
		if j.PreemptedBy != g.ID || j.Preemptions != 1 || !preemptedEvent(j) || j.FinishedAt == nil {
			t.Errorf("victim %s (restart never): preempted_by %q, preemptions %d, events %+v; want preempted by %s", j.ID, j.PreemptedBy, j.Preemptions, j.Events, g.ID)
		}
	}
	for _, v := range victims[:6] {
		j, err := c.Get(ctx, v.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.PreemptedBy != g.ID || j.Preemptions != 1 || !preemptedEvent(j) || !slices.ContainsFunc(j.Events, func(e api.Event) bool {
			return e.From == api.StateRunning && e.To == api.StatePending && strings.Contains(e.Reason, "not counted as a retry")
		}) {
			t.Errorf("victim %s (restart on-failure): state %s, preempted_by %q, preemptions %d, events %+v; want queued again, preempted by %s", j.ID, j.State, j.PreemptedBy, j.Preemptions, j.Events, g.ID)
		}
		if j.State == api.StateRunning && j.Attempt > 1 && j.StartedAt.Before(*g.StartedAt) {
			t.Errorf("victim %s restarted at %s, before the preemptor started at %s", j.ID, j.StartedAt, g.StartedAt)
		}
	}
	waitFor(t, c, g.ID, api.StateSucceeded)
	for _, v := range victims[:6] {
		j := waitFor(t, c, v.ID, api.StateRunning)
		if j.Attempt != 2 || j.Allocation == nil || len(j.Allocation.GPUs) != 1 {
			t.Errorf("victim %s after the preemptor ended: attempt %d, allocation %+v; want its second run on one GPU", j.ID, j.Attempt, j.Allocation)
		}
	}
	if text := scrape(t, metricsClient(msock)); !strings.Contains(text, "\nfusiond_preemptions_total{tier=\"besteffort\"} 8\n") {
		t.Errorf("metrics do not count the 8 best-effort jobs preempted:\n%s", text)
	}
	show := d.ctl(nil, "", "show", victims[7].ID)
	if show.code != 0 || !strings.Contains(show.stdout, "preempted by job "+g.ID) {
		t.Errorf("fusionctl show %s (exit %d):\n%s%s\nwant it to say it was preempted by %s", victims[7].ID, show.code, show.stdout, show.stderr, g.ID)
	}
	for _, v := range victims[:6] {
		c.Cancel(ctx, v.ID)
	}
	for _, v := range victims[:6] {
		waitFor(t, c, v.ID, api.StateCancelled)
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
