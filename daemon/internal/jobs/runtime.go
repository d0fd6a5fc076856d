package jobs

import (
	"cmp"
	"fmt"
	"syscall"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// A job's own run-time limit (api.JobSpec.MaxRuntime): each attempt may
// run that long from its start. One that is still running at its limit is
// stopped through the cancel path (SIGTERM, SIGKILL after CancelGrace) and
// ends failed, "exceeded max_runtime …", however it exited, with no
// on-failure retry (Kubernetes' activeDeadlineSeconds and Slurm's TIMEOUT
// do the same: a retry would run into the same limit). One that ends on
// its own at or after its limit, before the loop stopped it, ends failed
// the same way ("… ended past it …"), unless it was being stopped for
// something else; a re-attached attempt already past its limit when a
// daemon took it over is the exception: if it has ended, it may have
// ended in time while no daemon ran, so it ends as it exited. A start
// after a preemption or a move is a new attempt with the whole limit
// again.
//
// Deadlines are kept on the monotonic clock, like every other decision of
// the manager (Config.Now): a wall clock stepped forward or back neither
// kills a job early nor lets it run longer. The wall clock is read once
// per attempt, when a daemon re-attaches to an attempt an earlier daemon
// started: what is left of its limit is its limit less the time since its
// recorded start (StartedAt), so a restart neither extends an attempt nor
// cuts it short, and one found past its limit is stopped on the loop's
// first pass. The loop checks the deadlines on every pass (at least once
// a second); no goroutine or timer is kept per job.

// runtimeDeadline is when a running attempt reaches its limit.
type runtimeDeadline struct {
	// at is a monotonic reading.
	at    time.Time
	limit time.Duration
	proc  Process
	// pastAtAttach: a re-attached attempt already past its deadline
	// when this daemon took it over; if it has ended, it may have ended
	// in time while no daemon ran (its end's time is unknown).
	pastAtAttach bool
}

// attemptDeadline is when the attempt of j now starting (fresh) or
// re-attached (state running, with a recorded start) reaches its limit,
// and whether it has one. monoNow and wallNow are readings of the same
// moment.
func attemptDeadline(j *api.Job, reattached bool, monoNow, wallNow time.Time) (time.Time, bool) {
	limit := time.Duration(j.Spec.MaxRuntime)
	if limit <= 0 || j.Spec.Pod != nil {
		return time.Time{}, false
	}
	if reattached && j.StartedAt != nil {
		// A recorded start "in the future" (the wall clock went back since)
		// counts as a start now.
		ran := max(wallNow.Sub(*j.StartedAt), 0)
		return monoNow.Add(limit - ran), true
	}
	return monoNow.Add(limit), true
}

// trackDeadline records the deadline of attempt proc of j, if it has a
// limit. The caller holds m.mu.
func (m *Manager) trackDeadline(j *api.Job, proc Process, reattached bool) {
	now := time.Now()
	at, ok := attemptDeadline(j, reattached, now, m.cfg.Now())
	if !ok {
		return
	}
	m.deadlines[j.ID] = runtimeDeadline{at: at, limit: time.Duration(j.Spec.MaxRuntime), proc: proc, pastAtAttach: reattached && !now.Before(at)}
}

// exceededReason is why a job stopped at its limit ended failed.
func exceededReason(limit time.Duration) string {
	return "exceeded max_runtime " + limit.String()
}

// stopOverdue stops every running attempt past its limit that is not
// being stopped already (cancelled, preempted, evicted, moved or stopped
// over its GPU memory cap: its end is recorded as that; one whose stop is
// for a move or a preemption starts again with a new deadline).
func (m *Manager) stopOverdue() {
	now := time.Now()
	type due struct {
		j     *api.Job
		proc  Process
		limit time.Duration
	}
	var stop []due
	m.mu.Lock()
	q := &m.queue
	for id, d := range m.deadlines {
		if now.Before(d.at) {
			continue
		}
		j := m.jobs[id]
		if j == nil || m.procs[id] != d.proc {
			delete(m.deadlines, id) // its attempt is over
			continue
		}
		if j.State != api.StateRunning {
			continue // marked running in a moment
		}
		_, preempted := q.preempting[id]
		if preempted || m.cancels[id] || q.reclaiming[id] != "" || j.MovingFor != "" || m.overCap[id] != "" {
			continue
		}
		delete(m.deadlines, id)
		reason := exceededReason(d.limit)
		m.overtime[id] = reason
		stop = append(stop, due{j, d.proc, d.limit})
	}
	m.mu.Unlock()
	for _, s := range stop {
		why := fmt.Sprintf("%s; stopping: SIGTERM, SIGKILL after %s", exceededReason(s.limit), m.cfg.CancelGrace)
		m.log.Warn("stopping a job at its max_runtime", "job", s.j.ID, "max_runtime", s.limit, "pid", s.proc.PID())
		// The mark is stored before the signal: a daemon restarted while
		// the attempt stops still records its end as failed at its limit
		// (supervise), though m.overtime is gone.
		reason := exceededReason(s.limit)
		_ = m.annotate(s.j, why, func(j *api.Job) {
			j.Reason = why
			j.StoppedOvertime = reason
		})
		_ = s.proc.Signal(syscall.SIGTERM)
		go m.killAfterGrace(s.j.ID, s.proc)
	}
}

// takeOvertime takes the record that j was stopped at its limit: why, or
// "" if it was not; and forgets its deadline. The record is this daemon's
// (m.overtime) or, for an attempt an earlier daemon was stopping when it
// went down, the stored mark (StoppedOvertime). past, when the attempt
// was not stopped, is why it ran past its limit: attempt proc ended (end,
// a monotonic reading) at or after its deadline, before the loop's next
// pass stopped it. A re-attached attempt already past its deadline at
// re-attach has no past: it may have ended in time while no daemon ran.
func (m *Manager) takeOvertime(j *api.Job, proc Process, end time.Time) (why, past string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	why = cmp.Or(m.overtime[j.ID], j.StoppedOvertime)
	if d, ok := m.deadlines[j.ID]; ok && why == "" && d.proc == proc && !d.pastAtAttach && !end.Before(d.at) {
		past = exceededReason(d.limit)
	}
	delete(m.overtime, j.ID)
	delete(m.deadlines, j.ID)
	return why, past
}

// overtimeStopping reports whether id is being stopped at its limit. The
// caller holds m.mu.
func (m *Manager) overtimeStopping(id string) bool { return m.overtime[id] != "" }
