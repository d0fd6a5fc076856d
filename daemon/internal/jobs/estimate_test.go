package jobs_test

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// byName estimates a job's run time from its name.
type byName map[string]time.Duration

func (b byName) EstimateJob(j *api.Job) (time.Duration, bool) {
	d, ok := b[j.Spec.Name]
	return d, ok
}

// EASY backfill with run times: on a 2-CPU host a 1-CPU job expected to
// run 3 s holds half of it; the head wants both CPUs. A 1-CPU job behind
// it expected to end well before the head could start is placed at once;
// one expected to outlast that waits for the head, as every job behind it
// does without estimates (TestBigJobNotStarvedBySmallOnes).
func TestBackfillWithEstimates(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	est := byName{"hog": 3 * time.Second, "short": 500 * time.Millisecond, "long": time.Minute}
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second, Estimator: est}, st,
		jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second), jobstest.Placer(2000, 1<<30), slog.New(slog.DiscardHandler))
	jobstest.Run(t, m)

	hog := submit(t, m, api.JobSpec{Name: "hog", Command: []string{"sleep", "3"}, Resources: api.Resources{CPU: 1000}})
	waitFor(t, m, hog.ID, state(api.StateRunning))
	head := submit(t, m, api.JobSpec{Name: "head", Command: []string{"true"}, Priority: 10, Resources: api.Resources{CPU: 2000}})
	waitFor(t, m, head.ID, func(j api.Job) bool { return j.State == api.StatePending && j.Reason != "" })
	long := submit(t, m, api.JobSpec{Name: "long", Command: []string{"true"}, Resources: api.Resources{CPU: 1000}})
	short := submit(t, m, api.JobSpec{Name: "short", Command: []string{"sleep", "0.2"}, Resources: api.Resources{CPU: 1000}})

	s := waitFor(t, m, short.ID, state(api.StateSucceeded))
	h := waitFor(t, m, head.ID, state(api.StateSucceeded))
	l := waitFor(t, m, long.ID, state(api.StateSucceeded))
	if !s.StartedAt.Before(*h.StartedAt) {
		t.Errorf("short job started at %s, not before the head (%s): not backfilled", s.StartedAt, h.StartedAt)
	}
	if l.StartedAt.Before(*h.StartedAt) {
		t.Errorf("long job started at %s, before the head (%s), though expected to outlast its shadow time", l.StartedAt, h.StartedAt)
	}
}
