// Package sched is fusiond's placement engine. It is pure and deterministic:
// it performs no I/O, reads no clock and holds no global state; every source
// of randomness is a seed passed in by the caller, and logical time (for
// queue aging) is a number the caller supplies.
//
// The same code places jobs on the one local host (the daemon passes a
// single Node) and on the 1213 simulated nodes of the openb trace (the
// simulator in cmd/fusionctl/internal/sim passes them all).
//
// A placement runs filter → score → choose:
//
//   - Filter rejects nodes that cannot host the request (capacity, allowed
//     GPU models, MIG profile, FPGA bitstream, topology policy) and records
//     why (FilterReason).
//   - Score rates each remaining node with a Policy. fusiond's own policy
//     (Weighted) is Σ w_d·s_d over the dimensions compute, locality,
//     fragmentation, energy, load and priority, each normalised to [0,1],
//     with a weight Profile per job class. The paper baselines (Random,
//     DotProd, GpuClustering, GpuPacking, BestFit, FGD) are Policies too.
//   - Choose takes the best score; ties are broken with the engine's seeded
//     generator. Inside the node the policy also picks which devices
//     (Assignment): NVLink-connected GPU sets, cores on the GPUs' NUMA node,
//     the MIG slot that keeps the rest of the GPU usable.
//
// Gangs (all-or-nothing, PlaceGang), the queue's one ordering rule
// (CompareQueued: priority with aging) with EASY backfill (Queue.Schedule
// over many nodes, BackfillAllowed on one), and preemption planning with a
// victim budget (PlanPreemption) and defragmentation (Engine.PlanMoves:
// the fewest moves of movable work after which a request fits, each
// victim re-placed by the policy) build on Engine.Place. Where a placement
// is decided on a stale, shared view (peers offering jobs to each other),
// SpreadChoice orders the ranked candidates so that origins deciding at
// once do not all pick the same best one.
//
// The package is also the scheduling vocabulary of the whole project: Class,
// Tier (ordered by Tier.Rank) and TopologyPolicy are defined here once.
// daemon/api aliases them for the wire (their JSON is their string) and
// package cgroups names its tier cgroups after Tier; both may import this
// package because it imports nothing of the project.
//
// Exclusive cores are counted here per NUMA node (Node.FreeCores,
// Assignment.Cores, Node.KeepSharedCores for the shared pool's minimum) to
// filter, score and choose the NUMA node of a job's cores; the daemon's
// host placer (daemon/internal/hostplacer) then takes that many concrete
// cores on each chosen node.
package sched
