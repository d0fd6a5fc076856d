package sched

import "math/bits"

// FilterReason says why a node cannot host a request; "" means it can.
type FilterReason string

// Filter reasons, one per filter rule.
const (
	Fits               FilterReason = ""
	ReasonCPU          FilterReason = "insufficient cpu"
	ReasonMemory       FilterReason = "insufficient memory"
	ReasonCores        FilterReason = "not enough free exclusive cores"
	ReasonGPUModel     FilterReason = "gpu model not allowed"
	ReasonGPUs         FilterReason = "not enough free whole gpus"
	ReasonGPUShare     FilterReason = "no gpu with enough free share"
	ReasonGPUMemory    FilterReason = "no gpu with enough free memory"
	ReasonMPSOwner     FilterReason = "the MPS gpus with room serve another user's shares (MPS runs one user's clients at a time)"
	ReasonMIG          FilterReason = "no free or creatable MIG instance of the profile"
	ReasonFPGA         FilterReason = "no free fpga region"
	ReasonTopology     FilterReason = "topology policy cannot be met"
	ReasonInvalidInput FilterReason = "invalid request"
	ReasonReserved     FilterReason = "reserved for a waiting job"
)

// allReasons lists every non-empty FilterReason, for counting.
var allReasons = [...]FilterReason{ReasonCPU, ReasonMemory, ReasonCores, ReasonGPUModel, ReasonGPUs, ReasonGPUShare,
	ReasonGPUMemory, ReasonMPSOwner, ReasonMIG, ReasonFPGA, ReasonTopology, ReasonInvalidInput, ReasonReserved}

func reasonIndex(r FilterReason) int {
	for i, x := range allReasons {
		if x == r {
			return i
		}
	}
	return len(allReasons) - 2
}

// Filter applies every filter rule to one node, cheapest first, and
// returns the first that fails, or Fits.
func Filter(req *Request, n *Node) FilterReason {
	if req.CPUMilli+int64(req.ExclusiveCores)*1000 > n.CPUFreeMilli {
		return ReasonCPU
	}
	if req.MemMiB > n.MemFreeMiB {
		return ReasonMemory
	}
	if req.ExclusiveCores > 0 {
		total := 0
		for _, c := range n.FreeCores {
			total += c
		}
		if total-req.ExclusiveCores < n.KeepSharedCores {
			return ReasonCores
		}
	}
	if req.GPUs > 0 || req.MIGProfile != "" {
		if !n.anyModelAllowed(req) {
			return ReasonGPUModel
		}
	}
	if req.GPUs > 0 {
		fit, memShort, ownerShort := 0, false, false
		for i := range n.GPUs {
			g := &n.GPUs[i]
			if g.MIG != nil || g.MilliFree < req.GPUMilli || (len(req.GPUModels) > 0 && !req.ModelAllowed(n.ModelOf(i))) {
				continue
			}
			if g.MemMiB > 0 && g.MemFreeMiB < req.GPUMemMiB {
				memShort = true
				continue
			}
			if !g.ownerFits(req.Owner, req.GPUMilli) {
				ownerShort = true
				continue
			}
			fit++
		}
		if fit >= req.GPUs && req.GPUs > 1 && !n.Homogeneous() {
			fit = n.fitOfOneModel(req, -1)
		}
		if fit < req.GPUs {
			switch {
			case ownerShort:
				return ReasonMPSOwner
			case memShort:
				return ReasonGPUMemory
			case req.Shared():
				return ReasonGPUShare
			default:
				return ReasonGPUs
			}
		}
	}
	if req.MIGProfile != "" {
		if _, ok := pickMIG(req, n); !ok {
			return ReasonMIG
		}
	}
	if req.Bitstream != "" && pickFPGA(req, n) < 0 {
		return ReasonFPGA
	}
	if !topologyOK(req, n) {
		return ReasonTopology
	}
	return Fits
}

// numaCount is the number of NUMA nodes the node describes.
func (n *Node) numaCount() int {
	c := len(n.FreeCores)
	for i := range n.GPUs {
		c = max(c, n.GPUs[i].NUMA+1)
	}
	return max(c, 1)
}

// mustAlign reports whether req's GPUs must sit on a NUMA node that also
// holds its exclusive cores (what topologyOK demanded of the node).
func mustAlign(req *Request, n *Node) bool {
	if req.ExclusiveCores == 0 {
		return false
	}
	switch req.Topology {
	case TopologySingleNUMANode:
		return true
	case TopologyRestricted:
		return numaCouldEverHold(req, n)
	}
	return false
}

// fitsOnNUMA reports whether the GPUs and exclusive cores of req fit on
// NUMA node numa alone.
func fitsOnNUMA(req *Request, n *Node, numa int) bool {
	if req.ExclusiveCores > 0 && (numa >= len(n.FreeCores) || n.FreeCores[numa] < req.ExclusiveCores) {
		return false
	}
	if req.GPUs > 0 && n.fitOfOneModel(req, numa) < req.GPUs {
		return false
	}
	return true
}

// anyModelAllowed reports whether n has a GPU of a model req allows.
func (n *Node) anyModelAllowed(req *Request) bool {
	if len(req.GPUModels) == 0 {
		return len(n.GPUs) > 0
	}
	for i := range n.GPUs {
		if req.ModelAllowed(n.ModelOf(i)) {
			return true
		}
	}
	return false
}

// gpusOfOneModel is the most GPUs of one model req allows, free or not.
func (n *Node) gpusOfOneModel(req *Request) int {
	return n.mostOfOneModel(func(i int) bool { return req.ModelAllowed(n.ModelOf(i)) })
}

// fitOfOneModel is the most GPUs of one model that can each give req its
// share, on NUMA node numa (-1: anywhere).
func (n *Node) fitOfOneModel(req *Request, numa int) int {
	return n.mostOfOneModel(func(i int) bool { return (numa < 0 || n.GPUs[i].NUMA == numa) && n.gpuFits(req, i) })
}

// mostOfOneModel is the most GPUs of one model that keep holds for (the
// GPUs of one request are of one model).
func (n *Node) mostOfOneModel(keep func(i int) bool) int {
	var set uint64
	for i := range min(len(n.GPUs), 64) {
		if keep(i) {
			set |= 1 << uint(i)
		}
	}
	var buf [8]uint64
	best := 0
	for _, g := range n.modelMasks(set, buf[:0]) {
		best = max(best, bits.OnesCount64(g))
	}
	return best
}

// topologyOK applies the Topology Manager policy: single-numa-node needs
// the devices and exclusive cores on one NUMA node; restricted needs that
// too whenever one NUMA node of the machine could hold the request at all
// (the preferred, narrowest alignment); best-effort and none always pass
// (best-effort is rewarded in the locality score instead).
func topologyOK(req *Request, n *Node) bool {
	if req.GPUs == 0 && req.ExclusiveCores == 0 {
		return true
	}
	switch req.Topology {
	case TopologySingleNUMANode:
		return anyNUMAFits(req, n)
	case TopologyRestricted:
		if !numaCouldEverHold(req, n) {
			return true
		}
		return anyNUMAFits(req, n)
	default:
		return true
	}
}

func anyNUMAFits(req *Request, n *Node) bool {
	for numa := range n.numaCount() {
		if fitsOnNUMA(req, n, numa) {
			return true
		}
	}
	return false
}

// numaCouldEverHold reports whether some NUMA node of the empty machine
// has enough GPUs for req (cores are not known when empty, so only GPUs
// are considered).
func numaCouldEverHold(req *Request, n *Node) bool {
	for numa := range n.numaCount() {
		if n.mostOfOneModel(func(i int) bool {
			return n.GPUs[i].MIG == nil && n.GPUs[i].NUMA == numa && req.ModelAllowed(n.ModelOf(i))
		}) >= req.GPUs {
			return true
		}
	}
	return false
}
