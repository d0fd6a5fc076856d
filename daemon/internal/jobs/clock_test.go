package jobs_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// wallClock is a wall clock that can be set forward and back, as NTP or an
// operator steps a real one: its readings carry no monotonic part, like a
// time.Time that went through UTC() or the store.
type wallClock struct{ offset atomic.Int64 }

func (c *wallClock) Now() time.Time       { return time.Now().Round(0).Add(time.Duration(c.offset.Load())) }
func (c *wallClock) jump(d time.Duration) { c.offset.Add(int64(d)) }

// clockManager is a manager over the store in dir whose wall clock is clk.
func clockManager(t *testing.T, dir string, clk *wallClock, maxAge time.Duration) (*jobs.Manager, func()) {
	t.Helper()
	runner := jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second, MaxAge: maxAge, Now: clk.Now},
		st, runner, jobstest.Placer(2000, 1<<30), slog.New(slog.DiscardHandler))
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

func exists(t *testing.T, m *jobs.Manager, id string) bool {
	t.Helper()
	_, err := m.Get(context.Background(), root, id)
	return err == nil
}

// TestWallClockJumps steps the manager's wall clock an hour forward and
// back while jobs run, wait and sit finished: retention by age is measured
// on the monotonic clock (a jump forward does not delete a job that just
// finished, a jump back does not keep it past max_age), a job's events stay
// in the order they happened though their recorded times go back, the
// cancel grace is neither cut short nor stretched, and a daemon starting
// with its clock set back treats jobs "finished in the future" as just
// finished.
func TestWallClockJumps(t *testing.T) {
	const maxAge = 2 * time.Second
	dir := t.TempDir()
	clk := &wallClock{}
	m, stop := clockManager(t, dir, clk, maxAge)

	// Retention: forward an hour right after the job finished.
	a := submit(t, m, api.JobSpec{Command: []string{"true"}})
	waitFor(t, m, a.ID, state(api.StateSucceeded))
	clk.jump(time.Hour)
	m.CollectGarbage()
	if !exists(t, m, a.ID) {
		t.Fatalf("job %s that finished a moment ago was deleted after the wall clock jumped 1h forward (max_age %s)", a.ID, maxAge)
	}
	// Back two hours (an hour before it finished), then max_age passes.
	clk.jump(-2 * time.Hour)
	time.Sleep(maxAge + 300*time.Millisecond)
	m.CollectGarbage()
	if exists(t, m, a.ID) {
		t.Fatalf("job %s kept %s after it finished (max_age %s) because the wall clock went back 1h", a.ID, maxAge+300*time.Millisecond, maxAge)
	}

	// Events: a job that waits, runs and ends across jumps both ways.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk.jump(time.Hour) // back to the real time
	blocker := submit(t, m, api.JobSpec{Command: []string{"sleep", "1"}, Resources: api.Resources{CPU: 2000}})
	waitFor(t, m, blocker.ID, state(api.StateRunning))
	b := submit(t, m, api.JobSpec{Command: []string{"sleep", "0.5"}, Resources: api.Resources{CPU: 2000}})
	events, unsub := m.Subscribe(root, b.ID)
	defer unsub()
	clk.jump(time.Hour) // while b waits
	waitFor(t, m, b.ID, state(api.StateRunning))
	clk.jump(-3 * time.Hour) // while b runs
	done := waitFor(t, m, b.ID, state(api.StateSucceeded))
	var order []api.State
	for _, e := range done.Events {
		order = append(order, e.To)
	}
	want := []api.State{api.StatePending, api.StatePlaced, api.StateStarting, api.StateRunning, api.StateSucceeded}
	if len(order) != len(want) {
		t.Fatalf("events %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("events %v, want %v", order, want)
		}
	}
	if !done.FinishedAt.Before(*done.StartedAt) {
		t.Errorf("recorded times are not the wall clock's: started %s, finished %s after a 3h jump back", done.StartedAt, done.FinishedAt)
	}
	var streamed []api.State
	for len(streamed) < 4 {
		select {
		case e := <-events:
			streamed = append(streamed, e.To)
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("event stream gave %v", streamed)
		}
	}
	for i, s := range streamed {
		if s != want[i+1] {
			t.Fatalf("event stream %v, want %v", streamed, want[1:])
		}
	}

	// Cancel grace (1s) with the clock jumping an hour both ways meanwhile.
	clk.jump(2 * time.Hour)
	c := submit(t, m, api.JobSpec{Command: []string{"sh", "-c", "trap '' TERM; sleep 600"}})
	waitFor(t, m, c.ID, state(api.StateRunning))
	time.Sleep(100 * time.Millisecond) // let sh install the trap
	start := time.Now()
	if _, err := m.Cancel(context.Background(), root, c.ID); err != nil {
		t.Fatal(err)
	}
	clk.jump(time.Hour)
	time.Sleep(200 * time.Millisecond)
	clk.jump(-2 * time.Hour)
	waitFor(t, m, c.ID, state(api.StateCancelled))
	if took := time.Since(start); took < 900*time.Millisecond || took > 5*time.Second {
		t.Errorf("cancel of a job ignoring SIGTERM took %s with a 1s grace", took)
	}

	// A daemon starting with its clock an hour behind the records: jobs
	// "finished in the future" age from now, not from an hour from now.
	stop()
	clk.jump(-time.Hour)
	m2, _ := clockManager(t, dir, clk, maxAge)
	if !exists(t, m2, c.ID) {
		t.Fatalf("job %s missing after the restart", c.ID)
	}
	m2.CollectGarbage()
	if !exists(t, m2, c.ID) {
		t.Fatalf("job %s deleted at once after the restart", c.ID)
	}
	time.Sleep(maxAge + 300*time.Millisecond)
	m2.CollectGarbage()
	if exists(t, m2, c.ID) || exists(t, m2, b.ID) {
		t.Errorf("jobs kept past max_age because their recorded finish is ahead of the wall clock")
	}
}
