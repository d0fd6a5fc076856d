package sched

import "strconv"

// Keeping room for large requests.
//
// FGD's measure weighs each typical shape by its popularity, and the
// typical shapes cover the most popular 95 % of requests, so the rare large
// shapes (a whole 8-GPU node with most of its CPU) carry no weight: a
// policy following it alone breaks the few nodes that could host them for
// small requests, and the large requests fail first. fusiond's policy adds
// a reserve term to the first key of its fragmentation dimension: the FGD
// measure of the workload's large shapes, each weighted by ReserveBoost
// times its share of all requests. Breaking the last free 8-GPU node with
// enough CPU then costs what its eight GPUs are worth to those shapes, so
// small requests go to nodes that are already broken while there are any.

// ReserveBoost is how much more a large shape weighs in the reserve term
// than its share of requests (see docs/benchmarks.md for how it was
// chosen).
var ReserveBoost = 8.0

var tuneBoost = "" // EXPERIMENT

func init() {
	if tuneBoost != "" {
		ReserveBoost, _ = strconv.ParseFloat(tuneBoost, 64)
	}
}

// largeShapes returns the shapes (counts in P, of total requests) that ask
// for at least half the largest whole-GPU count observed (and at least
// two GPUs), with P their share of all requests times ReserveBoost.
func largeShapes(shapes []Shape, total float64) []Shape {
	most := 0
	for _, s := range shapes {
		if s.GPUMilli == MilliPerGPU {
			most = max(most, s.GPUs)
		}
	}
	var out []Shape
	for _, s := range shapes {
		if s.GPUMilli == MilliPerGPU && s.GPUs >= 2 && 2*s.GPUs >= most {
			s.P = ReserveBoost * s.P / total
			out = append(out, s)
		}
	}
	return out
}

// linkFrag joins the policy's two measures into one scorer pass (one
// cache lookup per node) and adds the reserve term, once.
func (p *Weighted) linkFrag() {
	if p.fs.linked {
		return
	}
	p.fs.linked = true
	if p.fsCap != nil {
		p.fs.second = p.fsCap.model
	}
	if len(p.fs.model.Reserve) > 0 {
		p.fs.reserve = NewFragModel(p.fs.model.Reserve)
	}
}
