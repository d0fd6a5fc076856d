package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/sched"
)

// Workload applies the paper's protocol to a pod list: sorted by name,
// then pods drawn uniformly at random (with replacement, seeded) appended
// until the total GPU request reaches targetPct of capacityMilli, then the
// whole list shuffled with the same seed. Lists already above the target
// are kept whole: the measurement at targetPct is read as the arrived
// request passes it, which for a shuffled list equals a random prune.
func Workload(pods []Pod, seed uint64, targetPct float64, capacityMilli int64) []Pod {
	out := slices.Clone(pods)
	slices.SortFunc(out, func(a, b Pod) int { return strings.Compare(a.Name, b.Name) })
	rng := rand.New(rand.NewPCG(seed, 0x0be))
	var total int64
	for i := range out {
		total += out[i].GPUMilliTotal()
	}
	target := int64(targetPct / 100 * float64(capacityMilli))
	if len(pods) > 0 && capacityMilli > 0 {
		hasGPU := slices.ContainsFunc(pods, func(p Pod) bool { return p.GPUMilliTotal() > 0 })
		for hasGPU && total < target {
			p := out[rng.IntN(len(pods))]
			p.Name = fmt.Sprintf("%s-r%d", p.Name, len(out))
			out = append(out, p)
			total += p.GPUMilliTotal()
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// ShapeModel learns the typical shapes of a workload (coverage 0.95 as the
// paper's simulator does), priming FGD and fusiond the way the paper does.
func ShapeModel(pods []Pod, coverage float64) *sched.FragModel {
	l := sched.NewShapeLearner()
	for i := range pods {
		r := pods[i].Request()
		l.Observe(&r)
	}
	return l.Model(coverage)
}

// CurvePoint is the allocation when the arrived request reached
// ArrivedPct: AllocPct is the GPU request placed, FailedPct the GPU request
// of the pods that could not be placed, both in % of GPU capacity.
type CurvePoint struct {
	ArrivedPct float64 `json:"arrived_pct"`
	AllocPct   float64 `json:"alloc_pct"`
	FailedPct  float64 `json:"failed_pct"`
}

// FailThresholds are the arrived-request points (% of GPU capacity) at
// which a run reports its failures (FailPoint).
var FailThresholds = []float64{90, 100, 110, 120, 130}

// FailPoint is what had failed to place by the time the arrived GPU
// request reached ArrivedPct: pods, their GPUs (whole GPUs, shares summed),
// and the big pods among them (those asking for as many whole GPUs as the
// largest node has).
type FailPoint struct {
	ArrivedPct float64 `json:"arrived_pct"`
	Pods       float64 `json:"pods"`
	GPUs       float64 `json:"gpus"`
	BigPods    float64 `json:"big_pods"`
}

// RunResult is one policy × seed run of the protocol.
type RunResult struct {
	Trace     string `json:"trace"`
	Policy    string `json:"policy"`
	Seed      uint64 `json:"seed"`
	Pods      int    `json:"pods"`
	Failed    int    `json:"failed"`
	FailedGPU int    `json:"failed_gpu_pods"`
	// AllocPct[i] and FragPct[i] are read when the arrived GPU request
	// first reaches Thresholds[i] percent of capacity (NaN if never).
	Thresholds      []float64    `json:"thresholds"`
	AllocPct        []float64    `json:"alloc_pct"`
	FragPct         []float64    `json:"frag_pct"`
	Seconds         float64      `json:"seconds"`
	DecisionsPerSec float64      `json:"decisions_per_sec"`
	Curve           []CurvePoint `json:"curve,omitempty"`
	// FailAt[i] is read when the arrived request first reaches
	// FailThresholds[i] (zero Pods and NaN GPUs if never); BigGPUs is the
	// GPU count of the largest node, which defines a big pod.
	FailAt  []FailPoint `json:"fail_at"`
	BigGPUs int         `json:"big_gpus"`
	// BoundPct is the seed's Bound (Pct) at the last threshold (set by
	// Simulate; 0 where nothing computed it).
	BoundPct float64 `json:"bound_pct"`
	// Moves is the --moves budget (at most that many moves per 1,000
	// arrivals; 0: the plain protocol). MovesUsed is the moves made,
	// PodsMoved the distinct pods moved, PlacedByMoves the arrivals placed
	// only thanks to moves; NoMoveAllocPct is the same policy and seed
	// without moves (Simulate fills it when Moves > 0).
	Moves          int       `json:"moves,omitempty"`
	MovesUsed      int       `json:"moves_used,omitempty"`
	PodsMoved      int       `json:"pods_moved,omitempty"`
	PlacedByMoves  int       `json:"placed_by_moves,omitempty"`
	NoMoveAllocPct []float64 `json:"no_move_alloc_pct,omitempty"`
	// Idle and NoMoveIdle are where the idle GPU was when the arrived
	// request reached the last threshold, with and without moves
	// (Simulate fills them when Moves > 0).
	Idle       *IdleGPUs `json:"idle,omitempty"`
	NoMoveIdle *IdleGPUs `json:"no_move_idle,omitempty"`
}

// IdleGPUs splits the idle GPU of a cluster, in GPUs (milli summed):
// whole idle GPUs, slivers (under SliverMilli free on a GPU that holds
// work) and the rest of partly used GPUs.
type IdleGPUs struct {
	Whole   float64 `json:"whole"`
	Partial float64 `json:"partial"`
	Sliver  float64 `json:"sliver"`
}

// SliverMilli is the free share below which a partly used GPU's rest
// counts as a sliver (IdleGPUs): only the few pods asking less can use it.
const SliverMilli = 200

// idleOf is nodes' IdleGPUs (MIG GPUs left out).
func idleOf(nodes []*sched.Node) *IdleGPUs {
	var w, p, s int64
	for _, n := range nodes {
		for i := range n.GPUs {
			g := &n.GPUs[i]
			switch {
			case g.MIG != nil || g.MilliFree <= 0:
			case g.MilliFree >= sched.MilliPerGPU:
				w += g.MilliFree
			case g.MilliFree < SliverMilli:
				s += g.MilliFree
			default:
				p += g.MilliFree
			}
		}
	}
	return &IdleGPUs{Whole: float64(w) / sched.MilliPerGPU, Partial: float64(p) / sched.MilliPerGPU, Sliver: float64(s) / sched.MilliPerGPU}
}

// RunProtocol places workload pods one by one with the named policy on
// fresh nodes and never removes them.
func RunProtocol(ctx context.Context, specs []NodeSpec, workload []Pod, policy string, seed uint64, frag *sched.FragModel, thresholds []float64, tie sched.TieBreak) (RunResult, error) {
	p, ok := sched.PolicyByName(policy, frag, nil)
	if !ok {
		return RunResult{}, fmt.Errorf("%w: unknown policy %q", ErrBadOption, policy)
	}
	return runProtocol(ctx, specs, workload, p, policy, seed, frag, thresholds, tie, replayOpts{dedupe: dedupable(p, tie)})
}

// replayOpts are runProtocol's options beyond the policy and the trace.
type replayOpts struct {
	// dedupe scores one node per state group (nodeView).
	dedupe bool
	// placed, when non-nil, receives each pod's node index (-1: failed).
	placed *[]int
	// moves is the --moves variant's budget: at most that many moves of
	// best-effort pods per 1,000 arrivals (0: the plain protocol).
	moves int
	// movesAt, when non-nil, receives the moves made so far after each
	// arrival (with moves > 0).
	movesAt *[]int
	// idle fills RunResult.Idle at the last threshold.
	idle bool
}

// runProtocol is RunProtocol with the policy built and the options of
// replayOpts.
func runProtocol(ctx context.Context, specs []NodeSpec, workload []Pod, p sched.Policy, policy string, seed uint64, frag *sched.FragModel, thresholds []float64, tie sched.TieBreak, ro replayOpts) (RunResult, error) {
	if ro.moves < 0 {
		return RunResult{}, fmt.Errorf("%w: --moves %d: want 0 or more moves per 1,000 arrivals", ErrBadOption, ro.moves)
	}
	nodes := BuildNodes(specs)
	eng := sched.NewEngine(sched.Options{Policy: p, Seed: seed, TieBreak: tie})
	var view *nodeView
	if ro.dedupe {
		view = newNodeView(nodes, seed, memoryBlind(p))
	}
	res := RunResult{Policy: policy, Seed: seed, Pods: len(workload), Thresholds: thresholds, Moves: ro.moves}
	meter := newProtocolMeter(&res, nodes, frag)
	meter.idle = ro.idle
	var mv *mover
	if ro.moves > 0 {
		mv = newMover(ro.moves, eng, nodes, view)
	}
	start := time.Now()
	for i := range workload {
		if i%256 == 0 && ctx.Err() != nil {
			return res, ctx.Err()
		}
		req := workload[i].Request()
		scored := nodes
		if view != nil {
			scored = view.forRequest(&req)
		}
		d, err := eng.Place(&req, scored)
		if err == nil {
			err = eng.Commit(&req, &d.Assignment, nodes)
			if err == nil && view != nil {
				view.changed(d.Assignment.NodeIdx)
			}
		}
		if mv != nil {
			if err == nil {
				mv.placed(&req, &d.Assignment, i+1)
			} else if a, ok, merr := mv.tryMoves(&req, i+1); merr != nil {
				return res, merr
			} else if ok {
				d.Assignment, err = a, nil
			}
		}
		if ro.placed != nil {
			if err != nil {
				*ro.placed = append(*ro.placed, -1)
			} else {
				*ro.placed = append(*ro.placed, d.Assignment.NodeIdx)
			}
		}
		meter.pod(&req, err == nil)
		if mv != nil && ro.movesAt != nil {
			*ro.movesAt = append(*ro.movesAt, mv.used)
		}
	}
	if mv != nil {
		mv.report(&res)
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Seconds > 0 {
		res.DecisionsPerSec = float64(len(workload)) / res.Seconds
	}
	return res, nil
}

// clusterFragPct is the paper's fragmentation ratio: fragmented idle GPU
// milli over all idle GPU milli, in percent.
func clusterFragPct(nodes []*sched.Node, frag *sched.FragModel) float64 {
	var f, idle float64
	for _, n := range nodes {
		f += frag.NodeFrag(n)
		idle += float64(n.GPUMilliFree())
	}
	if idle == 0 {
		return 0
	}
	return 100 * f / idle
}
