package sched

import (
	"cmp"
	"slices"
)

// Keeping room for large requests.
//
// FGD's measure weighs each typical shape by its popularity, and the
// typical shapes cover the most popular 95 % of requests, so the rare large
// shapes (a whole 8-GPU node with most of its CPU) carry little or no
// weight: a policy led by it alone may break the few nodes that could host
// them for small requests, and the large requests fail first. fusiond's
// policy adds a reserve key to its fragmentation dimension, right after
// FGD's coarse measure: the FGD measure of the workload's large shapes
// alone, each weighted by its share of all requests. Among the options FGD
// rates alike, a placement that leaves every large shape as hostable as
// before beats one that takes the last room a large shape had on that
// node, so small requests go to nodes already broken while there are any.

// The reserve key's resolution is FragParams.ReserveSteps (10 by
// default): sigmoid(gain/1000) on that many steps, so only a real loss of
// room counts.

// largeShapes returns the shapes (counts in P, of total requests) that ask
// for at least two whole GPUs, with P their share of all requests; the
// policy keeps those asking for at least FragParams.ReserveFrac of the
// largest count (largeOf).
func largeShapes(shapes []Shape, total float64) []Shape {
	var out []Shape
	for _, s := range shapes {
		if s.GPUMilli == MilliPerGPU && s.GPUs >= 2 {
			s.P /= total
			out = append(out, s)
		}
	}
	return out
}

// linkFrag joins the policy's measures into one scorer pass (one cache
// lookup per node) and adds the reserve measure, once. NewWeighted builds
// the two scorers; the coordinator may move this there.
func (p *Weighted) linkFrag() {
	if p.fs.linked {
		return
	}
	p.fs.linked = true
	fp := p.Frag.Effective(p.fs.model)
	p.fs.params = fp
	switch fp.Tail {
	case TailCapacityCPUOnly, TailCapacityAll:
		if p.fsCap != nil {
			p.fs.second = p.fsCap.model
			p.fs.secondCPUOnly = fp.Tail == TailCapacityCPUOnly
		}
	case TailStrandAll, TailStrandGPU:
		sm := NewFragModel(p.fs.model.Shapes)
		sm.Strand = true
		p.fs.second = sm
		p.fs.secondGPUOnly = fp.Tail == TailStrandGPU
	}
	if large, _ := fp.reserveOf(p.fs.model); large != nil {
		p.fs.reserve = NewFragModel(large)
	}
	if fp.SliverMass > 0 {
		p.fs.usable = usableShares(p.fs.model.Shapes)
	}
}

// reserveOf is the reserve's large shapes of m under fp (nil when the
// reserve is off) and whether it is off because they are common: more
// than fp.ReserveMaxShare of all requests. fp has its defaults.
func (fp FragParams) reserveOf(m *FragModel) (large []Shape, common bool) {
	if m == nil {
		return nil, false
	}
	large = largeOf(m.Reserve, fp.ReserveFrac)
	if fp.ReserveUncovered {
		large = slices.DeleteFunc(large, func(s Shape) bool {
			return slices.ContainsFunc(m.Shapes, func(t Shape) bool {
				return t.CPUMilli == s.CPUMilli && t.GPUs == s.GPUs && t.GPUMilli == s.GPUMilli && t.Models == s.Models
			})
		})
	}
	var share float64
	for _, s := range large {
		share += s.P
	}
	if len(large) == 0 {
		return nil, false
	}
	if share > fp.ReserveMaxShare {
		return nil, true
	}
	return large, false
}

// fullNodesAsFGD says whether the policy scores a CPU-only request on a
// node with no free GPU by the keys (FragParams.Effective); p.fs is set.
func (p *Weighted) fullNodesAsFGD() bool {
	p.linkFrag()
	return p.fs.params.FullNodesAsFGD
}

// largeOf keeps the shapes asking for at least frac of the largest GPU
// count among them.
func largeOf(shapes []Shape, frac float64) []Shape {
	most := 0
	for _, s := range shapes {
		most = max(most, s.GPUs)
	}
	var out []Shape
	for _, s := range shapes {
		if float64(s.GPUs) >= frac*float64(most) {
			out = append(out, s)
		}
	}
	return out
}

// usableShares is the cumulative share of the typical GPU requests by
// the GPU share they ask for, smallest first (whole GPUs at 1000).
func usableShares(shapes []Shape) []shareMass {
	var total float64
	by := map[int64]float64{}
	for _, s := range shapes {
		if s.GPUMilli > 0 {
			by[s.GPUMilli] += s.P
			total += s.P
		}
	}
	out := make([]shareMass, 0, len(by))
	for m, p := range by {
		out = append(out, shareMass{milli: m, cum: p})
	}
	slices.SortFunc(out, func(a, b shareMass) int { return cmp.Compare(a.milli, b.milli) })
	var cum float64
	for i := range out {
		cum += out[i].cum
		out[i].cum = cum / total
	}
	return out
}
