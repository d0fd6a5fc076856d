// Package sim replays GPU-cluster traces in the openb CSV format (the
// Alibaba trace of the FGD paper, ATC'23) through the daemon/sched engine,
// offline and deterministic for a seed. It implements the paper's protocol
// (Run) — pods resampled to a target share of GPU capacity, shuffled by
// seed, arriving one by one and never leaving — with a variant that may
// move best-effort pods for a pod that fits nowhere (Options.Moves, at
// most N moves per 1,000 arrivals, through sched.Engine.PlanMoves) — and a time-ordered mode
// (RunTimed) that honours creation and deletion times and reports the
// GPUs' energy under a stated power model (PowerModel), per GPU-hour and
// per unit of delivered compute (A100-equivalent GPU-hours from the GPU
// model table's FP16 throughput), and an upper bound
// on what any policy could allocate (Bound). NewCommand exposes them
// as `fusionctl simulate`.
//
// It runs only offline, in fusionctl; the daemon never links it. It may
// import daemon/sched, the standard library and gonum (the bound's LP).
package sim
