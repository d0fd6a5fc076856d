package jobs

import (
	"fmt"
	"syscall"

	"github.com/fusiond/fusiond/daemon/api"
)

// reclaimEviction stands, in place of a preemptor's job ID, for a job
// stopped by the reclaim loop (EvictReclaimed): job IDs are numbers.
const reclaimEviction = "reclaim"

// EvictReclaimed stops a running best-effort job to give capacity back to
// guaranteed and burstable jobs (the reclaim loop's eviction,
// docs/load.md "Reclaimed capacity"): SIGTERM, then SIGKILL after
// CancelGrace, like a preemption's victim; when it ends it is queued again
// with restart on-failure (not counted as a retry) or recorded preempted,
// either with reason in its events. Evicting a job already stopping is a
// no-op.
func (m *Manager) EvictReclaimed(id, reason string) error {
	if reason == "" {
		reason = "evicted to give reclaimed capacity back"
	}
	m.mu.Lock()
	j := m.jobs[id]
	switch {
	case j == nil:
		m.mu.Unlock()
		return api.Errorf(api.CodeNotFound, "job %s not found", id)
	case j.Tier != api.TierBestEffort:
		m.mu.Unlock()
		return api.Errorf(api.CodeConflict, "job %s is %s: only best-effort jobs are evicted for reclaimed capacity", id, j.Tier)
	}
	proc := m.procs[id]
	if j.State != api.StateRunning || proc == nil {
		m.mu.Unlock()
		return api.Errorf(api.CodeConflict, "job %s is %s, not running", id, j.State)
	}
	q := &m.queue
	if _, stopping := q.preempting[id]; stopping || m.cancels[id] || m.overtimeStopping(id) || q.reclaiming[id] != "" || j.MovingFor != "" {
		m.mu.Unlock()
		return nil
	}
	if q.reclaiming == nil {
		q.reclaiming = map[string]string{}
	}
	q.reclaiming[id] = reason
	m.mu.Unlock()
	m.log.Info("evicting a best-effort job for reclaimed capacity", "job", id, "reason", reason)
	m.annotate(j, fmt.Sprintf("%s; stopping: SIGTERM, SIGKILL after %s", reason, m.cfg.CancelGrace), func(*api.Job) {})
	_ = proc.Signal(syscall.SIGTERM)
	go m.killAfterGrace(id, proc)
	return nil
}

// finishEvicted records how a job evicted by the reclaim loop ended, as
// finishPreempted does for a preemption's victim.
func (m *Manager) finishEvicted(j *api.Job, desc string, record func(*api.Job)) error {
	m.mu.Lock()
	reason := m.queue.reclaiming[j.ID]
	delete(m.queue.reclaiming, j.ID)
	m.mu.Unlock()
	if r := j.Spec.Restart; r != nil && r.Policy == api.RestartOnFailure {
		return m.transition(j, api.StatePending, fmt.Sprintf("%s (%s); queued again (not counted as a retry)", reason, desc), func(j *api.Job) {
			record(j)
			j.FinishedAt = nil
			j.Allocation = nil
			j.PID = 0
			j.Preemptions++
		})
	}
	return m.transition(j, api.StatePreempted, fmt.Sprintf("%s (%s)", reason, desc), func(j *api.Job) {
		record(j)
		j.Preemptions++
	})
}
