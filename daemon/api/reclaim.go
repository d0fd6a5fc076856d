package api

import "time"

// ReclaimStatus is the reclaimed-capacity loop's state: what guaranteed
// and burstable jobs reserved but are not predicted to use, and how much
// of it best-effort jobs use.
type ReclaimStatus struct {
	// Enabled is false when the loop does not run; Reason says why.
	Enabled bool   `json:"enabled"`
	Reason  string `json:"reason,omitempty"`
	// ReclaimableCPU and ReclaimableMemory: reserved − predicted peak −
	// margin, summed over the guaranteed and burstable jobs.
	ReclaimableCPU    MilliCPU `json:"reclaimable_cpu"`
	ReclaimableMemory Bytes    `json:"reclaimable_memory"`
	// ReclaimedCPU and ReclaimedMemory: the part of it best-effort jobs
	// use now (their use beyond their own requests).
	ReclaimedCPU    MilliCPU `json:"reclaimed_cpu"`
	ReclaimedMemory Bytes    `json:"reclaimed_memory"`
	// PlacedCPU and PlacedMemory are what best-effort jobs placed on
	// reclaimed capacity hold of it: the part of their requests the
	// placer admitted beyond unreserved capacity.
	PlacedCPU    MilliCPU `json:"placed_cpu"`
	PlacedMemory Bytes    `json:"placed_memory"`
	// BestEffortCPU and BestEffortMemory are the best-effort jobs' use now.
	BestEffortCPU    MilliCPU `json:"besteffort_cpu"`
	BestEffortMemory Bytes    `json:"besteffort_memory"`
	// BudgetCPU and BudgetMemory are the limits reclaiming puts on the
	// best-effort tier now (0: none).
	BudgetCPU    MilliCPU `json:"budget_cpu"`
	BudgetMemory Bytes    `json:"budget_memory"`
	// LentCPU is what each best-effort job may use beyond its own CPU
	// request now (its cgroup's quota raised by it).
	LentCPU MilliCPU `json:"lent_cpu"`
	// Evictions counts best-effort jobs evicted to give memory back
	// (they end as preempted, or go back to pending with restart
	// on-failure).
	Evictions    int        `json:"evictions"`
	LastAction   string     `json:"last_action,omitempty"`
	LastActionAt *time.Time `json:"last_action_at,omitempty"`
}

// EventReclaim is the kind of a reclaimed-capacity action event.
const EventReclaim = "reclaim"
