package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestLoadAwareness: fusiond as production runs it. `fusionctl status`
// shows the telemetry bus, its cost and the reclaim loop; an elastic
// service of min 2 replicas, submitted from a YAML spec, gets its second
// replica as a job, and `fusionctl events` carries the scale event; a
// best-effort job beside it shows in the reclaim accounting.
func TestLoadAwareness(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "elastic: {step: 200ms}\nreclaim: {window: 200ms}\n")
	d.start()
	c := d.client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := ctlEvents(t, ctx, d, &syscall.Credential{Uid: 0, Gid: 0})

	r := d.ctl(nil, "", "status")
	for _, want := range []string{"Load:", "CPU ", "Telemetry:", "every 100ms (jobs every 1s)", "Reclaim:", "reclaimable"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	spec := `name: web
class: service
tier: burstable
command: [sh, -c, "sleep 300"]
resources: {cpu: 100m, memory: 16Mi}
replicas: {min: 2, max: 3, target: {metric: cpu, value: 50}}
`
	r = d.ctl(nil, spec, "submit", "-q", "-")
	leader := strings.TrimSpace(r.stdout)
	if leader == "" {
		t.Fatalf("submit: %s%s", r.stdout, r.stderr)
	}
	hog, err := c.Submit(ctx, api.JobSpec{Name: "hog", Class: api.ClassBatch, Command: []string{"sh", "-c", "while :; do :; done"},
		Resources: api.Resources{CPU: 200, Memory: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for scaled := false; !scaled; {
		select {
		case e := <-events:
			scaled = e.Kind == api.EventScale && e.JobID == leader && strings.Contains(e.Reason, "replicas 1 → 2")
		case <-deadline:
			t.Fatalf("no scale event for %s in 30 s", leader)
		}
	}
	list, err := c.List(ctx, api.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replicas := 0
	for _, j := range list {
		if j.Spec.Labels[api.LabelReplicaOf] == leader {
			replicas++
		}
	}
	if replicas != 1 {
		t.Errorf("%d replica jobs of %s, want 1", replicas, leader)
	}
	waitFor(t, c, hog.ID, api.StateRunning)
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := c.Node(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Reclaim != nil && n.Reclaim.BestEffortCPU > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the best-effort hog's use never reached the reclaim accounting: %+v", n.Reclaim)
		}
	}
	for _, id := range []string{leader, hog.ID} {
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
