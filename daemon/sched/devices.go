package sched

import "math/bits"

// assign chooses the devices inside n for req. sharedGPU is the GPU a
// policy chose for a shared request (-1: best fit). It returns the
// assignment and a locality score in [0,1]. n must have passed Filter.
func assign(req *Request, n *Node, idx, sharedGPU int) (Assignment, float64) {
	a := Assignment{Node: n.Name, NodeIdx: idx, CPUMilli: req.CPUMilli + int64(req.ExclusiveCores)*1000, MemMiB: req.MemMiB, FPGA: -1}
	loc := 1.0
	homeNUMA := -1
	switch {
	case req.Shared():
		g := sharedGPU
		if g < 0 || g >= len(n.GPUs) || !n.gpuFits(req, g) {
			g = bestFitGPU(req, n)
		}
		a.GPUs = []int{g}
		a.GPUMilli, a.GPUMemMiB = req.GPUMilli, req.GPUMemMiB
		homeNUMA = n.GPUs[g].NUMA
	case req.GPUs > 0:
		a.GPUs, loc = pickWholeGPUs(req, n)
		a.GPUMilli, a.GPUMemMiB = req.GPUMilli, req.GPUMemMiB
		homeNUMA = n.GPUs[a.GPUs[0]].NUMA
	}
	if req.MIGProfile != "" {
		if p, ok := pickMIG(req, n); ok {
			a.MIG = &p
			homeNUMA = n.GPUs[p.GPU].NUMA
		}
	}
	if req.Bitstream != "" {
		if r := pickFPGA(req, n); r >= 0 {
			a.FPGA, a.Bitstream = r, req.Bitstream
			a.Program = n.FPGAs[r].Bitstream != req.Bitstream
			if homeNUMA < 0 {
				homeNUMA = n.FPGAs[r].NUMA
			} else if n.FPGAs[r].NUMA != homeNUMA {
				loc *= 0.5
			}
		}
	}
	if req.ExclusiveCores > 0 {
		var spread int
		a.Cores, spread = pickCores(req, n, homeNUMA)
		if spread > 1 {
			loc *= 1 / float64(spread)
		}
	}
	a.GPUModel, a.Owner = n.gpuModelOf(&a), req.Owner
	return a, loc
}

// gpuFits reports whether GPU i can give req its share (or be one of its
// whole GPUs): not in MIG mode, of an allowed model, with the share and
// memory free, and for a share on an MPS GPU, serving no other owner.
func (n *Node) gpuFits(req *Request, i int) bool {
	g := &n.GPUs[i]
	return g.MIG == nil && g.MilliFree >= req.GPUMilli && (g.MemMiB == 0 || g.MemFreeMiB >= req.GPUMemMiB) &&
		(len(req.GPUModels) == 0 || req.ModelAllowed(n.ModelOf(i))) && g.ownerFits(req.Owner, req.GPUMilli)
}

// modelMasks splits a set of GPUs (bit i: GPU i) by model: on a node of
// one model the set itself, else one set per model in the order of the
// models' first GPU. The GPUs of one request come from one of them.
func (n *Node) modelMasks(set uint64, buf []uint64) []uint64 {
	if set == 0 {
		return buf
	}
	if n.Homogeneous() {
		return append(buf, set)
	}
	for rest := set; rest != 0; {
		first := bits.TrailingZeros64(rest)
		m := n.ModelOf(first)
		var group uint64
		for s := rest; s != 0; s &= s - 1 {
			if i := bits.TrailingZeros64(s); n.ModelOf(i) == m {
				group |= 1 << uint(i)
			}
		}
		buf = append(buf, group)
		rest &^= group
	}
	return buf
}

// gpuModelOf is the model of an assignment's GPUs ("" without GPUs).
func (n *Node) gpuModelOf(a *Assignment) string {
	switch {
	case len(a.GPUs) > 0 && a.GPUs[0] >= 0 && a.GPUs[0] < len(n.GPUs):
		return n.ModelOf(a.GPUs[0])
	case a.MIG != nil && a.MIG.GPU >= 0 && a.MIG.GPU < len(n.GPUs):
		return n.ModelOf(a.MIG.GPU)
	}
	return ""
}

// bestFitGPU is the fitting GPU with the least free share (lowest index
// on ties), which keeps whole GPUs whole.
func bestFitGPU(req *Request, n *Node) int {
	best := -1
	aligned := alignedNUMA(req, n)
	for i := range n.GPUs {
		if n.gpuFits(req, i) && aligned(n.GPUs[i].NUMA) && (best < 0 || n.GPUs[i].MilliFree < n.GPUs[best].MilliFree) {
			best = i
		}
	}
	return best
}

// pickWholeGPUs chooses req.GPUs fitting GPUs: on one NUMA node when
// possible, and among those the set with the most NVLink pairs, grown
// greedily from each seed GPU. Locality is the fraction of NVLink-connected
// pairs (1 without NVLink information) halved when NUMA nodes are mixed.
func pickWholeGPUs(req *Request, n *Node) ([]int, float64) {
	k := req.GPUs
	if len(n.NVLink) == 0 && n.numaCount() == 1 && n.Homogeneous() {
		out := make([]int, 0, k)
		for i := range n.GPUs {
			if len(out) < k && n.gpuFits(req, i) {
				out = append(out, i)
			}
		}
		return out, 1
	}
	var link [64]uint64
	for _, p := range n.NVLink {
		if p[0] >= 0 && p[0] < 64 && p[1] >= 0 && p[1] < 64 {
			link[p[0]] |= 1 << uint(p[1])
			link[p[1]] |= 1 << uint(p[0])
		}
	}
	var free uint64
	aligned := alignedNUMA(req, n)
	for i := range n.GPUs {
		if i < 64 && n.gpuFits(req, i) && aligned(n.GPUs[i].NUMA) {
			free |= 1 << uint(i)
		}
	}
	// The set comes from the GPUs of one model: the seed's.
	var gb [8]uint64
	groups := n.modelMasks(free, gb[:0])
	bestSet, bestScore := uint64(0), -1.0
	for seed := range min(len(n.GPUs), 64) {
		if free&(1<<uint(seed)) == 0 {
			continue
		}
		free := free
		for _, g := range groups {
			if g&(1<<uint(seed)) != 0 {
				free = g
			}
		}
		set := uint64(1) << uint(seed)
		numa := n.GPUs[seed].NUMA
		for bits.OnesCount64(set) < k {
			next, nextScore := -1, -1
			for j := range min(len(n.GPUs), 64) {
				if free&(1<<uint(j)) == 0 || set&(1<<uint(j)) != 0 {
					continue
				}
				s := bits.OnesCount64(link[j]&set) * 2
				if n.GPUs[j].NUMA == numa {
					s++
				}
				if s > nextScore {
					next, nextScore = j, s
				}
			}
			if next < 0 {
				break
			}
			set |= 1 << uint(next)
		}
		if bits.OnesCount64(set) < k {
			continue
		}
		if s := setLocality(n, set, &link); s > bestScore {
			bestSet, bestScore = set, s
		}
	}
	out := make([]int, 0, k)
	for set := bestSet; set != 0; set &= set - 1 {
		out = append(out, bits.TrailingZeros64(set))
	}
	return out, bestScore
}

func setLocality(n *Node, set uint64, link *[64]uint64) float64 {
	k := bits.OnesCount64(set)
	if k <= 1 {
		return 1
	}
	pairs, linked := 0, 0
	numa := -1
	mixed := false
	for s := set; s != 0; s &= s - 1 {
		i := bits.TrailingZeros64(s)
		if numa < 0 {
			numa = n.GPUs[i].NUMA
		} else if n.GPUs[i].NUMA != numa {
			mixed = true
		}
		linked += bits.OnesCount64(link[i] & set)
		pairs += k - 1
	}
	l := 1.0
	if len(n.NVLink) > 0 {
		l = float64(linked) / float64(pairs)
	}
	if mixed {
		l *= 0.5
	}
	return l
}

// alignedNUMA tells which NUMA nodes req's GPUs may come from: when its
// topology policy ties its exclusive cores to its devices (mustAlign),
// only nodes that hold the GPUs and the cores together; otherwise any.
func alignedNUMA(req *Request, n *Node) func(numa int) bool {
	if !mustAlign(req, n) {
		return func(int) bool { return true }
	}
	return func(numa int) bool { return fitsOnNUMA(req, n, numa) }
}

// pickCores takes exclusive cores from the home NUMA node (the devices')
// first, then from the others in index order (never for single-numa-node,
// which Filter has already guaranteed fits on one node). Without a home
// node (none, one without cores, or under single-numa-node one short of
// them) it starts from the node with the most free cores that holds them
// all (lowest on a tie). It
// returns the per-NUMA counts and how many NUMA nodes they span.
func pickCores(req *Request, n *Node, home int) (map[int]int, int) {
	var buf [8]int
	take := buf[:0]
	if len(n.FreeCores) > len(buf) {
		take = make([]int, 0, len(n.FreeCores))
	}
	take = take[:len(n.FreeCores)]
	spread := coresTaken(req, n, home, take)
	out := make(map[int]int, spread)
	for i, c := range take {
		if c > 0 {
			out[i] = c
		}
	}
	return out, spread
}

// coresTaken is pickCores' rule: it writes into take (len(n.FreeCores))
// how many exclusive cores each NUMA node gives and returns how many NUMA
// nodes give some.
func coresTaken(req *Request, n *Node, home int, take []int) int {
	need := req.ExclusiveCores
	clear(take)
	if home < 0 || home >= len(n.FreeCores) || (req.Topology == TopologySingleNUMANode && n.FreeCores[home] < need) {
		home = -1
		for i, c := range n.FreeCores {
			if c >= need && (home < 0 || c > n.FreeCores[home]) {
				home = i
			}
		}
	}
	spread := 0
	if home >= 0 {
		t := min(need, n.FreeCores[home])
		if t > 0 {
			take[home] = t
			need -= t
			spread++
		}
	}
	for i, c := range n.FreeCores {
		if need == 0 {
			break
		}
		if i == home || c == 0 {
			continue
		}
		t := min(need, c)
		take[i] = t
		need -= t
		spread++
	}
	return spread
}

// pickMIG chooses a MIG instance for req, in this order: an existing idle
// instance of the profile (no reconfiguration); else a new instance on
// free slices, at a start NVIDIA allows (MIG.starts), choosing the spot
// that leaves the longest run of free slices on that GPU (and the cheapest
// reconfiguration on ties); else a new instance over slices that only idle
// instances hold, destroying them, choosing the cheapest (fewest destroyed,
// MIGPick.Cost) and then the longest free run left. Instances in use are
// never destroyed.
func pickMIG(req *Request, n *Node) (MIGPick, bool) {
	for gi := range n.GPUs {
		m := n.GPUs[gi].MIG
		if m == nil || !req.ModelAllowed(n.ModelOf(gi)) {
			continue
		}
		for _, in := range m.Instances {
			if !in.InUse && in.Slices == req.MIGSlices && (in.Profile == "" || in.Profile == req.MIGProfile) {
				return MIGPick{GPU: gi, Start: in.Start, Slices: in.Slices}, true
			}
		}
	}
	for _, idle := range []bool{false, true} {
		best, bestRun, bestCost, found := MIGPick{}, -1, 0.0, false
		for gi := range n.GPUs {
			m := n.GPUs[gi].MIG
			if m == nil || !req.ModelAllowed(n.ModelOf(gi)) {
				continue
			}
			p, left, ok := bestMIGSpot(req, m, idle)
			if !ok {
				continue
			}
			p.GPU = gi
			cost := p.Cost(m)
			better := left > bestRun || (left == bestRun && cost < bestCost)
			if idle {
				better = cost < bestCost || (cost == bestCost && left > bestRun)
			}
			if !found || better {
				best, bestRun, bestCost, found = p, left, cost, true
			}
		}
		if found {
			return best, true
		}
	}
	return MIGPick{}, false
}

// bestMIGSpot is the best place on m for a new instance of req (its GPU
// left 0) and the longest run of free slices it leaves. Without idle, only
// free slices count and the spot leaving the longest run wins (the first
// on ties). With idle, only spots over slices that idle instances hold
// count (none in use): the fewest instances destroyed wins, then the
// longest run left.
func bestMIGSpot(req *Request, m *MIG, idle bool) (MIGPick, int, bool) {
	used := m.usedMask()
	best, bestRun := MIGPick{}, -1
	for _, start := range m.starts(req.MIGProfile, req.MIGSlices) {
		var run uint64
		for s := start; s < start+req.MIGSlices; s++ {
			run |= 1 << uint(s)
		}
		if !idle {
			if !m.sliceRunFree(start, req.MIGSlices) {
				continue
			}
			if left := longestFreeRun(used|run, m.TotalSlices); left > bestRun {
				best, bestRun = MIGPick{Start: start, Slices: req.MIGSlices, Create: true}, left
			}
			continue
		}
		if m.sliceRunFree(start, req.MIGSlices) || !m.sliceRunIdle(start, req.MIGSlices) {
			continue
		}
		destroy := m.idleOn(start, req.MIGSlices)
		after := run
		for _, in := range m.Instances {
			if !in.overlaps(start, req.MIGSlices) {
				after |= instMask(in)
			}
		}
		left := longestFreeRun(after, m.TotalSlices)
		if bestRun < 0 || len(destroy) < len(best.Destroy) || (len(destroy) == len(best.Destroy) && left > bestRun) {
			best, bestRun = MIGPick{Start: start, Slices: req.MIGSlices, Create: true, Destroy: destroy}, left
		}
	}
	return best, bestRun, bestRun >= 0
}

// instMask is the slices in holds.
func instMask(in MIGInstance) uint64 {
	var mask uint64
	for s := in.Start; s < in.Start+in.Slices && s < 64; s++ {
		mask |= 1 << uint(s)
	}
	return mask
}

func longestFreeRun(used uint64, total int) int {
	best, cur := 0, 0
	for s := range total {
		if used&(1<<uint(s)) == 0 {
			cur++
			best = max(best, cur)
		} else {
			cur = 0
		}
	}
	return best
}

// pickFPGA returns a free region already holding req.Bitstream, or else
// the free region that programs fastest; -1 when none is free.
func pickFPGA(req *Request, n *Node) int {
	best := -1
	for i := range n.FPGAs {
		r := &n.FPGAs[i]
		if r.Busy {
			continue
		}
		if r.Bitstream == req.Bitstream {
			return i
		}
		if best < 0 || r.ProgramMs < n.FPGAs[best].ProgramMs {
			best = i
		}
	}
	return best
}
