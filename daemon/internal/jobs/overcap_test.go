package jobs_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// A running job told it is over its GPU memory cap keeps running with the
// event and reason (warn); stopped over it, it ends failed with the
// reason, even though it exits 0 on SIGTERM, and a second stop is a no-op.
func TestStopOverGPUCap(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 4000, Memory: 1 << 30})
	// Exits 0 on SIGTERM: the stop still records a failure.
	j := submit(t, m, api.JobSpec{Command: []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"}})
	waitFor(t, m, j.ID, state(api.StateRunning))

	warn := "GPU memory 2.0 GiB over its cap of 1.0 GiB on GPU-x (over_cap: warn: left running)"
	if err := m.NoteGPUMemory(j.ID, warn); err != nil {
		t.Fatal(err)
	}
	got, _ := m.Get(context.Background(), root, j.ID)
	if got.State != api.StateRunning || got.Reason != warn || got.Events[len(got.Events)-1].Reason != warn {
		t.Fatalf("after the warning: %s %q %+v", got.State, got.Reason, got.Events[len(got.Events)-1])
	}

	why := "GPU memory 2.0 GiB over its cap of 1.0 GiB on GPU-x"
	if err := m.StopOverGPUCap(j.ID, why); err != nil {
		t.Fatal(err)
	}
	if err := m.StopOverGPUCap(j.ID, "again"); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	end := waitFor(t, m, j.ID, func(j api.Job) bool { return j.State.Terminal() })
	if end.State != api.StateFailed || !strings.HasPrefix(end.Reason, "stopped: "+why+" (exit code 0)") {
		t.Fatalf("stopped job: %s %q", end.State, end.Reason)
	}
	var stopping int
	for _, e := range end.Events {
		if strings.Contains(e.Reason, "stopping: SIGTERM") {
			stopping++
		}
		if strings.Contains(e.Reason, "again") {
			t.Errorf("the second stop was recorded: %q", e.Reason)
		}
	}
	if stopping != 1 {
		t.Errorf("%d stopping events, want 1: %+v", stopping, end.Events)
	}
	if err := m.StopOverGPUCap(j.ID, why); err == nil {
		t.Error("stopping a finished job did not fail")
	}
	if err := m.StopOverGPUCap("999", why); err == nil {
		t.Error("stopping an unknown job did not fail")
	}
	if err := m.NoteGPUMemory("999", why); err == nil {
		t.Error("noting an unknown job did not fail")
	}

	// A job not stopped over its cap that exits 0 still succeeds (the
	// record is taken with the stopped one's end).
	ok := submit(t, m, api.JobSpec{Command: []string{"true"}})
	waitFor(t, m, ok.ID, state(api.StateSucceeded))
}
