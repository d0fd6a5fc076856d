package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// Config tunes the manager.
type Config struct {
	// LogDir holds one directory of logs per job.
	LogDir string
	// DefaultTiers maps a class to its tier when the spec names none.
	DefaultTiers map[api.Class]api.Tier
	// CancelGrace is how long a cancelled job has between SIGTERM and
	// SIGKILL.
	CancelGrace time.Duration
	// MaxFinished and MaxAge bound how many finished jobs are kept.
	MaxFinished int
	MaxAge      time.Duration
	// DaemonUID is the uid fusiond runs as; only root can run jobs as
	// other users.
	DaemonUID uint32
	// LeaveJobsRunning makes Stop leave running jobs to their monitors
	// (for the next daemon to re-attach) instead of terminating them.
	LeaveJobsRunning bool
	// Preparer readies allocated devices before a job starts (optional).
	Preparer Preparer
	// Now is the wall clock the records' timestamps come from (time.Now
	// when nil). Retention by age, grace periods, probes and max_runtime
	// deadlines measure elapsed time on the monotonic clock, so a wall
	// clock set forward or back (NTP step, operator) neither deletes a
	// job that just finished nor keeps one forever, nor moves a deadline.
	// The wall clock enters two decisions through recorded starts
	// (StartedAt): a re-attached attempt's max_runtime, what is left of
	// it read once, at re-attach (runtime.go); and, on every pass of the
	// queue with an Estimator, a running job's expected end (its recorded
	// start plus its estimate) for the head's shadow time and backfill
	// (queue.go), which a step of the wall clock moves by the step.
	Now func() time.Time
	// Limits bound each user's jobs, specs and logs (zero: no limit).
	Limits Limits
	// LogScanInterval is how often the jobs' logs are measured against
	// Limits.LogBytes and Limits.LogBudget (10s when zero).
	LogScanInterval time.Duration
	// Observer is told of submissions, transitions and placement
	// decisions (optional).
	Observer Observer
	// Queue tunes the queue's aging, gangs and preemption.
	Queue QueueConfig
	// Audit records every admission, from every source (optional).
	Audit Auditor
	// RunEnded, when set, is told of every attempt that ran to its own
	// end — succeeded, or failed (restarted on failure or not; stopped at
	// its max_runtime counts as failed) — with the
	// record as that end stored it, the attempt's start and end; not of
	// attempts cancelled, preempted or lost (they did not end on their
	// own), nor of jobs handed over to peers. Called without the
	// manager's lock held; it must not block.
	RunEnded func(j api.Job, started, ended time.Time, failed bool)
	// Estimator, when set with a placer that is a Shadower, gives the
	// queue's EASY backfill run times: a job behind the head may also take
	// what the head waits for when it is expected to end before the head
	// could start (queue.go).
	Estimator RuntimeEstimator
}

// Manager owns every job record in memory (mirroring the store) and drives
// jobs through their lifecycle.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	store  *store.Store
	runner Runner
	placer Placer
	events *broker

	mu       sync.Mutex
	jobs     map[string]*api.Job
	procs    map[string]Process
	cancels  map[string]bool
	cordoned bool
	storeErr error
	// probedAt is when Ready last re-probed a failed store.
	probedAt time.Time
	// unrecorded holds, per job, how a job attempt ended that could not be
	// stored (a full or read-only state filesystem): retried until the
	// store takes it.
	unrecorded map[string]func() error
	// unreserved names re-attached jobs whose allocation could not be
	// reserved again (their devices not found, or taken): nothing is
	// placed while one runs, since it may use what a new job would get.
	unreserved map[string]string
	// reserved are batches being admitted (counted against the limits
	// until stored); specBytes caches each job's spec size; logByUser and
	// logTotal are the last log measurement.
	reserved  map[*reservation]struct{}
	specBytes map[string]int64
	logByUser map[uint32]int64
	logTotal  int64
	// byOrigin indexes the jobs peers handed over by hand-over key;
	// holds are the gang members waiting for the queue's verdict, with
	// their holds (admit.go).
	byOrigin map[string]string
	holds    map[string]time.Duration
	// releasing are jobs whose end (or return to the queue) is being
	// recorded before what they held is given back: the queue leaves
	// them alone until it is.
	releasing map[string]bool
	// running is how many jobs the last Running found (its next
	// slice's capacity).
	running int
	// finished holds, per finished job, a monotonic reading of when it
	// finished: retention by age measures from it, never from the
	// recorded (wall-clock) FinishedAt.
	finished map[string]time.Time

	// overCap names the jobs told to stop for holding more GPU memory
	// than their share's cap, with why (overcap.go).
	overCap map[string]string
	// deadlines are the running attempts' run-time limits; overtime
	// names the jobs told to stop at theirs, with why (runtime.go).
	deadlines map[string]runtimeDeadline
	overtime  map[string]string

	// queue is the queue's and preemption's memory (queue.go).
	queue queueState
	// ho hands jobs that do not fit to peers and holds peers' gang
	// members (nil: no peers); peerPolicy is what admission applies to
	// peers' jobs (handover.go).
	ho         Handover
	peerPolicy PeerPolicy

	kick chan struct{}
	// settles are peers' jobs waiting for the next pass's verdict.
	settles chan settle
	// gcKick asks the loop to collect garbage now (the spec budget is
	// passed).
	gcKick   chan struct{}
	wg       sync.WaitGroup
	stopping chan struct{}
}

// New builds a manager. Call Recover before Start.
func New(cfg Config, st *store.Store, runner Runner, placer Placer, log *slog.Logger) *Manager {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.CancelGrace <= 0 {
		cfg.CancelGrace = 10 * time.Second
	}
	if cfg.LogScanInterval <= 0 {
		cfg.LogScanInterval = 10 * time.Second
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	return &Manager{
		cfg: cfg, log: log, store: st, runner: runner, placer: placer,
		events:     newBroker(),
		jobs:       map[string]*api.Job{},
		procs:      map[string]Process{},
		cancels:    map[string]bool{},
		unrecorded: map[string]func() error{},
		unreserved: map[string]string{},
		kick:       make(chan struct{}, 1),
		settles:    make(chan settle, 64),
		byOrigin:   map[string]string{},
		holds:      map[string]time.Duration{},
		releasing:  map[string]bool{},
		gcKick:     make(chan struct{}, 1),
		stopping:   make(chan struct{}),
		reserved:   map[*reservation]struct{}{},
		specBytes:  map[string]int64{},
		logByUser:  map[uint32]int64{},
		finished:   map[string]time.Time{},
		deadlines:  map[string]runtimeDeadline{},
		overtime:   map[string]string{},
	}
}

func (m *Manager) now() time.Time { return m.cfg.Now().UTC() }

// Recover loads every job from the store and settles the ones the last
// daemon left unfinished: pending jobs stay queued, placed jobs go back to
// the queue, and jobs that were starting or running are re-attached to
// their monitors (or their recorded results are collected). Only a job
// whose monitor is gone without a result is lost (its leftover processes
// are killed).
func (m *Manager) Recover() error {
	var unfinished []*api.Job
	// A job finished before this daemon started is as old as the wall
	// clock says now (the only reading there is), and ages on the
	// monotonic clock from here on; one "finished in the future" (the
	// clock went back since) counts as just finished.
	loadedMono, loadedWall := time.Now(), m.cfg.Now()
	err := m.store.Jobs(func(j api.Job) error {
		m.jobs[j.ID] = &j
		if j.Origin != nil {
			m.byOrigin[j.Origin.Key] = j.ID
		}
		if j.State.Terminal() {
			var age time.Duration
			if j.FinishedAt != nil {
				age = max(loadedWall.Sub(*j.FinishedAt), 0)
			}
			m.finished[j.ID] = loadedMono.Add(-age)
		}
		if !j.State.Terminal() {
			unfinished = append(unfinished, &j)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load jobs: %w", err)
	}
	cordon, err := m.store.Meta("cordoned")
	if err != nil {
		return fmt.Errorf("load node state: %w", err)
	}
	m.cordoned = cordon == "true"
	attached := 0
	for _, j := range unfinished {
		if j.Spec.Pod != nil {
			if err := m.recoverPod(j); err != nil {
				return err
			}
			continue
		}
		if j.Handover != nil {
			if err := m.resumeHandover(j); err != nil {
				return err
			}
			continue
		}
		switch j.State {
		case api.StatePending:
			if j.Origin != nil {
				// A peer's job is placed at once or refused, never
				// queued here: one left pending (the daemon stopped
				// before its verdict, or before it started) is
				// forgotten, and its origin places it again. A gang
				// member among them never starts without its gang.
				m.forgetUnstarted(j.ID, api.StatePending, "fusiond restarted before it started")
			}
		case api.StatePlaced:
			if j.Origin != nil && j.Spec.Gang == nil {
				m.forgetUnstarted(j.ID, api.StatePlaced, "fusiond restarted before it started")
				continue
			}
			if j.Origin != nil && j.Spec.Gang != nil {
				// A gang member a peer reserved here (held or committed,
				// never started): its hold or barrier did not survive the
				// restart, so it is released rather than queued to run
				// without its gang.
				if err := m.transition(j, api.StateCancelled, "fusiond restarted while the member was held for its gang: released, never started", func(j *api.Job) {
					t := m.now()
					j.FinishedAt = &t
					j.Allocation = nil
				}); err != nil {
					return err
				}
				continue
			}
			if err := m.transition(j, api.StatePending, "placement dropped: fusiond restarted before the job started", func(j *api.Job) {
				j.Allocation = nil
			}); err != nil {
				return err
			}
		case api.StateStarting, api.StateRunning:
			proc, err := m.runner.Attach(j.ID, j.Attempt)
			if err == nil {
				m.reattach(j, proc)
				attached++
				continue
			}
			if j.State == api.StateStarting && errors.Is(err, ErrNeverStarted) {
				if err := m.requeueNeverStarted(j); err != nil {
					return err
				}
				continue
			}
			if err := m.markLost(j, err); err != nil {
				return err
			}
		}
	}
	m.log.Info("recovered jobs", "total", len(m.jobs), "unfinished", len(unfinished), "reattached", attached, "cordoned", m.cordoned)
	return nil
}

// reattach resumes supervising a job attempt an earlier daemon started.
func (m *Manager) reattach(j *api.Job, proc Process) {
	if j.Allocation != nil {
		if problem := m.reserveAgain(j); problem != nil {
			m.log.Error("re-attached job holds resources that could not be reserved again; placing nothing until it ends", "job", j.ID, "err", problem)
			m.unreserved[j.ID] = problem.Error()
		}
	}
	m.log.Info("re-attached to job", "job", j.ID, "attempt", j.Attempt, "pid", proc.PID())
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.supervise(j, proc, j.Attempt)
		m.poke()
	}()
}

// reserveAgain reserves what a job an earlier daemon left still holds:
// its allocation in the placer, its devices with the drivers (a GPU
// share). It says why it could not.
func (m *Manager) reserveAgain(j *api.Job) error {
	rc, ok := m.placer.(Reclaimer)
	if !ok {
		return errors.New("the placer cannot re-reserve allocations")
	}
	if err := rc.Reclaim(j); err != nil {
		return fmt.Errorf("re-reserving its allocation: %w", err)
	}
	if rc, ok := m.cfg.Preparer.(Reclaimer); ok {
		if err := rc.Reclaim(j); err != nil {
			return fmt.Errorf("re-admitting its devices: %w", err)
		}
	}
	return nil
}

// requeueNeverStarted queues again a job that was starting when the last
// daemon stopped but whose monitor never started it. Its devices may have
// been prepared (a MIG instance created): that is undone, and anything a
// monitor may have left is reaped, before the job waits for a new
// placement.
func (m *Manager) requeueNeverStarted(j *api.Job) error {
	reason := fmt.Sprintf("placement dropped: fusiond restarted before attempt %d started", j.Attempt)
	if n, err := m.runner.Reap(j.ID, j.PID); err != nil {
		reason += fmt.Sprintf(" (cleaning up failed: %v)", err)
	} else if n > 0 {
		reason += fmt.Sprintf(" (%d leftover processes killed)", n)
	}
	if prep := m.cfg.Preparer; prep != nil && j.Allocation != nil {
		prep.Release(j)
	}
	return m.transition(j, api.StatePending, reason, func(j *api.Job) {
		j.Allocation = nil
		j.PID = 0
		j.Attempt-- // the attempt that never ran does not count as a retry
	})
}

// markLost records a job whose process did not survive the restart.
func (m *Manager) markLost(j *api.Job, attachErr error) error {
	reason := fmt.Sprintf("fusiond restarted while the job was %s; its process did not survive", j.State)
	if !errors.Is(attachErr, ErrGone) {
		reason += fmt.Sprintf(" (re-attaching failed: %v)", attachErr)
	}
	// Reap even without a recorded pid: a monitor may have started the
	// job after the last record.
	n, err := m.runner.Reap(j.ID, j.PID)
	switch {
	case err != nil:
		reason += fmt.Sprintf(" (cleaning up leftovers failed: %v)", err)
	case n > 0:
		reason += fmt.Sprintf(" (%d leftover processes killed)", n)
	}
	return m.transition(j, api.StateLost, reason, func(j *api.Job) {
		t := m.now()
		j.FinishedAt = &t
		j.StoppedOvertime = "" // it has stopped
	})
}

// SetCPUQuota changes a running job's CPU quota in millicores (0 removes
// it), when the runner supports it. The QoS loop moves best-effort jobs
// with it.
func (m *Manager) SetCPUQuota(id string, milli int64) error {
	qs, ok := m.runner.(QuotaSetter)
	if !ok {
		return api.Errorf(api.CodeUnavailable, "this runner cannot change CPU quotas")
	}
	m.mu.Lock()
	j, found := m.jobs[id]
	running := found && j.State == api.StateRunning
	m.mu.Unlock()
	if !running {
		return api.Errorf(api.CodeConflict, "job %s is not running", id)
	}
	return qs.SetCPUQuota(id, milli)
}

// Start runs the scheduling and housekeeping loops until Stop.
func (m *Manager) Start() {
	m.wg.Add(1)
	go m.loop()
	m.poke()
}

// Stop stops scheduling, terminates running jobs (SIGTERM, then SIGKILL
// after the grace period, all at once), records them and waits.
func (m *Manager) Stop(ctx context.Context) {
	close(m.stopping)
	if m.cfg.LeaveJobsRunning {
		m.log.Info("leaving running jobs to their monitors")
		done := make(chan struct{})
		go func() { m.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
		}
		m.events.closeAll()
		return
	}
	m.mu.Lock()
	procs := make(map[string]Process, len(m.procs))
	for id, p := range m.procs {
		procs[id] = p
	}
	m.mu.Unlock()
	m.cancelHandedOverOnStop()
	for id, p := range procs {
		m.log.Info("stopping job for shutdown", "job", id, "pid", p.PID())
		_ = p.Signal(syscall.SIGTERM)
	}
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	timer := time.NewTimer(m.cfg.CancelGrace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		for _, p := range procs {
			_ = p.Signal(syscall.SIGKILL)
		}
		select {
		case <-done:
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
	m.events.closeAll()
}

func (m *Manager) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// kickGC has the loop collect garbage at once.
func (m *Manager) kickGC() {
	select {
	case m.gcKick <- struct{}{}:
	default:
	}
}

func (m *Manager) loop() {
	defer m.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	gc := time.NewTicker(time.Minute)
	defer gc.Stop()
	logs := time.NewTicker(m.cfg.LogScanInterval)
	defer logs.Stop()
	m.collectGarbage()
	m.accountLogs()
	for {
		select {
		case <-m.stopping:
			m.refuseSettles()
			return
		case <-m.kick:
		case <-tick.C:
		case s := <-m.settles:
			// A peer's job: placed by this pass or refused, with every
			// other one waiting.
			batch := []settle{s}
			for len(batch) < cap(m.settles) {
				select {
				case s := <-m.settles:
					batch = append(batch, s)
					continue
				default:
				}
				break
			}
			m.retryUnrecorded()
			m.schedule()
			m.settleAll(batch)
			continue
		case <-gc.C:
			m.collectGarbage()
			continue
		case <-m.gcKick:
			m.collectGarbage()
			continue
		case <-logs.C:
			m.accountLogs()
			continue
		}
		m.retryUnrecorded()
		m.schedule()
		m.stopOverdue()
	}
}

// ErrShuttingDown is returned for requests that arrive during shutdown.
var ErrShuttingDown = &api.Error{Code: api.CodeUnavailable, Message: "fusiond is shutting down"}

func (m *Manager) isStopping() bool {
	select {
	case <-m.stopping:
		return true
	default:
		return false
	}
}

func (m *Manager) publish(j *api.Job, ev api.Event) {
	ev.JobID, ev.Kind = j.ID, api.EventJob
	m.events.publish(ev)
}

// PublishDevice sends a device health event to every subscriber of the
// whole stream (any user: device health says why jobs wait) and retries
// placement, since a device may have come back.
func (m *Manager) PublishDevice(ev api.Event) {
	ev.Kind, ev.JobID, ev.From, ev.To = api.EventDevice, "", "", ""
	m.events.publish(ev)
	if ev.Device != "" && ev.Healthy != nil {
		m.noteDeviceHealth(ev.Device, *ev.Healthy, ev.Reason)
	}
	m.poke()
}

// noteDeviceHealth records a device's health transition on every placed,
// starting or running job whose allocation holds it. The policy for a
// device lost under a job (docs/reliability.md): the job is not stopped —
// its processes see the failure and decide (a CUDA program usually exits
// with an error, and then its restart policy applies, placing it on
// healthy devices) — and it keeps its reservation, so nothing else is
// placed on the device while the job holds it, even once the device is
// back in service. The job is marked degraded (Job.Degraded) with an event
// in its history and stream that keeps its state (from = to).
func (m *Manager) noteDeviceHealth(device string, healthy bool, why string) {
	m.mu.Lock()
	var hit []*api.Job
	for _, j := range m.jobs {
		if active(j.State) && slices.Contains(allocationDevices(j.Allocation), device) &&
			slices.Contains(j.Degraded, device) == healthy {
			hit = append(hit, j)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(hit, func(a, b *api.Job) int { return cmp.Compare(idNum(a.ID), idNum(b.ID)) })
	for _, j := range hit {
		reason := fmt.Sprintf("degraded: device %s out of service (%s); the job keeps it and keeps running", device, why)
		if healthy {
			reason = fmt.Sprintf("device %s back in service (%s)", device, why)
		}
		m.annotate(j, reason, func(j *api.Job) {
			if healthy {
				j.Degraded = slices.DeleteFunc(j.Degraded, func(d string) bool { return d == device })
			} else if !slices.Contains(j.Degraded, device) {
				j.Degraded = append(j.Degraded, device)
			}
		})
	}
}

// annotate records an event on an active job that does not change its
// state, stores and publishes it; a job that has moved on to pending or a
// final state meanwhile is left alone (ErrBadTransition). A store failure
// is logged and returned (the in-memory record is put back).
func (m *Manager) annotate(j *api.Job, reason string, mutate func(*api.Job)) error {
	return m.annotateIf(j, reason, nil, mutate)
}

// annotateIf is annotate that first asks check (nil: nothing), under m.mu,
// whether the event still applies; its error, wrapped, refuses it.
func (m *Manager) annotateIf(j *api.Job, reason string, check func(*api.Job) error, mutate func(*api.Job)) error {
	m.mu.Lock()
	if !active(j.State) {
		state := j.State
		m.mu.Unlock()
		return fmt.Errorf("job %s is %s: %w", j.ID, state, ErrBadTransition)
	}
	if check != nil {
		if err := check(j); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("job %s: %w", j.ID, err)
		}
	}
	before := cloneJob(j)
	ev := api.Event{Time: m.now(), From: j.State, To: j.State, Reason: reason}
	j.Events = append(j.Events, ev)
	mutate(j)
	j.Version++
	snap := cloneJob(j)
	m.mu.Unlock()
	if err := m.store.PutJob(snap); err != nil {
		m.noteStoreError(err)
		m.mu.Lock()
		if j.Version == snap.Version {
			*j = before
		}
		m.mu.Unlock()
		m.log.Warn("could not record an event on a job", "job", j.ID, "reason", reason, "err", err)
		return err
	}
	m.noteStoreOK()
	m.publish(&snap, ev)
	m.log.Warn("job event", "job", j.ID, "state", snap.State, "reason", reason)
	return nil
}

// active is true of the states in which a job holds its allocation.
func active(s api.State) bool {
	return s == api.StatePlaced || s == api.StateStarting || s == api.StateRunning
}

// allocationDevices names the devices a holds: whole GPUs, a shared GPU,
// a MIG instance and its GPU, an FPGA region.
func allocationDevices(a *api.Allocation) []string {
	if a == nil {
		return nil
	}
	out := slices.Clone(a.GPUs)
	if s := a.GPUShare; s != nil {
		out = append(out, s.GPU)
	}
	if mig := a.MIG; mig != nil {
		out = append(out, mig.GPU)
		if mig.Instance != "" {
			out = append(out, mig.Instance)
		}
	}
	if f := a.FPGA; f != nil {
		out = append(out, f.Region)
	}
	return out
}

func (m *Manager) noteStoreError(err error) {
	m.mu.Lock()
	m.storeErr = err
	m.mu.Unlock()
	m.log.Error("state database write failed", "err", err)
}

// noteStoreOK clears a recorded store error once a write succeeded again.
func (m *Manager) noteStoreOK() {
	m.mu.Lock()
	was := m.storeErr
	m.storeErr = nil
	m.mu.Unlock()
	if was != nil {
		m.log.Info("state database writable again", "after", was)
	}
}

// transition moves j to state to (with an optional further change to the
// record), persists it, and publishes the event. The caller must not hold
// m.mu. A forbidden transition is an error and changes nothing.
func (m *Manager) transition(j *api.Job, to api.State, reason string, mutate func(*api.Job)) error {
	return m.transitionFrom(j, "", to, reason, mutate)
}

// transitionFrom is transition that succeeds only while the job is still
// in state from (any state when from is ""), so a decision taken on a state
// read earlier cannot apply to a job that has moved on meanwhile. If the
// store write fails, the in-memory record is put back as it was (unless it
// changed again meanwhile).
func (m *Manager) transitionFrom(j *api.Job, from, to api.State, reason string, mutate func(*api.Job)) error {
	return m.move(j, from, to, reason, mutate, true)
}

// placeUnstored places a peer's job in memory only: its start (launch's
// move to starting) stores the placement with it, so the hand-over's
// answer waits for one durable write, the record stored at admission.
// A crash in between loses nothing acknowledged: the stored record is a
// peer's pending job, which the next daemon forgets as it forgets a
// placed one that never started (Recover), and its origin, polling,
// places it again.
func (m *Manager) placeUnstored(j *api.Job, reason string, mutate func(*api.Job)) error {
	return m.move(j, api.StatePending, api.StatePlaced, reason, mutate, false)
}

// move is transitionFrom, the record stored only when store is set.
func (m *Manager) move(j *api.Job, from, to api.State, reason string, mutate func(*api.Job), store bool) error {
	m.mu.Lock()
	cur := j.State
	if from != "" && cur != from {
		m.mu.Unlock()
		return fmt.Errorf("job %s is %s, no longer %s: %w", j.ID, cur, from, ErrBadTransition)
	}
	if !CanTransition(cur, to) {
		m.mu.Unlock()
		return fmt.Errorf("job %s: %s → %s: %w", j.ID, cur, to, ErrBadTransition)
	}
	before := cloneJob(j)
	ev := api.Event{Time: m.now(), From: cur, To: to, Reason: reason}
	var waited time.Duration
	if n := len(j.Events); cur == api.StatePending && to == api.StatePlaced && n > 0 {
		waited = ev.Time.Sub(j.Events[n-1].Time)
	}
	j.State = to
	j.Reason = reason
	j.Events = append(j.Events, ev)
	if to == api.StatePending {
		j.Degraded = nil // its allocation is given up
	}
	if mutate != nil {
		mutate(j)
	}
	j.Version++
	snap := cloneJob(j)
	if to.Terminal() {
		m.finished[j.ID] = time.Now() // monotonic
	}
	m.mu.Unlock()

	if store {
		if err := m.store.PutJob(snap); err != nil {
			m.noteStoreError(err)
			m.mu.Lock()
			if j.Version == snap.Version {
				*j = before
			}
			m.mu.Unlock()
			return fmt.Errorf("%w: %w", errStore, err)
		}
		m.noteStoreOK()
	}
	m.publish(&snap, ev)
	m.cfg.Observer.Transitioned(cur, to)
	if cur == api.StatePending && to == api.StatePlaced {
		m.cfg.Observer.Waited(snap.Spec.Class, waited)
	}
	m.log.Info("job state", "job", j.ID, "from", cur, "to", to, "reason", reason)
	return nil
}

func cloneJob(j *api.Job) api.Job {
	c := *j
	c.Events = slices.Clone(j.Events)
	c.Degraded = slices.Clone(j.Degraded)
	if j.Allocation != nil {
		c.Allocation = cloneAllocation(j.Allocation)
	}
	if j.Exit != nil {
		e := *j.Exit
		c.Exit = &e
	}
	if j.Usage != nil {
		u := *j.Usage
		c.Usage = &u
	}
	return c
}

// cloneAllocation copies an allocation deeply, so a copy handed out (to the
// preparer, to API callers) never aliases the live record.
func cloneAllocation(in *api.Allocation) *api.Allocation {
	a := *in
	a.Devices = slices.Clone(in.Devices)
	a.GPUs = slices.Clone(in.GPUs)
	a.GPUPCI = maps.Clone(in.GPUPCI)
	if in.GPUShare != nil {
		s := *in.GPUShare
		a.GPUShare = &s
	}
	if in.MIG != nil {
		m := *in.MIG
		a.MIG = &m
	}
	if in.FPGA != nil {
		f := *in.FPGA
		a.FPGA = &f
	}
	return &a
}

// visible reports whether c may see j.
func visible(c api.Caller, j *api.Job) bool { return c.Admin || c.UID == j.Owner.UID }

func (m *Manager) lookup(c api.Caller, id string) (*api.Job, error) {
	j, ok := m.jobs[id]
	if !ok || !visible(c, j) {
		// Someone else's job is reported as absent: its existence is not
		// the caller's business.
		return nil, api.Errorf(api.CodeNotFound, "no job %q", id)
	}
	return j, nil
}

// Get returns one job.
func (m *Manager) Get(_ context.Context, c api.Caller, id string) (api.Job, error) {
	m.mu.Lock()
	j, err := m.lookup(c, id)
	if err != nil {
		m.mu.Unlock()
		return api.Job{}, err
	}
	out := cloneJob(j)
	proc := m.procs[id]
	m.mu.Unlock()
	// A running job's usage is measured now, not stored.
	if ur, ok := proc.(UsageReporter); ok && out.State == api.StateRunning {
		if u, err := ur.Usage(); err == nil {
			out.Usage = &u
		}
	}
	return out, nil
}

// ListPage returns one page of the jobs c may see that match opts, newest
// first, and the token for the next page ("" on the last). A page holds
// opts.Limit jobs (api.DefaultPageSize when 0), at most api.MaxPageSize;
// the token is the last ID returned, so a page resumes where the previous
// one stopped even while jobs are added or forgotten.
//
// A page is one snapshot: its jobs are chosen and copied under one
// acquisition of the lock, so no change lands between two of them (a
// device that changes hands shows under one job of the page, never two).
// Only the running jobs' usage is read after the lock is let go (measured
// now, as Get does). Pages read one after the other are each a snapshot,
// of different moments.
func (m *Manager) ListPage(_ context.Context, c api.Caller, opts api.ListOptions) ([]api.Job, string, error) {
	size := opts.Limit
	if size <= 0 {
		size = api.DefaultPageSize
	}
	size = min(size, api.MaxPageSize)
	var before uint64
	if opts.Continue != "" {
		n, err := strconv.ParseUint(opts.Continue, 10, 64)
		if err != nil || n == 0 {
			return nil, "", &api.Error{Code: api.CodeBadRequest, Field: "continue", Message: "not a token a previous page returned"}
		}
		before = n
	}
	m.mu.Lock()
	hits := make([]listHit, 0, min(len(m.jobs), 4*size))
	for _, j := range m.jobs {
		n := idNum(j.ID)
		if (before == 0 || n < before) && visible(c, j) && matches(j, opts) {
			hits = append(hits, listHit{n, j})
		}
	}
	// The page's jobs are picked before they are sorted: the lock is held
	// for a selection of all the matches and a sort of one page, not a
	// sort of every match.
	more := len(hits) > size
	if more {
		selectNewest(hits, size)
		hits = hits[:size]
	}
	slices.SortFunc(hits, func(a, b listHit) int { return cmp.Compare(b.n, a.n) })
	next := ""
	if more {
		next = strconv.FormatUint(hits[size-1].n, 10)
	}
	out := make([]api.Job, len(hits))
	var measure map[int]UsageReporter
	for i, h := range hits {
		out[i] = cloneJob(h.j)
		if h.j.State != api.StateRunning {
			continue
		}
		if ur, ok := m.procs[h.j.ID].(UsageReporter); ok {
			if measure == nil {
				measure = map[int]UsageReporter{}
			}
			measure[i] = ur
		}
	}
	m.mu.Unlock()
	// A running job's usage is measured now, not stored.
	for i, ur := range measure {
		if u, err := ur.Usage(); err == nil {
			out[i].Usage = &u
		}
	}
	return out, next, nil
}

// listHit is a job that matches a listing, with its ID as a number.
type listHit struct {
	n uint64
	j *api.Job
}

// selectNewest reorders h so that its first k entries are the k with the
// highest IDs, in no particular order (quickselect: linear on average,
// where sorting every match would be n log n). 0 < k < len(h).
func selectNewest(h []listHit, k int) {
	lo, hi := 0, len(h)-1
	for lo < hi {
		// Median of three as the pivot; entries above it go left.
		mid := lo + (hi-lo)/2
		if h[mid].n > h[lo].n {
			h[mid], h[lo] = h[lo], h[mid]
		}
		if h[hi].n > h[lo].n {
			h[hi], h[lo] = h[lo], h[hi]
		}
		if h[mid].n > h[hi].n {
			h[mid], h[hi] = h[hi], h[mid]
		}
		pivot := h[hi].n // the median, now at hi
		i := lo
		for j := lo; j < hi; j++ {
			if h[j].n > pivot {
				h[i], h[j] = h[j], h[i]
				i++
			}
		}
		h[i], h[hi] = h[hi], h[i]
		switch {
		case i == k || i == k-1:
			return
		case i < k:
			lo = i + 1
		default:
			hi = i - 1
		}
	}
}

// RunningJob is what the loops that follow running jobs read of one (QoS,
// reclaim, the elastic resizer, telemetry): no events, no allocation.
// Spec is shared with the record (a spec never changes once admitted):
// read it, never change it.
type RunningJob struct {
	ID        string
	Tier      api.Tier
	Owner     api.Owner
	Spec      api.JobSpec
	StartedAt time.Time
	// GPUs are the whole GPUs it holds and Share its share of one (nil:
	// none), copies of its allocation's.
	GPUs  []string
	Share *api.GPUShare
}

// Running lists the jobs running on this host, oldest first (the QoS
// loop's view of what to protect and what to squeeze); jobs handed over
// to peers run there, and pods' device holds run nothing here. It copies
// only what RunningJob holds, so a poller holds the manager's lock for a
// fraction of what a copy of each record costs.
func (m *Manager) Running() []RunningJob {
	m.mu.Lock()
	out := make([]RunningJob, 0, m.running)
	for _, j := range m.jobs {
		if j.State == api.StateRunning && j.Handover == nil && j.Spec.Pod == nil {
			r := RunningJob{ID: j.ID, Tier: j.Tier, Owner: j.Owner, Spec: j.Spec}
			if j.StartedAt != nil {
				r.StartedAt = *j.StartedAt
			}
			if a := j.Allocation; a != nil {
				r.GPUs = slices.Clone(a.GPUs)
				if a.GPUShare != nil {
					sh := *a.GPUShare
					r.Share = &sh
				}
			}
			out = append(out, r)
		}
	}
	m.running = len(out)
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b RunningJob) int { return cmp.Compare(idNum(a.ID), idNum(b.ID)) })
	return out
}

func idNum(id string) uint64 {
	n, _ := strconv.ParseUint(id, 10, 64)
	return n
}

func matches(j *api.Job, o api.ListOptions) bool {
	if len(o.State) > 0 && !slices.Contains(o.State, j.State) {
		return false
	}
	if o.Class != "" && j.Spec.Class != o.Class {
		return false
	}
	if o.User != "" && o.User != j.Owner.User && o.User != strconv.FormatUint(uint64(j.Owner.UID), 10) {
		return false
	}
	return true
}

// Cancel stops a job: a queued job is cancelled at once; a running one gets
// SIGTERM, then SIGKILL after the grace period, and is recorded as
// cancelled when it exits. Cancelling a finished job is a conflict.
func (m *Manager) Cancel(_ context.Context, c api.Caller, id string) (api.Job, error) {
	m.mu.Lock()
	j, err := m.lookup(c, id)
	if err != nil {
		m.mu.Unlock()
		return api.Job{}, err
	}
	state := j.State
	by := fmt.Sprintf("cancelled by %s (uid %d)", cmp.Or(c.User, "?"), c.UID)
	switch {
	case state.Terminal():
		m.mu.Unlock()
		return api.Job{}, api.Errorf(api.CodeConflict, "job %s already %s", id, state)
	case j.Spec.Pod != nil:
		m.mu.Unlock()
		return api.Job{}, api.Errorf(api.CodeConflict, "job %s holds devices kubelet allocated to a pod: it ends when kubelet frees them (delete the pod)", id)
	case j.Handover != nil:
		m.mu.Unlock()
		return m.cancelHandedOver(c, j, by)
	case state == api.StatePending:
		m.mu.Unlock()
		err := m.transitionFrom(j, api.StatePending, api.StateCancelled, by, func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
		})
		if errors.Is(err, ErrBadTransition) {
			// Placed meanwhile: stop it like a starting job.
			return m.cancelStarted(c, id, by)
		}
		if err != nil {
			return api.Job{}, err
		}
	default:
		m.mu.Unlock()
		return m.cancelStarted(c, id, by)
	}
	return m.Get(context.Background(), c, id)
}

// cancelStarted cancels a job that is placed, starting or running: the
// launcher sees the flag before it starts the process, or the process gets
// SIGTERM (and SIGKILL after the grace period).
func (m *Manager) cancelStarted(c api.Caller, id, by string) (api.Job, error) {
	if m.releaseIfHeld(id, by+" while it was held for its gang: released, never started") {
		return m.Get(context.Background(), c, id)
	}
	m.mu.Lock()
	j := m.jobs[id]
	if j.State.Terminal() {
		m.mu.Unlock()
		return api.Job{}, api.Errorf(api.CodeConflict, "job %s already %s", id, j.State)
	}
	proc := m.procs[id]
	already := m.cancels[id]
	m.cancels[id] = true
	j.Reason = by + "; stopping"
	m.mu.Unlock()
	if proc != nil && !already {
		m.log.Info("cancelling job", "job", id, "pid", proc.PID())
		_ = proc.Signal(syscall.SIGTERM)
		go m.killAfterGrace(id, proc)
	}
	return m.Get(context.Background(), c, id)
}

func (m *Manager) killAfterGrace(id string, p Process) {
	t := time.NewTimer(m.cfg.CancelGrace)
	defer t.Stop()
	select {
	case <-t.C:
	case <-m.stopping:
		return
	}
	m.mu.Lock()
	still := m.procs[id] == p
	m.mu.Unlock()
	if still {
		m.log.Warn("job ignored SIGTERM; killing", "job", id, "grace", m.cfg.CancelGrace)
		_ = p.Signal(syscall.SIGKILL)
	}
}

// LogPath returns the path of a job's log file and whether the job has
// finished (so a follower knows when to stop).
func (m *Manager) LogPath(c api.Caller, id string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j, err := m.lookup(c, id)
	if err != nil {
		return "", false, err
	}
	return m.logPath(id), j.State.Terminal(), nil
}

func (m *Manager) logPath(id string) string { return filepath.Join(m.cfg.LogDir, id, "output.log") }

// Subscribe streams events of the jobs c may see (optionally one job).
func (m *Manager) Subscribe(c api.Caller, jobID string) (<-chan api.Event, func()) {
	return m.events.subscribe(func(ev api.Event) bool {
		if ev.Kind == api.EventDevice || ev.Kind == api.EventQoS && ev.JobID == "" {
			return jobID == ""
		}
		if jobID != "" && ev.JobID != jobID {
			return false
		}
		if c.Admin {
			return true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		j, ok := m.jobs[ev.JobID]
		return ok && j.Owner.UID == c.UID
	})
}

// SetCordoned stops (or resumes) placing new jobs on this host. Running
// jobs are not touched. Admins only.
func (m *Manager) SetCordoned(c api.Caller, on bool) error {
	if !c.Admin {
		return api.Errorf(api.CodeForbidden, "only root or the admin group may cordon the node")
	}
	if err := m.store.SetMeta("cordoned", strconv.FormatBool(on)); err != nil {
		return fmt.Errorf("store node state: %w", err)
	}
	m.mu.Lock()
	m.cordoned = on
	m.mu.Unlock()
	m.log.Info("node cordon changed", "cordoned", on, "uid", c.UID)
	m.poke()
	return nil
}

// Cordoned reports whether the node is cordoned.
func (m *Manager) Cordoned() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cordoned
}

// Counts returns the number of jobs in each state and whether the node is
// cordoned.
func (m *Manager) Counts() (map[api.State]int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[api.State]int{}
	for _, j := range m.jobs {
		out[j.State]++
	}
	return out, m.cordoned
}

// errStore marks a transition that failed because the store could not
// write it.
var errStore = errors.New("state database write failed")

// storeProbeInterval is how often Ready tries the store again after a
// write failed.
const storeProbeInterval = time.Second

// storeProbeBytes is the size of the probe record: room for a few large
// job records.
const storeProbeBytes = 1 << 20

// Ready reports nil when the manager can take work. After a failed store
// write it probes the store (a 1 MiB write, at most once a second), so
// readiness comes back once the state filesystem has room again.
func (m *Manager) Ready() error {
	if m.isStopping() {
		return ErrShuttingDown
	}
	m.mu.Lock()
	serr := m.storeErr
	probe := serr != nil && time.Since(m.probedAt) >= storeProbeInterval
	if probe {
		m.probedAt = time.Now()
	}
	m.mu.Unlock()
	if serr == nil {
		return nil
	}
	if probe {
		err := m.probeStore()
		if err == nil {
			return nil
		}
		serr = err
	}
	return fmt.Errorf("last state database write failed: %w", serr)
}

// probeStore writes a probe record; on success the store error is cleared
// and the loop retries what could not be recorded.
func (m *Manager) probeStore() error {
	if err := m.store.Probe(storeProbeBytes); err != nil {
		m.mu.Lock()
		m.storeErr = err
		m.mu.Unlock()
		return err
	}
	m.noteStoreOK()
	m.poke()
	return nil
}

// retryUnrecorded stores the ends of job attempts that could not be stored
// when they happened.
func (m *Manager) retryUnrecorded() {
	m.mu.Lock()
	if len(m.unrecorded) == 0 {
		m.mu.Unlock()
		return
	}
	pending := maps.Clone(m.unrecorded)
	m.mu.Unlock()
	for id, retry := range pending {
		err := retry()
		if errors.Is(err, errStore) {
			return // still not writable: try again on the next tick
		}
		if err != nil {
			m.log.Warn("recording a job's end that could not be stored before", "job", id, "err", err)
		} else {
			m.log.Info("recorded a job's end that could not be stored before", "job", id)
		}
		m.mu.Lock()
		delete(m.unrecorded, id)
		m.mu.Unlock()
	}
}

// collectGarbage forgets the oldest finished jobs beyond the configured
// count and age, with their logs.
func (m *Manager) collectGarbage() {
	m.mu.Lock()
	var finished []*api.Job
	for _, j := range m.jobs {
		if j.State.Terminal() {
			finished = append(finished, j)
		}
	}
	slices.SortFunc(finished, func(a, b *api.Job) int { return cmp.Compare(idNum(a.ID), idNum(b.ID)) })
	now := time.Now() // monotonic: see Config.Now
	var drop []string
	chosen := map[string]bool{}
	for i, j := range finished {
		tooMany := m.cfg.MaxFinished > 0 && len(finished)-i > m.cfg.MaxFinished
		at, ok := m.finished[j.ID]
		tooOld := m.cfg.MaxAge > 0 && ok && now.Sub(at) > m.cfg.MaxAge
		if tooMany || tooOld {
			drop = append(drop, j.ID)
			chosen[j.ID] = true
		}
	}
	overBudget := m.overSpecBudget(finished, chosen)
	drop = append(drop, overBudget...)
	m.mu.Unlock()
	if len(overBudget) > 0 {
		m.log.Info("forgetting finished jobs to keep the specs within limits.spec_budget", "count", len(overBudget), "budget", api.Bytes(m.cfg.Limits.SpecBudget).Human())
	}
	if len(drop) == 0 {
		return
	}
	if err := m.store.DeleteJobs(drop...); err != nil {
		m.noteStoreError(err)
		return
	}
	m.mu.Lock()
	for _, id := range drop {
		if j := m.jobs[id]; j != nil && j.Origin != nil {
			delete(m.byOrigin, j.Origin.Key)
		}
		delete(m.jobs, id)
		delete(m.specBytes, id)
		delete(m.finished, id)
	}
	m.mu.Unlock()
	for _, id := range drop {
		if err := os.RemoveAll(filepath.Join(m.cfg.LogDir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("removing job logs", "job", id, "err", err)
		}
	}
	m.log.Info("forgot finished jobs", "count", len(drop))
}

// HeldDevices names every device that placed, starting or running jobs
// hold: GPU UUIDs, MIG instance UUIDs and FPGA regions. MIG apply and FPGA
// programming refuse to touch them.
func (m *Manager) HeldDevices() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := map[string]bool{}
	for _, j := range m.jobs {
		a := j.Allocation
		if a == nil || (j.State != api.StatePlaced && j.State != api.StateStarting && j.State != api.StateRunning) {
			continue
		}
		for _, g := range a.GPUs {
			held[g] = true
		}
		if s := a.GPUShare; s != nil {
			held[s.GPU] = true
		}
		if mig := a.MIG; mig != nil {
			if mig.Instance != "" {
				held[mig.Instance] = true
			} else {
				// The instance is yet to be created: keep the GPU's
				// layout from being changed under the job.
				held[mig.GPU] = true
			}
		}
		if f := a.FPGA; f != nil {
			held[f.Region] = true
		}
	}
	return held
}

// PublishQoS sends a QoS loop action to the event stream: to every
// subscriber of the whole stream and to those of the protected job it
// names (when it names one).
func (m *Manager) PublishQoS(ev api.Event) {
	ev.Kind, ev.From, ev.To = api.EventQoS, "", ""
	m.events.publish(ev)
}
