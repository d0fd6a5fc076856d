package jobs

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

// QueueConfig tunes the queue and preemption: the daemon's `scheduling`
// config section (docs/scheduling.md, "Queue" and "Preemption").
type QueueConfig struct {
	// AgingPerMinute is the priority a pending job gains per minute it
	// waits (0: none). Pending jobs are ordered by sched.CompareQueued.
	AgingPerMinute float64
	// GangTimeout is how long the members of a gang wait for the rest of
	// it to be submitted before they fail (0: forever).
	GangTimeout time.Duration
	// NoPreemption turns preemption off.
	NoPreemption bool
	// MaxEvictions bounds the jobs preempted per PreemptionWindow (8 and
	// 10 minutes when zero).
	MaxEvictions     int
	PreemptionWindow time.Duration
	// Defrag tunes defragmentation (defrag.go).
	Defrag DefragConfig
}

// queueState is the queue's memory between passes; guarded by m.mu.
type queueState struct {
	// epoch is when the first pass ran: queue times are milliseconds
	// since (monotonic).
	epoch time.Time
	// queuedAt is when a pass first saw each pending job pending
	// (monotonic; a restarted daemon starts every job's wait anew).
	queuedAt map[string]time.Time
	// preempting maps each job told to stop for a preemption to the job
	// it makes room for; preemptor is the job the last preemption was
	// for, tried first while it is pending so what was freed goes to it.
	preempting map[string]string
	preemptor  string
	// reclaiming maps each job the reclaim loop told to stop to why
	// (reclaim.go).
	reclaiming map[string]string
	// evictions are when the jobs of the current window were preempted.
	evictions []time.Time
	// moving maps each job a defragmentation plan moves to the job it
	// makes room for, from the plan until the job is placed again, ends
	// otherwise, or waits after that job was placed or is gone;
	// madeRoom says, per job moves were made for, what was moved and
	// why, for its placement's event; budget counts the moves
	// (defrag.go).
	moving   map[string]string
	madeRoom map[string]string
	budget   moveBudget
	// shadowFor is the head whose shadow time shadowAt is: the earliest
	// one any pass computed while it was head.
	shadowFor string
	shadowAt  time.Time
}

// queued is one pending job or a whole gang, in queue order.
type queued struct {
	group []*api.Job
	// gang is set for a gang; complete when every member is pending.
	gang     *api.Gang
	members  int
	queuedAt time.Time
}

// endsBy reports whether every member of group has a run-time estimate
// and, starting now, is expected to end by t.
func (m *Manager) endsBy(group []*api.Job, now, t time.Time) bool {
	if m.cfg.Estimator == nil {
		return false
	}
	for _, j := range group {
		est, ok := m.cfg.Estimator.EstimateJob(j)
		if !ok || est < 0 || now.Add(est).After(t) {
			return false
		}
	}
	return true
}

// schedule runs one pass over the queue. Pending jobs are ordered by
// sched.CompareQueued (priority plus aging, then time queued, then ID);
// the job the last preemption made room for goes first while it waits.
// Each job (a gang: all its members, placed all-or-nothing once all are
// pending) is tried in that order. The first one that does not fit is the
// head: it holds a reservation (EASY backfill: every job behind it is
// placed only where it leaves what the head needs, Backfiller.PlaceBehind)
// and, if it is a single job and preemption is on, may preempt lower-tier
// jobs (preempt.go). With run times (Config.Estimator and a Shadower
// placer) the head also has a shadow time, when it is expected to fit as
// the jobs holding resources end (each at its start plus its estimate; a
// job without one holds on), the earliest any pass computed while it is
// head (earliestShadow); a job behind it that PlaceBehind refuses is
// placed anyway when every member is expected to end by then. An
// estimate that is too short can delay the head (EASY's trade).
func (m *Manager) schedule() {
	m.mu.Lock()
	if m.cordoned {
		m.mu.Unlock()
		return
	}
	now := time.Now()
	q := &m.queue
	if q.queuedAt == nil {
		q.epoch, q.queuedAt, q.preempting = now, map[string]time.Time{}, map[string]string{}
		q.moving, q.madeRoom, q.budget = map[string]string{}, map[string]string{}, newMoveBudget(m.cfg.Queue.Defrag)
	}
	var pending []*api.Job
	active := map[uint32]int{}
	// ends are the expected ends of the jobs holding resources, for the
	// head's shadow time (EASY backfill with run times).
	var ends map[string]time.Time
	if m.cfg.Estimator != nil {
		ends = map[string]time.Time{}
	}
	for _, j := range m.jobs {
		if ends != nil && j.Spec.Pod == nil && (j.State == api.StatePlaced || j.State == api.StateStarting || j.State == api.StateRunning) {
			if est, ok := m.cfg.Estimator.EstimateJob(j); ok {
				start := now // placed or starting: it starts about now
				if j.State == api.StateRunning && j.StartedAt != nil {
					start = *j.StartedAt
				}
				ends[j.ID] = start.Add(est)
			}
		}
		switch j.State {
		case api.StatePending:
			if m.releasing[j.ID] || j.Spec.Pod != nil {
				// Its last placement is being given back, or it is a
				// pod's device hold (pods.go): never queued.
				continue
			}
			pending = append(pending, j)
			if _, ok := q.queuedAt[j.ID]; !ok {
				q.queuedAt[j.ID] = pendingSince(j, now)
			}
		case api.StatePlaced, api.StateStarting, api.StateRunning:
			if j.Spec.Pod == nil { // kubelet's holds are not root's jobs
				active[j.Owner.UID]++
			}
		}
	}
	for id := range q.queuedAt {
		if j := m.jobs[id]; j == nil || j.State != api.StatePending {
			delete(q.queuedAt, id)
		}
	}
	if j := m.jobs[q.preemptor]; j == nil || j.State != api.StatePending {
		q.preemptor = ""
	}
	for id := range q.preempting {
		if j := m.jobs[id]; j == nil || j.State != api.StateRunning && j.State != api.StateStarting {
			delete(q.preempting, id) // ended and recorded, or forgotten
		}
	}
	// unpin are the jobs whose pins go: those of a plan whose head was
	// placed or is gone.
	var unpin []string
	for id, by := range q.moving {
		// Kept while it stops and waits to be placed again, but only
		// while the head it made room for waits: after that it is
		// queued as any other job, its pin dropped.
		h := m.jobs[by]
		headWaits := h != nil && h.State == api.StatePending
		if j := m.jobs[id]; j == nil || j.State.Terminal() || j.State != api.StatePending && j.MovingFor == "" || j.State == api.StatePending && !headWaits {
			delete(q.moving, id)
			if !headWaits {
				unpin = append(unpin, id)
			}
		}
	}
	for id := range q.madeRoom {
		if j := m.jobs[id]; j == nil || j.State != api.StatePending {
			delete(q.madeRoom, id)
			unpin = append(unpin, id)
		}
	}
	for id := range q.reclaiming {
		if j := m.jobs[id]; j == nil || j.State != api.StateRunning && j.State != api.StateStarting {
			delete(q.reclaiming, id) // ended otherwise (cancelled, lost)
		}
	}
	keys := make(map[*api.Job]sched.Queued, len(pending))
	for _, j := range pending {
		keys[j] = sched.Queued{Priority: j.Spec.Priority, Enqueued: q.queuedAt[j.ID].Sub(q.epoch).Milliseconds(), Tie: fmt.Sprintf("%020d", idNum(j.ID))}
	}
	queuedAt := maps.Clone(q.queuedAt)
	first := q.preemptor
	// Jobs being moved go right after first, to their planned places,
	// while the head they made room for waits (pruned above).
	moved := map[string]bool{}
	for id := range q.moving {
		moved[id] = true
	}
	var blocked string
	for _, id := range slices.Sorted(maps.Keys(m.unreserved)) {
		blocked = fmt.Sprintf("waiting: re-attached job %s holds resources that could not be reserved again (%s); nothing is placed until it ends", id, m.unreserved[id])
		break
	}
	m.mu.Unlock()
	if d, ok := m.placer.(Defragmenter); ok && len(unpin) > 0 {
		d.Unpin(unpin)
	}
	if blocked != "" {
		m.setWaiting(pending, blocked)
		return
	}
	nowMs, rate := now.Sub(m.queue.epoch).Milliseconds(), m.cfg.Queue.AgingPerMinute/60000
	// A peer's job comes after every local one: it runs here only where
	// it delays no job queued here (it is backfill, whatever priority
	// its origin gave it).
	slices.SortFunc(pending, func(a, b *api.Job) int {
		return cmp.Or(cmp.Compare(b32(a.ID == first), b32(b.ID == first)), cmp.Compare(b32(moved[a.ID]), b32(moved[b.ID])), cmp.Compare(b32(a.Origin == nil), b32(b.Origin == nil)),
			sched.CompareQueued(keys[a], keys[b], nowMs, rate))
	})

	backfill, _ := m.placer.(Backfiller)
	shadower, _ := m.placer.(Shadower)
	var head []*api.Job
	// shadow is when the head is expected to fit (hasShadow: known).
	var shadow time.Time
	hasShadow := false
	passAt := now // the FitsEmpty switch below shadows now
	ahead := 0
	for _, e := range groupQueue(pending, queuedAt) {
		group, j := e.group, e.group[0]
		if e.gang != nil && len(group) < e.members {
			if t := m.cfg.Queue.GangTimeout; t > 0 && now.Sub(e.queuedAt) > t {
				m.failPending(group, fmt.Sprintf("gang %q incomplete: %d of %d members submitted within %s (scheduling.gang_timeout)", e.gang.Name, len(group), e.members, t))
				continue
			}
			m.setWaiting(group, fmt.Sprintf("waiting for gang %q: %d of %d members submitted", e.gang.Name, len(group), e.members))
			continue
		}
		if uid := j.Owner.UID; m.overRunningLimit(active, uid, len(group)) {
			m.setWaiting(group, fmt.Sprintf("waiting: %s has %d jobs placed or running, the most allowed (limit %s)",
				api.UserName(uid, j.Owner.User), active[uid], LimitRunningJobs))
			continue
		}
		if m.handingOver(j) {
			continue // offered to peers right now
		}
		decided := time.Now()
		var allocs []api.Allocation
		var why string
		var ok bool
		if head != nil && backfill != nil {
			allocs, why, ok = backfill.PlaceBehind(group, head)
			if !ok && hasShadow && m.endsBy(group, now, shadow) {
				// It takes what the head waits for, but is expected
				// to give it back before the head could start.
				if a, _, placed := m.placer.Place(group); placed {
					allocs, ok = a, true
				}
			}
		} else {
			allocs, why, ok = m.placer.Place(group)
		}
		m.cfg.Observer.Decided(ok, len(group), time.Since(decided))
		if !ok && m.overflow(group, why) {
			continue // handed to peers (daemon/internal/handover)
		}
		if ok && j.ID != first && !moved[j.ID] && m.poorFit(group) {
			// Fits here poorly, a peer ranks better: offered to it (not
			// the job jobs were preempted here for).
			continue
		}
		if !ok && j.Origin != nil {
			// A peer's job that does not fit now is refused (admit.go):
			// it neither holds the head's reservation nor preempts.
			m.setWaiting(group, why)
			continue
		}
		if !ok {
			w := sched.Waiting{Reason: why, Ahead: ahead}
			if head == nil && backfill != nil {
				switch ever, now := backfill.FitsEmpty(group); {
				case !ever && e.gang != nil && m.ho == nil:
					m.failPending(group, fmt.Sprintf("gang %q of %d can never fit on this host together: %s", e.gang.Name, len(group), why))
					continue
				case !ever:
					// Only peers can run it (with peers on, Admit lets
					// such jobs in): no reservation here.
					w.Reason += "; cannot fit on this host even empty: waiting for a peer to take it"
				case !now:
					// Waits for devices out of service: holding a
					// reservation meanwhile would stop the jobs behind it.
					w.Reason += "; does not fit even with nothing else running while devices are out of service"
				default:
					head = group
					w.Reserved = "room on this host"
					if shadower != nil && ends != nil {
						shadow, hasShadow = shadower.ShadowTime(group, ends, passAt)
					}
					shadow, hasShadow = m.earliestShadow(j.ID, shadow, hasShadow)
					if len(group) == 1 {
						s := m.preempt(j)
						if s == "" {
							s = m.defrag(j)
						}
						if s != "" {
							w.Reason += "; " + s
						}
					}
				}
			}
			m.setWaiting(group, w.String())
			ahead += len(group)
			continue
		}
		m.mu.Lock()
		if q.preemptor == j.ID {
			q.preemptor = ""
		}
		roomMade := q.madeRoom[j.ID]
		delete(q.madeRoom, j.ID)
		m.mu.Unlock()
		for i, member := range group {
			alloc := allocs[i]
			summary, _, _ := strings.Cut(cmp.Or(alloc.Explain, "resources reserved"), "\n")
			if roomMade != "" {
				summary += "; " + roomMade
			}
			place := m.transition
			m.mu.Lock()
			_, held := m.holds[member.ID]
			m.mu.Unlock()
			if member.Origin != nil && !held {
				// A peer's job to start now: its start stores the
				// placement (placeUnstored), so the offer's answer
				// waits for no second write.
				place = func(j *api.Job, _ api.State, reason string, mutate func(*api.Job)) error {
					return m.placeUnstored(j, reason, mutate)
				}
			}
			if err := place(member, api.StatePlaced, "placed: "+summary, func(j *api.Job) {
				j.Allocation = &alloc
			}); err != nil {
				m.release(member)
				m.log.Error("recording placement", "job", member.ID, "err", err)
				continue
			}
			active[member.Owner.UID]++
			m.mu.Lock()
			hold, held := m.holds[member.ID]
			delete(m.holds, member.ID)
			m.mu.Unlock()
			if held {
				m.ho.Hold(member.ID, hold) // a gang member from a peer: started by its commit
				continue
			}
			m.wg.Add(1)
			go m.launch(member)
		}
	}
	if head == nil {
		m.earliestShadow("", time.Time{}, false) // no head: forgotten
	}
}

// earliestShadow keeps, for head id, the earliest shadow time any pass
// computed while it was head, and returns it: a head's shadow time only
// moves earlier (docs/scheduling.md, "Run-time estimates"). A pass that
// computes none keeps the earlier one.
func (m *Manager) earliestShadow(id string, t time.Time, ok bool) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := &m.queue
	if q.shadowFor != id {
		q.shadowFor, q.shadowAt = "", time.Time{}
	}
	if q.shadowFor != "" && (!ok || q.shadowAt.Before(t)) {
		return q.shadowAt, true
	}
	if ok {
		q.shadowFor, q.shadowAt = id, t
	}
	return t, ok
}

func b32(b bool) int {
	if b {
		return 0
	}
	return 1
}

// groupQueue turns ordered pending jobs into the queue's entries: each
// job alone, or a gang at its first member's place with its members in
// order (at most its size).
func groupQueue(pending []*api.Job, queuedAt map[string]time.Time) []queued {
	var out []queued
	at := map[string]int{}
	for _, j := range pending {
		g := j.Spec.Gang
		if g == nil || j.Origin != nil {
			// A peer's member of a cross-host gang is placed alone:
			// its origin holds the gang together.
			out = append(out, queued{group: []*api.Job{j}, queuedAt: queuedAt[j.ID]})
			continue
		}
		key := gangKey(j)
		i, ok := at[key]
		if !ok {
			at[key] = len(out)
			out = append(out, queued{gang: g, members: g.Size, queuedAt: queuedAt[j.ID]})
			i = len(out) - 1
		}
		e := &out[i]
		if len(e.group) < e.members {
			e.group = append(e.group, j)
		}
		if t := queuedAt[j.ID]; t.Before(e.queuedAt) {
			e.queuedAt = t
		}
	}
	return out
}

// failPending records queued jobs that can never be placed as failed.
func (m *Manager) failPending(group []*api.Job, reason string) {
	for _, j := range group {
		_ = m.transitionFrom(j, api.StatePending, api.StateFailed, reason, func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
		})
	}
}

// pendingSince is when j last became pending, from its recorded events (so
// a job's aging survives a daemon restart), else its creation; never
// later than now.
func pendingSince(j *api.Job, now time.Time) time.Time {
	t := j.CreatedAt
	for i := len(j.Events) - 1; i >= 0; i-- {
		if e := j.Events[i]; e.To == api.StatePending && !e.Time.IsZero() {
			t = e.Time
			break
		}
	}
	if t.IsZero() || t.After(now) {
		return now
	}
	return t
}
