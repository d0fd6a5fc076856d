package sched

import "math"

// FragParams are the knobs of fusiond's lexicographic fragmentation
// dimension (frag.go, reserve.go). The zero value and DefaultFragParams
// are the shipped policy; `fusionctl simulate --tune` searches them on the
// openb replay (docs/benchmarks.md).
type FragParams struct {
	// ReserveSteps is the reserve key's resolution: sigmoid(gain/1000)
	// on this many steps (0: 10).
	ReserveSteps int `json:"reserve_steps"`
	// ReserveFrac selects the reserve's large shapes: whole-GPU shapes of
	// at least two GPUs asking for at least this share of the largest
	// whole-GPU count seen (0: 0.5).
	ReserveFrac float64 `json:"reserve_frac"`
	// ReserveMaxShare turns the reserve off when the large shapes are
	// more than this share of all requests: then they are common enough
	// for FGD's measure to weigh them (0: 0.03).
	ReserveMaxShare float64 `json:"reserve_max_share"`
	// ReserveUncovered keeps in the reserve only the large shapes that
	// are not among the typical shapes (FGD's measure already weighs
	// those).
	ReserveUncovered bool `json:"reserve_uncovered"`
	// Tail is the measure after the reserve key (before the engine's node
	// ranking).
	Tail TailKey `json:"tail"`
	// SliverMass, when above 0, adds a key after the reserve for shared
	// requests: 1 when the share the request leaves on its GPU is 0 or
	// usable by typical GPU shapes holding at least this share of the
	// typical GPU requests, else 0.
	SliverMass float64 `json:"sliver_mass"`
	// FullNodesAsFGD scores a CPU-only request on a node with GPUs but
	// none free by the keys (as FGD does: nothing to fragment, a neutral
	// score) instead of as a perfect fit (the default).
	FullNodesAsFGD bool `json:"full_nodes_as_fgd"`
	// ExactLast adds FGD's measure unquantised as the last key, before
	// the node ranking.
	ExactLast bool `json:"exact_last"`
	// CPUOnlyTailMax and CPUOnlyFullMax are the rule that switches the
	// keys for CPU-only requests by the workload the policy has learned
	// (Effective): when the typical shapes' CPU-only share
	// (FragModel.CPUOnlyShare) is above CPUOnlyTailMax, the CPU-only
	// capacity tail is off (Tail capacity-cpu becomes none); when it is
	// above CPUOnlyFullMax, CPU-only requests on nodes with no free GPU
	// are scored by the keys (FullNodesAsFGD). Each in (0, 1]; 0: the
	// default; 1: never.
	CPUOnlyTailMax float64 `json:"cpu_only_tail_max"`
	CPUOnlyFullMax float64 `json:"cpu_only_full_max"`
	// ReserveOffKeepsCPUKeys keeps fusiond's CPU-only keys where the
	// reserve is off because the large shapes are common
	// (ReserveMaxShare). By default (false) the rule makes them FGD's
	// there as well — the CPU-only capacity tail off, full nodes scored
	// by the keys — so that, with neither the reserve nor the CPU-only
	// keys, fusiond places as FGD does where FGD's measure already
	// weighs the large shapes.
	ReserveOffKeepsCPUKeys bool `json:"reserve_off_keeps_cpu_keys"`
}

// TailKey names the measure fusiond's fragmentation dimension ranks by
// after the reserve key.
type TailKey int

// The tail keys.
const (
	// TailCapacityCPUOnly: the multi-copy (capacity) measure, for
	// CPU-only requests only (the default).
	TailCapacityCPUOnly TailKey = iota
	// TailNone: no tail key.
	TailNone
	// TailCapacityAll: the capacity measure for every request.
	TailCapacityAll
	// TailStrandAll: the GPU share typical shapes could not use for want
	// of CPU on the node (strandFrag), for every request.
	TailStrandAll
	// TailStrandGPU: the strand measure for GPU requests, nothing for
	// CPU-only ones.
	TailStrandGPU
	// NumTails counts the tail keys.
	NumTails
)

var tailNames = [NumTails]string{"capacity-cpu", "none", "capacity-all", "strand-all", "strand-gpu"}

func (t TailKey) String() string {
	if t >= 0 && t < NumTails {
		return tailNames[t]
	}
	return "tail?"
}

// DefaultFragParams are the shipped values: the policy before the
// `fusionctl simulate --tune` search plus a reserve share limit, and the
// CPU-only rule's thresholds a later search chose; docs/benchmarks.md
// ("Tuning") says why not all of the first search's choice. The share
// limit was 0.05 (the first search's choice, reserve off on
// multigpu40/50); with the CPU-only keys FGD's where the reserve is off,
// a search of it alone on the train seeds 42..46 of all 24 pod lists
// chose 0.03, which turns the reserve off on multigpu30 too (large shapes
// 3.75 % of requests; multigpu20 has 2.3–2.4 %).
func DefaultFragParams() FragParams {
	return FragParams{ReserveSteps: 10, ReserveFrac: 0.5, ReserveMaxShare: 0.03, Tail: TailCapacityCPUOnly, CPUOnlyTailMax: DefaultCPUOnlyTailMax, CPUOnlyFullMax: DefaultCPUOnlyFullMax}
}

// The CPU-only rule's default thresholds (FragParams.CPUOnlyTailMax,
// CPUOnlyFullMax): the CPU-only share of the typical shapes above which
// the CPU-only capacity tail is off, and above which full nodes are
// scored as FGD scores them. `fusionctl simulate --tune --tune-only
// cpu_only_tail_max,cpu_only_full_max` chose them on the train seeds
// 42..46 of the 24 openb pod lists (docs/benchmarks.md): the tail off
// from cpu200 up (CPU-only share 0.20–0.31; the other pod lists have
// 0.14 or less), full nodes as FGD on cpu300 alone (0.30–0.31; cpu250
// has 0.25–0.26).
const (
	DefaultCPUOnlyTailMax = 0.15
	DefaultCPUOnlyFullMax = 0.275
)

// Effective resolves fp against the shape model m the policy judges
// fragmentation by: the defaults for zero values, then the CPU-only rule
// (CPUOnlyTailMax, CPUOnlyFullMax, ReserveOffKeepsCPUKeys; a nil m has no
// CPU-only and no large shapes). It is pure; the policy applies its
// result on its first decision after each SetFragModel.
func (fp FragParams) Effective(m *FragModel) FragParams {
	fp = fp.withDefaults()
	share := m.CPUOnlyShare()
	_, common := fp.reserveOf(m)
	fgdKeys := common && !fp.ReserveOffKeepsCPUKeys
	if (share > fp.CPUOnlyTailMax || fgdKeys) && fp.Tail == TailCapacityCPUOnly {
		fp.Tail = TailNone
	}
	if share > fp.CPUOnlyFullMax || fgdKeys {
		fp.FullNodesAsFGD = true
	}
	return fp
}

// CPUOnlyShare is the popularity of the typical shapes that ask for no
// GPU (0 for a nil model).
func (f *FragModel) CPUOnlyShare() float64 {
	if f == nil {
		return 0
	}
	var out float64
	for _, s := range f.Shapes {
		if s.GPUs == 0 && s.GPUMilli == 0 {
			out += s.P
		}
	}
	return out
}

func (fp FragParams) withDefaults() FragParams {
	d := DefaultFragParams()
	if fp.ReserveSteps <= 0 {
		fp.ReserveSteps = d.ReserveSteps
	}
	if fp.ReserveFrac <= 0 {
		fp.ReserveFrac = d.ReserveFrac
	}
	if fp.ReserveMaxShare <= 0 {
		fp.ReserveMaxShare = d.ReserveMaxShare
	}
	if fp.CPUOnlyTailMax <= 0 {
		fp.CPUOnlyTailMax = d.CPUOnlyTailMax
	}
	if fp.CPUOnlyFullMax <= 0 {
		fp.CPUOnlyFullMax = d.CPUOnlyFullMax
	}
	return fp
}

// fragKeys folds the measures of e into fusiond's fragmentation score
// (in [0,1], ordered lexicographically): FGD's coarse measure, the
// reserve on fp.ReserveSteps steps, then the sliver key, the tail measure
// and the exact FGD measure, each where enabled.
func fragKeys(fp *FragParams, e *fragEntry, sliver float64) float64 {
	steps := float64(fp.ReserveSteps)
	r := math.Trunc(sigmoid(e.res/1000) * steps)
	t := e.sig2 // 0 where the tail measure does not apply
	if fp.ExactLast {
		t = (math.Trunc(t*1000) + 0.999*e.sig) / 1001
	}
	if fp.SliverMass > 0 {
		t = (sliver + 0.999*t) / 2
	}
	return (math.Trunc(e.sig*maxScore) + (r+t)/(steps+1)) / (maxScore + 1)
}

// sliverKey is 1 when the share req leaves on GPU g of n is 0 or usable
// by typical GPU shapes holding at least mass of the typical GPU requests
// (usable is the model's cumulative mass by share, see linkFrag), else 0;
// 1 for requests that are not shared.
func sliverKey(req *Request, n *Node, g int, mass float64, usable []shareMass) float64 {
	if !req.Shared() || g < 0 || g >= len(n.GPUs) {
		return 1
	}
	left := n.GPUs[g].MilliFree - req.GPUMilli
	if left <= 0 {
		return 1
	}
	var m float64
	for _, u := range usable {
		if u.milli > left {
			break
		}
		m = u.cum
	}
	if m >= mass {
		return 1
	}
	return 0
}

// shareMass is the cumulative share of typical GPU requests asking for at
// most milli of one GPU.
type shareMass struct {
	milli int64
	cum   float64
}

// strandFrag is the CPU-stranding measure: for each typical GPU shape,
// the idle GPU milli it could not use on the node because the node's free
// CPU runs out first (whatever the GPUs' packing), weighted by its
// popularity.
func (f *FragModel) strandFrag(model string, cpuFree int64, free []int64) float64 {
	var total int64
	for _, m := range free {
		total += m
	}
	if total == 0 {
		return 0
	}
	acc := f.accessFor(model)
	var out float64
	for k := range f.Shapes {
		s := &f.Shapes[k]
		if s.GPUMilli == 0 || !acc[k] || s.CPUMilli == 0 {
			continue
		}
		usable := (cpuFree / s.CPUMilli) * int64(s.GPUs) * s.GPUMilli
		if usable < total {
			out += s.P * float64(total-usable)
		}
	}
	return out
}
