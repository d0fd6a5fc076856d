package jobs

import (
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// A job's time in the queue comes from its record, so its aging survives
// a daemon restart: the last transition to pending counts, else creation.
func TestPendingSinceFromRecord(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	created := now.Add(-time.Hour)
	requeued := now.Add(-10 * time.Minute)
	j := &api.Job{CreatedAt: created, Events: []api.Event{
		{Time: created, To: api.StatePending},
		{Time: created.Add(time.Minute), From: api.StatePending, To: api.StatePlaced},
		{Time: created.Add(2 * time.Minute), From: api.StatePlaced, To: api.StateRunning},
		{Time: requeued, From: api.StateRunning, To: api.StatePending},
	}}
	if got := pendingSince(j, now); !got.Equal(requeued) {
		t.Errorf("requeued job: pending since %v, want %v (its last transition to pending)", got, requeued)
	}
	if got := pendingSince(&api.Job{CreatedAt: created}, now); !got.Equal(created) {
		t.Errorf("job without events: pending since %v, want its creation %v", got, created)
	}
	if got := pendingSince(&api.Job{CreatedAt: now.Add(time.Hour)}, now); !got.Equal(now) {
		t.Errorf("job created in the future (clock step): pending since %v, want now", got)
	}
}
