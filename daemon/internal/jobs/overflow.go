package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
)

// Overflow reaches the peers a job that does not fit here is handed over
// to (daemon/internal/peers implements it over mutual TLS).
type Overflow interface {
	// Offer offers job to the peers, best ranked first, until one accepts.
	// local is the job's key on this daemon ("<id>#<n>"); the Overflow
	// makes it global by prefixing this node's name. An error means no
	// peer took the job. When an offer's answer is lost the returned
	// handover has no RemoteID: the job is followed like an accepted one
	// until the peer answers or is lost (the peer stops what it never
	// hears from the origin about, see Poll).
	Offer(ctx context.Context, local string, job api.Job) (api.Handover, error)
	// Poll reads the job's state on the peer and its output from offset
	// on. Every Poll renews the peer's lease on the job: a peer that has
	// not been polled for its lease stops the job, so an origin that lost
	// its peer may place the job again without two copies running. It
	// fails with ErrRemoteGone when the peer does not have the job.
	Poll(ctx context.Context, h api.Handover, offset int64) (RemoteStatus, error)
	// Cancel asks the peer to cancel the job.
	Cancel(ctx context.Context, h api.Handover) error
}

// ErrRemoteGone is Poll's answer when the peer has no job of the key.
var ErrRemoteGone = errors.New("the peer does not have the job")

// RemoteStatus is a handed-over job as its peer reports it.
type RemoteStatus struct {
	ID      string          `json:"id"`
	State   api.State       `json:"state"`
	Reason  string          `json:"reason,omitempty"`
	Attempt int             `json:"attempt,omitempty"`
	PID     int             `json:"pid,omitempty"`
	Exit    *api.ExitStatus `json:"exit,omitempty"`
	// LeaseEnded is set when the peer stopped the job because this
	// daemon did not poll it for its lease (a partition): the origin
	// takes the job back instead of recording it cancelled.
	LeaseEnded bool `json:"lease_ended,omitempty"`
	// Log is the job's output from the offset asked for (bounded; the
	// next Poll reads on).
	Log []byte `json:"log,omitempty"`
}

// OverflowConfig says when a job is offered to peers and how a handed-over
// job is followed.
type OverflowConfig struct {
	// Budget is, per class, how long a job may wait unplaced here before
	// it is offered to peers; a class without one is never offered.
	Budget map[api.Class]time.Duration
	// Poll is how often the origin polls a handed-over job (and renews
	// the peer's lease on it).
	Poll time.Duration
	// Lost is how long a peer may stay unreachable before its job is
	// taken back: queued again if it had not started there, else per its
	// restart policy. It must exceed the peer's lease plus the cancel
	// grace, so the peer has stopped the job by then.
	Lost time.Duration
	// Retry is how long a job waits after every peer refused it before it
	// is offered again.
	Retry time.Duration
	// Users says which local users a peer's jobs may run as
	// (peers.users; its AcceptRoot is peers.accept_root_jobs).
	Users admission.PeerUsers
	// PeerLimits bound what each peer holds here (peers.limits).
	PeerLimits PeerLimits
}

type overflowState struct {
	o   Overflow
	cfg OverflowConfig

	mu sync.Mutex
	// since is when (monotonic) each pending job first failed to place;
	// offering marks jobs with an offer in flight; retryAt when a refused
	// job may be offered again.
	since    map[string]time.Time
	offering map[string]bool
	retryAt  map[string]time.Time
	refused  map[string]string
	// held are accepted gang members that have not started (held for
	// their gang's commit, then committed and waiting for its start),
	// each with the timer that releases it. Every entry holds a placement
	// here, so the map is bounded by what the host can place; an entry
	// goes when its member starts or is released. Whether a member
	// started is read from its record (gangs.go), so no set of committed
	// keys is kept.
	held map[string]*heldMember
	// accept serialises hand-overs accepted from peers.
	accept sync.Mutex
}

// SetOverflow lets the manager hand jobs over to peers. Call it before
// Recover, which resumes following the jobs handed over earlier.
func (m *Manager) SetOverflow(o Overflow, cfg OverflowConfig) {
	if cfg.Poll <= 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	if cfg.Lost <= 0 {
		cfg.Lost = 30 * time.Second
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 5 * time.Second
	}
	m.ovf = &overflowState{o: o, cfg: cfg, since: map[string]time.Time{}, offering: map[string]bool{}, retryAt: map[string]time.Time{}, refused: map[string]string{}}
}

// admit1 is the placer's Admit, except that with peers a job this host
// can never run is taken when its class may be handed over (it is offered
// at once, see overflow).
func (m *Manager) admit1(spec api.JobSpec) error {
	err := m.placer.Admit(spec)
	var e *api.Error
	if err == nil || m.ovf == nil || !errors.As(err, &e) || e.Code != api.CodeUnsatisfiable {
		return err
	}
	if _, ok := m.ovf.o.(GangOverflow); spec.Gang != nil && !ok {
		return err
	}
	if _, ok := m.ovf.cfg.Budget[spec.Class]; !ok {
		return err
	}
	return nil
}

// offerDue is the queue's bookkeeping of a group (keyed by its first job)
// that did not fit here: it records when that first happened and reports
// whether to offer it to peers now (budget waited; the group is then marked
// offering) and, if not, whether the queue leaves it alone anyway (every
// peer refused it a moment ago: that stays its waiting reason).
func (m *Manager) offerDue(group []*api.Job, budget time.Duration) (taken, offer bool) {
	id := group[0].ID
	m.pruneOverflow()
	now := time.Now()
	m.ovf.mu.Lock()
	first, seen := m.ovf.since[id]
	if !seen {
		first = now
		m.ovf.since[id] = now
	}
	if now.Before(m.ovf.retryAt[id]) {
		refused := m.ovf.refused[id]
		m.ovf.mu.Unlock()
		m.setWaiting(group, refused)
		return true, false
	}
	if now.Sub(first) < budget {
		m.ovf.mu.Unlock()
		return false, false
	}
	m.ovf.offering[id] = true
	m.ovf.mu.Unlock()
	return true, true
}

// handingOver is true while an offer of j to peers is in flight: the queue
// leaves it alone, so it is never placed here and there at once.
func (m *Manager) handingOver(j *api.Job) bool {
	if m.ovf == nil {
		return false
	}
	m.ovf.mu.Lock()
	defer m.ovf.mu.Unlock()
	return m.ovf.offering[j.ID]
}

// overflow is called by the queue for a group that could not be placed
// (why says why): a single job that came from no peer and has waited its
// class's budget is offered to peers in the background. It reports whether
// it took the job (the queue then skips it).
func (m *Manager) overflow(group []*api.Job, why string) bool {
	if m.ovf == nil || group[0].Origin != nil {
		return false
	}
	if group[0].Spec.Gang != nil {
		return m.overflowGang(group, why)
	}
	if len(group) != 1 {
		return false
	}
	j := group[0]
	budget, ok := m.ovf.cfg.Budget[j.Spec.Class]
	if !ok {
		return false
	}
	left := fmt.Sprintf("did not fit here within its %s wait budget (%s)", budget, why)
	if err := m.placer.Admit(j.Spec); err != nil {
		budget = 0 // it can never run here
		left = fmt.Sprintf("cannot run on this host (%v)", err)
	}
	if taken, offer := m.offerDue(group, budget); !offer {
		return taken
	}
	m.setWaiting(group, "waiting: "+why+"; offering to peers")
	m.wg.Add(1)
	go m.offer(j, why, left)
	return true
}

// offer hands j over to the first peer that accepts it.
func (m *Manager) offer(j *api.Job, why, left string) {
	defer m.wg.Done()
	defer func() {
		m.ovf.mu.Lock()
		delete(m.ovf.offering, j.ID)
		m.ovf.mu.Unlock()
		m.poke()
	}()
	m.mu.Lock()
	snap := cloneJob(j)
	m.mu.Unlock()
	if snap.State != api.StatePending {
		return
	}
	// The key changes with every event, so a job queued again after a
	// lost peer is a new hand-over; while pending it stays the same, so a
	// retried offer is recognised.
	local := snap.ID + "#" + strconv.Itoa(len(snap.Events))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := m.ovf.o.Offer(ctx, local, snap)
	if err != nil {
		reason := fmt.Sprintf("waiting: %s; no peer took it: %v", why, err)
		m.ovf.mu.Lock()
		m.ovf.retryAt[j.ID] = time.Now().Add(m.ovf.cfg.Retry)
		m.ovf.refused[j.ID] = reason
		m.ovf.mu.Unlock()
		m.setWaiting([]*api.Job{j}, reason)
		return
	}
	h.At = m.now()
	h.Why = left + "; " + h.Why
	if err := m.transitionFrom(j, api.StatePending, api.StatePlaced, "handed over to peer "+h.Peer+": "+h.Why, func(j *api.Job) {
		hc := h
		j.Handover = &hc
	}); err != nil {
		// Cancelled (or placed here) meanwhile: the peer must not run it.
		m.log.Info("job left the queue while it was offered; cancelling it on the peer", "job", j.ID, "peer", h.Peer, "err", err)
		if cerr := m.ovf.o.Cancel(ctx, h); cerr != nil {
			m.log.Warn("cancelling a hand-over on the peer failed; its lease ends it", "job", j.ID, "peer", h.Peer, "err", cerr)
		}
		return
	}
	m.ovf.forget(j.ID)
	m.wg.Add(1)
	go m.follow(j)
}

// pruneOverflow forgets the waits of jobs no longer pending (placed
// here, cancelled).
func (m *Manager) pruneOverflow() {
	m.ovf.mu.Lock()
	ids := make([]string, 0, len(m.ovf.since))
	for id := range m.ovf.since {
		ids = append(ids, id)
	}
	m.ovf.mu.Unlock()
	var gone []string
	m.mu.Lock()
	for _, id := range ids {
		if j, ok := m.jobs[id]; !ok || j.State != api.StatePending {
			gone = append(gone, id)
		}
	}
	m.mu.Unlock()
	for _, id := range gone {
		m.ovf.forget(id)
	}
}

func (o *overflowState) forget(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.since, id)
	delete(o.retryAt, id)
	delete(o.refused, id)
}

// resumeHandover follows, after a restart, a job an earlier daemon handed
// over.
func (m *Manager) resumeHandover(j *api.Job) error {
	if m.ovf == nil {
		return m.transition(j, api.StateLost, fmt.Sprintf("handed over to peer %s, but fusiond now runs without peers and cannot follow it", j.Handover.Peer), func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
		})
	}
	m.wg.Add(1)
	go m.follow(j)
	return nil
}

// follow polls a handed-over job on its peer until it ends there: its
// state is mirrored into the origin's record, its output appended to the
// origin's log file (so fusionctl logs works unchanged), and a peer lost
// for longer than OverflowConfig.Lost gives the job back.
func (m *Manager) follow(j *api.Job) {
	defer m.wg.Done()
	m.mu.Lock()
	h := *j.Handover
	m.mu.Unlock()
	logPath := m.logPath(j.ID)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o750); err != nil {
		m.log.Error("log directory of a handed-over job", "job", j.ID, "err", err)
	}
	var offset int64
	if st, err := os.Stat(logPath); err == nil {
		offset = st.Size()
	}
	last := time.Now()
	tick := time.NewTicker(m.ovf.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-m.stopping:
			return
		case <-tick.C:
		}
		m.mu.Lock()
		cancelled := m.cancels[j.ID]
		m.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), max(m.ovf.cfg.Poll*4, 2*time.Second))
		if cancelled {
			if err := m.ovf.o.Cancel(ctx, h); err == nil {
				m.forgetCancel(j.ID)
			}
		}
		st, err := m.ovf.o.Poll(ctx, h, offset)
		cancel()
		if errors.Is(err, ErrRemoteGone) {
			m.takeBack(j, h, "peer "+h.Peer+" does not have the job")
			return
		}
		if err != nil {
			if away := time.Since(last); away >= m.ovf.cfg.Lost {
				m.takeBack(j, h, fmt.Sprintf("peer %s unreachable for %s (%v)", h.Peer, away.Round(time.Second), err))
				return
			}
			m.mu.Lock()
			if !j.State.Terminal() {
				j.Reason = fmt.Sprintf("on peer %s; unreachable for %s: %v", h.Peer, time.Since(last).Round(time.Second), err)
			}
			m.mu.Unlock()
			continue
		}
		last = time.Now()
		if h.RemoteID == "" && st.ID != "" {
			// The offer's answer was lost; the peer had accepted it.
			h.RemoteID = st.ID
			m.mu.Lock()
			if j.Handover != nil {
				// A new value: copies of the record share the old one.
				hc := *j.Handover
				hc.RemoteID = st.ID
				j.Handover = &hc // stored with the next transition
			}
			m.mu.Unlock()
		}
		if len(st.Log) > 0 {
			if err := appendFile(logPath, st.Log); err != nil {
				m.log.Warn("appending a handed-over job's output", "job", j.ID, "err", err)
			} else {
				offset += int64(len(st.Log))
			}
		}
		if m.mirror(j, h, st) {
			return
		}
	}
}

func appendFile(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// mirror moves the origin's record forward to the peer's state (through
// the states between, as the state machine requires) and reports whether
// the job has ended.
func (m *Manager) mirror(j *api.Job, h api.Handover, st RemoteStatus) bool {
	on := "on peer " + h.Peer + " as job " + st.ID
	step := func(from, to api.State, reason string, mutate func(*api.Job)) {
		if err := m.transitionFrom(j, from, to, reason, mutate); err != nil {
			m.log.Warn("mirroring a handed-over job", "job", j.ID, "err", err)
		}
	}
	state := func() api.State {
		m.mu.Lock()
		defer m.mu.Unlock()
		return j.State
	}
	remote := st.State
	if remote == api.StatePending || remote == api.StatePlaced {
		return false
	}
	if state() == api.StatePlaced && remote != api.StateCancelled {
		step(api.StatePlaced, api.StateStarting, fmt.Sprintf("starting %s (attempt %d there)", on, st.Attempt), func(j *api.Job) {
			j.Attempt++
		})
	}
	if state() == api.StateStarting && (remote == api.StateRunning || remote == api.StateSucceeded || remote == api.StateFailed && st.Exit != nil) {
		step(api.StateStarting, api.StateRunning, fmt.Sprintf("running %s, pid %d there", on, st.PID), func(j *api.Job) {
			t := m.now()
			j.StartedAt = &t
		})
	}
	if !remote.Terminal() {
		return false
	}
	if st.LeaseEnded {
		m.takeBack(j, h, "peer "+h.Peer+" stopped the job when its lease ended (it heard nothing from this daemon)")
		return true
	}
	cur := state()
	if cur.Terminal() {
		return true
	}
	if err := m.transition(j, remote, on+": "+st.Reason, func(j *api.Job) {
		j.Exit = st.Exit
		t := m.now()
		j.FinishedAt = &t
	}); err != nil {
		m.log.Warn("recording the end of a handed-over job", "job", j.ID, "err", err)
		return false
	}
	m.poke()
	return true
}

// takeBack gives a job back to this daemon when its peer is lost: queued
// again if it had not started there; after it started, queued again only
// as its restart policy allows, else lost.
func (m *Manager) takeBack(j *api.Job, h api.Handover, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = m.ovf.o.Cancel(ctx, h) // best effort: it also stops there when its lease ends
	cancel()
	m.mu.Lock()
	cur, attempt, restart := j.State, j.Attempt, j.Spec.Restart
	cancelled := m.cancels[j.ID]
	delete(m.cancels, j.ID)
	m.mu.Unlock()
	if cur.Terminal() {
		return
	}
	var err error
	switch {
	case cancelled:
		err = m.transition(j, api.StateCancelled, why+"; cancelled before it was heard of again", func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
			j.Handover = nil
		})
	case cur == api.StatePlaced:
		err = m.transition(j, api.StatePending, why+"; it had not started there: queued again", func(j *api.Job) {
			j.Handover = nil
		})
	case restart != nil && restart.Policy == api.RestartOnFailure && attempt <= restart.MaxRetries:
		err = m.transition(j, api.StatePending, fmt.Sprintf("%s after it started there; restarting (retry %d of %d)", why, attempt, restart.MaxRetries), func(j *api.Job) {
			j.Handover = nil
		})
	default:
		err = m.transition(j, api.StateLost, why+" after it started there; its restart policy does not run it again", func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
		})
	}
	if err != nil {
		m.log.Error("taking back a handed-over job", "job", j.ID, "err", err)
	}
	m.log.Warn("took back a handed-over job", "job", j.ID, "peer", h.Peer, "why", why)
	m.poke()
}

// cancelHandedOver forwards a cancel to the peer running the job; the
// follower records the end when the peer reports it, and keeps asking
// while the peer cannot be reached.
func (m *Manager) cancelHandedOver(c api.Caller, j *api.Job, by string) (api.Job, error) {
	m.mu.Lock()
	h := *j.Handover
	m.cancels[j.ID] = true
	j.Reason = by + "; stopping on peer " + h.Peer
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.ovf.o.Cancel(ctx, h); err != nil {
		m.log.Warn("cancel not delivered to the peer yet; retrying", "job", j.ID, "peer", h.Peer, "err", err)
	} else {
		m.forgetCancel(j.ID)
	}
	return m.Get(context.Background(), c, j.ID)
}

// cancelHandedOverOnStop asks the peers to cancel the jobs handed over
// from here when fusiond stops and stops its jobs with it
// (leave_jobs_on_shutdown: false); the next daemon records how they ended.
func (m *Manager) cancelHandedOverOnStop() {
	if m.ovf == nil {
		return
	}
	m.mu.Lock()
	var hs []api.Handover
	for _, j := range m.jobs {
		if j.Handover != nil && !j.State.Terminal() {
			hs = append(hs, *j.Handover)
		}
	}
	m.mu.Unlock()
	for _, h := range hs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := m.ovf.o.Cancel(ctx, h); err != nil {
			m.log.Warn("stopping: cancelling a handed-over job on its peer failed; its lease ends it", "peer", h.Peer, "key", h.Key, "err", err)
		}
		cancel()
	}
}

func summaryOf(a api.Allocation) string {
	s, _, _ := strings.Cut(cmp.Or(a.Explain, "resources reserved"), "\n")
	return s
}

// Accepted lists the unfinished jobs peers handed over to this host (the
// peer side renews their leases from the origins' polls).
func (m *Manager) Accepted() []api.Job {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []api.Job
	for _, j := range m.jobs {
		if j.Origin != nil && !j.State.Terminal() {
			out = append(out, cloneJob(j))
		}
	}
	return out
}

// AcceptedByKey finds the job a peer handed over under key.
func (m *Manager) AcceptedByKey(key string) (api.Job, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j, ok := m.jobs[m.byOrigin[key]]; ok && j.Origin != nil && j.Origin.Key == key {
		return cloneJob(j), true
	}
	return api.Job{}, false
}

// QueueLoad is the queue's part of the load this host gossips: pending
// jobs, how long the oldest has waited, the GPU share (thousandths) held
// per GPU, and whether the host takes work.
func (m *Manager) QueueLoad() (pending int, oldest time.Duration, shares map[string]int, cordoned bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	shares = map[string]int{}
	for _, j := range m.jobs {
		switch {
		case j.State == api.StatePending:
			pending++
			if n := len(j.Events); n > 0 {
				oldest = max(oldest, now.Sub(j.Events[n-1].Time))
			}
		case active(j.State) && j.Allocation != nil && j.Allocation.GPUShare != nil:
			shares[j.Allocation.GPUShare.GPU] += j.Allocation.GPUShare.Milli
		}
	}
	return pending, oldest, shares, m.cordoned
}
