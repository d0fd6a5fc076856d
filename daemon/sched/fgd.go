package sched

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// fragKey identifies a request shape for the per-node score cache.
type fragKey struct {
	cpu, milli int64
	gpus       int
	models     string
}

type fragEntry struct {
	gain float64 // before − after (higher is better)
	sig  float64 // sigmoid(gain/1000)
	gpu  int
	// sig2 is sigmoid(gain/1000) under the scorer's second model (its
	// best GPU for a shared request), when it has one.
	sig2 float64
	// res is the reserve measure's gain (before − after), when set.
	res float64
	// key is fusiond's fragmentation score folded from this entry
	// (Weighted.fragmentation), valid when keyed: it depends only on the
	// entry, the node's state and the request's shape, which is what the
	// cache is keyed by.
	key   float64
	keyed bool
}

type nodeFragCache struct {
	node    *Node
	version uint64
	before  float64
	gpuFree int64 // n.GPUMilliFree()
	// noneNegative: no GPU (MIG ones aside) has a negative free share.
	noneNegative bool
	// before2 and beforeR are the second and reserve measures before,
	// computed when an entry first needs them (have2, haveR).
	before2      float64
	beforeR      float64
	have2, haveR bool
	// byShape[id] is valid when stamp[id] == 1 (cleared when the
	// node's version changes).
	byShape []fragEntry
	stamp   []uint64
	// keyBound bounds fusiond's fragmentation keys of any request on the
	// node (Weighted.fragBound), valid when bounded.
	keyBound float64
	bounded  bool
}

// fragScorer computes, with a per-node cache, the fragmentation gain
// (before − after) of placing a request on a node and the GPU that
// maximises it. Request shapes are interned once per request so the
// per-node lookup is an index.
type fragScorer struct {
	model *FragModel
	// second, when set, is a second measure computed with the first in
	// one pass and one cache lookup (fusiond's lexicographic tie-breaker).
	second *FragModel
	// secondCPUOnly computes second only for CPU-only requests (the only
	// ones fusiond's policy uses it for).
	secondCPUOnly bool
	// secondGPUOnly computes second only for GPU requests.
	secondGPUOnly bool
	// params are fusiond's key parameters and usable the typical GPU
	// requests' cumulative share by GPU share (the sliver key), set
	// by linkFrag.
	params FragParams
	usable []shareMass
	// reserve, when set, is a third measure (the large shapes,
	// reserve.go), computed in the same pass.
	reserve *FragModel
	linked  bool
	cache   []nodeFragCache
	shapes  map[fragKey]int
	// last interned request, to intern once per Place and not per node.
	lastReq *Request
	lastKey fragKey
	lastID  int
	// scratch holds the entry of a node outside the cache (idx < 0).
	scratch fragEntry
	// nonNegativeP: no shape of model has a negative popularity (checked
	// once, when shapesChecked).
	nonNegativeP, shapesChecked bool
}

func (f *fragScorer) shapeID(req *Request) int {
	k := fragKey{cpu: req.CPUMilli, milli: req.GPUMilli, gpus: req.GPUs}
	if len(req.GPUModels) > 0 {
		k.models = strings.Join(req.GPUModels, "|")
	}
	if f.lastReq == req && f.lastKey == k {
		return f.lastID
	}
	if f.shapes == nil {
		f.shapes = map[fragKey]int{}
	}
	id, ok := f.shapes[k]
	if !ok {
		id = len(f.shapes)
		f.shapes[k] = id
	}
	f.lastReq, f.lastKey, f.lastID = req, k, id
	return id
}

func (f *fragScorer) gain(req *Request, n *Node, idx int) fragEntry {
	return *f.entry(req, n, idx)
}

// entry is gain's cache entry for req on n, computed if need be; for
// idx < 0 (no cache) the scorer's scratch entry, valid until the next
// call.
func (f *fragScorer) entry(req *Request, n *Node, idx int) *fragEntry {
	if idx < 0 {
		var b2 float64
		if f.second != nil {
			b2 = f.second.NodeFrag(n)
		}
		var br float64
		if f.reserve != nil {
			br = f.reserve.NodeFrag(n)
		}
		f.scratch = f.compute(req, n, f.model.NodeFrag(n), b2, br)
		return &f.scratch
	}
	c := f.node(n, idx)
	id := f.shapeID(req)
	if id >= len(c.stamp) {
		// Room for every shape seen so far: most nodes see most of them.
		grow := max(id+1, 2*len(c.stamp), len(f.shapes))
		c.stamp = append(c.stamp, make([]uint64, grow-len(c.stamp))...)
		c.byShape = append(c.byShape, make([]fragEntry, grow-len(c.byShape))...)
	}
	if c.stamp[id] != 1 {
		if f.second != nil && !c.have2 && f.usesSecond(req) {
			c.before2, c.have2 = f.second.NodeFrag(n), true
		}
		if f.reserve != nil && !c.haveR {
			c.beforeR, c.haveR = f.reserve.NodeFrag(n), true
		}
		c.byShape[id], c.stamp[id] = f.compute(req, n, c.before, c.before2, c.beforeR), 1
	}
	return &c.byShape[id]
}

// usesSecond says whether the second measure is computed for req.
func (f *fragScorer) usesSecond(req *Request) bool {
	return !(f.secondCPUOnly && req.GPUs > 0) && !(f.secondGPUOnly && req.GPUs == 0)
}

// node is the cache of n (index idx ≥ 0) with FGD's measure before,
// emptied of its entries if n changed since.
func (f *fragScorer) node(n *Node, idx int) *nodeFragCache {
	if idx >= len(f.cache) {
		f.cache = append(f.cache, make([]nodeFragCache, idx+1-len(f.cache))...)
	}
	c := &f.cache[idx]
	if c.node != n || c.version != n.Version {
		c.node, c.version = n, n.Version
		c.before, c.gpuFree = f.model.NodeFrag(n), n.GPUMilliFree()
		c.noneNegative = !slices.ContainsFunc(n.GPUs, func(g GPU) bool { return g.MIG == nil && g.MilliFree < 0 })
		clear(c.stamp)
		c.have2, c.haveR, c.bounded = false, false, false
	}
	return c
}

func (f *fragScorer) compute(req *Request, n *Node, before, before2, beforeR float64) fragEntry {
	second := f.second
	if !f.usesSecond(req) {
		second = nil
	}
	if req.Shared() {
		best := fragEntry{gain: math.Inf(-1), gpu: -1}
		best2, bestR := math.Inf(-1), math.Inf(-1)
		var one [1]int
		for i := range n.GPUs {
			if !n.gpuFits(req, i) || sameShareBefore(req, n, i) {
				continue
			}
			one[0] = i
			g := before - f.model.fragAfter(n, req, one[:])
			if g > best.gain {
				best = fragEntry{gain: g, gpu: i}
				if f.reserve != nil { // of the GPU the request will take
					bestR = beforeR - f.reserve.fragAfter(n, req, one[:])
				}
			}
			if second != nil {
				best2 = max(best2, before2-second.fragAfter(n, req, one[:]))
			}
		}
		best.sig = sigmoid(best.gain / 1000)
		if second != nil {
			best.sig2 = sigmoid(best2 / 1000)
		}
		if f.reserve != nil {
			best.res = bestR
		}
		return best
	}
	var gpus []int
	if req.GPUs > 0 {
		gpus, _ = pickWholeGPUs(req, n)
	}
	g := before - f.model.fragAfter(n, req, gpus)
	e := fragEntry{gain: g, sig: sigmoid(g / 1000), gpu: -1}
	if second != nil {
		e.sig2 = sigmoid((before2 - second.fragAfter(n, req, gpus)) / 1000)
	}
	if f.reserve != nil {
		e.res = beforeR - f.reserve.fragAfter(n, req, gpus)
	}
	return e
}

// sameShareBefore says whether a GPU before i that fits req has the same
// free share as GPU i: the fragmentation measures depend only on the
// multiset of free shares (sums and counts of integers), so taking i
// leaves the same measure as taking that one, which comes first and wins
// ties anyway.
func sameShareBefore(req *Request, n *Node, i int) bool {
	for j := range i {
		if n.GPUs[j].MilliFree == n.GPUs[i].MilliFree && n.gpuFits(req, j) {
			return true
		}
	}
	return false
}

// FGD is Fragmentation Gradient Descent (ATC'23): place where the expected
// fragmentation grows least, scored as in the paper's simulator
// (sigmoid of the decrease per 1000 milli, on an integer 0..100 scale).
type FGD struct{ fs fragScorer }

// NewFGD returns FGD over the typical shapes of model.
// A nil model has no shapes: every node then scores alike.
func NewFGD(model *FragModel) *FGD {
	if model == nil {
		model = NewFragModel(nil)
	}
	return &FGD{fs: fragScorer{model: model}}
}

// Name implements Policy.
func (*FGD) Name() string { return "fgd" }

// Score implements Policy.
func (p *FGD) Score(req *Request, n *Node, idx int, _ *rand.Rand) Scored {
	e := p.fs.gain(req, n, idx)
	return Scored{Score: math.Trunc(e.sig * maxScore), GPU: e.gpu}
}

// NewFGDExact returns FGDExact over model (nil: no shapes).
func NewFGDExact(model *FragModel) *FGDExact {
	if model == nil {
		model = NewFragModel(nil)
	}
	return &FGDExact{fs: fragScorer{model: model}}
}

// FGDExact is FGD without the integer score scale: the raw fragmentation
// decrease decides. It exists to show how much the paper's coarse scale
// (and the node order that breaks its many ties) matters; see
// docs/benchmarks.md.
type FGDExact struct{ fs fragScorer }

// Name implements Policy.
func (*FGDExact) Name() string { return "fgd-exact" }

// Score implements Policy.
func (p *FGDExact) Score(req *Request, n *Node, idx int, _ *rand.Rand) Scored {
	e := p.fs.gain(req, n, idx)
	return Scored{Score: e.gain, GPU: e.gpu}
}
