package jobs

import (
	"fmt"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// Records is the job manager's records as the hand-over reaches them
// (it implements handover.Jobs): jobs named by ID, each call under the
// manager's lock, moves through the one state machine.
type Records struct{ m *Manager }

// Records is the view of the records the hand-over is built over.
func (m *Manager) Records() *Records { return &Records{m} }

// live is the record of id. m.mu held.
func (r *Records) live(id string) (*api.Job, error) {
	j := r.m.jobs[id]
	if j == nil {
		return nil, fmt.Errorf("job %s: %w", id, api.ErrNotFound)
	}
	return j, nil
}

// Job is a copy of the record of id.
func (r *Records) Job(id string) (api.Job, bool) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	j, err := r.live(id)
	if err != nil {
		return api.Job{}, false
	}
	return cloneJob(j), true
}

// State is the state of job id.
func (r *Records) State(id string) (api.State, bool) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	j, err := r.live(id)
	if err != nil {
		return "", false
	}
	return j.State, true
}

// AcceptedByKey is Manager.AcceptedByKey.
func (r *Records) AcceptedByKey(key string) (api.Job, bool) { return r.m.AcceptedByKey(key) }

func (r *Records) get(id string) (*api.Job, error) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.live(id)
}

// Move moves job id from state from (any when "") to to, stored and
// published.
func (r *Records) Move(id string, from, to api.State, reason string, mutate func(*api.Job)) error {
	j, err := r.get(id)
	if err != nil {
		return err
	}
	return r.m.transitionFrom(j, from, to, reason, mutate)
}

// Annotate records an event on active job id.
func (r *Records) Annotate(id, reason string, mutate func(*api.Job)) error {
	j, err := r.get(id)
	if err != nil {
		return err
	}
	return r.m.annotate(j, reason, mutate)
}

// Patch changes the in-memory record of id (stored with its next move).
func (r *Records) Patch(id string, mutate func(*api.Job)) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	if j := r.m.jobs[id]; j != nil {
		mutate(j)
	}
}

// SetWaiting sets the waiting reason of those of ids still pending.
func (r *Records) SetWaiting(ids []string, reason string) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	for _, id := range ids {
		if j := r.m.jobs[id]; j != nil && j.State == api.StatePending {
			j.Reason = reason
		}
	}
}

// CanRun is the placer's Admit.
func (r *Records) CanRun(spec api.JobSpec) error { return r.m.placer.Admit(spec) }

// Launch starts placed job id (not once the manager stops: the next
// daemon settles it).
func (r *Records) Launch(id string) {
	j, err := r.get(id)
	if err != nil || r.m.isStopping() {
		return
	}
	r.m.wg.Add(1)
	go r.m.launch(j)
}

// Release gives back what job id holds.
func (r *Records) Release(id string) {
	if j, err := r.get(id); err == nil {
		r.m.release(j)
	}
}

// CancelAsked reports whether a cancel of id is asked and not delivered.
func (r *Records) CancelAsked(id string) bool {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.cancels[id]
}

// ForgetCancel drops the cancel asked of id.
func (r *Records) ForgetCancel(id string) { r.m.forgetCancel(id) }

// TakeCancel is a copy of the record of id and whether a cancel was
// asked, which it drops, in one step.
func (r *Records) TakeCancel(id string) (api.Job, bool) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	cancelled := r.m.cancels[id]
	delete(r.m.cancels, id)
	j, err := r.live(id)
	if err != nil {
		return api.Job{}, cancelled
	}
	return cloneJob(j), cancelled
}

// LogFile is where the output of job id goes.
func (r *Records) LogFile(id string) string { return r.m.logPath(id) }

// Poke asks the queue for a pass.
func (r *Records) Poke() { r.m.poke() }

// Now is the manager's clock.
func (r *Records) Now() time.Time { return r.m.now() }

// Go runs f as one of the manager's goroutines (not once the manager
// stops).
func (r *Records) Go(f func()) {
	if r.m.isStopping() {
		return
	}
	r.m.wg.Add(1)
	go func() {
		defer r.m.wg.Done()
		f()
	}()
}

// Stopping is closed when the manager stops.
func (r *Records) Stopping() <-chan struct{} { return r.m.stopping }
