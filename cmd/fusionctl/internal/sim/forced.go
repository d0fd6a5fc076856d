package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/sched"
)

// Forced pods.
//
// Under the protocol every pod that fits somewhere when it arrives is
// placed. Pod i is forced when it fits on some node whatever happened to
// pods 0..i-1: no placement of any subset of them blocks every node for
// it. Such a pod is placed in every run of every policy, so the bound's LP
// may require it (AllocBound: x_s ≥ forced pods of request s).
//
// Blocking node n for pod p (c cores, m memory, g GPUs of s milli each,
// allowed models) needs one of
//
//	cpu: CPU used on n ≥ C_n − c + 1
//	mem: memory used on n ≥ M_n − m + 1
//	gpu: in every group of allowed GPUs of n (one model) with G ≥ g GPUs,
//	     at least G − g + 1 GPUs with used ≥ 1001 − s milli (a GPU with less
//	     used has s free; a whole GPU is s = 1000: one milli blocks it),
//
// costing k_cpu, k_mem and k_gpu (the number of GPUs to block) of three
// budgets that pods 0..i-1 supply: B_cpu = Σ CPU, B_mem = Σ memory and
// B_gpu = min(Σ GPUs touched, ⌊Σ GPU milli / (1001 − s)⌋) — each GPU
// blocked needs a pod on it (a whole-GPU pod touches its g GPUs, a share
// one) and 1001 − s milli. Only the nodes that could hold p empty need
// blocking, and only earlier pods that fit at least one of their node
// types empty can use them: the others do not count. Ignoring which of
// those nodes and GPUs each earlier pod can use only gives the adversary
// more, never less.
//
// Any real blocking gives y_{n,d} ∈ {0,1} (1 for one dimension d that
// blocks n) with Σ_d y_{n,d} ≥ 1 per node and Σ_n k_{n,d} y_{n,d} ≤ B_d
// per budget; nodes that cannot hold p even empty need nothing and are left
// out. If λ ≥ 0 has
//
//	F(λ) = Σ_n min_d λ_d k_{n,d} − Σ_d λ_d B_d > 0
//
// no such y exists, even fractional: Σ_d λ_d B_d ≥ Σ_{n,d} λ_d k_{n,d}
// y_{n,d} ≥ Σ_n (min_d λ_d k_{n,d}) Σ_d y_{n,d} ≥ Σ_n min_d λ_d k_{n,d},
// a contradiction. So such a λ (a Farkas certificate) proves p forced. F is
// concave, piecewise linear and homogeneous; with nodes grouped by type
// (equal capacity and models) it is linear on each cell of the lines
// λ_d k_{t,d} = λ_e k_{t,e} over the triangle Σλ = 1, so its maximum lies
// on a cell vertex: a triangle corner, a line meeting an edge, or two lines
// meeting. forcedChecker evaluates F at all of them, which is the
// relaxation's exact answer; a certificate is accepted only with a margin
// above rounding. Budgets only grow with i, so for one pod shape the
// certificate of its last forced arrival proves every earlier one: the
// forced arrivals of a shape are a prefix, found by binary search.

// forcedShape is what forcing depends on besides the budgets.
type forcedShape struct {
	cpu, mem int64
	gpus     int
	milli    int64
	spec     string
}

func shapeOf(p *Pod) forcedShape {
	return forcedShape{cpu: p.CPUMilli, mem: p.MemMiB, gpus: p.GPUs, milli: p.GPUMilli, spec: p.GPUSpec}
}

// nodeKind is a node type: equal NodeSpecs but for the name, and how many.
type nodeKind struct {
	spec  NodeSpec
	count float64
}

func nodeKinds(specs []NodeSpec) []nodeKind {
	idx := map[NodeSpec]int{}
	var out []nodeKind
	for _, n := range specs {
		n.Name = ""
		i, ok := idx[n]
		if !ok {
			i = len(out)
			idx[n] = i
			out = append(out, nodeKind{spec: n})
		}
		out[i].count++
	}
	return out
}

// gpuBlocks is k_gpu: the GPUs of n to block so that no g of one allowed
// model have s free (0 when none could even empty).
func gpuBlocks(n NodeSpec, p *Pod) float64 {
	var k int
	for _, g := range n.Groups() {
		if g.GPUs >= p.GPUs && (p.GPUSpec == "" || slices.Contains(strings.Split(p.GPUSpec, "|"), g.Model)) {
			k += g.GPUs - p.GPUs + 1
		}
	}
	return float64(k)
}

// forcedMargin is how far above zero F must be, in units of the cluster's
// total of each budget (F's terms are at most about 1 in them), to count.
const forcedMargin = 1e-9

// forcedChecker tells, for one pod shape, whether given budgets prove it
// forced: the maximum of F over the cell vertices (see above).
type forcedChecker struct {
	// cands are the candidate λ (scaled to the cluster totals) and
	// base[j] = Σ_t N_t min_d λ_d k_{t,d} at cands[j].
	cands [][3]float64
	base  []float64
	scale [3]float64
	// never: no node can hold the pod even empty.
	never bool
}

// newForcedChecker prepares the candidates for pod shape p on kinds;
// scale are the cluster's CPU, memory and GPUs (each > 0).
func newForcedChecker(kinds []nodeKind, p *Pod, scale [3]float64) *forcedChecker {
	type typ struct {
		n float64
		k [3]float64
	}
	var ts []typ
	for _, nk := range kinds {
		if !nk.spec.canHold(p) {
			continue
		}
		ts = append(ts, typ{n: nk.count, k: [3]float64{
			float64(nk.spec.CPUMilli-p.CPUMilli+1) / scale[0],
			float64(nk.spec.MemMiB-p.MemMiB+1) / scale[1],
			gpuBlocks(nk.spec, p) / scale[2],
		}})
	}
	fc := &forcedChecker{scale: scale, never: len(ts) == 0}
	if fc.never {
		return fc
	}
	pairs := [3][2]int{{0, 1}, {0, 2}, {1, 2}}
	// A line of pair (d, e) is λ_d k_d = λ_e k_e: λ_d/λ_e = ratio.
	lines := [3][]float64{}
	for _, t := range ts {
		for pi, pr := range pairs {
			r := t.k[pr[1]] / t.k[pr[0]]
			if !slices.Contains(lines[pi], r) {
				lines[pi] = append(lines[pi], r)
			}
		}
	}
	add := func(l [3]float64) {
		s := l[0] + l[1] + l[2]
		if s <= 0 || math.IsInf(s, 0) || math.IsNaN(s) {
			return
		}
		fc.cands = append(fc.cands, [3]float64{l[0] / s, l[1] / s, l[2] / s})
	}
	add([3]float64{1, 0, 0})
	add([3]float64{0, 1, 0})
	add([3]float64{0, 0, 1})
	for pi, pr := range pairs {
		for _, r := range lines[pi] {
			// The line meets the edge where the third λ is 0.
			var l [3]float64
			l[pr[0]], l[pr[1]] = r, 1
			add(l)
		}
	}
	// Two lines of different pairs meet in one point; fix the λ they
	// share to 1 and read the other two off the ratios.
	for a := range 3 {
		for b := a + 1; b < 3; b++ {
			pa, pb := pairs[a], pairs[b]
			for _, ra := range lines[a] {
				for _, rb := range lines[b] {
					var l [3]float64
					switch {
					case pa[0] == pb[0]: // (0,1) and (0,2): λ0 = 1
						l[pa[0]], l[pa[1]], l[pb[1]] = 1, 1/ra, 1/rb
					case pa[1] == pb[1]: // (0,2) and (1,2): λ2 = 1
						l[pa[1]], l[pa[0]], l[pb[0]] = 1, ra, rb
					default: // (0,1) and (1,2): λ1 = 1
						l[pa[1]], l[pa[0]], l[pb[1]] = 1, ra, 1/rb
					}
					add(l)
				}
			}
		}
	}
	fc.base = make([]float64, len(fc.cands))
	for j, l := range fc.cands {
		for _, t := range ts {
			fc.base[j] += t.n * min(l[0]*t.k[0], l[1]*t.k[1], l[2]*t.k[2])
		}
	}
	return fc
}

// forced reports whether budgets b (CPU milli, memory MiB, GPUs the
// earlier pods can block) prove the pod forced.
func (fc *forcedChecker) forced(b [3]float64) bool {
	if fc.never {
		return false
	}
	nb := [3]float64{b[0] / fc.scale[0], b[1] / fc.scale[1], b[2] / fc.scale[2]}
	for j, l := range fc.cands {
		if fc.base[j]-(l[0]*nb[0]+l[1]*nb[1]+l[2]*nb[2]) > forcedMargin {
			return true
		}
	}
	return false
}

// ForcedPods reports which of the first n pods of workload are forced on
// specs: placed in every protocol run whatever the policy (see above).
// Only pods asking for GPUs are examined; the others are reported false.
func ForcedPods(specs []NodeSpec, workload []Pod, n int) ([]bool, error) {
	if n < 0 || n > len(workload) {
		return nil, fmt.Errorf("%w: forced pods: %d of %d pods", ErrBadOption, n, len(workload))
	}
	kinds := nodeKinds(specs)
	var scale [3]float64
	for _, k := range kinds {
		scale[0] += k.count * float64(k.spec.CPUMilli)
		scale[1] += k.count * float64(k.spec.MemMiB)
		scale[2] += k.count * float64(k.spec.GPUs)
	}
	for i := range scale {
		scale[i] = max(scale[i], 1)
	}
	// masks[i] are the node kinds pod i fits when empty, one byte each
	// (a map key).
	masks := make([]string, n)
	byShape := map[forcedShape]string{}
	positions := map[forcedShape][]int{}
	var order []forcedShape
	for i := range n {
		p := &workload[i]
		sh := shapeOf(p)
		m, ok := byShape[sh]
		if !ok {
			b := make([]byte, len(kinds))
			for k, nk := range kinds {
				if nk.spec.canHold(p) {
					b[k] = 1
				}
			}
			m = string(b)
			byShape[sh] = m
		}
		masks[i] = m
		if p.GPUs > 0 && strings.IndexByte(m, 1) >= 0 {
			if _, had := positions[sh]; !had {
				order = append(order, sh)
			}
			positions[sh] = append(positions[sh], i)
		}
	}
	// Budgets before each pod for the pods that fit the kinds of mask:
	// CPU, memory, GPUs touched and GPU milli of the earlier pods that fit
	// at least one of those kinds empty (the others never use them).
	type budget struct{ cpu, mem, touch, milli int64 }
	budgets := map[string][]budget{}
	budgetsFor := func(mask string) []budget {
		if b, ok := budgets[mask]; ok {
			return b
		}
		before := make([]budget, n)
		var cur budget
		for i := range n {
			before[i] = cur
			if !overlap(masks[i], mask) {
				continue
			}
			p := &workload[i]
			cur.cpu += p.CPUMilli
			cur.mem += p.MemMiB
			cur.touch += int64(p.GPUs)
			cur.milli += p.GPUMilliTotal()
		}
		budgets[mask] = before
		return before
	}
	out := make([]bool, n)
	for _, sh := range order {
		pos := positions[sh]
		fc := newForcedChecker(kinds, &workload[pos[0]], scale)
		per := sched.MilliPerGPU + 1 - sh.milli
		before := budgetsFor(byShape[sh])
		at := func(j int) bool {
			b := before[pos[j]]
			return fc.forced([3]float64{float64(b.cpu), float64(b.mem), float64(min(b.touch, b.milli/per))})
		}
		// The forced arrivals are a prefix pos[:k]: find k.
		lo, hi := 0, len(pos)
		for lo < hi {
			mid := (lo + hi) / 2
			if at(mid) {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		for _, i := range pos[:lo] {
			out[i] = true
		}
	}
	return out, nil
}

// overlap reports whether two kind masks share a kind.
func overlap(a, b string) bool {
	for i := range len(a) {
		if a[i] == 1 && b[i] == 1 {
			return true
		}
	}
	return false
}
