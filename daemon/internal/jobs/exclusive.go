package jobs

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
)

// ExclusiveCPUPlacer wraps a Placer and gives every guaranteed job whole
// cores of its own (from a cgroups.CPUAllocator), on the NUMA node of its
// devices when the inner placer chose one (required there under the
// single-numa-node and restricted policies): they fill the job's
// Allocation.CPUSet and NUMANode and leave the shared pool while it runs.
// After every change of the pool it calls onShared (the daemon rewrites the
// burstable and best-effort cpusets there).
type ExclusiveCPUPlacer struct {
	Placer
	log      *slog.Logger
	onShared func([]int) error

	nodes map[int]int // cpu → NUMA node

	mu    sync.Mutex
	alloc *cgroups.CPUAllocator
}

var (
	_ Placer    = (*ExclusiveCPUPlacer)(nil)
	_ Reclaimer = (*ExclusiveCPUPlacer)(nil)
)

// NewExclusiveCPUPlacer wraps inner over the host's cores (see
// cgroups.CoresOf), always leaving minShared cores shared. onShared may be
// nil.
func NewExclusiveCPUPlacer(inner Placer, cores []cgroups.Core, minShared int, onShared func([]int) error, log *slog.Logger) (*ExclusiveCPUPlacer, error) {
	alloc, err := cgroups.NewCPUAllocator(cores, minShared)
	if err != nil {
		return nil, err
	}
	nodes := map[int]int{}
	for _, c := range cores {
		for _, cpu := range c.CPUs {
			nodes[cpu] = c.Node
		}
	}
	return &ExclusiveCPUPlacer{Placer: inner, alloc: alloc, nodes: nodes, onShared: onShared, log: log}, nil
}

// SharedCPUs is the current shared pool.
func (p *ExclusiveCPUPlacer) SharedCPUs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alloc.Shared()
}

func (p *ExclusiveCPUPlacer) publish() {
	if p.onShared == nil {
		return
	}
	if err := p.onShared(p.alloc.Shared()); err != nil {
		p.log.Error("updating the shared cpu pool", "err", err)
	}
}

// Place places group with the inner placer, then gives its guaranteed
// members exclusive cores; when the cores are not there, nothing is
// placed.
func (p *ExclusiveCPUPlacer) Place(group []*api.Job) ([]api.Allocation, string, bool) {
	allocs, why, ok := p.Placer.Place(group)
	if !ok {
		return nil, why, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for i, j := range group {
		if j.Tier != api.TierGuaranteed {
			continue
		}
		n := cgroups.CoresFor(int64(j.Spec.Resources.CPU))
		// On the NUMA node of the job's devices when it has one.
		cpus, err := p.alloc.Allocate(j.ID, allocs[i].NUMANode, n)
		if err != nil && allocs[i].NUMANode >= 0 && j.Spec.Topology != api.TopologySingleNUMANode && j.Spec.Topology != api.TopologyRestricted {
			cpus, err = p.alloc.Allocate(j.ID, -1, n)
		}
		if err != nil {
			for _, m := range group[:i] {
				p.alloc.Release(m.ID)
			}
			for _, m := range group {
				p.Placer.Release(m)
			}
			if changed {
				p.publish()
			}
			return nil, fmt.Sprintf("guaranteed job needs %d exclusive cores: %v", n, err), false
		}
		changed = true
		node := p.nodes[cpus[0]]
		allocs[i].CPUSet = cgroups.FormatCPUList(cpus)
		allocs[i].NUMANode = node
		allocs[i].Explain = fmt.Sprintf("%s CPU on exclusive cores %s (NUMA node %d), %s memory",
			j.Spec.Resources.CPU, allocs[i].CPUSet, node, j.Spec.Resources.Memory)
	}
	if changed {
		p.publish()
	}
	return allocs, "", true
}

// Release returns the job's reservation and its exclusive cores.
func (p *ExclusiveCPUPlacer) Release(j *api.Job) {
	p.Placer.Release(j)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.alloc.Release(j.ID)) > 0 {
		p.publish()
	}
}

// Reclaim re-reserves a re-attached job's allocation, exclusive cores
// included.
func (p *ExclusiveCPUPlacer) Reclaim(j *api.Job) error {
	if rc, ok := p.Placer.(Reclaimer); ok {
		if err := rc.Reclaim(j); err != nil {
			return err
		}
	}
	if j.Allocation == nil || j.Allocation.CPUSet == "" {
		return nil
	}
	cpus, err := cgroups.ParseCPUList(j.Allocation.CPUSet)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.alloc.Claim(j.ID, cpus); err != nil {
		return err
	}
	p.publish()
	return nil
}
