package cgroups

import (
	"cmp"
	"slices"

	"github.com/fusiond/fusiond/topology"
)

// Core is one physical core: its NUMA node and its logical CPUs (SMT
// siblings). Exclusive sets are handed out in whole cores so that no other
// job shares a guaranteed job's core through a hyperthread.
type Core struct {
	Node int
	CPUs []int
	// Kind and Capacity are the topology model's core type on a hybrid
	// CPU (topology.Core.Kind, .Capacity); unknown and 0 elsewhere. The
	// placer takes performance cores first for guaranteed work.
	Kind     topology.CoreKind
	Capacity int
}

// CoresOf is the host's physical cores as the daemon's placer takes them
// (the cores guaranteed jobs get exclusively): each core of the topology
// model (topology.Discover, the one discovery of the host's CPUs) with its
// online SMT siblings and its NUMA node (node 0 for a core the model
// places on no node), in order of their first CPU. Cores without an online
// CPU are left out.
func CoresOf(h *topology.Host) []Core {
	if h == nil {
		return nil
	}
	cores := make([]Core, 0, len(h.Cores))
	for _, c := range h.Cores {
		cpus := c.CPUs.List()
		if len(cpus) == 0 {
			continue
		}
		cores = append(cores, Core{Node: max(int(c.Node), 0), CPUs: cpus, Kind: c.Kind, Capacity: c.Capacity})
	}
	slices.SortFunc(cores, func(a, b Core) int { return cmp.Compare(a.CPUs[0], b.CPUs[0]) })
	return cores
}
