package e2e

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestSimulatedGPUsSurviveRestart: fusiond --simulate dgxh200 runs a job
// on all 8 GPUs and is killed (kill -9); the restarted daemon names the
// same GPUs, re-attaches the job with its 8 GPUs reserved, and a second
// 8-GPU job waits for them instead of being placed on the same GPUs.
func TestSimulatedGPUsSurviveRestart(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()
	gpus := func() []string {
		t.Helper()
		g, err := c.GPUs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, x := range g.GPUs {
			ids = append(ids, x.UUID)
		}
		return ids
	}
	before := gpus()
	eight := api.JobSpec{Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 8}}}
	a, err := c.Submit(context.Background(), eight)
	if err != nil {
		t.Fatal(err)
	}
	a = waitFor(t, c, a.ID, api.StateRunning)
	if a.Allocation == nil || len(a.Allocation.GPUs) != 8 || len(a.Allocation.GPUPCI) != 8 {
		t.Fatalf("first job's allocation %+v: want 8 GPUs with their PCI addresses", a.Allocation)
	}

	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	d.start()
	if after := gpus(); !slices.Equal(before, after) {
		t.Fatalf("GPU UUIDs changed across a restart:\nbefore %v\nafter  %v", before, after)
	}
	a = waitFor(t, c, a.ID, api.StateRunning)
	n, err := c.Node(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n.Allocated.GPUs != 8 {
		t.Errorf("after the restart %d GPUs allocated, want the re-attached job's 8", n.Allocated.GPUs)
	}
	b, err := c.Submit(context.Background(), eight)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if b, err = c.Get(context.Background(), b.ID); err != nil {
			t.Fatal(err)
		}
		if b.State != api.StatePending {
			t.Fatalf("second 8-GPU job is %s on %v while the first holds %v: double-booked", b.State, b.Allocation, a.Allocation.GPUs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(b.Reason, "gpu") {
		t.Errorf("second job waits with reason %q; want it to name the GPUs", b.Reason)
	}
	for _, id := range []string{a.ID, b.ID} {
		c.Cancel(context.Background(), id)
	}
	waitFor(t, c, a.ID, api.StateCancelled)
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
