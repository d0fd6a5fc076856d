// Package jobs is fusiond's job manager: the lifecycle state machine, the
// queue that hands pending jobs to a Placer, the Runner that starts them,
// and the event stream. Every state change is written to the store before
// the manager acts on it, except a peer's job placed to start now: its
// placement is written with its start, before anything is started
// (placeUnstored).
//
// It owns the job lifecycle and may import daemon/api, daemon/sched (the
// queue's ordering and backfill rule), daemon/internal/store,
// devices (grants) and the standard library; it talks to placement,
// device preparation and execution only through the interfaces it defines
// (Placer, Preparer, Runner).
package jobs

import (
	"fmt"

	"github.com/fusiond/fusiond/daemon/api"
)

// transitions lists, for each state, the states a job may move to.
//
//	pending  → placed | cancelled | failed
//	placed   → starting | pending (placement dropped) | cancelled
//	starting → running | failed | cancelled | lost | pending (not started: shutdown)
//	running  → succeeded | failed | cancelled | lost | preempted | pending (restart, or preempted with restart on-failure)
var transitions = map[api.State][]api.State{
	api.StatePending:  {api.StatePlaced, api.StateCancelled, api.StateFailed},
	api.StatePlaced:   {api.StateStarting, api.StatePending, api.StateCancelled},
	api.StateStarting: {api.StateRunning, api.StateFailed, api.StateCancelled, api.StateLost, api.StatePending},
	api.StateRunning:  {api.StateSucceeded, api.StateFailed, api.StateCancelled, api.StateLost, api.StatePending, api.StatePreempted},
}

// CanTransition reports whether the state machine allows from → to.
func CanTransition(from, to api.State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ErrBadTransition is returned for a transition the state machine forbids.
var ErrBadTransition = fmt.Errorf("transition not allowed")
