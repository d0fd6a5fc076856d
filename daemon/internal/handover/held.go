package handover

import (
	"errors"
	"fmt"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// The holder's side of a cross-host gang (GangOverflow's steps as a peer
// runs them here): a member a peer reserves is admitted with a hold
// (jobs.Offer.Hold), placed by the queue and then held here instead of
// started; CommitHeld keeps it behind a start barrier, StartCommitted
// starts it, ReleaseHeld and the timers release it, never started.

// ErrNotHeld is the holder's answer to a commit or start for a key that
// holds no reservation (never reserved, released at the end of its hold
// or barrier, or aborted); the error names why when the job says.
var ErrNotHeld = errors.New("no held gang member under that key")

// ErrNotCommitted is the answer to a start of a member held but not
// committed.
var ErrNotCommitted = errors.New("the gang member is held but not committed")

// heldMember is an accepted gang member that has not started: held until
// its commit, then committed until its start. timer releases it at
// deadline (the end of the hold, then of the start barrier).
type heldMember struct {
	timer     *time.Timer
	deadline  time.Time
	committed bool
}

// Hold keeps an accepted gang member, just placed, placed but not
// started until CommitHeld, releasing it after d.
func (a *Agent) Hold(id string, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := &heldMember{deadline: time.Now().Add(d)}
	h.timer = time.AfterFunc(d, func() {
		a.expireHeld(id, h, fmt.Sprintf("its gang was not committed within %s: reservation released, never started", d))
	})
	a.held[id] = h
}

// takeHeld removes and returns the held member of id when its timer is
// stopped in time (before its deadline); else nil. a.mu held.
func (a *Agent) takeHeld(id string) *heldMember {
	h := a.held[id]
	if h == nil || !time.Now().Before(h.deadline) || !h.timer.Stop() {
		return nil
	}
	delete(a.held, id)
	return h
}

// heldJob finds the accepted job of key and its held entry (nil when it
// holds none).
func (a *Agent) heldJob(key string) (api.Job, *heldMember, bool) {
	j, ok := a.jobs.AcceptedByKey(key)
	if !ok {
		return api.Job{}, nil, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return j, a.held[j.ID], true
}

// notHeld is ErrNotHeld with the member's own reason.
func notHeld(j api.Job) error {
	if j.State.Terminal() && j.Reason != "" {
		return fmt.Errorf("%w: job %s %s: %s", ErrNotHeld, j.ID, j.State, j.Reason)
	}
	return ErrNotHeld
}

// started is true of an accepted member whose start was asked for (the
// record shows it: its first attempt began), so a repeated commit or
// start answers as the first did, without a set of committed keys to
// keep.
func started(j api.Job) bool { return j.Attempt > 0 }

// CommitHeld commits the held gang member of key. With a barrier above
// zero it stays placed, not started, until StartCommitted, and is
// released if none comes within barrier; the commit is recorded on the
// job (an event) before the answer. A barrier of zero starts it now (an
// origin that predates the start barrier). started reports which.
func (a *Agent) CommitHeld(key string, barrier time.Duration) (bool, error) {
	j, h, ok := a.heldJob(key)
	if !ok {
		return false, ErrNotHeld
	}
	if h == nil {
		if started(j) {
			return true, nil // started before: idempotent
		}
		return false, notHeld(j)
	}
	if h.committed {
		return false, nil // committed before: idempotent
	}
	a.mu.Lock()
	if a.takeHeld(j.ID) != h {
		a.mu.Unlock()
		j, _ = a.jobs.AcceptedByKey(key)
		return false, fmt.Errorf("its hold ended before the commit: %w", notHeld(j))
	}
	if barrier <= 0 {
		a.mu.Unlock()
		a.jobs.Launch(j.ID)
		return true, nil
	}
	c := &heldMember{deadline: time.Now().Add(barrier), committed: true}
	c.timer = time.AfterFunc(barrier, func() {
		a.expireHeld(j.ID, c, fmt.Sprintf("committed with its gang, but the origin's start did not come within its %s start barrier: released, never started", barrier))
	})
	a.held[j.ID] = c
	a.mu.Unlock()
	if err := a.jobs.Annotate(j.ID, fmt.Sprintf("committed with its gang by origin %s; waiting up to %s for the gang's start", j.Origin.Node, barrier), func(j *api.Job) {
		j.Reason = "committed with its gang; waiting for the gang's start"
	}); err != nil {
		a.mu.Lock()
		taken := a.takeHeld(j.ID) == c
		a.mu.Unlock()
		if taken {
			a.releaseHeld(j.ID, "the commit could not be recorded: released, never started")
		}
		return false, fmt.Errorf("recording the commit: %w", err)
	}
	return false, nil
}

// StartCommitted starts the committed gang member of key.
func (a *Agent) StartCommitted(key string) error {
	j, h, ok := a.heldJob(key)
	switch {
	case !ok:
		return ErrNotHeld
	case h == nil && started(j):
		return nil // started before: idempotent
	case h == nil:
		return notHeld(j)
	case !h.committed:
		return ErrNotCommitted
	}
	a.mu.Lock()
	taken := a.takeHeld(j.ID) == h
	a.mu.Unlock()
	if !taken {
		j, _ = a.jobs.AcceptedByKey(key)
		return fmt.Errorf("its start barrier ended before the start: %w", notHeld(j))
	}
	a.jobs.Launch(j.ID)
	return nil
}

// ReleaseHeld releases the held or committed (not started) gang member of
// key (its gang aborted: why) and reports whether there was one.
func (a *Agent) ReleaseHeld(key, why string) bool {
	j, ok := a.jobs.AcceptedByKey(key)
	if !ok {
		return false
	}
	return a.ReleaseIfHeld(j.ID, why+": released, never started")
}

// ReleaseIfHeld releases the member id if it is held or committed, with
// reason, and reports whether it was.
func (a *Agent) ReleaseIfHeld(id, reason string) bool {
	a.mu.Lock()
	h := a.held[id]
	stopped := h != nil && h.timer.Stop()
	if stopped {
		delete(a.held, id)
	}
	a.mu.Unlock()
	if !stopped {
		return false
	}
	a.releaseHeld(id, reason)
	return true
}

// expireHeld releases member id at the end of its hold or barrier, if h
// is still its entry.
func (a *Agent) expireHeld(id string, h *heldMember, reason string) {
	a.mu.Lock()
	mine := a.held[id] == h
	if mine {
		delete(a.held, id)
	}
	a.mu.Unlock()
	if mine {
		a.releaseHeld(id, reason)
	}
}

func (a *Agent) releaseHeld(id, reason string) {
	a.jobs.ForgetCancel(id)
	if _, ok := a.jobs.State(id); !ok {
		return
	}
	if err := a.jobs.Move(id, api.StatePlaced, api.StateCancelled, reason, func(j *api.Job) {
		t := a.jobs.Now()
		j.FinishedAt = &t
	}); err != nil {
		a.log.Warn("releasing a held gang member", "job", id, "err", err)
		return
	}
	a.jobs.Release(id)
	a.jobs.Poke()
}
