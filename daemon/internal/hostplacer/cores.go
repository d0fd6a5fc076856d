package hostplacer

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/topology"
)

// Exclusive cores: a guaranteed job gets whole cores of its own, in the
// one decision that places it. The engine counts the free cores of each
// NUMA node (sched.Node.FreeCores, built here from Hardware.Cores) and
// chooses how many the job takes on which node (sched.Assignment.Cores:
// its devices' node first, its topology policy applied); the placer then
// takes exactly that many concrete cores on each chosen node (whole cores,
// SMT siblings together, lowest first CPU first) and records them as the
// job's Allocation.CPUSet. The engine's counts are always derived from the
// concrete cores jobs hold, so the two cannot disagree.
//
// On a hybrid CPU (Hardware.Cores with kinds, from the topology model)
// the choice within a node is scored by core type (coreScore): latency-
// sensitive and guaranteed work takes performance cores first, throughput
// work (batch, best effort) efficiency cores first; among cores of one
// type the bigger capacity (or, for throughput work, the smaller) first,
// then the lowest first CPU. On other hosts every core scores alike and
// the order is the lowest first CPU, as before.

// CoresFor is the number of whole cores a guaranteed CPU request in
// millicores gets: fractions are rounded up.
func CoresFor(milli int64) int {
	if milli <= 0 {
		return 0
	}
	return int((milli + 999) / 1000)
}

// normalizeCores is hw's cores as the placer keeps them: each with its
// CPUs sorted, a core without CPUs or with a CPU an earlier core already
// lists left out, a negative node read as node 0, in order of first CPU.
func normalizeCores(in []cgroups.Core) []cgroups.Core {
	seen := map[int]bool{}
	out := make([]cgroups.Core, 0, len(in))
next:
	for _, c := range in {
		cpus := slices.Sorted(slices.Values(c.CPUs))
		cpus = slices.Compact(cpus)
		if len(cpus) == 0 || cpus[0] < 0 {
			continue
		}
		for _, cpu := range cpus {
			if seen[cpu] {
				continue next
			}
		}
		for _, cpu := range cpus {
			seen[cpu] = true
		}
		out = append(out, cgroups.Core{Node: max(c.Node, 0), CPUs: cpus, Kind: c.Kind, Capacity: c.Capacity})
	}
	slices.SortFunc(out, func(a, b cgroups.Core) int { return cmp.Compare(a.CPUs[0], b.CPUs[0]) })
	return out
}

// coresPerNUMA counts cores per NUMA node (index = node).
func coresPerNUMA(cores []cgroups.Core) []int {
	var out []int
	for _, c := range cores {
		for len(out) <= c.Node {
			out = append(out, 0)
		}
		out[c.Node]++
	}
	return out
}

// cpuOwners maps every CPU a held job owns exclusively to the job. The
// caller holds p.mu.
func (p *Placer) cpuOwners() map[int]string {
	own := map[int]string{}
	for id, h := range p.held {
		for _, cpu := range h.cpus {
			own[cpu] = id
		}
	}
	return own
}

// coreFree reports whether no job holds a CPU of c.
func coreFree(c cgroups.Core, own map[int]string) bool {
	for _, cpu := range c.CPUs {
		if _, ok := own[cpu]; ok {
			return false
		}
	}
	return true
}

// coresHeld is the engine's count of cpus per NUMA node: the cores of the
// host that hold one of them. Nil when cpus are none of the host's.
func (p *Placer) coresHeld(cpus []int) map[int]int {
	if len(cpus) == 0 {
		return nil
	}
	in := make(map[int]bool, len(cpus))
	for _, cpu := range cpus {
		in[cpu] = true
	}
	var out map[int]int
	for _, c := range p.cores {
		for _, cpu := range c.CPUs {
			if in[cpu] {
				if out == nil {
					out = map[int]int{}
				}
				out[c.Node]++
				break
			}
		}
	}
	return out
}

// corePref is which core type a job's exclusive cores are taken from
// first on a hybrid CPU.
type corePref int

const (
	preferPerformance corePref = iota
	preferEfficiency
)

func (c corePref) String() string {
	if c == preferEfficiency {
		return "efficiency"
	}
	return "performance"
}

// corePreference is a request's core type: best-effort and batch work
// (throughput, not latency) prefers efficiency cores; everything else,
// latency-sensitive classes (service, inference) and guaranteed jobs of
// the other classes, performance cores. A guaranteed batch job still gets
// whole exclusive cores: efficiency ones first, leaving the performance
// cores to latency-sensitive work.
func corePreference(req *sched.Request) corePref {
	if req.Tier == sched.TierBestEffort || req.Class == sched.ClassBatch {
		return preferEfficiency
	}
	return preferPerformance
}

// coreScore is how much a job with preference pref wants core c: higher
// is taken first. Its type counts first (the preferred type, then unknown,
// then the other), its relative capacity second (bigger first for
// performance, smaller first for efficiency). Cores of a host without
// core types all score 0.
func coreScore(c cgroups.Core, pref corePref) int {
	kind := 1 // unknown
	switch c.Kind {
	case topology.CoreKindPerformance:
		kind = 2
	case topology.CoreKindEfficiency:
		kind = 0
	}
	capacity := c.Capacity
	if pref == preferEfficiency {
		kind, capacity = 2-kind, topology.MaxCoreCapacity-min(capacity, topology.MaxCoreCapacity)
	}
	if c.Kind == topology.CoreKindUnknown {
		return kind * (topology.MaxCoreCapacity + 1)
	}
	return kind*(topology.MaxCoreCapacity+1) + capacity
}

// takeCoresFor picks the concrete cores of an engine assignment:
// perNUMA[n] free cores on each node n, highest coreScore for pref first,
// then lowest first CPU. It changes nothing. The caller holds p.mu.
func (p *Placer) takeCoresFor(perNUMA map[int]int, pref corePref) ([]int, error) {
	own := p.cpuOwners()
	var cpus []int
	for _, node := range slices.Sorted(maps.Keys(perNUMA)) {
		need := perNUMA[node]
		var free []cgroups.Core
		for _, c := range p.cores {
			if c.Node == node && coreFree(c, own) {
				free = append(free, c)
			}
		}
		// p.cores is in first-CPU order and the sort is stable.
		slices.SortStableFunc(free, func(a, b cgroups.Core) int { return cmp.Compare(coreScore(b, pref), coreScore(a, pref)) })
		if need > len(free) {
			return nil, fmt.Errorf("%d more free cores wanted on NUMA node %d than the host has", need-len(free), node)
		}
		for _, c := range free[:need] {
			cpus = append(cpus, c.CPUs...)
		}
	}
	slices.Sort(cpus)
	return cpus, nil
}

// claimCores checks that cpus (a re-attached job's recorded cpuset) are
// whole cores of this host that no other job holds. The caller holds p.mu.
func (p *Placer) claimCores(jobID string, cpus []int) error {
	own := p.cpuOwners()
	want := map[int]bool{}
	for _, c := range cpus {
		want[c] = true
	}
	for _, c := range p.cores {
		in := 0
		for _, cpu := range c.CPUs {
			if want[cpu] {
				in++
				delete(want, cpu)
			}
		}
		switch {
		case in == 0:
			continue
		case in != len(c.CPUs):
			return fmt.Errorf("job %s holds part of core %s only", jobID, cgroups.FormatCPUList(c.CPUs))
		}
		for _, cpu := range c.CPUs {
			if o, ok := own[cpu]; ok && o != jobID {
				return fmt.Errorf("job %s holds core %s, which job %s holds", jobID, cgroups.FormatCPUList(c.CPUs), o)
			}
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("job %s holds cpus %s, which are not cores of this host", jobID, cgroups.FormatCPUList(slices.Sorted(maps.Keys(want))))
	}
	return nil
}

// sharedCPUs is the shared pool: the CPUs of every core no job holds. The
// caller holds p.mu.
func (p *Placer) sharedCPUs() []int {
	own := p.cpuOwners()
	var cpus []int
	for _, c := range p.cores {
		if coreFree(c, own) {
			cpus = append(cpus, c.CPUs...)
		}
	}
	slices.Sort(cpus)
	return cpus
}

// SharedCPUs is the shared pool burstable and best-effort jobs run on: the
// host's cores that no guaranteed job holds (nil without Hardware.Cores).
func (p *Placer) SharedCPUs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sharedCPUs()
}

// publish hands the shared pool to Options.OnShared when it changed since
// the last time. The caller holds p.mu, so the pools reach OnShared in
// order.
func (p *Placer) publish() {
	if len(p.cores) == 0 {
		return
	}
	shared := p.sharedCPUs()
	if slices.Equal(shared, p.published) {
		return
	}
	p.published = shared
	if p.opts.OnShared == nil {
		return
	}
	if err := p.opts.OnShared(shared); err != nil {
		p.log.Error("updating the shared cpu pool", "cpus", cgroups.FormatCPUList(shared), "err", err)
	}
}
