package handover

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// ids are the IDs of a group's jobs.
func ids(group []*api.Job) []string {
	out := make([]string, len(group))
	for i, j := range group {
		out[i] = j.ID
	}
	return out
}

// offerDue is the queue's bookkeeping of a group (keyed by its first job)
// that did not fit here: it records when that first happened and reports
// whether to offer it to peers now (budget waited; the group is then marked
// offering) and, if not, whether the queue leaves it alone anyway (every
// peer refused it a moment ago: that stays its waiting reason).
func (a *Agent) offerDue(group []string, budget time.Duration) (taken, offer bool) {
	id := group[0]
	a.prune()
	now := time.Now()
	a.mu.Lock()
	first, seen := a.since[id]
	if !seen {
		first = now
		a.since[id] = now
	}
	if now.Before(a.retryAt[id]) {
		refused := a.refused[id]
		a.mu.Unlock()
		a.jobs.SetWaiting(group, refused)
		return true, false
	}
	if now.Sub(first) < budget {
		a.mu.Unlock()
		return false, false
	}
	a.offering[id] = true
	a.mu.Unlock()
	return true, true
}

// Offering is true while an offer of the job to peers is in flight: the
// queue leaves it alone, so it is never placed here and there at once.
func (a *Agent) Offering(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.offering[id]
}

// Overflow is called by the queue for a group that could not be placed
// (why says why): a single job that came from no peer and has waited its
// class's budget is offered to peers in the background. It reports whether
// it took the job (the queue then skips it). It reads only what a record
// never changes after admission (ID, Spec, Origin).
func (a *Agent) Overflow(group []*api.Job, why string) bool {
	if group[0].Origin != nil {
		return false
	}
	if group[0].Spec.Gang != nil {
		return a.overflowGang(group, why)
	}
	if len(group) != 1 {
		return false
	}
	j := group[0]
	budget, ok := a.cfg.Budget[j.Spec.Class]
	if !ok {
		return false
	}
	left := fmt.Sprintf("did not fit here within its %s wait budget (%s)", budget, why)
	if err := a.jobs.CanRun(j.Spec); err != nil {
		budget = 0 // it can never run here
		left = fmt.Sprintf("cannot run on this host (%v)", err)
	}
	if taken, offer := a.offerDue(ids(group), budget); !offer {
		return taken
	}
	a.jobs.SetWaiting(ids(group), "waiting: "+why+"; offering to peers")
	id := j.ID
	a.jobs.Go(func() { a.offer(id, why, left, math.Inf(-1)) })
	return true
}

// PoorFit is called by the queue for a single job it just placed here
// with engine score score (before the placement is recorded): the
// poor-fit rule (Config.RankSelf). A job that came from no peer, of a
// class with a wait budget, whose score is below RankSelf.Below is
// ranked against the peers; when the best peer's ranking score exceeds
// score by RankSelf.Margin or more, the job is offered (to the peers
// that rank that well) in the background and PoorFit reports true (the
// queue gives the placement back and leaves the job alone meanwhile).
// When every such peer refuses, the job is placed here on a later pass
// without being ranked again for Config.Retry.
func (a *Agent) PoorFit(j *api.Job, score float64) bool {
	rule := a.cfg.RankSelf
	if rule.Below <= 0 || score >= rule.Below || j.Origin != nil || j.Spec.Gang != nil {
		return false
	}
	if _, ok := a.cfg.Budget[j.Spec.Class]; !ok {
		return false
	}
	r, ok := a.o.(Ranker)
	if !ok {
		return false
	}
	id := j.ID
	a.prune()
	a.mu.Lock()
	recent := time.Now().Before(a.retryAt[id]) || a.offering[id]
	a.mu.Unlock()
	if recent {
		return false // refused a moment ago: it runs here
	}
	peer, best, ok := r.Best(j.Spec)
	if !ok || best < score+rule.Margin {
		return false
	}
	a.mu.Lock()
	a.offering[id] = true
	a.mu.Unlock()
	why := fmt.Sprintf("fits here poorly (engine score %.2f, below peers.rank_self.below %.2f) and peer %s ranks %.2f, at least peers.rank_self.margin %.2f better",
		score, rule.Below, peer, best, rule.Margin)
	a.jobs.SetWaiting([]string{id}, "waiting: "+why+"; offering to peers")
	a.jobs.Go(func() { a.offer(id, why, why, score+rule.Margin) })
	return true
}

// offered ends an offer of id: the queue may place it again.
func (a *Agent) offered(id string) {
	a.mu.Lock()
	delete(a.offering, id)
	a.mu.Unlock()
	a.jobs.Poke()
}

// offer hands job id over to the first peer that accepts it, of those
// ranked at least min (-Inf: any; an Overflow that is no Ranker offers to
// all).
func (a *Agent) offer(id, why, left string, min float64) {
	defer a.offered(id)
	snap, ok := a.jobs.Job(id)
	if !ok || snap.State != api.StatePending {
		return
	}
	// The key changes with every event, so a job queued again after a
	// lost peer is a new hand-over; while pending it stays the same, so a
	// retried offer is recognised.
	local := snap.ID + "#" + strconv.Itoa(len(snap.Events))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var h api.Handover
	var err error
	if r, ok := a.o.(Ranker); ok && !math.IsInf(min, -1) {
		h, err = r.OfferAbove(ctx, local, snap, min)
	} else {
		h, err = a.o.Offer(ctx, local, snap)
	}
	if err != nil {
		reason := fmt.Sprintf("waiting: %s; no peer took it: %v", why, err)
		a.mu.Lock()
		a.retryAt[id] = time.Now().Add(a.cfg.Retry)
		a.refused[id] = reason
		a.mu.Unlock()
		a.jobs.SetWaiting([]string{id}, reason)
		return
	}
	if err := a.handedOver(id, h, left, ""); err != nil {
		// Cancelled (or placed here) meanwhile: the peer must not run it.
		a.log.Info("job left the queue while it was offered; cancelling it on the peer", "job", id, "peer", h.Peer, "err", err)
		if cerr := a.o.Cancel(ctx, h); cerr != nil {
			a.log.Warn("cancelling a hand-over on the peer failed; its lease ends it", "job", id, "peer", h.Peer, "err", cerr)
		}
		return
	}
	a.forget(id)
	a.jobs.Go(func() { a.follow(id) })
}

// handedOver records pending job id as placed on h's peer (with, when
// set, saying how: "with its gang"), why it went there being left and
// the peer's ranking; it fails when the job left the queue meanwhile.
func (a *Agent) handedOver(id string, h api.Handover, left, with string) error {
	h.At = a.jobs.Now()
	h.Why = left + "; " + h.Why
	return a.jobs.Move(id, api.StatePending, api.StatePlaced, "handed over to peer "+h.Peer+with+": "+h.Why, func(j *api.Job) {
		j.Handover = &h
	})
}

// prune forgets the waits and refusals of jobs no longer pending (placed
// here, cancelled).
func (a *Agent) prune() {
	a.mu.Lock()
	ids := make([]string, 0, len(a.since)+len(a.retryAt))
	for id := range a.since {
		ids = append(ids, id)
	}
	for id := range a.retryAt {
		if _, ok := a.since[id]; !ok {
			ids = append(ids, id) // a poor fit's refusal (PoorFit)
		}
	}
	a.mu.Unlock()
	for _, id := range ids {
		if st, ok := a.jobs.State(id); !ok || st != api.StatePending {
			a.forget(id)
		}
	}
}

func (a *Agent) forget(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.since, id)
	delete(a.retryAt, id)
	delete(a.refused, id)
}

// Follow follows, after a restart, a job an earlier daemon handed over.
func (a *Agent) Follow(id string) {
	a.jobs.Go(func() { a.follow(id) })
}

// follow polls a handed-over job on its peer until it ends there: its
// state is mirrored into the origin's record, its output appended to the
// origin's log file (so fusionctl logs works unchanged), and a peer lost
// for longer than Config.Lost gives the job back.
func (a *Agent) follow(id string) {
	j, ok := a.jobs.Job(id)
	if !ok || j.Handover == nil {
		return
	}
	h := *j.Handover
	logPath := a.jobs.LogFile(id)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o750); err != nil {
		a.log.Error("log directory of a handed-over job", "job", id, "err", err)
	}
	var offset int64
	if st, err := os.Stat(logPath); err == nil {
		offset = st.Size()
	}
	last := time.Now()
	tick := time.NewTicker(a.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-a.jobs.Stopping():
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(a.cfg.Poll*4, 2*time.Second))
		if a.jobs.CancelAsked(id) {
			if err := a.o.Cancel(ctx, h); err == nil {
				a.jobs.ForgetCancel(id)
			}
		}
		st, err := a.o.Poll(ctx, h, offset)
		cancel()
		if errors.Is(err, ErrRemoteGone) {
			a.takeBack(id, h, "peer "+h.Peer+" does not have the job")
			return
		}
		if err != nil {
			if away := time.Since(last); away >= a.cfg.Lost {
				a.takeBack(id, h, fmt.Sprintf("peer %s unreachable for %s (%v)", h.Peer, away.Round(time.Second), err))
				return
			}
			a.jobs.Patch(id, func(j *api.Job) {
				if !j.State.Terminal() {
					j.Reason = fmt.Sprintf("on peer %s; unreachable for %s: %v", h.Peer, time.Since(last).Round(time.Second), err)
				}
			})
			continue
		}
		last = time.Now()
		if h.RemoteID == "" && st.ID != "" {
			// The offer's answer was lost; the peer had accepted it.
			h.RemoteID = st.ID
			a.jobs.Patch(id, func(j *api.Job) {
				if j.Handover != nil {
					// A new value: copies of the record share the old one.
					hc := *j.Handover
					hc.RemoteID = st.ID
					j.Handover = &hc // stored with the next transition
				}
			})
		}
		if len(st.Log) > 0 {
			if err := appendFile(logPath, st.Log); err != nil {
				a.log.Warn("appending a handed-over job's output", "job", id, "err", err)
			} else {
				offset += int64(len(st.Log))
			}
		}
		if a.mirror(id, h, st) {
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
func (a *Agent) mirror(id string, h api.Handover, st RemoteStatus) bool {
	on := "on peer " + h.Peer + " as job " + st.ID
	step := func(from, to api.State, reason string, mutate func(*api.Job)) {
		if err := a.jobs.Move(id, from, to, reason, mutate); err != nil {
			a.log.Warn("mirroring a handed-over job", "job", id, "err", err)
		}
	}
	state := func() api.State {
		s, _ := a.jobs.State(id)
		return s
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
			t := a.jobs.Now()
			j.StartedAt = &t
		})
	}
	if !remote.Terminal() {
		return false
	}
	if st.LeaseEnded {
		a.takeBack(id, h, "peer "+h.Peer+" stopped the job when its lease ended (it heard nothing from this daemon)")
		return true
	}
	cur, ok := a.jobs.State(id)
	if !ok || cur.Terminal() {
		return true
	}
	if err := a.jobs.Move(id, "", remote, on+": "+st.Reason, func(j *api.Job) {
		j.Exit = st.Exit
		t := a.jobs.Now()
		j.FinishedAt = &t
	}); err != nil {
		a.log.Warn("recording the end of a handed-over job", "job", id, "err", err)
		return false
	}
	a.jobs.Poke()
	return true
}

// takeBack gives a job back to this daemon when its peer is lost: queued
// again if it had not started there; after it started, queued again only
// as its restart policy allows, else lost.
func (a *Agent) takeBack(id string, h api.Handover, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = a.o.Cancel(ctx, h) // best effort: it also stops there when its lease ends
	cancel()
	j, cancelled := a.jobs.TakeCancel(id)
	cur, attempt, restart := j.State, j.Attempt, j.Spec.Restart
	if cur == "" || cur.Terminal() { // forgotten, or ended
		return
	}
	var err error
	switch {
	case cancelled:
		err = a.jobs.Move(id, "", api.StateCancelled, why+"; cancelled before it was heard of again", func(j *api.Job) {
			t := a.jobs.Now()
			j.FinishedAt = &t
			j.Handover = nil
		})
	case cur == api.StatePlaced:
		err = a.jobs.Move(id, "", api.StatePending, why+"; it had not started there: queued again", func(j *api.Job) {
			j.Handover = nil
		})
	case restart != nil && restart.Policy == api.RestartOnFailure && attempt <= restart.MaxRetries:
		err = a.jobs.Move(id, "", api.StatePending, fmt.Sprintf("%s after it started there; restarting (retry %d of %d)", why, attempt, restart.MaxRetries), func(j *api.Job) {
			j.Handover = nil
		})
	default:
		err = a.jobs.Move(id, "", api.StateLost, why+" after it started there; its restart policy does not run it again", func(j *api.Job) {
			t := a.jobs.Now()
			j.FinishedAt = &t
		})
	}
	if err != nil {
		a.log.Error("taking back a handed-over job", "job", id, "err", err)
	}
	a.log.Warn("took back a handed-over job", "job", id, "peer", h.Peer, "why", why)
	a.jobs.Poke()
}

// CancelRemote forwards a cancel of job id, handed over as h, to its
// peer (the manager has recorded that a cancel was asked); the follower
// records the end when the peer reports it, and keeps asking while the
// peer cannot be reached.
func (a *Agent) CancelRemote(id string, h api.Handover) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.o.Cancel(ctx, h); err != nil {
		a.log.Warn("cancel not delivered to the peer yet; retrying", "job", id, "peer", h.Peer, "err", err)
	} else {
		a.jobs.ForgetCancel(id)
	}
}

// CancelOnStop asks the peers to cancel the jobs handed over from here
// (hs) when fusiond stops and stops its jobs with it
// (leave_jobs_on_shutdown: false); the next daemon records how they ended.
func (a *Agent) CancelOnStop(hs []api.Handover) {
	for _, h := range hs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := a.o.Cancel(ctx, h); err != nil {
			a.log.Warn("stopping: cancelling a handed-over job on its peer failed; its lease ends it", "peer", h.Peer, "key", h.Key, "err", err)
		}
		cancel()
	}
}
