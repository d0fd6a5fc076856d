package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestExecutorOOMAndUsage: a job over its memory limit is OOM-killed and
// reported so; the daemon and a job beside it carry on; fusionctl show
// prints the jobs' accounting.
func TestExecutorOOMAndUsage(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "")
	d.start()
	c := d.client()
	ctx := context.Background()

	bystander, err := c.Submit(ctx, api.JobSpec{Name: "bystander", Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	hog, err := c.Submit(ctx, api.JobSpec{Name: "hog", Command: []string{"tail", "/dev/zero"},
		Resources: api.Resources{CPU: 500, Memory: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	j := waitFor(t, c, hog.ID, api.StateFailed)
	if j.Exit == nil || !j.Exit.OOMKilled || !strings.Contains(j.Reason, "oom-killed") {
		t.Fatalf("memory hog ended %+v (%s), want oom-killed", j.Exit, j.Reason)
	}
	if j.Usage == nil || j.Usage.OOMKills == 0 || j.Usage.MemoryPeak < 24<<20 {
		t.Errorf("hog's recorded usage %+v: want an OOM kill and a peak near 32Mi", j.Usage)
	}
	if err := c.Ready(ctx); err != nil {
		t.Errorf("daemon not ready after the OOM kill: %v", err)
	}
	b := waitFor(t, c, bystander.ID, api.StateRunning)
	if !processAlive(b.PID) {
		t.Errorf("bystander pid %d died", b.PID)
	}
	if r := d.ctl(nil, "", "show", hog.ID); !strings.Contains(r.stdout, "oom-killed") || !strings.Contains(r.stdout, "OOM kills") {
		t.Errorf("show of the hog lacks the OOM kill:\n%s", r.stdout)
	}
	if r := d.ctl(nil, "", "show", bystander.ID); !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, "peak memory") {
		t.Errorf("show of a running job lacks its usage:\n%s", r.stdout)
	}
	if _, err := c.Cancel(ctx, bystander.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, bystander.ID, api.StateCancelled)
}
