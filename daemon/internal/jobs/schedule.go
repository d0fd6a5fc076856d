package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// gangKey scopes gang names to their owner, so users cannot join each
// other's gangs.
func gangKey(j *api.Job) string {
	return strconv.FormatUint(uint64(j.Owner.UID), 10) + "/" + j.Spec.Gang.Name
}

// setWaiting updates the (unpersisted) reason of queued jobs.
func (m *Manager) setWaiting(group []*api.Job, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, j := range group {
		if j.State == api.StatePending {
			j.Reason = reason
		}
	}
}

// launch starts one placed job and waits for it.
func (m *Manager) launch(j *api.Job) {
	defer m.wg.Done()
	m.mu.Lock()
	attempt := j.Attempt + 1
	snap := cloneJob(j)
	m.mu.Unlock()

	if err := m.transition(j, api.StateStarting, fmt.Sprintf("starting attempt %d", attempt), func(j *api.Job) {
		j.Attempt = attempt
	}); err != nil {
		m.release(j)
		return
	}
	m.mu.Lock()
	cancelled := m.cancels[j.ID]
	m.mu.Unlock()
	if cancelled {
		m.mu.Lock()
		delete(m.cancels, j.ID)
		m.mu.Unlock()
		m.releaseAfter(j, func() error {
			return m.transition(j, api.StateCancelled, "cancelled before it started", func(j *api.Job) {
				t := m.now()
				j.FinishedAt = &t
			})
		})
		return
	}
	var grant devices.Grant
	if prep := m.cfg.Preparer; prep != nil {
		g, err := prep.Prepare(context.Background(), &snap)
		if err != nil {
			m.forgetCancel(j.ID)
			m.releaseAfter(j, func() error {
				return m.transition(j, api.StateFailed, "could not prepare its devices: "+err.Error(), func(j *api.Job) {
					t := m.now()
					j.FinishedAt = &t
				})
			})
			return
		}
		grant = g
		if snap.Allocation != nil {
			// Preparing may have named a device it created (a MIG
			// instance); the running transition persists it.
			a := cloneAllocation(snap.Allocation)
			m.mu.Lock()
			j.Allocation = a
			m.mu.Unlock()
		}
	}
	if m.isStopping() {
		// The daemon is going down: do not start a process nobody will
		// follow; the next daemon places the job again.
		m.forgetCancel(j.ID)
		m.releaseAfter(j, func() error {
			return m.transition(j, api.StatePending, "not started: fusiond is shutting down", func(j *api.Job) {
				j.Allocation = nil
			})
		})
		return
	}
	req, err := m.runRequest(&snap, attempt)
	req.Devices, req.DeviceEnv = grant.Nodes, grant.Env
	var proc Process
	if err == nil {
		proc, err = m.runner.Start(context.Background(), req)
	}
	if err != nil {
		m.forgetCancel(j.ID)
		m.releaseAfter(j, func() error {
			return m.transition(j, api.StateFailed, "could not start: "+err.Error(), func(j *api.Job) {
				t := m.now()
				j.FinishedAt = &t
			})
		})
		return
	}
	m.supervise(j, proc, attempt)
	m.poke()
}

// forgetCancel drops a pending cancel request of a job that will not run.
func (m *Manager) forgetCancel(id string) {
	m.mu.Lock()
	delete(m.cancels, id)
	m.mu.Unlock()
}

// releaseAfter records a placed job's move with record, then gives back
// what it held (as it was before the move, which may drop its allocation):
// no record shows its devices under it and another job at once, and a job
// moved back to the queue is not placed again before that.
func (m *Manager) releaseAfter(j *api.Job, record func() error) {
	m.mu.Lock()
	held := cloneJob(j)
	m.releasing[j.ID] = true
	m.mu.Unlock()
	if err := record(); err != nil {
		m.log.Warn("recording a job that gives back its placement", "job", j.ID, "err", err)
	}
	m.release(&held)
	m.mu.Lock()
	delete(m.releasing, j.ID)
	m.mu.Unlock()
	m.poke()
}

// release gives back a job's placement and whatever preparing its devices
// took.
func (m *Manager) release(j *api.Job) {
	m.placer.Release(j)
	if prep := m.cfg.Preparer; prep != nil {
		prep.Release(j)
	}
}

// supervise records a started (or re-attached) attempt as running, waits
// for it to end and records how it ended.
func (m *Manager) supervise(j *api.Job, proc Process, attempt int) {
	// Read before the deadline is set, so the recorded start is never
	// after the moment the limit counts from.
	started := m.now()
	m.mu.Lock()
	m.procs[j.ID] = proc
	cancelled := m.cancels[j.ID]
	state := j.State
	// Marked as stopped at its limit (a re-attached job the last daemon
	// was stopping at its max_runtime): stopped again, with no new
	// deadline, and recorded failed at its limit when it ends (finish).
	overdue := j.StoppedOvertime != ""
	if overdue {
		m.overtime[j.ID] = j.StoppedOvertime
	} else {
		// A re-attached running attempt keeps the deadline of its
		// recorded start (runtime.go).
		m.trackDeadline(j, proc, state == api.StateRunning)
	}
	// Marked for a move (a re-attached job the last daemon was moving):
	// stopped again, and queued again when it ends (finish).
	moving := j.MovingFor != ""
	m.mu.Unlock()
	if cancelled || moving || overdue {
		_ = proc.Signal(syscall.SIGTERM)
		go m.killAfterGrace(j.ID, proc)
	}
	markRunning := func() error {
		return m.transitionFrom(j, api.StateStarting, api.StateRunning, fmt.Sprintf("running as pid %d, uid %d", proc.PID(), j.Owner.UID), func(j *api.Job) {
			j.PID = proc.PID()
			j.StartedAt = &started
		})
	}
	if state != api.StateRunning {
		_ = markRunning() // if the store cannot take it, recorded with the job's end
	}

	exit, detached, werr := m.wait(proc)
	endedAt := time.Now() // monotonic, against its deadline
	if detached {
		return // the next daemon re-attaches
	}
	var usage *api.Usage
	if ur, ok := proc.(UsageReporter); ok && werr == nil {
		if u, err := ur.Usage(); err == nil {
			usage = &u
		}
	}
	releasable := true
	if werr != nil {
		// The monitor died without a result (kill -9, the OOM killer):
		// its job may still be running in its cgroup. It is killed and
		// its cgroup removed before its CPUs, memory and devices go to
		// anyone else.
		var ok bool
		ok, werr = m.reapOrphan(j, proc, werr)
		releasable = ok
	}
	m.mu.Lock()
	delete(m.procs, j.ID)
	cancelled = m.cancels[j.ID]
	delete(m.cancels, j.ID)
	// What the attempt holds is given back after its end is recorded
	// (below), so no record shows a device under this job and another at
	// once; a job queued again waits for it (releasing).
	held := cloneJob(j)
	if releasable {
		m.releasing[j.ID] = true
	}
	m.mu.Unlock()
	giveBack := func() {
		if !releasable {
			return
		}
		m.release(&held)
		m.mu.Lock()
		delete(m.unreserved, j.ID)
		delete(m.releasing, j.ID)
		m.mu.Unlock()
		m.poke()
	}
	preemptedBy := m.preemptedBy(j.ID)
	overCap := m.takeOverCap(j.ID)
	overtime, past := m.takeOvertime(j, proc, endedAt)
	m.mu.Lock()
	moved := j.MovingFor != ""
	m.mu.Unlock()
	// Ended on its own at or after its deadline, before the loop stopped
	// it: it exceeded its limit all the same, unless it was being stopped
	// for something else.
	ranPast := overtime == "" && past != "" && !cancelled && preemptedBy == "" && overCap == "" && !moved
	if ranPast {
		overtime = past
	}
	// The end is recorded now or, if the store cannot take it (a full
	// state filesystem), by the loop once it can: the monitor's result is
	// not turned into a lost job for want of disk space.
	record := func() error {
		m.mu.Lock()
		st := j.State
		m.mu.Unlock()
		if st == api.StateStarting {
			if err := markRunning(); err != nil {
				return err
			}
		}
		return m.finish(j, exit, usage, werr, stopCause{cancelled: cancelled, preemptedBy: preemptedBy, overCap: overCap, overtime: overtime, ranPast: ranPast}, attempt)
	}
	if err := record(); errors.Is(err, errStore) {
		// Its placement is kept until its end is stored: until then its
		// record says it runs, and what it held goes to nobody else.
		m.log.Warn("job ended but its end could not be stored; retrying, its placement kept meanwhile", "job", j.ID, "err", err)
		m.mu.Lock()
		m.unrecorded[j.ID] = func() error {
			err := record()
			if !errors.Is(err, errStore) {
				giveBack()
			}
			return err
		}
		m.mu.Unlock()
		return
	}
	giveBack()
}

// reapOrphan kills what is left of a job whose monitor is gone without a
// result and says so in the error the job is recorded lost with. It
// reports false when the leftovers could not be removed: the job's
// reservation is then kept, so nothing else is placed on what its
// processes may still use.
func (m *Manager) reapOrphan(j *api.Job, proc Process, werr error) (bool, error) {
	var n int
	var err error
	for try := 0; try < 3; try++ {
		if n, err = m.runner.Reap(j.ID, proc.PID()); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		m.log.Error("job's monitor died and its processes could not be killed; keeping its reservation", "job", j.ID, "err", err)
		return false, fmt.Errorf("%w; killing its processes failed, so its resources stay reserved: %v", werr, err)
	}
	m.log.Warn("job's monitor died; killed the job's processes and removed its cgroup", "job", j.ID, "killed", n)
	return true, fmt.Errorf("%w; monitor died: %d processes of the job killed and its cgroup removed", werr, n)
}

// wait waits for proc to end, or, when the manager leaves jobs running on
// shutdown, until the manager stops (detached).
func (m *Manager) wait(proc Process) (api.ExitStatus, bool, error) {
	if !m.cfg.LeaveJobsRunning {
		e, err := proc.Wait()
		return e, false, err
	}
	type result struct {
		e   api.ExitStatus
		err error
	}
	ch := make(chan result, 1)
	go func() {
		e, err := proc.Wait()
		ch <- result{e, err}
	}()
	select {
	case r := <-ch:
		return r.e, false, r.err
	case <-m.stopping:
		return api.ExitStatus{}, true, nil
	}
}

// stopCause is why the daemon stopped an attempt, if it did.
type stopCause struct {
	// cancelled: a user cancelled the job.
	cancelled bool
	// preemptedBy is the job it was preempted for (or reclaimEviction).
	preemptedBy string
	// overCap is why it was stopped for its GPU memory (StopOverGPUCap).
	overCap string
	// overtime is why it was stopped at its max_runtime (runtime.go);
	// with ranPast, why it ended on its own past it, before it was
	// stopped.
	overtime string
	ranPast  bool
}

// finish records how an attempt ended. stop.overCap, when not empty, is
// why the daemon stopped it for its GPU memory (StopOverGPUCap): the
// attempt failed, however it exited, and its restart policy applies as to
// an OOM kill. stop.overtime, when not empty, is why it was stopped at its
// max_runtime (or, with stop.ranPast, why it ended on its own past it):
// the job failed, however it exited, and is not restarted; it wins over a
// cancel that came while it was being stopped.
func (m *Manager) finish(j *api.Job, exit api.ExitStatus, usage *api.Usage, werr error, stop stopCause, attempt int) error {
	cancelled, preemptedBy, overCap := stop.cancelled, stop.preemptedBy, stop.overCap
	// ended is the record as a run that ended on its own left it, for
	// Config.RunEnded (captured under the lock, in the transition).
	var ended api.Job
	var started, endedAt time.Time
	capture := func(mutate func(*api.Job)) func(*api.Job) {
		return func(j *api.Job) {
			if j.StartedAt != nil {
				started = *j.StartedAt
			}
			mutate(j)
			ended = cloneJob(j)
			endedAt = m.now()
		}
	}
	runEnded := func(err error, failed bool) error {
		if err == nil && m.cfg.RunEnded != nil && ended.Handover == nil && !started.IsZero() {
			m.cfg.RunEnded(ended, started, endedAt, failed)
		}
		return err
	}
	// Every end clears a move's mark: a job ended otherwise (cancelled,
	// lost, over its limit) is no longer being moved.
	record := func(j *api.Job) {
		e := exit
		j.Exit = &e
		j.Usage = usage
		t := m.now()
		j.FinishedAt = &t
		j.MovingFor = ""
		j.StoppedOvertime = ""
	}
	desc := describeExit(exit)
	m.mu.Lock()
	movingFor := j.MovingFor
	m.mu.Unlock()
	if overCap != "" && werr == nil && !cancelled && preemptedBy == "" && movingFor == "" {
		desc = fmt.Sprintf("stopped: %s (%s)", overCap, desc)
	}
	switch {
	case werr != nil:
		return m.transition(j, api.StateLost, "lost track of the process: "+werr.Error(), record)
	case stop.overtime != "":
		// Stopped at its limit: failed, never retried (a retry would run
		// into the same limit).
		how := "stopped"
		if stop.ranPast {
			how = "ended past it"
		}
		return runEnded(m.transition(j, api.StateFailed, fmt.Sprintf("%s: %s (%s); not restarted", stop.overtime, how, desc), capture(record)), true)
	case cancelled:
		return m.transition(j, api.StateCancelled, "cancelled; "+desc, record)
	case movingFor != "":
		// Told to stop for a move: queued again however it exited.
		return m.finishMoved(j, movingFor, desc, record)
	case preemptedBy != "":
		// Told to stop for a preemption: preempted however it exited.
		return m.finishPreempted(j, preemptedBy, desc, record)
	case exit.Code == 0 && exit.Signal == "" && !exit.OOMKilled && overCap == "":
		return runEnded(m.transition(j, api.StateSucceeded, desc, capture(record)), false)
	case j.Spec.Restart != nil && j.Spec.Restart.Policy == api.RestartOnFailure && attempt-j.Preemptions-j.Moves <= j.Spec.Restart.MaxRetries:
		// Starts after a preemption or a move are not retries.
		return runEnded(m.transition(j, api.StatePending, fmt.Sprintf("%s; restarting (retry %d of %d)", desc, attempt-j.Preemptions-j.Moves, j.Spec.Restart.MaxRetries), capture(func(j *api.Job) {
			e := exit
			j.Exit = &e
			j.Usage = usage
			j.Allocation = nil
			j.PID = 0
			j.MovingFor = ""
			j.StoppedOvertime = ""
		})), true)
	default:
		return runEnded(m.transition(j, api.StateFailed, desc, capture(record)), true)
	}
}

func describeExit(e api.ExitStatus) string {
	switch {
	case e.OOMKilled:
		return "oom-killed: the job exceeded its memory limit"
	case e.Signal != "":
		return "killed by signal " + e.Signal
	default:
		return "exit code " + strconv.Itoa(e.Code)
	}
}

// runRequest builds the runner's view of a job: its environment, working
// directory and identity.
func (m *Manager) runRequest(j *api.Job, attempt int) (RunRequest, error) {
	home := "/"
	name := j.Owner.User
	if u, err := user.LookupId(strconv.FormatUint(uint64(j.Owner.UID), 10)); err == nil {
		home = u.HomeDir
		name = u.Username
	}
	workdir := j.Spec.Workdir
	if workdir == "" && j.Spec.Rootfs != "" {
		workdir = "/" // inside the container
	}
	if workdir == "" {
		workdir = home
		if st, err := os.Stat(home); err != nil || !st.IsDir() {
			workdir = "/"
		}
	}
	env := map[string]string{
		"PATH":                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":                home,
		"USER":                name,
		"LOGNAME":             name,
		"FUSIOND_JOB_ID":      j.ID,
		"FUSIOND_JOB_NAME":    j.Spec.Name,
		"FUSIOND_JOB_ATTEMPT": strconv.Itoa(attempt),
		"FUSIOND_TIER":        string(j.Tier),
	}
	if a := j.Allocation; a != nil {
		env["FUSIOND_CPU_MILLIS"] = strconv.FormatInt(int64(a.CPU), 10)
		env["FUSIOND_MEMORY_BYTES"] = strconv.FormatInt(int64(a.Memory), 10)
	}
	for k, v := range j.Spec.Env {
		env[k] = v
	}
	envList := make([]string, 0, len(env))
	for _, k := range sortedKeys(env) {
		envList = append(envList, k+"="+env[k])
	}
	logPath := m.logPath(j.ID)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o750); err != nil {
		return RunRequest{}, fmt.Errorf("log directory: %w", err)
	}
	var alloc api.Allocation
	if j.Allocation != nil {
		alloc = *j.Allocation
	}
	return RunRequest{
		JobID: j.ID, Attempt: attempt, Command: j.Spec.Command, Env: envList,
		Workdir: workdir, UID: j.Owner.UID, GID: j.Owner.GID, Groups: j.Owner.Groups,
		LogPath: logPath, Tier: j.Tier, Allocation: alloc, Rootfs: j.Spec.Rootfs,
	}, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
