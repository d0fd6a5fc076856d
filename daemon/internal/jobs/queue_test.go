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

// newQueueManager is newManager with the queue tuned by q.
func newQueueManager(t *testing.T, capacity api.NodeResources, q jobs.QueueConfig) *jobs.Manager {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second, Queue: q}, st,
		jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second), jobstest.Placer(capacity.CPU, capacity.Memory), slog.New(slog.DiscardHandler))
	jobstest.Run(t, m)
	return m
}

// A steady stream of small jobs cannot starve a big high-priority one: the
// big job, first in the queue, holds a reservation, so no small job behind
// it takes the CPU it waits for (before, each CPU freed went to the next
// small job and the big one waited as long as the stream lasted).
func TestBigJobNotStarvedBySmallOnes(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 4000, Memory: 1 << 30})
	small := api.JobSpec{Command: []string{"sleep", "0.3"}, Resources: api.Resources{CPU: 1000}}
	for range 4 {
		j := submit(t, m, small)
		waitFor(t, m, j.ID, state(api.StateRunning))
	}
	big := submit(t, m, api.JobSpec{Command: []string{"sleep", "0.2"}, Priority: 500, Resources: api.Resources{CPU: 4000}})
	var later []api.Job
	for i := 0; i < 100; i++ {
		later = append(later, submit(t, m, small))
		if j, _ := m.Get(context.Background(), root, big.ID); j.State != api.StatePending {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := waitFor(t, m, big.ID, state(api.StateSucceeded))
	j := waitFor(t, m, later[0].ID, func(j api.Job) bool { return j.StartedAt != nil })
	if j.StartedAt.Before(*b.FinishedAt) {
		t.Errorf("small job %s, submitted after the big one, started at %s, before the big one ended at %s", j.ID, j.StartedAt, b.FinishedAt)
	}
	for _, l := range later {
		j := waitFor(t, m, l.ID, state(api.StateSucceeded))
		if j.StartedAt == nil || j.StartedAt.Before(*b.StartedAt) {
			t.Errorf("small job %s, submitted after the big one, started at %v, before it (%s)", j.ID, j.StartedAt, b.StartedAt)
		}
	}
}

// The queue says where a waiting job stands: the head holds the
// reservation, the jobs behind it count the jobs ahead of them.
func TestWaitingPosition(t *testing.T) {
	m := newManager(t, api.NodeResources{CPU: 2000, Memory: 1 << 30})
	hog := submit(t, m, api.JobSpec{Command: []string{"sleep", "30"}, Resources: api.Resources{CPU: 2000}})
	waitFor(t, m, hog.ID, state(api.StateRunning))
	a := submit(t, m, api.JobSpec{Command: []string{"true"}, Priority: 10})
	b := submit(t, m, api.JobSpec{Command: []string{"true"}, Priority: 5})
	c := submit(t, m, api.JobSpec{Command: []string{"true"}, Priority: 20})
	waitFor(t, m, c.ID, func(j api.Job) bool { return strings.HasSuffix(j.Reason, "room on this host reserved for it") })
	waitFor(t, m, a.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "; 1 job ahead") })
	waitFor(t, m, b.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "; 2 jobs ahead") })
	m.Cancel(context.Background(), root, hog.ID)
	for _, id := range []string{a.ID, b.ID, c.ID} {
		waitFor(t, m, id, state(api.StateSucceeded))
	}
}

// Preemption takes at most max_evictions victims per window: a plan that
// needs more is not made, and once the window's budget is spent the next
// job waits, saying so.
func TestPreemptionBudget(t *testing.T) {
	m := newQueueManager(t, api.NodeResources{CPU: 4000, Memory: 1 << 30}, jobs.QueueConfig{MaxEvictions: 1, PreemptionWindow: time.Hour})
	be := func() api.Job {
		return submit(t, m, api.JobSpec{Tier: api.TierBestEffort, Command: []string{"sleep", "60"}, Resources: api.Resources{CPU: 2000}})
	}
	x, y := be(), be()
	waitFor(t, m, x.ID, state(api.StateRunning))
	waitFor(t, m, y.ID, state(api.StateRunning))
	// A burstable job (the jobs' placer has no exclusive cores for a
	// guaranteed one) that needs both best-effort jobs gone: over the budget of one.
	whole := submit(t, m, api.JobSpec{Tier: api.TierBurstable, Command: []string{"true"}, Resources: api.Resources{CPU: 4000}})
	waitFor(t, m, whole.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "reserved for it") })
	time.Sleep(1500 * time.Millisecond) // more passes
	for _, id := range []string{x.ID, y.ID} {
		if j, _ := m.Get(context.Background(), root, id); j.State != api.StateRunning || j.PreemptedBy != "" {
			t.Errorf("job %s is %s (preempted by %q): a plan over the budget was carried out", id, j.State, j.PreemptedBy)
		}
	}
	m.Cancel(context.Background(), root, whole.ID)
	// One victim is within the budget.
	half := submit(t, m, api.JobSpec{Tier: api.TierBurstable, Command: []string{"sleep", "60"}, Resources: api.Resources{CPU: 2000}})
	waitFor(t, m, half.ID, state(api.StateRunning))
	victims := 0
	for _, id := range []string{x.ID, y.ID} {
		j, _ := m.Get(context.Background(), root, id)
		if j.State == api.StatePreempted {
			victims++
			if j.PreemptedBy != half.ID || !strings.Contains(j.Reason, "preempted by job "+half.ID) {
				t.Errorf("victim %s: preempted_by %q, reason %q; want job %s", id, j.PreemptedBy, j.Reason, half.ID)
			}
		}
	}
	if victims != 1 {
		t.Fatalf("%d jobs preempted for a job needing one's room, want 1", victims)
	}
	// The budget is spent: the next burstable job waits and says why.
	next := submit(t, m, api.JobSpec{Tier: api.TierBurstable, Command: []string{"true"}, Resources: api.Resources{CPU: 2000}})
	waitFor(t, m, next.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "preemption budget spent (1 per 1h0m0s)") })
	for _, id := range []string{x.ID, y.ID, half.ID, next.ID} {
		m.Cancel(context.Background(), root, id)
	}
}
