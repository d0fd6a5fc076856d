package e2e

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestQoSLoop: fusiond as production runs it (probes loaded in New, the
// loop over the running jobs' cgroups). A protected service job whose SLO
// (10µs, unmeetable beside CPU hogs) breaks makes the loop shrink the
// best-effort tier's quota: `fusionctl events` carries the action with the
// p99 behind it, `fusionctl status` the loop's state, `fusionctl show` the
// job's histogram and SLO state. With the service gone, the quota is
// restored and removed.
func TestQoSLoop(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "qos: {window: 200ms, restore_after: 1s, restore_step: 1000m, classes: {service: {runqueue_p99: 10us}}}\n")
	d.start()
	c := d.client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := ctlEvents(t, ctx, d, &syscall.Credential{Uid: 0, Gid: 0})

	if r := d.ctl(nil, "", "status"); !strings.Contains(r.stdout, "QoS loop:") || !strings.Contains(r.stdout, "probes attached") {
		t.Fatalf("status before any job:\n%s%s", r.stdout, r.stderr)
	}
	svc, err := c.Submit(ctx, api.JobSpec{Name: "svc", Class: api.ClassService, Tier: api.TierBurstable,
		Command:   []string{"sh", "-c", "while :; do sleep 0.001; done"},
		Resources: api.Resources{CPU: 200, Memory: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	var hogs []string
	for range 2 {
		h, err := c.Submit(ctx, api.JobSpec{Name: "hog", Class: api.ClassBatch,
			Command: []string{"sh", "-c", "while :; do :; done"}, Resources: api.Resources{CPU: 500, Memory: 32 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		hogs = append(hogs, h.ID)
	}
	waitFor(t, c, svc.ID, api.StateRunning)

	deadline := time.After(30 * time.Second)
	var shrink api.Event
	for shrink.Kind == "" {
		select {
		case e := <-events:
			if e.Kind == api.EventQoS && strings.HasPrefix(e.Reason, "shrink") {
				shrink = e
			}
		case <-deadline:
			t.Fatalf("no qos shrink event in 30 s; status:\n%s", d.ctl(nil, "", "status").stdout)
		}
	}
	if shrink.JobID != svc.ID || !strings.Contains(shrink.Reason, "run-queue p99") || !strings.Contains(shrink.Reason, "SLO 10µs") {
		t.Errorf("shrink event %+v: want the service job and its measured p99", shrink)
	}
	st := d.ctl(nil, "", "status").stdout
	// No guaranteed job holds cores: the pool is every CPU of the host.
	if !strings.Contains(st, "best-effort CPU held at") || !strings.Contains(st, "1 protected jobs") ||
		!strings.Contains(st, fmt.Sprintf("(shared pool %d CPU)", runtime.NumCPU())) {
		t.Errorf("status after a shrink:\n%s", st)
	}
	show := d.ctl(nil, "", "show", svc.ID).stdout
	if !strings.Contains(show, "Latency:") || !strings.Contains(show, "SLO run-queue p99 ≤ 10µs") || !strings.Contains(show, "Run-queue latency (since the job started):") {
		t.Errorf("show of the service job lacks its latency:\n%s", show)
	}
	// Who held the CPU while it waited: the hogs, among others, and the
	// shrink said so.
	if !strings.Contains(show, "Delayed by:") || !strings.Contains(show, "since start") || !strings.Contains(shrink.Reason, "the wait: ") {
		t.Errorf("show of the service job lacks who delayed it (shrink %q):\n%s", shrink.Reason, show)
	}
	if !strings.Contains(st, "protected jobs waited") {
		t.Errorf("status lacks the protected jobs' wait by runner:\n%s", st)
	}
	if j, _ := c.Get(ctx, hogs[0]); j.Latency == nil || j.Latency.State != "unprotected" || j.Latency.SLO != nil {
		t.Errorf("best-effort job's latency: %+v", j.Latency)
	}

	if _, err := c.Cancel(ctx, svc.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, svc.ID, api.StateCancelled)
	deadline = time.After(60 * time.Second)
	for {
		n, err := c.Node(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.QoS != nil && n.QoS.BestEffortQuota == 0 && strings.Contains(n.QoS.LastAction, "remove the best-effort CPU quota") {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("quota not removed 60 s after the service ended: %+v", n.QoS)
		case <-time.After(200 * time.Millisecond):
		}
	}
	for _, id := range hogs {
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitFor(t, c, id, api.StateCancelled)
	}
}
