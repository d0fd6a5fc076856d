package jobs_test

import (
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

type observed struct {
	mu          sync.Mutex
	submitted   map[api.Class]int
	transitions map[[2]api.State]int
	placed      int
	unplaced    int
	waits       int
}

func (o *observed) Submitted(c api.Class, _ api.Tier) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.submitted[c]++
}

func (o *observed) Transitioned(from, to api.State) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.transitions[[2]api.State{from, to}]++
}

func (o *observed) Decided(placed bool, n int, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if took < 0 || n < 1 {
		panic("bad decision report")
	}
	if placed {
		o.placed++
	} else {
		o.unplaced++
	}
}

func (o *observed) Waited(api.Class, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.waits++
}

// The observer hears of every submission, transition and decision, and
// Stats counts the table and the queue.
func TestObserverAndStats(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	obs := &observed{submitted: map[api.Class]int{}, transitions: map[[2]api.State]int{}}
	// Preemption off: the training job must wait behind the best-effort hog.
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second, Observer: obs, Queue: jobs.QueueConfig{NoPreemption: true},
		DefaultTiers: map[api.Class]api.Tier{api.ClassBatch: api.TierBestEffort}}, st,
		jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second), jobstest.Placer(1000, 1<<30), slog.New(slog.DiscardHandler))
	jobstest.Run(t, m)
	done := submit(t, m, api.JobSpec{Class: api.ClassBatch, Command: []string{"true"}})
	waitFor(t, m, done.ID, state(api.StateSucceeded))
	hog := submit(t, m, api.JobSpec{Class: api.ClassBatch, Command: []string{"sleep", "60"}})
	waitFor(t, m, hog.ID, state(api.StateRunning))
	queued := submit(t, m, api.JobSpec{Class: api.ClassTraining, Command: []string{"true"}})
	waitFor(t, m, queued.ID, func(j api.Job) bool {
		return j.Reason != "" && j.State == api.StatePending && j.Reason != queued.Reason
	})

	s := m.Stats()
	count := func(state api.State, class api.Class) int {
		for _, g := range s.Groups {
			if g.State == state && g.Class == class {
				return g.Count
			}
		}
		return 0
	}
	if s.Queued != 1 || s.OldestWait <= 0 || count(api.StateSucceeded, api.ClassBatch) != 1 || count(api.StateRunning, api.ClassBatch) != 1 || count(api.StatePending, api.ClassTraining) != 1 {
		t.Errorf("stats %+v", s)
	}
	for _, g := range s.Groups {
		if g.Class == api.ClassBatch && g.Tier != api.TierBestEffort {
			t.Errorf("batch job counted in tier %s", g.Tier)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.submitted[api.ClassBatch] != 2 || obs.submitted[api.ClassTraining] != 1 {
		t.Errorf("submissions %v", obs.submitted)
	}
	if obs.transitions[[2]api.State{api.StatePending, api.StatePlaced}] != 2 || obs.transitions[[2]api.State{api.StateRunning, api.StateSucceeded}] != 1 {
		t.Errorf("transitions %v", obs.transitions)
	}
	if obs.placed != 2 || obs.unplaced < 1 || obs.waits != 2 {
		t.Errorf("decisions: %d placed, %d unplaced; %d waits", obs.placed, obs.unplaced, obs.waits)
	}
}
