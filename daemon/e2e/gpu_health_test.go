package e2e

import (
	"context"
	"encoding/json"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestGPUHealthRecovers injects Xid 79 into a GPU of the simulated DGX
// H200 and follows it out of service and back: the device events reach
// the event stream (of an unprivileged user too), gpu list names the Xid, a
// job for all 8 GPUs waits saying why, and after a reset and the (short,
// configured) probation the GPU is healthy again and the job runs.
func TestGPUHealthRecovers(t *testing.T) {
	dir := publicTempDir(t)
	d := newDaemon(t, dir, "gpu: {health_probation: 1500ms, health_probe: 100ms, sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}}\n")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	c := d.client()
	ok := func(args ...string) string {
		t.Helper()
		r := d.ctl(nil, "", args...)
		if r.code != 0 {
			t.Fatalf("fusionctl %v: exit %d: %s%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	gpus, err := c.GPUs(context.Background())
	if err != nil || len(gpus.GPUs) != 8 {
		t.Fatalf("gpus: %v %d", err, len(gpus.GPUs))
	}
	uuid := gpus.GPUs[3].UUID

	// Device events as an unprivileged user sees them.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan api.Event, 16)
	stream := ctlEvents(t, ctx, d, &syscall.Credential{Uid: nobody, Gid: nobody})
	go func() {
		for e := range stream {
			if e.Kind == api.EventDevice {
				events <- e
			}
		}
	}()
	time.Sleep(300 * time.Millisecond) // let the stream subscribe
	next := func(healthy bool) api.Event {
		t.Helper()
		select {
		case e := <-events:
			if e.Device != uuid || e.Healthy == nil || *e.Healthy != healthy {
				t.Fatalf("device event %+v, want %s healthy=%v", e, uuid, healthy)
			}
			return e
		case <-time.After(15 * time.Second):
			t.Fatalf("no device event (healthy=%v) for %s\n%s", healthy, uuid, d.log)
			return api.Event{}
		}
	}

	if r := d.ctl(&syscall.Credential{Uid: nobody, Gid: nobody}, "", "gpu", "fault", "3", "--xid", "79"); r.code == 0 || !strings.Contains(r.stderr, "admin") {
		t.Errorf("nobody injected a fault: %d %s", r.code, r.stderr)
	}
	ok("gpu", "fault", "3", "--xid", "79", "--lost")
	if e := next(false); e.Xid != 79 || !strings.Contains(e.Reason, "fallen off the bus") {
		t.Errorf("unhealthy event %+v", e)
	}
	list := ok("gpu", "list")
	if !strings.Contains(list, "UNHEALTHY: Xid 79 (GPU has fallen off the bus), still failing") || !strings.Contains(list, "Recent device events:") {
		t.Errorf("gpu list:\n%s", list)
	}

	// A job for every GPU waits, naming the GPU out of service.
	j, err := c.Submit(context.Background(), api.JobSpec{Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Count: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		j, err = c.Get(context.Background(), j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != api.StatePending {
			t.Fatalf("8-GPU job is %s (%s) while a GPU is out of service", j.State, j.Reason)
		}
		if strings.Contains(j.Reason, "gpus") && strings.Contains(j.Reason, uuid) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("8-GPU job waits with reason %q; want it to name the GPUs and %s", j.Reason, uuid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Still failing: probing does not bring it back before a reset.
	time.Sleep(2 * time.Second)
	if j, _ = c.Get(context.Background(), j.ID); j.State != api.StatePending {
		t.Fatalf("job %s before the GPU was reset", j.State)
	}

	ok("gpu", "fault", "3", "--reset")
	var sawProbation bool
	for end := time.Now().Add(1200 * time.Millisecond); time.Now().Before(end) && !sawProbation; time.Sleep(50 * time.Millisecond) {
		l, err := c.GPUs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		sawProbation = l.GPUs[3].ProbationEnds != nil && !l.GPUs[3].Health.Healthy
	}
	if !sawProbation {
		t.Errorf("no probation_ends shown while GPU 3 was on probation")
	}
	if e := next(true); !strings.Contains(e.Reason, "healthy for") {
		t.Errorf("healthy event %+v", e)
	}
	waitFor(t, c, j.ID, api.StateRunning)
	j, _ = c.Get(context.Background(), j.ID)
	if j.Allocation == nil || len(j.Allocation.GPUs) != 8 {
		t.Errorf("allocation %+v, want 8 GPUs", j.Allocation)
	}
	if list := ok("gpu", "list"); strings.Contains(list, "UNHEALTHY:") || !strings.Contains(list, "→ healthy") {
		t.Errorf("gpu list after recovery:\n%s", list)
	}
	if _, err := c.Cancel(context.Background(), j.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, j.ID, api.StateCancelled)

	// Sharing: the configured replicas show per GPU, and a shared-GPU job's
	// share (compute and memory cap) shows on its GPU once it runs.
	sj, err := c.Submit(context.Background(), api.JobSpec{Command: []string{"sleep", "600"},
		Resources: api.Resources{CPU: 100, Memory: 16 << 20, GPU: &api.GPURequest{Share: 250, Memory: 8 << 30}}})
	if err != nil {
		t.Fatal(err)
	}
	sj = waitFor(t, c, sj.ID, api.StateRunning)
	if sj.Allocation == nil || sj.Allocation.GPUShare == nil {
		t.Fatalf("shared job allocation %+v", sj.Allocation)
	}
	share := ok("gpu", "share")
	if !strings.Contains(share, sj.ID) || !strings.Contains(share, "250 milli") || !strings.Contains(share, "8Gi") ||
		!strings.Contains(share, "time-slicing  2 ") {
		t.Errorf("gpu share:\n%s", share)
	}
	if _, err := c.Cancel(context.Background(), sj.ID); err != nil {
		t.Fatal(err)
	}
}

// ctlEvents runs `fusionctl events -o json` as cred until ctx ends and
// decodes the events it prints.
func ctlEvents(t *testing.T, ctx context.Context, d *daemon, cred *syscall.Credential) <-chan api.Event {
	t.Helper()
	cmd := osexec.CommandContext(ctx, filepath.Join(binDir, "fusionctl"), "--socket", d.socket, "events", "-o", "json")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan api.Event)
	go func() {
		defer close(ch)
		defer cmd.Wait()
		dec := json.NewDecoder(out)
		for {
			var e api.Event
			if err := dec.Decode(&e); err != nil {
				return
			}
			select {
			case ch <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}
