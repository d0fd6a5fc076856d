package jobs_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// events counts the events of j whose reason contains part.
func events(j api.Job, part string) int {
	n := 0
	for _, e := range j.Events {
		if strings.Contains(e.Reason, part) {
			n++
		}
	}
	return n
}

// A job still running at its max_runtime is stopped (SIGTERM) and ends
// failed with the reason, though it exits 0 on SIGTERM and may restart on
// failure: it is not restarted. A job within its limit is left alone,
// and one that ends before its limit ends as it would without one.
func TestMaxRuntimeStopsTheAttempt(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 4000, Memory: 1 << 30})
	over := submit(t, m, api.JobSpec{
		Command:    []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"},
		MaxRuntime: api.Duration(time.Second),
		Restart:    &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 2},
	})
	within := submit(t, m, api.JobSpec{Command: []string{"sleep", "600"}, MaxRuntime: api.Duration(time.Hour)})
	quick := submit(t, m, api.JobSpec{Command: []string{"true"}, MaxRuntime: api.Duration(time.Second)})

	end := waitFor(t, m, over.ID, func(j api.Job) bool { return j.State.Terminal() })
	const want = "exceeded max_runtime 1s: stopped (exit code 0); not restarted"
	if end.State != api.StateFailed || end.Reason != want {
		t.Fatalf("job over its limit: %s %q, want failed %q", end.State, end.Reason, want)
	}
	if end.Attempt != 1 || events(end, "restarting") != 0 {
		t.Errorf("job over its limit was restarted: attempt %d, events %+v", end.Attempt, end.Events)
	}
	if n := events(end, "exceeded max_runtime 1s; stopping: SIGTERM, SIGKILL after 1s"); n != 1 {
		t.Errorf("%d stopping events, want 1: %+v", n, end.Events)
	}
	if end.StartedAt == nil || end.FinishedAt == nil || end.FinishedAt.Sub(*end.StartedAt) < time.Second {
		t.Errorf("stopped before its limit: started %v, finished %v", end.StartedAt, end.FinishedAt)
	}

	got := waitFor(t, m, quick.ID, func(j api.Job) bool { return j.State.Terminal() })
	if got.State != api.StateSucceeded || events(got, "max_runtime") != 0 {
		t.Errorf("job that ended before its limit: %s %q", got.State, got.Reason)
	}
	got, err := m.Get(context.Background(), root, within.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateRunning || events(got, "max_runtime") != 0 {
		t.Errorf("job within its limit: %s %q, events %+v", got.State, got.Reason, got.Events)
	}
	if _, err := m.Cancel(context.Background(), root, within.ID); err != nil {
		t.Fatal(err)
	}
	if got := waitFor(t, m, within.ID, func(j api.Job) bool { return j.State.Terminal() }); got.State != api.StateCancelled {
		t.Errorf("cancelled job within its limit: %s %q", got.State, got.Reason)
	}
}

// limitManager is a manager over the store and logs in dir whose wall
// clock is clk; it leaves its jobs running when it stops, for the next
// one to re-attach.
func limitManager(t *testing.T, dir string, clk *wallClock) (*jobs.Manager, func()) {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	logs := filepath.Join(dir, "logs")
	m := jobs.New(jobs.Config{LogDir: logs, CancelGrace: time.Second, Now: clk.Now, LeaveJobsRunning: true},
		st, jobstest.Runner(t, logs, time.Second), jobstest.Placer(4000, 1<<30), slog.New(slog.DiscardHandler))
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	m.Start()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Stop(ctx)
		st.Close()
	}
	t.Cleanup(stop)
	return m, stop
}

// A re-attached attempt keeps the deadline of its recorded start: the
// daemon is down for what the wall clock says is 59m57s; a job with a
// 1h limit is stopped about 3 s after the next daemon starts (not given
// an hour more), one with a 30m limit at once, and one with a 2h limit
// keeps running. A wall clock stepped while they run moves no deadline.
func TestMaxRuntimeAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	clk := &wallClock{}
	m1, stop := limitManager(t, dir, clk)
	spec := func(limit time.Duration) api.JobSpec {
		return api.JobSpec{Command: []string{"sleep", "600"}, MaxRuntime: api.Duration(limit)}
	}
	hour := submit(t, m1, spec(time.Hour))
	half := submit(t, m1, spec(30*time.Minute))
	two := submit(t, m1, spec(2*time.Hour))
	for _, id := range []string{hour.ID, half.ID, two.ID} {
		waitFor(t, m1, id, state(api.StateRunning))
	}
	stop()
	clk.jump(time.Hour - 3*time.Second)

	m2, _ := limitManager(t, dir, clk)
	end := waitFor(t, m2, half.ID, func(j api.Job) bool { return j.State.Terminal() })
	if end.State != api.StateFailed || !strings.HasPrefix(end.Reason, "exceeded max_runtime 30m0s: stopped (killed by signal") {
		t.Fatalf("re-attached job long past its 30m limit: %s %q", end.State, end.Reason)
	}
	if end.Attempt != 1 {
		t.Errorf("attempt %d, want the re-attached first", end.Attempt)
	}
	// Stepping the wall clock back an hour now would give the 1h job an
	// hour more if deadlines followed it.
	clk.jump(-time.Hour)
	end = waitFor(t, m2, hour.ID, func(j api.Job) bool { return j.State.Terminal() })
	if end.State != api.StateFailed || !strings.HasPrefix(end.Reason, "exceeded max_runtime 1h0m0s: stopped") {
		t.Fatalf("re-attached job 3s short of its 1h limit: %s %q", end.State, end.Reason)
	}
	// And forward three hours: the 2h job, 1h into its limit by the
	// record, is not stopped.
	clk.jump(3 * time.Hour)
	time.Sleep(1500 * time.Millisecond) // more than one pass of the loop
	got, err := m2.Get(context.Background(), root, two.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateRunning || events(got, "max_runtime") != 0 {
		t.Errorf("re-attached job within its 2h limit: %s %q, events %+v", got.State, got.Reason, got.Events)
	}
}

// A daemon that goes down while it stops a job at its max_runtime leaves
// the mark in the job's record: the next daemon records the attempt's end
// as failed at its limit, though the job exits 0 on SIGTERM and may
// restart on failure, and does not restart it.
func TestMaxRuntimeStopAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	clk := &wallClock{}
	m1, stop := limitManager(t, dir, clk)
	j := submit(t, m1, api.JobSpec{
		// On SIGTERM it takes a moment, then exits 0: it is still running
		// when the first daemon goes down, and ends before the second
		// re-attaches.
		Command:    []string{"sh", "-c", "trap 'sleep 0.5; exit 0' TERM; while :; do sleep 0.05; done"},
		MaxRuntime: api.Duration(time.Second),
		Restart:    &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 2},
	})
	waitFor(t, m1, j.ID, func(j api.Job) bool { return j.StoppedOvertime != "" })
	stop()
	time.Sleep(1500 * time.Millisecond) // the job ends while no daemon runs

	m2, _ := limitManager(t, dir, clk)
	end := waitFor(t, m2, j.ID, func(j api.Job) bool { return j.State.Terminal() })
	const want = "exceeded max_runtime 1s: stopped (exit code 0); not restarted"
	if end.State != api.StateFailed || end.Reason != want {
		t.Fatalf("job stopped at its limit across a restart: %s %q, want failed %q", end.State, end.Reason, want)
	}
	if end.Attempt != 1 || events(end, "restarting") != 0 {
		t.Errorf("job stopped at its limit was restarted: attempt %d, events %+v", end.Attempt, end.Events)
	}
	if end.StoppedOvertime != "" {
		t.Errorf("ended job keeps stopped_overtime %q", end.StoppedOvertime)
	}
}

// A job that ends on its own past its max_runtime, before the loop's next
// pass (at least once a second) stopped it, exceeded its limit all the
// same: failed, not restarted, whichever came first, the stop or its end.
func TestMaxRuntimeEndedPastIt(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 4000, Memory: 1 << 30})
	j := submit(t, m, api.JobSpec{
		Command:    []string{"sleep", "1.2"},
		MaxRuntime: api.Duration(time.Second),
		Restart:    &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 2},
	})
	end := waitFor(t, m, j.ID, func(j api.Job) bool { return j.State.Terminal() })
	if end.State != api.StateFailed || !strings.HasPrefix(end.Reason, "exceeded max_runtime 1s: ") || !strings.HasSuffix(end.Reason, "; not restarted") {
		t.Fatalf("job that ran 1.2s with a 1s limit: %s %q", end.State, end.Reason)
	}
	if end.Attempt != 1 {
		t.Errorf("attempt %d, want 1", end.Attempt)
	}
	t.Logf("reason: %s", end.Reason)
}
