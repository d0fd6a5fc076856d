package jobs_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

type endedRun struct {
	job            api.Job
	started, ended time.Time
	failed         bool
}

// TestRunEnded checks the manager tells RunEnded of each attempt that
// ended on its own — a success, each failure of a job restarted on
// failure — and not of a cancelled one.
func TestRunEnded(t *testing.T) {
	dir := t.TempDir()
	runner := jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var mu sync.Mutex
	var runs []endedRun
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second,
		RunEnded: func(j api.Job, started, ended time.Time, failed bool) {
			mu.Lock()
			runs = append(runs, endedRun{j, started, ended, failed})
			mu.Unlock()
		}}, st, runner, jobstest.Placer(4000, 1<<30), slog.New(slog.DiscardHandler))
	jobstest.Run(t, m)

	ok := submit(t, m, api.JobSpec{Name: "ok", Command: []string{"sleep", "0.2"}})
	bad := submit(t, m, api.JobSpec{Name: "bad", Command: []string{"false"}, Restart: &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 1}})
	gone := submit(t, m, api.JobSpec{Name: "gone", Command: []string{"sleep", "60"}})
	waitFor(t, m, ok.ID, state(api.StateSucceeded))
	waitFor(t, m, bad.ID, state(api.StateFailed))
	waitFor(t, m, gone.ID, state(api.StateRunning))
	if _, err := m.Cancel(context.Background(), root, gone.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, m, gone.ID, state(api.StateCancelled))

	mu.Lock()
	defer mu.Unlock()
	count := map[string][]bool{}
	for _, r := range runs {
		count[r.job.Spec.Name] = append(count[r.job.Spec.Name], r.failed)
		if r.started.IsZero() || r.ended.Before(r.started) {
			t.Errorf("%s: run from %v to %v", r.job.Spec.Name, r.started, r.ended)
		}
	}
	if got := count["ok"]; len(got) != 1 || got[0] {
		t.Errorf("ok: %v, want one succeeded run", got)
	}
	if got := count["bad"]; len(got) != 2 || !got[0] || !got[1] {
		t.Errorf("bad: %v, want two failed runs (the first restarted)", got)
	}
	if got := count["gone"]; len(got) != 0 {
		t.Errorf("cancelled job told as %v", got)
	}
}
