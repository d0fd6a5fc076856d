package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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
	// The second actuator through its production path, on a resctrl root
	// laid out as the kernel shows it (this host has no RDT).
	rdt := fakeResctrl(t)
	d := newDaemon(t, dir, fmt.Sprintf("qos: {window: 200ms, restore_after: 1s, restore_step: 1000m, resctrl_root: %s, classes: {service: {runqueue_p99: 10us}}}\n", rdt))
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
	// The shrink moved best-effort's cache and bandwidth share with its
	// quota, and the hogs' threads are in its resctrl group.
	group := filepath.Join(rdt, "fusiond-besteffort")
	if b, err := os.ReadFile(filepath.Join(group, "schemata")); err != nil || string(b) == fullSchemata || !strings.Contains(shrink.Reason, "best-effort cache and bandwidth at") {
		t.Errorf("resctrl schemata after a shrink: %q, %v (shrink %q)", b, err, shrink.Reason)
	}
	if !strings.Contains(st, "cache and bandwidth: resctrl L3 (2 domains), MB (2 domains); best-effort at") {
		t.Errorf("status lacks the resctrl share:\n%s", st)
	}
	hog, _ := c.Get(ctx, hogs[0])
	deadline = time.After(10 * time.Second)
	for tasks, _ := os.ReadFile(filepath.Join(group, "tasks")); !slices.Contains(strings.Fields(string(tasks)), fmt.Sprint(hog.PID)); tasks, _ = os.ReadFile(filepath.Join(group, "tasks")) {
		select {
		case <-deadline:
			t.Fatalf("hog %d not in the resctrl group's tasks: %q", hog.PID, tasks)
		case <-time.After(100 * time.Millisecond):
		}
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
	if b, err := os.ReadFile(filepath.Join(group, "schemata")); err != nil || string(b) != fullSchemata {
		t.Errorf("resctrl schemata after the quota's removal: %q, %v; want the root's", b, err)
	}
	for _, id := range hogs {
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitFor(t, c, id, api.StateCancelled)
	}
}

// fullSchemata is fakeResctrl's root schemata as fusiond writes it back.
const fullSchemata = "L3:0=fffff;1=fffff\nMB:0=100;1=100\n"

// fakeResctrl lays out a resctrl root as the kernel shows it on a
// two-socket server with L3 allocation (20 ways) and memory bandwidth
// allocation in steps of 10%.
func fakeResctrl(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range map[string]string{
		"info/L3/cbm_mask": "fffff\n", "info/L3/min_cbm_bits": "1\n",
		"info/MB/bandwidth_gran": "10\n", "info/MB/min_bandwidth": "10\n",
		"schemata": "    L3:0=fffff;1=fffff\n    MB:0=100;1=100\n",
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
