package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
)

// Handover is the hand-over of jobs to peers, both sides
// (daemon/internal/handover.Agent), as the queue and the state machine
// call it. A manager without one runs without peers.
type Handover interface {
	// Offerable reports whether a job this host can never run may be let
	// in because it can be handed over (it is offered at once).
	Offerable(spec api.JobSpec) bool
	// Offering reports whether an offer of the job to peers is in flight:
	// the queue leaves it alone.
	Offering(id string) bool
	// Overflow is given a group the queue could not place (why says why)
	// and reports whether it took it (offering it to peers, or leaving it
	// waiting after every peer refused it a moment ago).
	Overflow(group []*api.Job, why string) bool
	// PoorFit is given a single job just placed here whose placement the
	// engine scored score, before it is recorded; it reports whether the
	// hand-over took the job to offer it to peers that rank better (the
	// queue then gives the placement back and leaves the job alone while
	// it is offered, see Offering).
	PoorFit(j *api.Job, score float64) bool
	// Follow follows a job an earlier daemon handed over.
	Follow(id string)
	// CancelRemote forwards a cancel to the peer of a handed-over job.
	CancelRemote(id string, h api.Handover)
	// CancelOnStop cancels the jobs handed over from here on their peers.
	CancelOnStop(hs []api.Handover)
	// Hold keeps a peer's gang member, just placed, from starting until
	// its gang commits; ReleaseIfHeld releases one held (or committed,
	// not started) and reports whether it was.
	Hold(id string, d time.Duration)
	ReleaseIfHeld(id, reason string) bool
}

// PeerPolicy is what the admission steps apply to a peer's jobs.
type PeerPolicy struct {
	// Users says which local users a peer's jobs may run as
	// (peers.users; its AcceptRoot is peers.accept_root_jobs).
	Users admission.PeerUsers
	// Limits bound what each peer holds here (peers.limits).
	Limits PeerLimits
}

// SetHandover lets the manager hand jobs over to peers and accept theirs,
// under policy. Call it before Recover, which resumes following the jobs
// handed over earlier.
func (m *Manager) SetHandover(h Handover, policy PeerPolicy) {
	m.ho, m.peerPolicy = h, policy
}

// admit1 is the placer's Admit, except that with peers a job this host
// can never run is taken when its class may be handed over (it is offered
// at once, see Handover.Overflow).
func (m *Manager) admit1(spec api.JobSpec) error {
	err := m.placer.Admit(spec)
	var e *api.Error
	if err == nil || m.ho == nil || !errors.As(err, &e) || e.Code != api.CodeUnsatisfiable {
		return err
	}
	if !m.ho.Offerable(spec) {
		return err
	}
	return nil
}

// handingOver is true while an offer of j to peers is in flight.
func (m *Manager) handingOver(j *api.Job) bool {
	return m.ho != nil && m.ho.Offering(j.ID)
}

// overflow gives a group the queue could not place to the hand-over.
func (m *Manager) overflow(group []*api.Job, why string) bool {
	return m.ho != nil && m.ho.Overflow(group, why)
}

// poorFit gives a job just placed here, as a single job, to the
// hand-over when its placement scores poorly and a peer ranks better
// (Handover.PoorFit); the placement is then given back.
func (m *Manager) poorFit(group []*api.Job) bool {
	sc, ok := m.placer.(Scorer)
	if m.ho == nil || !ok || len(group) != 1 || group[0].Origin != nil {
		return false
	}
	s, ok := sc.PlacedScore(group[0].ID)
	if !ok || !m.ho.PoorFit(group[0], s) {
		return false
	}
	m.release(group[0])
	return true
}

// resumeHandover follows, after a restart, a job an earlier daemon handed
// over.
func (m *Manager) resumeHandover(j *api.Job) error {
	if m.ho == nil {
		return m.transition(j, api.StateLost, fmt.Sprintf("handed over to peer %s, but fusiond now runs without peers and cannot follow it", j.Handover.Peer), func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
		})
	}
	m.ho.Follow(j.ID)
	return nil
}

// cancelHandedOver records the cancel of a handed-over job and forwards
// it to its peer; the follower records the end when the peer reports it,
// and keeps asking while the peer cannot be reached.
func (m *Manager) cancelHandedOver(c api.Caller, j *api.Job, by string) (api.Job, error) {
	m.mu.Lock()
	h := *j.Handover
	m.cancels[j.ID] = true
	j.Reason = by + "; stopping on peer " + h.Peer
	m.mu.Unlock()
	m.ho.CancelRemote(j.ID, h)
	return m.Get(context.Background(), c, j.ID)
}

// releaseIfHeld releases a held gang member (see Handover.Hold).
func (m *Manager) releaseIfHeld(id, reason string) bool {
	return m.ho != nil && m.ho.ReleaseIfHeld(id, reason)
}

// cancelHandedOverOnStop asks the peers to cancel the jobs handed over
// from here when fusiond stops and stops its jobs with it
// (leave_jobs_on_shutdown: false); the next daemon records how they ended.
func (m *Manager) cancelHandedOverOnStop() {
	if m.ho == nil {
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
	m.ho.CancelOnStop(hs)
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
