package sched

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

// reserveSteps is the reserve key's resolution: sigmoid(gain/1000) on
// this many steps, so only a real loss of room counts.
const reserveSteps = 10

// largeShapes returns the shapes (counts in P, of total requests) that ask
// for at least half the largest whole-GPU count observed (and at least
// two whole GPUs), with P their share of all requests.
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
	if p.fsCap != nil {
		p.fs.second = p.fsCap.model
		p.fs.secondCPUOnly = true
	}
	if len(p.fs.model.Reserve) > 0 {
		p.fs.reserve = NewFragModel(p.fs.model.Reserve)
	}
}
