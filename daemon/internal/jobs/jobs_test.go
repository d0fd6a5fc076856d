package jobs_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

func TestMain(m *testing.M) {
	jobstest.Reexec() // the job monitors of newManager's runner
	os.Exit(m.Run())
}

var root = api.Caller{UID: 0, Admin: true, User: "root"}

func TestTransitions(t *testing.T) {
	allowed := map[[2]api.State]bool{
		{api.StatePending, api.StatePlaced}: true, {api.StatePending, api.StateCancelled}: true, {api.StatePending, api.StateFailed}: true,
		{api.StatePlaced, api.StateStarting}: true, {api.StatePlaced, api.StatePending}: true, {api.StatePlaced, api.StateCancelled}: true,
		{api.StateStarting, api.StateRunning}: true, {api.StateStarting, api.StateFailed}: true, {api.StateStarting, api.StateCancelled}: true, {api.StateStarting, api.StateLost}: true,
		{api.StateStarting, api.StatePending}:  true,
		{api.StateRunning, api.StateSucceeded}: true, {api.StateRunning, api.StateFailed}: true, {api.StateRunning, api.StateCancelled}: true,
		{api.StateRunning, api.StateLost}: true, {api.StateRunning, api.StatePending}: true, {api.StateRunning, api.StatePreempted}: true,
	}
	for _, from := range api.States {
		for _, to := range api.States {
			if got := jobs.CanTransition(from, to); got != allowed[[2]api.State{from, to}] {
				t.Errorf("CanTransition(%s, %s) = %v", from, to, got)
			}
		}
		if from.Terminal() {
			for _, to := range api.States {
				if jobs.CanTransition(from, to) {
					t.Errorf("terminal state %s can move to %s", from, to)
				}
			}
		}
	}
}

// newManager runs the daemon's job manager over the daemon's placer for a
// host with capacity's CPU and memory and the daemon's executor.
func newManager(t *testing.T, capacity api.NodeResources) *jobs.Manager {
	t.Helper()
	dir := t.TempDir()
	runner := jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.DiscardHandler)
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}, st,
		runner, jobstest.Placer(capacity.CPU, capacity.Memory), log)
	jobstest.Run(t, m)
	return m
}

func submit(t *testing.T, m *jobs.Manager, spec api.JobSpec) api.Job {
	t.Helper()
	if spec.Resources.CPU == 0 {
		spec.Resources.CPU = 1000
	}
	if spec.Resources.Memory == 0 {
		spec.Resources.Memory = 16 << 20
	}
	j, err := m.Submit(context.Background(), root, spec)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func waitFor(t *testing.T, m *jobs.Manager, id string, cond func(api.Job) bool) api.Job {
	t.Helper()
	return jobstest.WaitFor(t, m, id, cond)
}

func state(s api.State) func(api.Job) bool { return func(j api.Job) bool { return j.State == s } }

func TestGangAllOrNothing(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 2000, Memory: 1 << 30})
	gang := &api.Gang{Name: "g", Size: 3}
	a := submit(t, m, api.JobSpec{Command: []string{"true"}, Gang: gang})
	b := submit(t, m, api.JobSpec{Command: []string{"true"}, Gang: gang})
	j := waitFor(t, m, a.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "2 of 3 members") })
	if j.State != api.StatePending {
		t.Fatalf("incomplete gang member is %s", j.State)
	}
	// The third member makes the gang need 3 CPUs on a 2-CPU host: none is
	// placed, and since it could never fit here together, every member
	// fails saying so.
	c := submit(t, m, api.JobSpec{Command: []string{"true"}, Gang: gang})
	waitFor(t, m, c.ID, func(j api.Job) bool {
		return strings.Contains(j.Reason, "can never fit on this host together") && strings.Contains(j.Reason, "insufficient cpu")
	})
	for _, id := range []string{a.ID, b.ID, c.ID} {
		if j, _ := m.Get(context.Background(), root, id); j.State != api.StateFailed || j.Allocation != nil || j.Attempt != 0 {
			t.Errorf("member %s is %s (attempt %d): a gang that can never fit must place nobody and fail", id, j.State, j.Attempt)
		}
	}
	// A gang that fits runs whole.
	small := &api.Gang{Name: "small", Size: 2}
	x := submit(t, m, api.JobSpec{Command: []string{"true"}, Gang: small, Resources: api.Resources{CPU: 500}})
	y := submit(t, m, api.JobSpec{Command: []string{"true"}, Gang: small, Resources: api.Resources{CPU: 500}})
	waitFor(t, m, x.ID, state(api.StateSucceeded))
	waitFor(t, m, y.ID, state(api.StateSucceeded))
}

func TestQueueOrderAndWaitingReason(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30})
	if _, err := m.Submit(context.Background(), root, api.JobSpec{}); err == nil {
		t.Fatal("empty spec accepted")
	}
	if err := m.SetCordoned(root, true); err != nil {
		t.Fatal(err)
	}
	if err := m.SetCordoned(api.Caller{UID: 1000}, false); err == nil {
		t.Fatal("non-admin uncordoned the node")
	}
	hog := submit(t, m, api.JobSpec{Command: []string{"sleep", "30"}, Priority: 1})
	low := submit(t, m, api.JobSpec{Command: []string{"true"}})
	high := submit(t, m, api.JobSpec{Command: []string{"true"}, Priority: 900})
	time.Sleep(50 * time.Millisecond)
	if j, _ := m.Get(context.Background(), root, hog.ID); j.State != api.StatePending {
		t.Fatalf("cordoned node placed a job: %s", j.State)
	}
	m.SetCordoned(root, false)
	// high priority first, even though submitted last.
	waitFor(t, m, high.ID, state(api.StateSucceeded))
	waitFor(t, m, hog.ID, state(api.StateRunning))
	j := waitFor(t, m, low.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "waiting: insufficient cpu") })
	if j.State != api.StatePending {
		t.Errorf("low is %s", j.State)
	}
	if _, err := m.Cancel(context.Background(), api.Caller{UID: 1000}, hog.ID); err == nil {
		t.Error("another user cancelled root's job")
	}
	m.Cancel(context.Background(), root, hog.ID)
	waitFor(t, m, hog.ID, state(api.StateCancelled))
	waitFor(t, m, low.ID, state(api.StateSucceeded))
}

func TestRestartOnFailure(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 2000, Memory: 1 << 30})
	j := submit(t, m, api.JobSpec{Command: []string{"false"}, Restart: &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 2}})
	j = waitFor(t, m, j.ID, state(api.StateFailed))
	if j.Attempt != 3 || j.Exit == nil || j.Exit.Code != 1 {
		t.Errorf("attempts %d exit %+v, want 3 attempts ending in exit code 1", j.Attempt, j.Exit)
	}
	restarts := 0
	for _, e := range j.Events {
		if e.From == api.StateRunning && e.To == api.StatePending {
			restarts++
		}
	}
	if restarts != 2 {
		t.Errorf("%d restart events, want 2", restarts)
	}
	missing := submit(t, m, api.JobSpec{Command: []string{"no-such-program-here"}})
	missing = waitFor(t, m, missing.ID, state(api.StateFailed))
	if !strings.Contains(missing.Reason, "not found in the job's PATH") {
		t.Errorf("reason %q", missing.Reason)
	}
}
