package sched

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// fragmentation is the Weighted policy's fragmentation dimension s_d for
// req on n (in [0,1], higher is better) and the GPU it chose for a shared
// request (-1: none chosen). With a shape model it is lexicographic: FGD's
// measure on its coarse 0..100 scale first, then, among options within one
// step, the reserve for large shapes, then the keys FragParams enables;
// without one, how much of the node's GPU share (CPU
// for CPU-only nodes) the request leaves free.
func (p *Weighted) fragmentation(req *Request, n *Node, idx int) (float64, int) {
	switch {
	case p.byKeys(req, n, idx):
		p.linkFrag()
		e := p.fs.entry(req, n, idx)
		if e.keyed {
			return e.key, e.gpu
		}
		// Keys, most significant first (fragKeys, with the policy's
		// FragParams): FGD's measure on its 0..100 scale; the reserve
		// for the workload's large shapes (reserve.go) on ReserveSteps
		// steps, unless the large shapes are common; then, where
		// chosen, a sliver key, a tail measure (before --tune: for a
		// CPU-only pod the capacity measure, the GPUs it would strand by
		// taking CPU) and the exact FGD measure. The
		// engine's node ranking breaks what ties remain, which packs.
		// The capacity measure is not a key for GPU requests: it prefers
		// fresh nodes, and on the multi-GPU traces it broke the nodes the
		// 8-GPU pods needed (docs/benchmarks.md).
		// The keys are folded once per cache entry (node state and
		// request shape).
		var sl float64
		if p.fs.params.SliverMass > 0 {
			sl = sliverKey(req, n, e.gpu, p.fs.params.SliverMass, p.fs.usable)
		}
		e.key, e.keyed = fragKeys(&p.fs.params, e, sl), true
		return e.key, e.gpu
	case len(n.GPUs) > 0:
		return 1 - float64(n.GPUMilliFree()-req.GPUMilliTotal())/float64(len(n.GPUs)*MilliPerGPU), -1
	default:
		return 1 - float64(n.CPUFreeMilli-req.CPUMilli)/float64(max(n.CPUMilli, 1)), -1
	}
}

// byKeys says whether fragmentation scores req on n (index idx) by the
// keys.
func (p *Weighted) byKeys(req *Request, n *Node, idx int) bool {
	switch {
	case p.fs == nil:
		return false
	case req.GPUs > 0:
		return true
	}
	var free int64
	if idx >= 0 {
		free = p.fs.node(n, idx).gpuFree
	} else {
		free = n.GPUMilliFree()
	}
	return free > 0 || (p.Frag.FullNodesAsFGD && len(n.GPUs) > 0)
}

// fragBound is at least fragmentation's score of any request on n where
// it scores by the keys (ok), found without the request's cache entry and
// kept per node state: FGD's gain there is at most the node's measure
// before (the measure after a placement is not negative: a sum of
// popularities times free shares, none negative, which ok requires), and
// fragKeys is non-decreasing in each measure, so the keys folded from
// that gain (with a margin far above the sigmoid's rounding) and every
// other measure at its largest bound it.
func (p *Weighted) fragBound(req *Request, n *Node, idx int) (float64, bool) {
	if idx < 0 || !p.byKeys(req, n, idx) {
		return 0, false
	}
	p.linkFrag()
	f := p.fs
	if !f.shapesChecked {
		f.nonNegativeP = !slices.ContainsFunc(f.model.Shapes, func(s Shape) bool { return !(s.P >= 0) })
		f.shapesChecked = true
	}
	c := f.node(n, idx)
	if !f.nonNegativeP || !c.noneNegative {
		return 0, false
	}
	if !c.bounded {
		e := fragEntry{sig: sigmoid(c.before/1000 + 1e-9), sig2: 1, res: math.Inf(1)}
		c.keyBound, c.bounded = fragKeys(&p.fs.params, &e, 1), true
	}
	return c.keyBound, true
}

// Shape is a typical request shape and its popularity P (the shapes of a
// FragModel sum to 1).
type Shape struct {
	CPUMilli int64   `json:"cpu_milli"`
	GPUs     int     `json:"gpus"`
	GPUMilli int64   `json:"gpu_milli"`
	Models   string  `json:"models,omitempty"` // "|"-separated allowed models, "" = any
	P        float64 `json:"p"`
}

func (s Shape) allows(model string) bool {
	if s.Models == "" {
		return true
	}
	if model == "" {
		return false
	}
	for m := range strings.SplitSeq(s.Models, "|") {
		if m == model {
			return true
		}
	}
	return false
}

// ShapeLearner counts the request shapes it observes; the daemon feeds it
// every job it sees, the simulator may prime it with the whole trace (as
// FGD does).
type ShapeLearner struct {
	counts map[Shape]float64
	total  float64
}

// NewShapeLearner returns an empty learner.
func NewShapeLearner() *ShapeLearner { return &ShapeLearner{counts: map[Shape]float64{}} }

// Observe records one request.
func (l *ShapeLearner) Observe(r *Request) {
	l.Add(Shape{CPUMilli: r.CPUMilli, GPUs: r.GPUs, GPUMilli: r.GPUMilli, Models: strings.Join(r.GPUModels, "|")}, 1)
}

// Add records weight requests of shape s (its P is ignored), as many
// Observe calls would; a prior, e.g. the shapes of the daemon's task
// profiles weighted by their decayed runs. A weight that is not a finite
// number above zero is ignored.
func (l *ShapeLearner) Add(s Shape, weight float64) {
	if !(weight > 0) || math.IsInf(weight, 0) {
		return
	}
	s.P = 0
	l.counts[s] += weight
	l.total += weight
}

// Total is the weight of the requests recorded.
func (l *ShapeLearner) Total() float64 { return l.total }

// Model returns the most popular shapes covering at least coverage (0..1]
// of the observed requests, popularity renormalised to sum to 1, most
// popular first (ties in a fixed order).
func (l *ShapeLearner) Model(coverage float64) *FragModel {
	shapes := make([]Shape, 0, len(l.counts))
	for k, c := range l.counts {
		k.P = c
		shapes = append(shapes, k)
	}
	slices.SortFunc(shapes, func(a, b Shape) int {
		if c := cmp.Compare(b.P, a.P); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.GPUs, b.GPUs), cmp.Compare(a.GPUMilli, b.GPUMilli), cmp.Compare(a.CPUMilli, b.CPUMilli), cmp.Compare(a.Models, b.Models))
	})
	var cum float64
	n := 0
	for n < len(shapes) && cum < coverage*l.total {
		cum += shapes[n].P
		n++
	}
	reserve := largeShapes(shapes, l.total)
	shapes = shapes[:n]
	for i := range shapes {
		shapes[i].P /= cum
	}
	m := NewFragModel(shapes)
	m.Reserve = reserve
	return m
}

// FragModel measures fragmentation the FGD way: for each typical shape k
// with popularity p_k, the idle GPU share of a node that shape k cannot use
// there — all of it when k does not fit the node at all (or asks for no
// GPU), otherwise the idle share on GPUs too small for k — weighted by p_k.
type FragModel struct {
	Shapes []Shape
	// Capacity selects the multi-copy measure (capacityFrag).
	Capacity bool
	// Strand selects the CPU-stranding measure (strandFrag).
	Strand bool
	// Reserve are the multi-GPU whole-GPU shapes of the workload
	// (reserve.go) with their share of all requests, covered or not;
	// fusiond's policy keeps the large ones (FragParams.ReserveFrac) for
	// its reserve key, FGD keeps the paper's measure.
	Reserve []Shape
	// access caches, per GPU model, which shapes may use it.
	access map[string][]bool
}

// NewFragModel returns a model over shapes.
func NewFragModel(shapes []Shape) *FragModel {
	return &FragModel{Shapes: shapes, access: map[string][]bool{}}
}

func (f *FragModel) accessFor(model string) []bool {
	if a, ok := f.access[model]; ok {
		return a
	}
	a := make([]bool, len(f.Shapes))
	for i, s := range f.Shapes {
		a[i] = s.allows(model)
	}
	f.access[model] = a
	return a
}

// NodeFrag is the expected fragmented GPU milli of n.
func (f *FragModel) NodeFrag(n *Node) float64 {
	var buf [64]int64
	free := gpuFreeList(n, buf[:0])
	return f.nodeMeasure(n, n.CPUFreeMilli, free)
}

// nodeMeasure is the model's measure of a node with cpuFree CPU and free
// (the free milli of its non-MIG GPUs, in index order). A node with
// several GPU models is measured per model, each model's GPUs with the
// shapes that may use them, and the parts summed.
func (f *FragModel) nodeMeasure(n *Node, cpuFree int64, free []int64) float64 {
	if n.Homogeneous() {
		model := n.GPUModel
		if len(n.GPUs) > 0 {
			model = n.ModelOf(0)
		}
		return f.measure(model, cpuFree, free)
	}
	var models [64]string
	k := 0
	for i := range n.GPUs {
		if n.GPUs[i].MIG == nil && k < len(models) {
			models[k] = n.ModelOf(i)
			k++
		}
	}
	var out float64
	var buf [64]int64
	for j := range k {
		if slices.Contains(models[:j], models[j]) {
			continue
		}
		part := buf[:0]
		for i := j; i < k && i < len(free); i++ {
			if models[i] == models[j] {
				part = append(part, free[i])
			}
		}
		out += f.measure(models[j], cpuFree, part)
	}
	return out
}

// measure is the model's measure (strand, capacity or FGD's) of the GPUs
// of one model.
func (f *FragModel) measure(model string, cpuFree int64, free []int64) float64 {
	switch {
	case f.Strand:
		return f.strandFrag(model, cpuFree, free)
	case f.Capacity:
		return f.capacityFrag(model, cpuFree, free)
	}
	return f.frag(model, cpuFree, free)
}

func gpuFreeList(n *Node, buf []int64) []int64 {
	for i := range n.GPUs {
		if n.GPUs[i].MIG == nil {
			buf = append(buf, n.GPUs[i].MilliFree)
		}
	}
	return buf
}

func (f *FragModel) frag(model string, cpuFree int64, free []int64) float64 {
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
		if s.GPUMilli == 0 || !acc[k] || cpuFree < s.CPUMilli {
			out += s.P * float64(total)
			continue
		}
		fit := 0
		var small int64
		for _, m := range free {
			if m >= s.GPUMilli {
				fit++
			} else {
				small += m
			}
		}
		if fit >= s.GPUs {
			out += s.P * float64(small)
		} else {
			out += s.P * float64(total)
		}
	}
	return out
}

// FragDelta returns the fragmentation increase on n if req takes GPU gpu
// (shared) or the GPUs in whole (whole-GPU requests), together with the
// fragmentation before.
func (f *FragModel) fragAfter(n *Node, req *Request, gpus []int) float64 {
	var buf [64]int64
	free := buf[:0]
	for i := range n.GPUs {
		if n.GPUs[i].MIG != nil {
			continue
		}
		m := n.GPUs[i].MilliFree
		if slices.Contains(gpus, i) {
			m -= req.GPUMilli
		}
		free = append(free, m)
	}
	return f.nodeMeasure(n, n.CPUFreeMilli-req.CPUMilli, free)
}

// capacityFrag is the multi-copy variant: for each typical shape, the idle
// GPU milli left over if the node were filled with as many copies of that
// shape as its GPUs and CPU allow.
func (f *FragModel) capacityFrag(model string, cpuFree int64, free []int64) float64 {
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
		if s.GPUMilli == 0 || !acc[k] || cpuFree < s.CPUMilli {
			out += s.P * float64(total)
			continue
		}
		var slots int64
		if s.GPUMilli < MilliPerGPU {
			for _, m := range free {
				slots += m / s.GPUMilli
			}
		} else {
			full := int64(0)
			for _, m := range free {
				if m >= MilliPerGPU {
					full++
				}
			}
			slots = full / int64(s.GPUs)
		}
		if s.CPUMilli > 0 {
			slots = min(slots, cpuFree/s.CPUMilli)
		}
		used := slots * int64(s.GPUs) * s.GPUMilli
		out += s.P * float64(total-used)
	}
	return out
}
