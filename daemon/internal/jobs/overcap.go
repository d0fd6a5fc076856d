package jobs

import (
	"fmt"
	"syscall"

	"github.com/fusiond/fusiond/daemon/api"
)

// NoteGPUMemory records reason on running job id — its processes hold
// more GPU memory than its share's cap on a time-sliced GPU, or are back
// under it — as an event in its history and stream and as its reason
// (fusionctl show); the job keeps running. The daemon's memory-cap watch
// calls it once per episode.
func (m *Manager) NoteGPUMemory(id, reason string) error {
	m.mu.Lock()
	j := m.jobs[id]
	m.mu.Unlock()
	if j == nil {
		return api.Errorf(api.CodeNotFound, "job %s not found", id)
	}
	return m.annotate(j, reason, func(j *api.Job) { j.Reason = reason })
}

// StopOverGPUCap stops running job id, of any tier, because its processes
// hold more GPU memory than its share's cap (reason says how much, on
// which GPU): SIGTERM, then SIGKILL after CancelGrace, as a cancel does.
// Its end is recorded failed with reason, however it exited, and its
// restart policy applies as to an OOM kill. Stopping a job already
// stopping (cancelled, preempted, evicted, moved or stopped over its cap)
// is a no-op.
func (m *Manager) StopOverGPUCap(id, reason string) error {
	m.mu.Lock()
	j := m.jobs[id]
	if j == nil {
		m.mu.Unlock()
		return api.Errorf(api.CodeNotFound, "job %s not found", id)
	}
	proc := m.procs[id]
	if j.State != api.StateRunning || proc == nil {
		state := j.State
		m.mu.Unlock()
		return api.Errorf(api.CodeConflict, "job %s is %s, not running", id, state)
	}
	q := &m.queue
	if _, preempted := q.preempting[id]; preempted || m.cancels[id] || q.reclaiming[id] != "" || m.overCap[id] != "" || m.overtimeStopping(id) || j.MovingFor != "" {
		m.mu.Unlock()
		return nil
	}
	if m.overCap == nil {
		m.overCap = map[string]string{}
	}
	m.overCap[id] = reason
	m.mu.Unlock()
	m.log.Warn("stopping a job over its GPU memory cap", "job", id, "reason", reason)
	why := fmt.Sprintf("%s; stopping: SIGTERM, SIGKILL after %s", reason, m.cfg.CancelGrace)
	m.annotate(j, why, func(j *api.Job) { j.Reason = why })
	_ = proc.Signal(syscall.SIGTERM)
	go m.killAfterGrace(id, proc)
	return nil
}

// takeOverCap takes the record that id was told to stop over its GPU
// memory cap: why, or "" if it was not.
func (m *Manager) takeOverCap(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	why := m.overCap[id]
	delete(m.overCap, id)
	return why
}
