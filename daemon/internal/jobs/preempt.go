package jobs

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Preemption (docs/scheduling.md, "Preemption"): the head of the queue, a
// single job that does not fit, may evict running jobs of strictly lower
// tiers, best-effort first, the fewest then the cheapest (the shortest
// running: least work lost) that make it fit, as the Preempter plans
// them; at most QueueConfig.MaxEvictions per PreemptionWindow. One
// preemption is in flight at a time. Victims get SIGTERM, then SIGKILL
// after CancelGrace; when one ends it is recorded preempted (restart
// never) or queued again (restart on-failure, not counted as a retry),
// with PreemptedBy naming the preemptor, which is then tried first so
// what was freed goes to it.

const (
	defaultMaxEvictions     = 8
	defaultPreemptionWindow = 10 * time.Minute
)

// preempt starts a preemption for head if it can and says in words what
// head waits for ("" when preemption is off or nothing applies).
func (m *Manager) preempt(head *api.Job) string {
	pl, ok := m.placer.(Preempter)
	if !ok || m.cfg.Queue.NoPreemption {
		return ""
	}
	budget, window := m.cfg.Queue.MaxEvictions, m.cfg.Queue.PreemptionWindow
	if budget <= 0 {
		budget = defaultMaxEvictions
	}
	if window <= 0 {
		window = defaultPreemptionWindow
	}
	now := time.Now()
	m.mu.Lock()
	q := &m.queue
	if len(q.preempting) > 0 {
		var ids []string
		for v, by := range q.preempting {
			if by == head.ID {
				ids = append(ids, v)
			}
		}
		m.mu.Unlock()
		if len(ids) == 0 {
			return "" // a preemption for another job is in flight
		}
		slices.SortFunc(ids, func(a, b string) int { return cmpID(a, b) })
		return fmt.Sprintf("preempted %s for it; waiting for them to stop", strings.Join(ids, ", "))
	}
	q.evictions = slices.DeleteFunc(q.evictions, func(t time.Time) bool { return now.Sub(t) >= window })
	left := budget - len(q.evictions)
	costs := map[string]float64{}
	procs := map[string]Process{}
	for id, j := range m.jobs {
		p := m.procs[id]
		if j.State != api.StateRunning || p == nil || m.cancels[id] || m.overtimeStopping(id) || q.reclaiming[id] != "" || j.MovingFor != "" || j.Tier.Rank() >= head.Tier.Rank() {
			continue
		}
		cost := 0.0
		if j.StartedAt != nil {
			cost = max(0, m.now().Sub(*j.StartedAt).Seconds())
		}
		costs[id], procs[id] = cost, p
	}
	m.mu.Unlock()
	if len(costs) == 0 {
		return ""
	}
	if left <= 0 {
		return fmt.Sprintf("preemption budget spent (%d per %s)", budget, window)
	}
	victims, err := pl.PlanPreemption(head, costs, left)
	if err != nil {
		if !errors.Is(err, sched.ErrNoPreemption) {
			m.log.Warn("planning a preemption", "job", head.ID, "err", err)
		}
		return ""
	}
	if len(victims) == 0 {
		return ""
	}
	m.mu.Lock()
	// A victim that ended since its process was looked up is gone
	// already: its room is free, and it is not recorded as preempted.
	victims = slices.DeleteFunc(victims, func(v string) bool { return m.procs[v] != procs[v] })
	for _, v := range victims {
		q.preempting[v] = head.ID
		q.evictions = append(q.evictions, now)
	}
	q.preemptor = head.ID
	m.mu.Unlock()
	if len(victims) == 0 {
		return ""
	}
	m.log.Info("preempting", "job", head.ID, "victims", victims)
	po, _ := m.cfg.Observer.(PreemptionObserver)
	for _, v := range victims {
		m.mu.Lock()
		vj := m.jobs[v]
		m.mu.Unlock()
		if po != nil {
			po.Preempted(vj.Tier)
		}
		m.annotate(vj, fmt.Sprintf("preempted by job %s (tier %s); stopping: SIGTERM, SIGKILL after %s", head.ID, head.Tier, m.cfg.CancelGrace), func(j *api.Job) {
			j.PreemptedBy = head.ID
		})
		_ = procs[v].Signal(syscall.SIGTERM)
		go m.killAfterGrace(v, procs[v])
	}
	return fmt.Sprintf("preempted %s for it; waiting for them to stop", strings.Join(victims, ", "))
}

// preemptedBy takes the record that id was told to stop for a preemption:
// the preemptor's ID, reclaimEviction for the reclaim loop's eviction, or
// "" if it was not.
func (m *Manager) preemptedBy(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.queue.reclaiming[id]; ok {
		return reclaimEviction // finishEvicted takes the entry
	}
	by := m.queue.preempting[id]
	delete(m.queue.preempting, id)
	return by
}

// finishPreempted records how a preempted job ended: queued again with
// restart on-failure (its retries left untouched), preempted otherwise.
func (m *Manager) finishPreempted(j *api.Job, by, desc string, record func(*api.Job)) error {
	if by == reclaimEviction {
		return m.finishEvicted(j, desc, record)
	}
	if r := j.Spec.Restart; r != nil && r.Policy == api.RestartOnFailure {
		return m.transition(j, api.StatePending, fmt.Sprintf("preempted by job %s (%s); queued again (not counted as a retry)", by, desc), func(j *api.Job) {
			record(j)
			j.FinishedAt = nil
			j.Allocation = nil
			j.PID = 0
			j.PreemptedBy = by
			j.Preemptions++
		})
	}
	return m.transition(j, api.StatePreempted, fmt.Sprintf("preempted by job %s (%s)", by, desc), func(j *api.Job) {
		record(j)
		j.PreemptedBy = by
		j.Preemptions++
	})
}

func cmpID(a, b string) int {
	x, y := idNum(a), idNum(b)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return strings.Compare(a, b)
}
