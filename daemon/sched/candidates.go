package sched

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
)

// AssignmentPolicy is a Policy that scores the concrete assignments of a
// request inside a node — which GPUs, MIG slot (an existing instance or a
// new one), shared GPU, FPGA region and NUMA node for the exclusive cores —
// rather than the node as a whole. The Engine uses it instead of Score
// when its policy has it, and picks the best (node, assignment).
type AssignmentPolicy interface {
	Policy
	// Choices appends to out the scored assignments of req on n (which
	// passed Filter; idx as for Score), best first: always the best, and
	// up to keep in all.
	Choices(req *Request, n *Node, idx, keep int, out []Choice) []Choice
}

var _ AssignmentPolicy = (*Weighted)(nil)

// maxChoices bounds the assignments a node contributes to a decision.
const maxChoices = 8

// Choice is one scored assignment inside a node, kept compact;
// Assignment makes it concrete.
type Choice struct {
	Scored
	// Dims are the dimensions' scores s_d (Scored.Parts are w_d·s_d).
	Dims     [NumDims]float64
	Locality float64
	gpus     uint64 // bit i: GPU i (the whole GPUs, or the one shared GPU)
	mig      MIGPick
	hasMIG   bool
	fpga     int // FPGA region, -1 for none
	home     int // NUMA node the exclusive cores start from, -1: pickCores' default
	// exact is false while the fragmentation part is only an upper bound
	// (a shared GPU other than the one the fragmentation measure chose).
	exact bool
	seq   int // generation order, the tie-break
}

// Assignment is the choice as an assignment on n (index idx).
func (c *Choice) Assignment(req *Request, n *Node, idx int) Assignment {
	a := Assignment{Node: n.Name, NodeIdx: idx, CPUMilli: req.CPUMilli + int64(req.ExclusiveCores)*1000, MemMiB: req.MemMiB, FPGA: -1}
	for s := c.gpus; s != 0; s &= s - 1 {
		a.GPUs = append(a.GPUs, bits.TrailingZeros64(s))
	}
	if len(a.GPUs) > 0 {
		a.GPUMilli, a.GPUMemMiB = req.GPUMilli, req.GPUMemMiB
	}
	if c.hasMIG {
		m := c.mig
		a.MIG = &m
	}
	if c.fpga >= 0 && c.fpga < len(n.FPGAs) {
		a.FPGA, a.Bitstream = c.fpga, req.Bitstream
		a.Program = n.FPGAs[c.fpga].Bitstream != req.Bitstream
	}
	if req.ExclusiveCores > 0 {
		a.Cores, _ = pickCores(req, n, c.home)
	}
	a.GPUModel, a.Owner = n.gpuModelOf(&a), req.Owner
	return a
}

// gpuKey is what makes two GPUs of a node interchangeable for a request:
// alternatives that differ only by GPUs of equal keys (and equal
// locality) are one candidate.
type gpuKey struct {
	model               string
	milli, mem          int64
	numa                int
	load, power, ppw, w float64
}

func keyOf(g *GPU) gpuKey {
	return gpuKey{model: g.Model, milli: g.MilliFree, mem: g.MemFreeMiB, numa: g.NUMA, load: g.Load, power: g.PowerW, ppw: g.PerfPerWatt, w: g.IdleWatts}
}

// hash mixes a key into 64 bits (a commutative sum of member hashes is the
// signature of a GPU set).
func (k gpuKey) hash() uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(k.model); i++ {
		h ^= uint64(k.model[i])
		h *= 1099511628211
	}
	for _, v := range [...]uint64{uint64(k.milli), uint64(k.mem), uint64(k.numa), math.Float64bits(k.load), math.Float64bits(k.power), math.Float64bits(k.ppw), math.Float64bits(k.w)} {
		h ^= v
		h *= 1099511628211
		h ^= h >> 29
	}
	return h
}

// option is a generated, not yet scored, choice.
type option struct {
	gpus   uint64
	mig    MIGPick
	hasMIG bool
	fpga   int
	home   int
	loc    float64
	sig    uint64 // symmetry signature
	// migFrag is the MIG slot's packing score (MIG options only).
	migFrag float64
}

// Choices implements AssignmentPolicy: it generates the node's concrete
// assignments (symmetric ones once), scores each Σ w_d·s_d with the
// class's profile and returns them best first.
func (p *Weighted) Choices(req *Request, n *Node, idx, keep int, out []Choice) []Choice {
	out, _ = p.choices(req, n, idx, keep, math.Inf(-1), false, out)
	return out
}

// boundedChooser is an AssignmentPolicy that can tell, before scoring a
// node's assignments, that none of them can score floor or more; the
// Engine then leaves the node out of a decision it cannot win or tie.
type boundedChooser interface {
	AssignmentPolicy
	// choicesAbove is Choices keeping the best only, except that when n
	// has assignments but none can score floor or more (with orEqual:
	// more than floor) it returns out unchanged and true, without
	// scoring them.
	choicesAbove(req *Request, n *Node, idx int, floor float64, orEqual bool, out []Choice) ([]Choice, bool)
}

var _ boundedChooser = (*Weighted)(nil)

func (p *Weighted) choicesAbove(req *Request, n *Node, idx int, floor float64, orEqual bool, out []Choice) ([]Choice, bool) {
	return p.choices(req, n, idx, 1, floor, orEqual, out)
}

// weightsFor is req's class's weights, looked up once per request (not
// per node); p.wGen counts their changes.
func (p *Weighted) weightsFor(req *Request) Weights {
	if p.lastReq != req || p.lastClass != req.Class {
		w := p.weights(req.Class)
		if p.wGen == 0 || w != p.lastW {
			p.wGen++
		}
		p.lastReq, p.lastClass, p.lastW = req, req.Class, w
	}
	return p.lastW
}

// choices is Choices; with a floor above -Inf and keep ≤ 1 it scores
// nothing when scoreBound shows that no assignment of n can score floor
// or more (orEqual: more than floor), and then reports true (n has
// assignments: it is feasible).
func (p *Weighted) choices(req *Request, n *Node, idx, keep int, floor float64, orEqual bool, out []Choice) ([]Choice, bool) {
	w := p.weightsFor(req)
	mig := req.MIGProfile != ""
	// The bounds take dimensions at their maximum, an upper bound only
	// while no weight is negative (the daemon's config refuses negative
	// weights; Weighted.Profiles is a public field).
	bounded := keep <= 1 && !math.IsInf(floor, -1) && !slices.ContainsFunc(w[:], func(x float64) bool { return x < 0 })
	// A bound below floor, or equal to it with orEqual, cannot win. The
	// state bound and the entry bound take the other dimensions at 1;
	// only where that leaves the node to be scored does the entry bound
	// take them at otherBounds' (which costs about as much as scoring one
	// assignment, and makes the bound the best assignment's score on a
	// node of alike GPUs, so that with orEqual a node that would only tie
	// is not scored).
	cannotWin := func(bound float64) bool { return bound < floor || (orEqual && bound == floor) }
	if bounded {
		// Whether n has options does not depend on the shared GPU the
		// fragmentation measure prefers (oneGPUOptions).
		// Outside MIG the bound with the priority at 1 (kept per node
		// state) first; it is the bound itself where priority weighs 0.
		var below bool
		if mig {
			fb, ok := p.fragBound(req, n, idx)
			below = ok && cannotWin(scoreBound(&w, nil, fb, priorityScore(req, n), true))
		} else {
			fb, sb, ok := p.stateScore(req, n, idx, &w)
			below = ok && (cannotWin(sb) || (w[DimPriority] != 0 && cannotWin(scoreBound(&w, nil, fb, priorityScore(req, n), false))))
		}
		if below && (hasOptions(req, n) || len(p.options(req, n, -1, false)) > 0) {
			return out, true
		}
	}
	prio := priorityScore(req, n)
	frag, fragGPU := p.fragmentation(req, n, idx)
	below := func() bool {
		if cannotWin(scoreBound(&w, nil, frag, prio, mig)) {
			return true
		}
		var others [NumDims]float64
		return p.otherBounds(req, n, &others) && cannotWin(scoreBound(&w, &others, frag, prio, mig))
	}
	if bounded && hasOptions(req, n) && below() {
		return out, true
	}
	opts := p.options(req, n, fragGPU, keep > 1)
	if bounded && !hasOptions(req, n) && len(opts) > 0 && below() {
		return out, true
	}
	base := len(out)
	for i := range opts {
		o := &opts[i]
		out = append(out, Choice{gpus: o.gpus, mig: o.mig, hasMIG: o.hasMIG, fpga: o.fpga, home: o.home, Locality: o.loc, exact: true, seq: i})
		c := &out[len(out)-1]
		c.GPU = -1
		if req.Shared() && o.gpus != 0 {
			c.GPU = bits.TrailingZeros64(o.gpus)
		}
		s := &c.Dims
		s[DimCompute] = p.computeOf(req, n, o)
		s[DimLocality] = o.loc
		s[DimFragmentation] = frag
		switch {
		case o.hasMIG:
			s[DimFragmentation] = (frag + o.migFrag) / 2
		case req.Shared() && c.GPU != fragGPU:
			c.exact = false // frag is an upper bound until refined
		}
		s[DimEnergy] = p.energyOf(req, n, o)
		s[DimLoad] = 1 - loadOf(req, n, o)
		s[DimPriority] = prio
		c.score(&w)
	}
	cs := out[base:]
	if len(cs) == 1 {
		return out, false
	}
	order := func(a, b Choice) int {
		return cmp.Or(cmp.Compare(b.Score, a.Score), cmp.Compare(a.seq, b.seq))
	}
	// Refine the inexact (upper-bound) candidates that could still matter:
	// all of them when several are kept, otherwise those whose bound beats
	// the best exact score.
	bestExact := math.Inf(-1)
	for i := range cs {
		if cs[i].exact {
			bestExact = max(bestExact, cs[i].Score)
		}
	}
	for i := range cs {
		if !cs[i].exact && (keep > 1 || cs[i].Score > bestExact) {
			cs[i].Dims[DimFragmentation] = p.sharedFrag(req, n, frag, fragGPU, cs[i].GPU)
			cs[i].score(&w)
			cs[i].exact = true
			bestExact = max(bestExact, cs[i].Score)
		}
	}
	for i := range cs {
		if !cs[i].exact {
			// Below the best exact score whatever its exact value: keep
			// it out of the order's top.
			cs[i].Score = math.Inf(-1)
		}
	}
	slices.SortStableFunc(cs, order)
	k := max(keep, 1)
	for len(cs) > k || (len(cs) > 1 && math.IsInf(cs[len(cs)-1].Score, -1)) {
		cs = cs[:len(cs)-1]
	}
	return out[:base+len(cs)], false
}

// hasOptions says whether options is sure to generate some assignment of
// req on n, which passed Filter, without generating them: for a request
// with no MIG instance, FPGA region or exclusive cores on a node of at
// most 64 GPUs. Then no NUMA alignment applies (mustAlign), a CPU-only
// request has its one option, and Filter counted at least req.GPUs GPUs
// that gpuFits, of one model (fitOfOneModel, as wholeGPUOptions groups
// them), from which oneGPUOptions and wholeGPUOptions build at least one.
func hasOptions(req *Request, n *Node) bool {
	return req.MIGProfile == "" && req.Bitstream == "" && req.ExclusiveCores == 0 && len(n.GPUs) <= 64
}

// scoreBound is at least the score of every assignment of a request on a
// node whose fragmentation dimension is frag and priority dimension prio
// (what all of the node's assignments share): the other dimensions at
// others' (bounds of them, otherBounds) or, with others nil, at their
// maximum, 1, and for a MIG request the fragmentation dimension at 1 too
// (a MIG option averages frag with its slot's packing). An assignment's
// fragmentation dimension is frag or, refined on another shared GPU
// (sharedFrag), less. It is summed by weigh, as the scores are, so its
// float arithmetic is theirs, term by term, and rounding, being
// monotone, keeps it a bound; where every dimension equals the best
// assignment's it is that assignment's score exactly.
func scoreBound(w *Weights, others *[NumDims]float64, frag, prio float64, mig bool) float64 {
	var dims, parts [NumDims]float64
	if others != nil {
		dims = *others
	} else {
		for d := range dims {
			dims[d] = 1
		}
	}
	if mig {
		dims[DimFragmentation] = 1
	} else {
		dims[DimFragmentation] = frag
	}
	dims[DimPriority] = prio
	return weigh(w, &dims, &parts)
}

func (c *Choice) score(w *Weights) { c.Score = weigh(w, &c.Dims, &c.Parts) }

// otherBounds sets dims' compute, locality, energy and load dimensions to
// bounds of those of every assignment of req on n and reports whether it
// could (false: dims unset). It can for a request without a MIG
// instance, FPGA region or exclusive cores on a node whose GPUs differ in
// nothing those dimensions read (liveUniform): its assignments are then
// req.GPUs of the first 64 GPUs (none for a CPU-only request) with
// locality at most 1, and computeOf, energyOf and loadOf give every such
// set the same value, so they are computed for the first req.GPUs GPUs —
// by the dimensions' own functions, so with their float arithmetic: they
// are every assignment's own values, and scoreBound with them and an
// assignment's fragmentation dimension is its score where its locality
// is 1.
func (p *Weighted) otherBounds(req *Request, n *Node, dims *[NumDims]float64) bool {
	k := req.GPUs
	if req.MIGProfile != "" || req.Bitstream != "" || req.ExclusiveCores > 0 || k > min(len(n.GPUs), 64) || (k > 0 && !liveUniform(n)) {
		return false
	}
	o := option{gpus: uint64(1)<<uint(k) - 1, fpga: -1, home: -1, loc: 1} // 1<<64 is 0 in Go: all 64
	dims[DimCompute] = p.computeOf(req, n, &o)
	dims[DimLocality] = 1
	dims[DimEnergy] = p.energyOf(req, n, &o)
	dims[DimLoad] = 1 - loadOf(req, n, &o)
	return true
}

// weigh clamps each dimension's score into [0,1], sets parts to w_d·s_d
// and returns their sum in dimension order. It is where every Choice's
// score and scoreBound are summed; it is kept out of line so that the
// compiler cannot fuse its multiply-adds differently at the two call
// sites (Go allows fused multiply-add, e.g. on arm64), which would break
// the bound by a rounding.
//
//go:noinline
func weigh(w *Weights, dims, parts *[NumDims]float64) float64 {
	var sum float64
	for d, v := range dims {
		if v < 0 {
			v = 0
		} else if v > 1 {
			v = 1
		}
		dims[d] = v
		parts[d] = w[d] * v
		sum += parts[d]
	}
	return sum
}

// sharedFrag is the fragmentation score of a shared request on GPU g when
// the fragmentation measure chose chosen (scored frag): lower by how much
// less of the measure's gain g keeps (the FGD measure, sigmoid per 1000
// milli); without a shape model, by how much emptier g is than the
// fullest fitting GPU.
func (p *Weighted) sharedFrag(req *Request, n *Node, frag float64, chosen, g int) float64 {
	if p.fs == nil || chosen < 0 {
		bf := bestFitGPU(req, n)
		if bf < 0 {
			return frag
		}
		return frag - float64(n.GPUs[g].MilliFree-n.GPUs[bf].MilliFree)/float64(MilliPerGPU*len(n.GPUs))
	}
	m := p.fs.model
	before := m.NodeFrag(n)
	var one [1]int
	one[0] = chosen
	best := sigmoid((before - m.fragAfter(n, req, one[:])) / 1000)
	one[0] = g
	here := sigmoid((before - m.fragAfter(n, req, one[:])) / 1000)
	return frag - max(0, best-here)
}

// options generates the node's assignments for req, symmetric ones once,
// at most maxChoices (the best by a cheap pre-score: locality, then the
// GPUs' live quality). fragGPU is the shared GPU the fragmentation
// measure chose (-1: none).
func (p *Weighted) options(req *Request, n *Node, fragGPU int, all bool) []option {
	opts := p.scratch[:0]
	switch {
	case req.MIGProfile != "":
		opts = migOptions(req, n, opts)
	case req.GPUs == 1:
		opts = oneGPUOptions(req, n, fragGPU, !all && req.Bitstream == "" && (req.ExclusiveCores == 0 || n.numaCount() == 1) && liveUniform(n), opts)
	case req.GPUs > 1:
		opts = wholeGPUOptions(req, n, opts)
	default:
		opts = append(opts, option{fpga: -1, home: -1, loc: 1})
	}
	if req.Bitstream != "" {
		opts = withFPGA(req, n, opts)
	}
	if req.ExclusiveCores > 0 {
		opts = withCores(req, n, opts)
	}
	if len(opts) > maxChoices {
		slices.SortStableFunc(opts, func(a, b option) int { return cmp.Compare(b.loc, a.loc) })
		opts = opts[:maxChoices]
	}
	p.scratch = opts
	return opts
}

// gpu is the option's first GPU (its MIG instance's GPU), 0 without.
func (o *option) gpu() int {
	switch {
	case o.gpus != 0:
		return bits.TrailingZeros64(o.gpus)
	case o.hasMIG:
		return o.mig.GPU
	}
	return 0
}

// dupSig reports whether an option with signature sig is already there.
func dupSig(opts []option, sig uint64) bool {
	for i := range opts {
		if opts[i].sig == sig {
			return true
		}
	}
	return false
}

// oneGPUOptions are the GPUs a one-GPU request (shared or whole) may take,
// one per class of interchangeable GPUs: the fragmentation measure's GPU
// (else the best fit for a share, the first fitting for a whole GPU)
// first. With onlyLead (only the best is wanted and the GPUs differ in
// nothing but what the fragmentation measure weighed) the lead alone.
func oneGPUOptions(req *Request, n *Node, lead int, onlyLead bool, opts []option) []option {
	if onlyLead && !mustAlign(req, n) {
		if lead < 0 && !req.Shared() {
			for i := range min(len(n.GPUs), 64) {
				if n.gpuFits(req, i) {
					lead = i
					break
				}
			}
		}
		if lead >= 0 && lead < len(n.GPUs) && lead < 64 && n.gpuFits(req, lead) {
			return append(opts, option{gpus: 1 << uint(lead), fpga: -1, home: n.GPUs[lead].NUMA, loc: 1})
		}
	}
	aligned := alignedNUMA(req, n)
	fits := func(i int) bool { return i >= 0 && i < 64 && n.gpuFits(req, i) && aligned(n.GPUs[i].NUMA) }
	if !fits(lead) {
		lead = -1
		if req.Shared() {
			lead = bestFitGPU(req, n)
		} else {
			for i := range n.GPUs {
				if fits(i) {
					lead = i
					break
				}
			}
		}
	}
	start := len(opts)
	add := func(i int) {
		if len(opts) > start {
			k := keyOf(&n.GPUs[i])
			for j := start; j < len(opts); j++ {
				if keyOf(&n.GPUs[bits.TrailingZeros64(opts[j].gpus)]) == k {
					return
				}
			}
		}
		opts = append(opts, option{gpus: 1 << uint(i), fpga: -1, home: n.GPUs[i].NUMA, loc: 1})
	}
	if fits(lead) {
		add(lead)
		if onlyLead {
			return opts
		}
	}
	for i := range n.GPUs {
		if i != lead && fits(i) {
			add(i)
		}
	}
	return opts
}

// liveUniform reports whether every GPU of n has the same live inputs and
// efficiency, so that no dimension but fragmentation tells two fitting GPUs
// apart (an idle draw without a power reading makes a GPU's holding work
// matter, see idleDepth).
func liveUniform(n *Node) bool {
	if len(n.GPUs) == 0 {
		return true
	}
	g0 := &n.GPUs[0]
	if g0.IdleWatts > 0 && g0.PowerW == 0 {
		return false
	}
	for i := 1; i < len(n.GPUs); i++ {
		g := &n.GPUs[i]
		if g.Model != g0.Model || g.Load != g0.Load || g.PowerW != g0.PowerW || g.PerfPerWatt != g0.PerfPerWatt || g.IdleWatts != g0.IdleWatts {
			return false
		}
	}
	return true
}

// better is the live order of two GPUs for growing a set: less loaded,
// then more efficient, then the lower index.
func better(n *Node, i, j int) bool {
	a, b := &n.GPUs[i], &n.GPUs[j]
	if a.Load != b.Load {
		return a.Load < b.Load
	}
	if a.PerfPerWatt != b.PerfPerWatt {
		return a.PerfPerWatt > b.PerfPerWatt
	}
	return i < j
}

// wholeGPUOptions are the sets of req.GPUs whole GPUs: without NVLink on
// one NUMA node, GPUs all alike give one set; otherwise a set grown
// greedily from each seed GPU (NVLink pairs first, then its NUMA node, then
// the live order), one per symmetry class (the members' keys and the
// set's locality).
func wholeGPUOptions(req *Request, n *Node, opts []option) []option {
	k := req.GPUs
	aligned := alignedNUMA(req, n)
	var free uint64
	alike := true
	first := -1
	for i := range min(len(n.GPUs), 64) {
		if n.gpuFits(req, i) && aligned(n.GPUs[i].NUMA) {
			free |= 1 << uint(i)
			if first < 0 {
				first = i
			} else if keyOf(&n.GPUs[i]) != keyOf(&n.GPUs[first]) {
				alike = false
			}
		}
	}
	if bits.OnesCount64(free) < k {
		return opts
	}
	if len(n.NVLink) == 0 && n.numaCount() == 1 && alike {
		set := uint64(0)
		for s := free; bits.OnesCount64(set) < k; s &= s - 1 {
			set |= s & -s
		}
		return append(opts, option{gpus: set, fpga: -1, home: n.GPUs[first].NUMA, loc: 1})
	}
	var link [64]uint64
	for _, pr := range n.NVLink {
		if pr[0] >= 0 && pr[0] < 64 && pr[1] >= 0 && pr[1] < 64 {
			link[pr[0]] |= 1 << uint(pr[1])
			link[pr[1]] |= 1 << uint(pr[0])
		}
	}
	// A set holds GPUs of one model: each model's GPUs are grown apart.
	var gb [8]uint64
	for _, free := range n.modelMasks(free, gb[:0]) {
		if bits.OnesCount64(free) >= k {
			opts = growSets(n, k, free, &link, opts)
		}
	}
	return opts
}

// growSets appends the sets of k GPUs grown greedily from each seed in
// free (NVLink pairs first, then the seed's NUMA node, then the live
// order), one per symmetry class.
func growSets(n *Node, k int, free uint64, link *[64]uint64, opts []option) []option {
	for s := free; s != 0; s &= s - 1 {
		seed := bits.TrailingZeros64(s)
		set := uint64(1) << uint(seed)
		numa := n.GPUs[seed].NUMA
		for bits.OnesCount64(set) < k {
			next, nextScore := -1, -1
			for r := free &^ set; r != 0; r &= r - 1 {
				j := bits.TrailingZeros64(r)
				sc := bits.OnesCount64(link[j]&set) * 2
				if n.GPUs[j].NUMA == numa {
					sc++
				}
				if sc > nextScore || (sc == nextScore && better(n, j, next)) {
					next, nextScore = j, sc
				}
			}
			set |= 1 << uint(next)
		}
		loc := setLocality(n, set, link)
		sig := math.Float64bits(loc)
		for m := set; m != 0; m &= m - 1 {
			sig += keyOf(&n.GPUs[bits.TrailingZeros64(m)]).hash()
		}
		if !dupSig(opts, sig) {
			// The set's home NUMA node: its lowest GPU's (as assign).
			opts = append(opts, option{gpus: set, fpga: -1, home: n.GPUs[bits.TrailingZeros64(set)].NUMA, loc: loc, sig: sig})
		}
	}
	return opts
}

// migOptions are, on each MIG GPU, a free instance of the profile (no
// reconfiguration) and the best spot for a new one on free slices (the one
// leaving the longest run of free slices, as pickMIG), GPUs with the same
// layout and key once. Only where the node offers none of these, each GPU's
// best spot over slices that only idle instances hold (destroying them, as
// pickMIG's last resort) is offered.
func migOptions(req *Request, n *Node, opts []option) []option {
	first := len(opts)
	var destroys []option
	for gi := range n.GPUs {
		m := n.GPUs[gi].MIG
		if m == nil || !req.ModelAllowed(n.ModelOf(gi)) {
			continue
		}
		used := m.usedMask()
		key := keyOf(&n.GPUs[gi]).hash() ^ used*0x9e3779b97f4a7c15
		free := m.TotalSlices - bits.OnesCount64(used)
		for _, in := range m.Instances {
			if !in.InUse && in.Slices == req.MIGSlices && (in.Profile == "" || in.Profile == req.MIGProfile) {
				if sig := key ^ 1; !dupSig(opts, sig) {
					opts = append(opts, option{mig: MIGPick{GPU: gi, Start: in.Start, Slices: in.Slices}, hasMIG: true, fpga: -1, home: n.GPUs[gi].NUMA, loc: 1, sig: sig, migFrag: 1})
				}
				break
			}
		}
		if p, bestRun, ok := bestMIGSpot(req, m, false); ok {
			if sig := key ^ 2; !dupSig(opts, sig) {
				p.GPU = gi
				opts = append(opts, option{mig: p, hasMIG: true, fpga: -1, home: n.GPUs[gi].NUMA, loc: 1, sig: sig, migFrag: migPacking(m, free, req.MIGSlices, bestRun)})
			}
			continue
		}
		if p, bestRun, ok := bestMIGSpot(req, m, true); ok {
			if sig := key ^ 3; !dupSig(destroys, sig) {
				p.GPU = gi
				// The destroyed instances' slices are free again.
				freed := 0
				for _, in := range m.Instances {
					if !in.InUse && in.overlaps(p.Start, p.Slices) {
						freed += in.Slices
					}
				}
				destroys = append(destroys, option{mig: p, hasMIG: true, fpga: -1, home: n.GPUs[gi].NUMA, loc: 1, sig: sig, migFrag: migPacking(m, free+freed, req.MIGSlices, bestRun)})
			}
		}
	}
	if len(opts) == first {
		opts = append(opts, destroys...)
	}
	return opts
}

// migPacking scores a new instance of k slices on m, free slices free
// before it and a longest free run of run after it: fewer free slices left
// on the GPU is better (whole GPUs stay whole), and a contiguous rest
// better than a broken one.
func migPacking(m *MIG, free, k, run int) float64 {
	t := float64(max(m.TotalSlices, 1))
	after := free - k
	return 1 - 0.5*float64(after)/t - 0.5*float64(after-run)/t
}

// withFPGA gives each option an FPGA region: every free region, regions
// alike (same bitstream state, programming time and NUMA node) once; a
// region off the devices' NUMA node halves the locality.
func withFPGA(req *Request, n *Node, opts []option) []option {
	type rkey struct {
		loaded bool
		ms     float64
		numa   int
	}
	var regions [maxChoices]int
	var keys [maxChoices]rkey
	nr := 0
	for i := range n.FPGAs {
		r := &n.FPGAs[i]
		if r.Busy {
			continue
		}
		k := rkey{r.Bitstream == req.Bitstream, r.ProgramMs, r.NUMA}
		if slices.Contains(keys[:nr], k) {
			continue
		}
		if nr == len(regions) {
			break
		}
		regions[nr], keys[nr] = i, k
		nr++
	}
	out := opts[len(opts):]
	for _, o := range opts {
		for _, ri := range regions[:nr] {
			x := o
			x.fpga = ri
			numa := n.FPGAs[ri].NUMA
			if o.gpus == 0 && !o.hasMIG {
				x.home = numa
			} else if numa != o.home {
				x.loc *= 0.5
			}
			out = append(out, x)
		}
	}
	// out was built past opts in the same array: move it down.
	return append(opts[:0], out...)
}

// withCores sets where each option's exclusive cores come from: the
// devices' NUMA node; for an option without devices, each NUMA node with
// free cores is an option. Cores spread over several NUMA nodes divide the
// locality by their number.
func withCores(req *Request, n *Node, opts []option) []option {
	var buf [8]int
	take := buf[:0]
	if len(n.FreeCores) > len(buf) {
		take = make([]int, 0, len(n.FreeCores))
	}
	take = take[:len(n.FreeCores)]
	out := opts[len(opts):]
	var hb [8]int
	for _, o := range opts {
		homes := append(hb[:0], o.home)
		if o.gpus == 0 && !o.hasMIG && o.fpga < 0 {
			// Most free cores first: on a tie the default rule's node.
			homes = homes[:0]
			for i, c := range n.FreeCores {
				if c > 0 {
					homes = append(homes, i)
				}
			}
			slices.SortStableFunc(homes, func(a, b int) int { return cmp.Compare(n.FreeCores[b], n.FreeCores[a]) })
			if len(homes) == 0 {
				homes = append(homes, -1)
			}
		}
		for _, h := range homes {
			x := o
			x.home = h
			if spread := coresTaken(req, n, h, take); spread > 1 {
				x.loc *= 1 / float64(spread)
			}
			out = append(out, x)
		}
	}
	return append(opts[:0], out...)
}

// priorityScore is the priority dimension: guaranteed work wants the CPU
// headroom a node keeps, lower tiers pack.
func priorityScore(req *Request, n *Node) float64 {
	taken := req.CPUMilli + int64(req.ExclusiveCores)*1000
	head := float64(n.CPUFreeMilli-taken) / float64(max(n.CPUMilli, 1))
	if req.Tier.Rank() >= TierGuaranteed.Rank() {
		return head
	}
	return 1 - head
}

// computeOf is the compute dimension of an option: the GPU model's
// capability for the class (training and batch want the most capable;
// inference and services on slices a modest one, so large GPUs stay for
// training), an FPGA region's readiness, 1 for CPU-only work.
func (p *Weighted) computeOf(req *Request, n *Node, o *option) float64 {
	if req.GPUs == 0 && req.MIGProfile == "" {
		if o.fpga < 0 {
			return 1
		}
		return regionCompute(req, &n.FPGAs[o.fpga])
	}
	c := p.capability(n.ModelOf(o.gpu()), req.Class)
	if (req.Class == ClassInference || req.Class == ClassService) && (req.Shared() || req.MIGProfile != "") {
		return 1 - c/2
	}
	return c
}

// regionCompute prefers a region already holding the bitstream (1) and
// otherwise weighs the programming time (one second costs half).
func regionCompute(req *Request, r *FPGARegion) float64 {
	if r.Bitstream == req.Bitstream {
		return 1
	}
	return 0.5 / (1 + r.ProgramMs/1000)
}

// energyOf is the energy dimension of an option: the mean over its GPUs
// of their performance per watt for the class, lowered by how deeply idle
// each GPU is (waking it from its idle power state costs the step to
// active power): a GPU at or below its idle draw counts half, one at twice
// its idle draw or more full, linearly between. A GPU without a power
// reading counts as idle when nothing holds it, it reports no load and its
// idle draw is known. Creating a MIG instance (reconfiguration) halves it,
// and each idle instance destroyed for it divides it further (1/(2+n)).
// CPU-only and FPGA-only work scores 1.
func (p *Weighted) energyOf(req *Request, n *Node, o *option) float64 {
	var sum float64
	cnt := 0
	one := func(i int) {
		g := &n.GPUs[i]
		sum += p.perfPerWatt(n.ModelOf(i), req.Class, g) * (1 - 0.5*idleDepth(g))
		cnt++
	}
	for s := o.gpus; s != 0; s &= s - 1 {
		one(bits.TrailingZeros64(s))
	}
	if o.hasMIG {
		one(o.mig.GPU)
	}
	if cnt == 0 {
		return 1
	}
	e := sum / float64(cnt)
	if o.hasMIG && o.mig.Create {
		// Each idle instance destroyed first is one more reconfiguration.
		e /= float64(2 + len(o.mig.Destroy))
	}
	return e
}

// idleDepth is 1 for a GPU in its idle power state, 0 for an active one.
func idleDepth(g *GPU) float64 {
	busy := g.MilliFree < MilliPerGPU
	if m := g.MIG; m != nil {
		busy = false
		for _, in := range m.Instances {
			busy = busy || in.InUse
		}
	}
	switch {
	case g.PowerW > 0 && g.IdleWatts > 0:
		return min(1, max(0, (2*g.IdleWatts-g.PowerW)/g.IdleWatts))
	case g.IdleWatts > 0 && !busy && g.Load == 0:
		return 1
	}
	return 0
}

// loadOf is the live load an option meets (0..1): the mean utilisation of
// its GPUs (70 %) and the CPU load where it runs (30 %), or the CPU load
// alone without GPUs. The CPU load is that of the NUMA nodes its exclusive
// cores come from (weighted by the cores taken) where it is measured per
// NUMA node, else the host's.
func loadOf(req *Request, n *Node, o *option) float64 {
	cpu := n.Load
	if req.ExclusiveCores > 0 && len(n.NUMALoad) > 0 {
		var buf [8]int
		take := buf[:0]
		if len(n.FreeCores) > len(buf) {
			take = make([]int, 0, len(n.FreeCores))
		}
		take = take[:len(n.FreeCores)]
		coresTaken(req, n, o.home, take)
		var l, c float64
		for i, t := range take {
			if t > 0 && i < len(n.NUMALoad) {
				l += float64(t) * n.NUMALoad[i]
				c += float64(t)
			}
		}
		if c > 0 {
			cpu = l / c
		}
	}
	var sum float64
	cnt := 0
	for s := o.gpus; s != 0; s &= s - 1 {
		sum += n.GPUs[bits.TrailingZeros64(s)].Load
		cnt++
	}
	if o.hasMIG {
		sum += n.GPUs[o.mig.GPU].Load
		cnt++
	}
	if cnt == 0 {
		return cpu
	}
	return 0.7*sum/float64(cnt) + 0.3*cpu
}
