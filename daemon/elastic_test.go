package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestElasticJobRunsItsReplicas runs a daemon and submits an elastic
// service of at least 2 replicas: the controller submits the second as a
// job of its own (labelled, same owner), says so on the event stream,
// and cancels it when the elastic job is cancelled.
func TestElasticJobRunsItsReplicas(t *testing.T) {
	ctx, c, stop := serveDaemon(t, "elastic", func(cfg *Config) {
		cfg.LeaveJobsOnShutdown = false
		cfg.Elastic.Step = Duration(200 * time.Millisecond)
	})

	// Burstable: this 2-CPU test host has one core to give exclusively.
	leader, err := c.Submit(ctx, api.JobSpec{Name: "web", Class: api.ClassService, Tier: api.TierBurstable, Command: []string{"/bin/sleep", "120"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20},
		Replicas:  &api.Replicas{Min: 2, Max: 3, Target: api.ScaleTarget{Metric: api.MetricCPU, Value: 50}}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var scale []api.Event
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	go func() {
		_ = c.Events(evCtx, leader.ID, func(e api.Event) error {
			if e.Kind == api.EventScale {
				mu.Lock()
				scale = append(scale, e)
				mu.Unlock()
			}
			return nil
		})
	}()
	replica := func() (api.Job, bool) {
		list, err := c.List(ctx, api.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range list {
			if j.Spec.Labels[api.LabelReplicaOf] == leader.ID {
				return j, true
			}
		}
		return api.Job{}, false
	}
	var r api.Job
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var ok bool
		if r, ok = replica(); ok && r.State == api.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running replica of %s after 20 s: %+v", leader.ID, r)
		}
	}
	if r.Spec.Name != "web-r2" || r.Spec.Labels[api.LabelReplica] != "2" || r.Spec.Replicas != nil || r.Owner.UID != leader.Owner.UID {
		t.Errorf("replica %+v", r)
	}
	if _, err := c.Cancel(ctx, leader.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		j, err := c.Get(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica outlived its elastic job by 20 s: %s", j.State)
		}
	}
	mu.Lock()
	got := append([]api.Event(nil), scale...)
	mu.Unlock()
	if len(got) < 1 || !strings.Contains(got[0].Reason, "replicas 1 → 2") {
		t.Errorf("scale events %+v, want replicas 1 → 2 first", got)
	}
	stop()
}

func TestCustomMetric(t *testing.T) {
	f := filepath.Join(t.TempDir(), "output.log")
	if _, ok := customMetric(f); ok {
		t.Error("no log, yet a metric")
	}
	body := "starting\nFUSIOND_METRIC=12.5\nserving\nFUSIOND_METRIC=oops\n" + strings.Repeat("x", 100) + "\nFUSIOND_METRIC=40\ndone\n"
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, ok := customMetric(f); !ok || v != 40 {
		t.Errorf("metric %v %v, want the last one, 40", v, ok)
	}
	// Only the tail is read: a metric 8 KiB back is too old.
	if err := os.WriteFile(f, []byte("FUSIOND_METRIC=7\n"+strings.Repeat("y\n", 5000)), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, ok := customMetric(f); ok {
		t.Errorf("a metric 10 KB back read as %v", v)
	}
	if n := replicaName(strings.Repeat("a", api.MaxNameLen), 12); len(n) != api.MaxNameLen || !strings.HasSuffix(n, "-r12") {
		t.Errorf("replica name %q", n)
	}
}

func TestElasticConfig(t *testing.T) {
	cfg := DefaultConfig()
	if err := ParseConfig([]byte("elastic: {lead: 2m, tolerance: 0.2}\n"), &cfg); err != nil || time.Duration(cfg.Elastic.Lead) != 2*time.Minute ||
		cfg.Elastic.Tolerance != 0.2 || time.Duration(cfg.Elastic.Cooldown) != 5*time.Minute {
		t.Errorf("elastic %+v, %v", cfg.Elastic, err)
	}
	for in, field := range map[string]string{"elastic: {step: 1ms}": "elastic.step", "elastic: {tolerance: 0.6}": "elastic.tolerance", "elastic: {cooldown: -1s}": "elastic.cooldown"} {
		cfg := DefaultConfig()
		if err := ParseConfig([]byte(in), &cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%q: err = %v, want one for %s", in, err, field)
		}
	}
}

// TestBurstableCPULimitFollowsUsage runs a daemon with elastic.resize: a
// burstable job spinning on a core gets a CPU limit of about its use ×
// 1.3 (a resize event says so), never below its request.
func TestBurstableCPULimitFollowsUsage(t *testing.T) {
	ctx, c, stop := serveDaemon(t, "resize", func(cfg *Config) {
		cfg.LeaveJobsOnShutdown = false
		cfg.Telemetry.JobInterval = Duration(100 * time.Millisecond)
		cfg.Elastic.Resize, cfg.Elastic.ResizePeriod = true, Duration(500*time.Millisecond)
	})
	job, err := c.Submit(ctx, api.JobSpec{Name: "spin", Class: api.ClassTraining, Tier: api.TierBurstable,
		Command: []string{"/bin/sh", "-c", "while :; do :; done"}, Resources: api.Resources{CPU: 100, Memory: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	resized := make(chan api.Event, 10)
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	go func() {
		_ = c.Events(evCtx, job.ID, func(e api.Event) error {
			if e.Kind == api.EventResize {
				resized <- e
			}
			return nil
		})
	}()
	select {
	case e := <-resized:
		// The spinner uses up to a core (less on this shared host): its
		// limit is at least its 100m request and reads as p95 × 1.3.
		var limit int
		if _, err := fmt.Sscanf(e.Reason, "CPU limit 0m → %dm", &limit); err != nil || limit < 100 || !strings.Contains(e.Reason, "never below the 100m request") {
			t.Errorf("resize event %+v: want a limit of at least the 100m request (%v)", e, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no resize event 30 s after a burstable job started spinning")
	}
	stop()
}
