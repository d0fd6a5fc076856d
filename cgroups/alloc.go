package cgroups

import (
	"fmt"
	"slices"
	"sort"
)

// Core is one physical core: its NUMA node and its logical CPUs (SMT
// siblings). Exclusive sets are handed out in whole cores so that no other
// job shares a guaranteed job's core through a hyperthread.
type Core struct {
	Node int
	CPUs []int
}

// CPUAllocator is the pure bookkeeping of exclusive cores: guaranteed jobs
// take whole cores out of the shared pool while they run and give them back
// when they end. It does no I/O and is not safe for concurrent use; the
// daemon holds one behind its own lock.
type CPUAllocator struct {
	cores     []Core
	owner     []string // owner[i] is the job holding cores[i], "" if shared
	minShared int
}

// NewCPUAllocator returns an allocator over cores that always leaves at
// least minShared cores in the shared pool (for the daemon, burstable and
// best-effort work).
func NewCPUAllocator(cores []Core, minShared int) (*CPUAllocator, error) {
	seen := map[int]bool{}
	cs := make([]Core, 0, len(cores))
	for _, c := range cores {
		if len(c.CPUs) == 0 {
			return nil, fmt.Errorf("%w: core on node %d has no cpus", ErrInvalidCPUList, c.Node)
		}
		for _, cpu := range c.CPUs {
			if cpu < 0 || seen[cpu] {
				return nil, fmt.Errorf("%w: cpu %d listed twice or negative", ErrInvalidCPUList, cpu)
			}
			seen[cpu] = true
		}
		cs = append(cs, Core{Node: c.Node, CPUs: slices.Sorted(slices.Values(c.CPUs))})
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].CPUs[0] < cs[j].CPUs[0] })
	if minShared < 0 {
		minShared = 0
	}
	return &CPUAllocator{cores: cs, owner: make([]string, len(cs)), minShared: minShared}, nil
}

// CoresFor is the number of whole cores a CPU request in millicores needs.
func CoresFor(milli int64) int {
	if milli <= 0 {
		return 0
	}
	return int((milli + 999) / 1000)
}

func (a *CPUAllocator) free() int {
	n := 0
	for _, o := range a.owner {
		if o == "" {
			n++
		}
	}
	return n
}

// Allocate gives jobID n whole cores on NUMA node (any node if node < 0,
// then the node with most free cores) and returns their CPUs. A job that
// already holds cores gets ErrInvalidPlacement.
func (a *CPUAllocator) Allocate(jobID string, node, n int) ([]int, error) {
	if jobID == "" || n <= 0 {
		return nil, fmt.Errorf("%w: allocate %d cores for job %q", ErrInvalidPlacement, n, jobID)
	}
	if slices.Contains(a.owner, jobID) {
		return nil, fmt.Errorf("%w: job %s already holds exclusive cores", ErrInvalidPlacement, jobID)
	}
	if a.free()-n < a.minShared {
		return nil, fmt.Errorf("%w: %d requested, %d free, %d kept shared", ErrInsufficientCPUs, n, a.free(), a.minShared)
	}
	if node < 0 {
		node = a.bestNode()
	}
	var picked []int
	for i, c := range a.cores {
		if len(picked) < n && c.Node == node && a.owner[i] == "" {
			picked = append(picked, i)
		}
	}
	if len(picked) < n {
		return nil, fmt.Errorf("%w: %d requested on node %d, %d free there", ErrInsufficientCPUs, n, node, len(picked))
	}
	var cpus []int
	for _, i := range picked {
		a.owner[i] = jobID
		cpus = append(cpus, a.cores[i].CPUs...)
	}
	sort.Ints(cpus)
	return cpus, nil
}

func (a *CPUAllocator) bestNode() int {
	count := map[int]int{}
	best, bestN := 0, -1
	for i, c := range a.cores {
		if a.owner[i] == "" {
			count[c.Node]++
		}
	}
	for node, n := range count {
		if n > bestN || (n == bestN && node < best) {
			best, bestN = node, n
		}
	}
	return best
}

// Claim records that jobID holds exactly cpus (read back from its cgroup
// after a daemon restart). The cpus must cover whole free cores.
func (a *CPUAllocator) Claim(jobID string, cpus []int) error {
	want := map[int]bool{}
	for _, c := range cpus {
		want[c] = true
	}
	var idx []int
	for i, c := range a.cores {
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
			return fmt.Errorf("%w: claim for %s splits core %v", ErrInvalidPlacement, jobID, c.CPUs)
		case a.owner[i] != "" && a.owner[i] != jobID:
			return fmt.Errorf("%w: core %v already held by %s", ErrInsufficientCPUs, c.CPUs, a.owner[i])
		}
		idx = append(idx, i)
	}
	if len(want) > 0 || len(idx) == 0 {
		return fmt.Errorf("%w: claim for %s names unknown cpus", ErrInvalidPlacement, jobID)
	}
	for _, i := range idx {
		a.owner[i] = jobID
	}
	return nil
}

// Release returns jobID's cores to the shared pool and reports them.
func (a *CPUAllocator) Release(jobID string) []int {
	var cpus []int
	for i, o := range a.owner {
		if o == jobID && jobID != "" {
			a.owner[i] = ""
			cpus = append(cpus, a.cores[i].CPUs...)
		}
	}
	sort.Ints(cpus)
	return cpus
}

// Exclusive returns the CPUs jobID holds.
func (a *CPUAllocator) Exclusive(jobID string) []int {
	var cpus []int
	for i, o := range a.owner {
		if o == jobID && jobID != "" {
			cpus = append(cpus, a.cores[i].CPUs...)
		}
	}
	sort.Ints(cpus)
	return cpus
}

// Shared returns the CPUs of the shared pool: every core nobody holds.
func (a *CPUAllocator) Shared() []int {
	var cpus []int
	for i, o := range a.owner {
		if o == "" {
			cpus = append(cpus, a.cores[i].CPUs...)
		}
	}
	sort.Ints(cpus)
	return cpus
}
