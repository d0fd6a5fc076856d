package jobs

import (
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// Observer is told what the manager does, as it happens (the daemon's
// metrics). Its methods are called without the manager's lock held and
// must not block.
type Observer interface {
	// Submitted: a job was accepted and stored.
	Submitted(class api.Class, tier api.Tier)
	// Transitioned: a job moved from one state to another (recorded).
	Transitioned(from, to api.State)
	// Decided: one placement decision over a group of jobs (one job, or a
	// whole gang) took took; placed says whether it reserved resources.
	Decided(placed bool, jobs int, took time.Duration)
	// Waited: a job of class left the queue (was placed) after waiting
	// waited since it last became pending.
	Waited(class api.Class, waited time.Duration)
}

// PreemptionObserver is an Observer that is also told of every job
// preempted (told to stop for a preemption), by the victim's tier.
type PreemptionObserver interface {
	Preempted(tier api.Tier)
}

// MoveObserver is an Observer that is also told of every job moved (told
// to stop to be started again elsewhere, defrag.go), by its tier.
type MoveObserver interface {
	Moved(tier api.Tier)
}

type noObserver struct{}

func (noObserver) Submitted(api.Class, api.Tier)     {}
func (noObserver) Transitioned(api.State, api.State) {}
func (noObserver) Decided(bool, int, time.Duration)  {}
func (noObserver) Waited(api.Class, time.Duration)   {}

// Group is the number of jobs in one state, class and tier.
type Group struct {
	State api.State
	Class api.Class
	Tier  api.Tier
	Count int
}

// Stats is a snapshot of the job table for metrics.
type Stats struct {
	// Groups counts the jobs the manager remembers by state, class and
	// tier (every combination that has at least one job).
	Groups []Group
	// Queued is the number of pending jobs; OldestWait how long the
	// longest-waiting of them has been pending (0 when none is).
	Queued     int
	OldestWait time.Duration
	Cordoned   bool
}

// Stats counts the jobs by state, class and tier and measures the queue.
func (m *Manager) Stats() Stats {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	type key struct {
		s api.State
		c api.Class
		t api.Tier
	}
	counts := map[key]int{}
	st := Stats{Cordoned: m.cordoned}
	for _, j := range m.jobs {
		counts[key{j.State, j.Spec.Class, j.Tier}]++
		if j.State == api.StatePending {
			st.Queued++
			if n := len(j.Events); n > 0 {
				st.OldestWait = max(st.OldestWait, now.Sub(j.Events[n-1].Time))
			}
		}
	}
	for k, n := range counts {
		st.Groups = append(st.Groups, Group{State: k.s, Class: k.c, Tier: k.t, Count: n})
	}
	return st
}
