package sim

import (
	"fmt"
	"math"
	"slices"

	"github.com/fusiond/fusiond/daemon/sched"
	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// BoundResult is Bound's answer.
type BoundResult struct {
	// Pct is the bound, LoosePct the same LP without forced pods (any
	// arrived pod may be dropped), both in % of GPU capacity.
	Pct      float64
	LoosePct float64
	// Arrived are the arrived pods asking for GPUs, Forced those of
	// them that are forced (ForcedPods).
	Arrived int
	Forced  int
}

// Bound bounds from above the GPU allocation (in % of GPU capacity) that
// any policy placing pods in the protocol's way — in order, each placed
// if it fits somewhere, never moved — could reach with the pods that have
// arrived when the arrived GPU request first reaches arrivedPct of
// capacity (the pod that reaches it included, as the protocol's figures
// read it). It is the optimum of a linear relaxation that ignores arrival
// order, nodes, CPU, memory and GPU models and keeps only how GPU shares
// pack onto the cluster's G GPUs: choose f_s ≤ x_s ≤ (arrived pods of
// request s) to maximise Σ x_s · GPU milli, subject to, for every
// threshold a in {1, 500} and each share below 500 milli requested,
//
//	Σ c_a(s) · x_s ≤ 1000 · G,
//
// where a whole GPU and a share above 1000−a count 1000 (what such a share
// leaves on its GPU is below a, usable only by shares below a), a share in
// [a, 1000−a] counts itself and a share below a counts 0. Each GPU of any
// real placement satisfies the cut on its own (a = 1: capacity; a = 500:
// at most one share above half per GPU). f_s counts the arrived pods of
// request s that are forced (ForcedPods): every run places them. So the
// optimum bounds every run. Leaving out CPU, memory and models only
// loosens it. If the forced pods alone break a cut, forcing is wrong: an
// error, not a number.
//
// Two node-level facts tighten it, each valid alone, and the smaller
// result is the bound: G counts only the GPUs of nodes that at least one
// arrived GPU pod fits when empty (CPU, memory, model), and the sum over
// nodes of what their CPU and memory allow — a node of C cores can use at
// most C / r GPUs, r the fewest cores per GPU among the arrived pods its
// model allows (likewise memory) — caps the total.
func Bound(specs []NodeSpec, workload []Pod, arrivedPct float64) (BoundResult, error) {
	var total int64
	for _, s := range specs {
		total += int64(s.GPUs)
	}
	if total == 0 {
		return BoundResult{}, fmt.Errorf("%w: no GPUs", ErrBadTrace)
	}
	if math.IsNaN(arrivedPct) || arrivedPct < 0 {
		return BoundResult{}, fmt.Errorf("%w: bound at %g%% arrived", ErrBadOption, arrivedPct)
	}
	if err := validPods(workload); err != nil {
		return BoundResult{}, err
	}
	capMilli := total * sched.MilliPerGPU
	var arrivedPods []*Pod
	var arrived int64
	n := 0
	for i := range workload {
		if 100*float64(arrived)/float64(capMilli) >= arrivedPct {
			break
		}
		n++
		arrived += workload[i].GPUMilliTotal()
		if workload[i].GPUMilliTotal() > 0 {
			arrivedPods = append(arrivedPods, &workload[i])
		}
	}
	forced, err := ForcedPods(specs, workload, n)
	if err != nil {
		return BoundResult{}, err
	}
	res := BoundResult{Arrived: len(arrivedPods)}
	gpus, nodeCap := usableGPUs(specs, arrivedPods)
	type shape struct {
		milli int64 // per GPU
		gpus  int
	}
	supply := map[shape]float64{}
	least := map[shape]float64{}
	for i := range n {
		p := &workload[i]
		if p.GPUMilliTotal() == 0 {
			continue
		}
		s := shape{milli: p.GPUMilli, gpus: p.GPUs}
		supply[s]++
		if forced[i] {
			least[s]++
			res.Forced++
		}
	}
	shapes := make([]shape, 0, len(supply))
	for s := range supply {
		shapes = append(shapes, s)
	}
	slices.SortFunc(shapes, func(a, b shape) int { return int(a.milli-b.milli) + 1000*(a.gpus-b.gpus) })
	ths := []int64{1, sched.MilliPerGPU / 2}
	for _, s := range shapes {
		if s.milli < sched.MilliPerGPU/2 && !slices.Contains(ths, s.milli) {
			ths = append(ths, s.milli)
		}
	}
	if len(shapes) == 0 || gpus == 0 {
		return res, nil
	}
	coef := func(s shape, th int64) float64 {
		switch {
		case s.milli >= sched.MilliPerGPU || s.milli > sched.MilliPerGPU-th:
			return float64(s.gpus)
		case s.milli >= th:
			return float64(s.milli) / sched.MilliPerGPU
		}
		return 0
	}
	solve := func(least map[shape]float64) (float64, error) {
		// x_s = least_s + x'_s with 0 ≤ x'_s ≤ supply_s − least_s. Rows:
		// supply per shape, one cut per threshold; ≤ made = by slacks.
		rows := len(shapes) + len(ths)
		cols := len(shapes) + rows
		a := mat.NewDense(rows, cols, nil)
		b := make([]float64, rows)
		c := make([]float64, cols)
		var fixed float64
		for k := range ths {
			b[len(shapes)+k] = float64(gpus)
		}
		for j, s := range shapes {
			gain := float64(s.milli) * float64(s.gpus) / sched.MilliPerGPU
			c[j] = -gain
			fixed += least[s] * gain
			a.Set(j, j, 1)
			b[j] = supply[s] - least[s]
			for k, th := range ths {
				a.Set(len(shapes)+k, j, coef(s, th))
				b[len(shapes)+k] -= least[s] * coef(s, th)
			}
		}
		for k, th := range ths {
			r := len(shapes) + k
			if b[r] < -1e-9 {
				return 0, fmt.Errorf("sim: bound: the forced pods need %.3f GPUs in the cut at %d milli, the cluster has %d usable: forcing is wrong", float64(gpus)-b[r], th, gpus)
			}
			b[r] = max(b[r], 0)
		}
		for r := range rows {
			a.Set(r, len(shapes)+r, 1)
		}
		opt, _, err := lp.Simplex(c, a, b, 1e-9, nil)
		if err != nil {
			return 0, fmt.Errorf("sim: bound: %w", err)
		}
		return min(100, 100*(fixed-opt)*sched.MilliPerGPU/float64(capMilli), 100*nodeCap/float64(total)), nil
	}
	if res.LoosePct, err = solve(nil); err != nil {
		return res, err
	}
	if res.Pct, err = solve(least); err != nil {
		return res, err
	}
	return res, nil
}

// usableGPUs returns the GPUs of nodes that some pod fits when empty and
// the sum over nodes of min(GPUs, CPU / fewest cores per GPU, memory /
// least memory per GPU) among the pods the node fits.
func usableGPUs(specs []NodeSpec, pods []*Pod) (int64, float64) {
	var gpus int64
	var sum float64
	type result struct {
		fits bool
		u    float64
	}
	seen := map[NodeSpec]result{}
	for _, n := range specs {
		n.Name = ""
		if r, ok := seen[n]; ok {
			if r.fits {
				gpus += int64(n.GPUs)
				sum += r.u
			}
			continue
		}
		seen[n] = result{}
		fits := false
		cpuPer, memPer := math.Inf(1), math.Inf(1)
		for _, p := range pods {
			if !n.canHold(p) {
				continue
			}
			fits = true
			g := float64(p.GPUMilliTotal()) / sched.MilliPerGPU
			cpuPer = min(cpuPer, float64(p.CPUMilli)/g)
			memPer = min(memPer, float64(p.MemMiB)/g)
		}
		if !fits {
			continue
		}
		gpus += int64(n.GPUs)
		u := float64(n.GPUs)
		if cpuPer > 0 {
			u = min(u, float64(n.CPUMilli)/cpuPer)
		}
		if memPer > 0 {
			u = min(u, float64(n.MemMiB)/memPer)
		}
		sum += u
		seen[n] = result{fits: true, u: u}
	}
	return gpus, sum
}
