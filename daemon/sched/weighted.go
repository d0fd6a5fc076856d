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

// Weighted is fusiond's own policy: Σ w_d·s_d with a profile per class.
type Weighted struct {
	Profiles Profiles
	// Capability is each GPU model's relative compute (0..1); unknown
	// models count 0.5.
	Capability map[string]float64
	fs         *fragScorer // FGD's single-copy measure
	fsCap      *fragScorer // the multi-copy (capacity) measure
}

// NewWeighted returns the policy; frag may be nil (fragmentation is then
// judged by how much of the node's GPU share stays free), profiles nil for
// DefaultProfiles.
func NewWeighted(profiles Profiles, frag *FragModel) *Weighted {
	if profiles == nil {
		profiles = DefaultProfiles()
	}
	w := &Weighted{Profiles: profiles, Capability: map[string]float64{}}
	if frag != nil {
		// fusiond judges fragmentation lexicographically: FGD's measure on
		// its coarse 0..100 scale first, then, among options within one
		// step of it, the multi-copy (capacity) measure — the GPU share a
		// node could not give to typical requests even if filled with them,
		// which also sees GPUs stranded by the CPU next to them.
		w.fs = &fragScorer{model: frag}
		cm := NewFragModel(frag.Shapes)
		cm.Capacity = true
		w.fsCap = &fragScorer{model: cm}
	}
	return w
}

// Name implements Policy.
func (*Weighted) Name() string { return "fusiond" }

// Dimensions returns s_d for every dimension (each in [0,1]) and the
// shared GPU chosen.
func (p *Weighted) Dimensions(req *Request, n *Node, idx int) ([NumDims]float64, int) {
	var s [NumDims]float64
	// Fragmentation first: it also chooses the shared GPU.
	var gpu int
	s[DimFragmentation], gpu = p.fragmentation(req, n, idx)
	var gpus []int
	var mig *MIGPick
	loc := 1.0
	var one [1]int
	switch {
	case req.GPUs > 1 || req.ExclusiveCores > 0 || req.MIGProfile != "" || req.Bitstream != "":
		a, l := assign(req, n, idx, gpu)
		gpus, mig, loc = a.GPUs, a.MIG, l
	case req.GPUs == 1:
		g := gpu
		if g < 0 || !gpuFits(req, &n.GPUs[g]) {
			if req.Shared() {
				g = bestFitGPU(req, n)
			} else {
				g = firstFreeGPU(req, n)
			}
		}
		if g >= 0 {
			one[0] = g
			gpus = one[:]
		}
	}
	s[DimLocality] = loc
	s[DimCompute] = p.compute(req, n)
	s[DimEnergy] = energy(n, gpus, mig)
	s[DimLoad] = 1 - loadOf(n, gpus)
	taken := req.CPUMilli + int64(req.ExclusiveCores)*1000
	head := float64(n.CPUFreeMilli-taken) / float64(max(n.CPUMilli, 1))
	if req.Tier.Rank() >= TierGuaranteed.Rank() {
		s[DimPriority] = head
	} else {
		s[DimPriority] = 1 - head
	}
	for d := range s {
		s[d] = min(1, max(0, s[d]))
	}
	return s, gpu
}

// Score implements Policy.
func (p *Weighted) Score(req *Request, n *Node, idx int, _ *rand.Rand) Scored {
	s, gpu := p.Dimensions(req, n, idx)
	w, ok := p.Profiles[req.Class]
	if !ok {
		w = p.Profiles[ClassBatch]
	}
	out := Scored{GPU: gpu}
	for d := range s {
		out.Parts[d] = w[d] * s[d]
		out.Score += out.Parts[d]
	}
	return out
}

// compute rates the device for the class: training and batch want the
// most capable GPU; inference and services on slices (shared or MIG) want
// a modest one so large GPUs stay for training.
func (p *Weighted) compute(req *Request, n *Node) float64 {
	if req.GPUs == 0 && req.MIGProfile == "" {
		if req.Bitstream == "" {
			return 1
		}
		return fpgaCompute(req, n)
	}
	c, ok := p.Capability[n.GPUModel]
	if !ok {
		c = 0.5
	}
	if (req.Class == ClassInference || req.Class == ClassService) && (req.Shared() || req.MIGProfile != "") {
		return 1 - c/2
	}
	return c
}

// fpgaCompute prefers a region already holding the bitstream (1) and
// otherwise weighs the programming time (one second costs half).
func fpgaCompute(req *Request, n *Node) float64 {
	r := pickFPGA(req, n)
	if r < 0 {
		return 0
	}
	if n.FPGAs[r].Bitstream == req.Bitstream {
		return 1
	}
	return 0.5 / (1 + n.FPGAs[r].ProgramMs/1000)
}

// energy is the chosen GPUs' performance per watt, halved for each idle
// GPU that would have to be woken (when its idle draw is known); creating
// a MIG instance (reconfiguration) halves it too.
func energy(n *Node, gpus []int, mig *MIGPick) float64 {
	if mig != nil {
		g := n.GPUs[mig.GPU].PerfPerWatt
		if g == 0 {
			g = 0.5
		}
		if mig.Create {
			g /= 2
		}
		return g
	}
	if len(gpus) == 0 {
		return 1
	}
	var s float64
	for _, g := range gpus {
		e := n.GPUs[g].PerfPerWatt
		if e == 0 {
			e = 0.5
		}
		if n.GPUs[g].IdleWatts > 0 && n.GPUs[g].MilliFree == MilliPerGPU && n.GPUs[g].Load == 0 {
			e /= 2
		}
		s += e
	}
	return s / float64(len(gpus))
}

func loadOf(n *Node, gpus []int) float64 {
	l := n.Load
	for _, g := range gpus {
		l = max(l, n.GPUs[g].Load)
	}
	return l
}

// firstFreeGPU is the lowest-index GPU that fits a whole-GPU request.
func firstFreeGPU(req *Request, n *Node) int {
	for i := range n.GPUs {
		if gpuFits(req, &n.GPUs[i]) {
			return i
		}
	}
	return -1
}
