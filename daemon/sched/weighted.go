package sched

import (
	"math/rand/v2"
)

// Weights holds w_d for each dimension.
type Weights [NumDims]float64

// Profiles maps a job class to its weights. Requests without a class use
// ClassBatch.
type Profiles map[Class]Weights

// DefaultProfiles are the weight profiles per class. Rationale:
//   - training: long multi-GPU jobs whose speed depends on the device and
//     the interconnect, so compute and locality dominate; fragmentation
//     still matters because their whole-GPU requests are what fragments.
//   - inference: small slices and latency: fragmentation (keep slices
//     packed so whole GPUs stay free) and live load (latency) dominate,
//     energy matters because inference runs around the clock.
//   - batch: throughput work that does not care where it runs: packing
//     (fragmentation) dominates, energy second.
//   - service: latency-critical and isolated: load and priority (headroom,
//     away from best-effort packing) dominate.
func DefaultProfiles() Profiles {
	return Profiles{
		ClassTraining:  {DimCompute: 0.30, DimLocality: 0.30, DimFragmentation: 0.25, DimEnergy: 0.05, DimLoad: 0.05, DimPriority: 0.05},
		ClassInference: {DimCompute: 0.10, DimLocality: 0.10, DimFragmentation: 0.35, DimEnergy: 0.15, DimLoad: 0.25, DimPriority: 0.05},
		ClassBatch:     {DimCompute: 0.01, DimLocality: 0.01, DimFragmentation: 0.96, DimEnergy: 0.01, DimLoad: 0.01, DimPriority: 0},
		ClassService:   {DimCompute: 0.10, DimLocality: 0.15, DimFragmentation: 0.15, DimEnergy: 0.05, DimLoad: 0.30, DimPriority: 0.25},
	}
}

// Weighted is fusiond's own policy: Σ w_d·s_d with a profile per class,
// over the concrete assignments inside each node (AssignmentPolicy).
type Weighted struct {
	Profiles Profiles
	// Capability overrides a GPU model's relative compute (0..1) for
	// every class.
	Capability map[string]float64
	// ModelTable reads each GPU model's compute and performance per watt
	// per class from the GPU model table (LookupGPU); without it a model
	// not in Capability counts 0.5 and each GPU's PerfPerWatt is used.
	ModelTable bool
	// Frag are the fragmentation keys' parameters (zero: the defaults,
	// DefaultFragParams); set before the first decision.
	Frag  FragParams
	fs    *fragScorer // FGD's single-copy measure
	fsCap *fragScorer // the multi-copy (capacity) measure
	// perf memoises the table per model and class.
	perf map[perfKey][2]float64
	// scratch holds a node's generated options between calls.
	scratch []option
	// lastReq's class's weights are lastW (looked up once per decision,
	// not per node).
	lastReq   *Request
	lastClass Class
	lastW     Weights
	// wGen counts the changes of lastW (from 1), for what is cached per
	// weights: states[idx], stateScore's per node.
	wGen   uint64
	states []stateBound
}

type perfKey struct {
	model string
	class Class
}

// NewWeighted returns the policy; frag may be nil (fragmentation is then
// judged by how much of the node's GPU share stays free), profiles nil for
// DefaultProfiles.
func NewWeighted(profiles Profiles, frag *FragModel) *Weighted {
	if profiles == nil {
		profiles = DefaultProfiles()
	}
	w := &Weighted{Profiles: profiles, Capability: map[string]float64{}}
	w.SetFragModel(frag)
	return w
}

// SetFragModel replaces the typical shapes fragmentation is judged
// against (nil: none), dropping what was cached for the old ones.
func (p *Weighted) SetFragModel(frag *FragModel) {
	p.fs, p.fsCap, p.states = nil, nil, nil
	if frag == nil {
		return
	}
	// fusiond judges fragmentation lexicographically: FGD's measure on
	// its coarse 0..100 scale first, then, among options within one
	// step of it, the multi-copy (capacity) measure — the GPU share a
	// node could not give to typical requests even if filled with them,
	// which also sees GPUs stranded by the CPU next to them.
	p.fs = &fragScorer{model: frag}
	cm := NewFragModel(frag.Shapes)
	cm.Capacity = true
	p.fsCap = &fragScorer{model: cm}
}

// Name implements Policy.
func (*Weighted) Name() string { return "fusiond" }

// weights is the class's profile (batch's for an unknown class).
func (p *Weighted) weights(c Class) Weights {
	w, ok := p.Profiles[c]
	if !ok {
		w = p.Profiles[ClassBatch]
	}
	return w
}

// Score implements Policy: the node's best assignment's score.
func (p *Weighted) Score(req *Request, n *Node, idx int, _ *rand.Rand) Scored {
	var buf [1]Choice
	cs := p.Choices(req, n, idx, 1, buf[:0])
	if len(cs) == 0 {
		return Scored{GPU: -1}
	}
	return cs[0].Scored
}

// modelPerf is the model's (capability, perf per watt) for the class from
// the table, memoised.
func (p *Weighted) modelPerf(model string, c Class) [2]float64 {
	k := perfKey{model, c}
	if v, ok := p.perf[k]; ok {
		return v
	}
	if p.perf == nil {
		p.perf = map[perfKey][2]float64{}
	}
	v := [2]float64{ModelCapability(model, c), ModelPerfPerWatt(model, c)}
	p.perf[k] = v
	return v
}

// capability is the model's relative compute for the class.
func (p *Weighted) capability(model string, c Class) float64 {
	if v, ok := p.Capability[model]; ok {
		return v
	}
	if p.ModelTable {
		return p.modelPerf(model, c)[0]
	}
	return neutralPerf
}

// perfPerWatt is GPU g's relative performance per watt for the class.
func (p *Weighted) perfPerWatt(model string, c Class, g *GPU) float64 {
	switch {
	case p.ModelTable:
		return p.modelPerf(model, c)[1]
	case g.PerfPerWatt > 0:
		return g.PerfPerWatt
	}
	return neutralPerf
}

// ParseDimension is the dimension named name (as Dimension.String
// writes it).
func ParseDimension(name string) (Dimension, bool) {
	for d := range NumDims {
		if d.String() == name {
			return d, true
		}
	}
	return 0, false
}
