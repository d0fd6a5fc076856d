package sched

import (
	"math"
	"math/rand/v2"
	"strings"
)

// Dimension is one scoring dimension of the Weighted policy.
type Dimension int

// The scoring dimensions, each normalised to [0,1].
const (
	DimCompute Dimension = iota
	DimLocality
	DimFragmentation
	DimEnergy
	DimLoad
	DimPriority
	NumDims
)

var dimNames = [NumDims]string{"compute", "locality", "fragmentation", "energy", "load", "priority"}

func (d Dimension) String() string {
	if d < 0 || d >= NumDims {
		return "unknown"
	}
	return dimNames[d]
}

// Scored is a policy's verdict on one node.
type Scored struct {
	Score float64
	// GPU is the GPU the policy chose for a shared request, -1 for the
	// default (best fit).
	GPU int
	// Parts holds w_d·s_d for each dimension (Weighted policy only).
	Parts [NumDims]float64
}

// Policy scores a node that passed the filter; higher is better. idx is
// the node's index in the slice given to Engine.Place, stable between
// calls, which policies may use to cache per node (checking Node.Version).
type Policy interface {
	Name() string
	Score(req *Request, n *Node, idx int, rng *rand.Rand) Scored
}

// Observer is implemented by policies that track what was placed where.
type Observer interface {
	Placed(req *Request, n *Node, idx int)
	Released(req *Request, n *Node, idx int)
}

// MemoryBlind is implemented by policies whose score of a node (and
// choice inside it) never reads the node's free memory (Node.MemFreeMiB):
// nodes that differ only there score alike wherever Filter lets them
// through. The simulator then groups such nodes.
type MemoryBlind interface {
	MemoryBlind() bool
}

var (
	_ MemoryBlind = BestFit{}
	_ MemoryBlind = GpuPacking{}
	_ MemoryBlind = DotProd{}
	_ MemoryBlind = (*FGD)(nil)
	_ MemoryBlind = (*FGDExact)(nil)
	_ MemoryBlind = (*Weighted)(nil)
)

// MemoryBlind implements MemoryBlind: BestFit reads free CPU and GPU.
func (BestFit) MemoryBlind() bool { return true }

// MemoryBlind implements MemoryBlind: GpuPacking reads the GPUs.
func (GpuPacking) MemoryBlind() bool { return true }

// MemoryBlind implements MemoryBlind: DotProd reads free CPU and GPU.
func (DotProd) MemoryBlind() bool { return true }

// MemoryBlind implements MemoryBlind: FGD's measure reads free CPU and
// GPU shares.
func (*FGD) MemoryBlind() bool { return true }

// MemoryBlind implements MemoryBlind: as FGD.
func (*FGDExact) MemoryBlind() bool { return true }

// MemoryBlind implements MemoryBlind: no dimension reads the node's free
// memory (GPU memory is read, where options tell GPUs apart).
func (*Weighted) MemoryBlind() bool { return true }

var (
	_ Policy = Random{}
	_ Policy = BestFit{}
	_ Policy = GpuPacking{}
	_ Policy = DotProd{}
	_ Policy = (*GpuClustering)(nil)
	_ Policy = Spread{}
	_ Policy = (*FGD)(nil)
	_ Policy = (*FGDExact)(nil)
	_ Policy = (*Weighted)(nil)
)

// Constants of the openb baselines' normalisation (the largest node).
const (
	maxSpecCPU = 128000.0
	maxSpecGPU = 8000.0
	maxScore   = 100
)

// PolicyByName returns a policy by its (case-insensitive) name: random,
// dotprod, gpuclustering, gpupacking, bestfit, fgd or fusiond. frag is
// the typical-shape model FGD and fusiond use; profiles may be nil for the
// defaults.
func PolicyByName(name string, frag *FragModel, profiles Profiles) (Policy, bool) {
	switch strings.ToLower(name) {
	case "random":
		return Random{}, true
	case "dotprod", "dotproduct":
		return DotProd{}, true
	case "gpuclustering", "clustering":
		return NewGpuClustering(), true
	case "gpupacking", "packing":
		return GpuPacking{}, true
	case "bestfit":
		return BestFit{}, true
	case "fgd":
		return NewFGD(frag), true
	case "fgd-exact":
		return NewFGDExact(frag), true
	case "fusiond":
		return NewWeighted(profiles, frag), true
	case "spread", "k8s-spread":
		return Spread{}, true
	}
	return nil, false
}

// BaselineNames lists the paper's policies in its order.
var BaselineNames = []string{"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"}

// Random places on a feasible node drawn uniformly at random (every node
// gets an independent uniform score, so there are no ties).
type Random struct{}

// Name implements Policy.
func (Random) Name() string { return "random" }

// Score implements Policy.
func (Random) Score(_ *Request, _ *Node, _ int, rng *rand.Rand) Scored {
	return Scored{Score: rng.Float64(), GPU: -1}
}

// BestFit prefers the node left with the least free CPU and GPU, each
// normalised by the largest node and weighted equally.
type BestFit struct{}

// Name implements Policy.
func (BestFit) Name() string { return "bestfit" }

// Score implements Policy.
func (BestFit) Score(req *Request, n *Node, _ int, _ *rand.Rand) Scored {
	left := float64(n.CPUFreeMilli-req.CPUMilli)/maxSpecCPU*0.5 + float64(n.GPUMilliFree()-req.GPUMilliTotal())/maxSpecGPU*0.5
	return Scored{Score: math.Trunc((1 - left) * maxScore), GPU: -1}
}

// GpuPacking prefers, in order: topping up partly used GPUs (the fuller the
// better), then fully free GPUs on a used node (the fewer the better), then
// an idle node (the smaller the better).
type GpuPacking struct{}

// Name implements Policy.
func (GpuPacking) Name() string { return "gpupacking" }

// Score implements Policy.
func (GpuPacking) Score(req *Request, n *Node, _ int, _ *rand.Rand) Scored {
	if req.GPUMilli <= 0 {
		return Scored{GPU: -1}
	}
	free := n.FullyFreeGPUs()
	if free == len(n.GPUs) {
		return Scored{Score: float64(max(maxScore/3-free, free)), GPU: -1}
	}
	// Take fitting GPUs, least free first.
	need, wholeUsed := req.GPUs, 0
	var ratio int64
	used := make([]bool, len(n.GPUs))
	for need > 0 {
		g := -1
		for i := range n.GPUs {
			if !used[i] && n.gpuFits(req, i) && (g < 0 || n.GPUs[i].MilliFree < n.GPUs[g].MilliFree) {
				g = i
			}
		}
		if g < 0 {
			return Scored{GPU: -1}
		}
		used[g] = true
		need--
		if n.GPUs[g].MilliFree == MilliPerGPU {
			wholeUsed++
		}
		ratio += n.GPUs[g].MilliFree * 100 / MilliPerGPU
	}
	if wholeUsed > 0 {
		return Scored{Score: float64(max(maxScore/2-wholeUsed, maxScore/3)), GPU: -1}
	}
	return Scored{Score: float64(max(maxScore-ratio/10, maxScore/2)), GPU: -1}
}

// DotProd is Tetris' alignment heuristic: the smaller the dot product of
// the request with the node's free resources (CPU and GPU normalised by the
// largest node), the better the node is packed. For a shared request each
// fitting GPU is tried and the best is kept.
type DotProd struct{}

// Name implements Policy.
func (DotProd) Name() string { return "dotprod" }

// Score implements Policy.
func (DotProd) Score(req *Request, n *Node, _ int, _ *rand.Rand) Scored {
	cpu := float64(req.CPUMilli) / maxSpecCPU * float64(n.CPUFreeMilli) / maxSpecCPU
	if !req.Shared() {
		d := (cpu + float64(req.GPUMilliTotal())/maxSpecGPU*float64(n.GPUMilliFree())/maxSpecGPU) / 2
		return Scored{Score: math.Trunc((1 - d) * maxScore), GPU: -1}
	}
	best, bestG := -1.0, -1
	for i := range n.GPUs {
		if !n.gpuFits(req, i) {
			continue
		}
		d := (cpu + float64(req.GPUMilli)/MilliPerGPU*float64(n.GPUs[i].MilliFree)/MilliPerGPU) / 2
		if s := 1 - d; s > best {
			best, bestG = s, i
		}
	}
	return Scored{Score: math.Trunc(best * maxScore), GPU: bestG}
}

// affinity is GpuClustering's label of a request: "shared" (-1) or the
// number of whole GPUs.
type affinity int

func affinityOf(req *Request) affinity {
	if req.Shared() {
		return -1
	}
	return affinity(req.GPUs)
}

// GpuClustering places requests next to requests of the same GPU kind
// (shared, or the same number of whole GPUs):
// a node holding only that shape is best, then nodes holding it among
// others, then idle nodes, then nodes of other shapes; within a band the
// fuller node wins.
type GpuClustering struct {
	nodes map[int]map[affinity]int
}

var _ Observer = (*GpuClustering)(nil)

// NewGpuClustering returns an empty GpuClustering policy.
func NewGpuClustering() *GpuClustering { return &GpuClustering{nodes: map[int]map[affinity]int{}} }

// Name implements Policy.
func (*GpuClustering) Name() string { return "gpuclustering" }

// Score implements Policy.
func (p *GpuClustering) Score(req *Request, n *Node, idx int, _ *rand.Rand) Scored {
	if req.GPUs == 0 {
		return Scored{GPU: -1}
	}
	aff := p.nodes[idx]
	band := int64(0)
	switch {
	case aff[affinityOf(req)] > 0 && len(aff) == 1:
		band = 3
	case aff[affinityOf(req)] > 0:
		band = 2
	case len(aff) == 0:
		band = 1
	}
	fill := int64(maxScore/4) * (int64(maxSpecGPU) - n.GPUMilliFree()) / int64(maxSpecGPU)
	return Scored{Score: float64(fill + band*maxScore/4), GPU: -1}
}

// Placed implements Observer.
func (p *GpuClustering) Placed(req *Request, _ *Node, idx int) {
	if req.GPUs == 0 {
		return
	}
	m := p.nodes[idx]
	if m == nil {
		m = map[affinity]int{}
		p.nodes[idx] = m
	}
	m[affinityOf(req)]++
}

// Released implements Observer.
func (p *GpuClustering) Released(req *Request, _ *Node, idx int) {
	m := p.nodes[idx]
	k := affinityOf(req)
	if m == nil || m[k] == 0 {
		return
	}
	if m[k]--; m[k] == 0 {
		delete(m, k)
	}
}

// Spread imitates the Kubernetes default scheduler's
// LeastAllocated/balanced behaviour: the emptiest node wins.
type Spread struct{}

// Name implements Policy.
func (Spread) Name() string { return "spread" }

// Score implements Policy.
func (Spread) Score(req *Request, n *Node, _ int, _ *rand.Rand) Scored {
	cpu := float64(n.CPUFreeMilli-req.CPUMilli) / float64(max(n.CPUMilli, 1))
	mem := float64(n.MemFreeMiB-req.MemMiB) / float64(max(n.MemMiB, 1))
	s := (cpu + mem) / 2
	if len(n.GPUs) > 0 {
		g := float64(n.GPUMilliFree()-req.GPUMilliTotal()) / float64(len(n.GPUs)*MilliPerGPU)
		s = (cpu + mem + g) / 3
	}
	return Scored{Score: math.Trunc(s * maxScore), GPU: -1}
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
