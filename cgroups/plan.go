// Package cgroups puts each fusiond job into its own control group under a
// QoS tier (fusiond/{guaranteed,burstable,besteffort}/<job>) and enforces
// the job's placement there: CPU set, CPU weight and quota, memory
// protection and limits, a pids limit and device access.
//
// Limits are computed by the pure function Plan from a Placement; a Manager
// applies them idempotently through containerd/cgroups/v3 on either a cgroup
// v1 (legacy or hybrid) or a cgroup v2 (unified) host. Device access uses the
// v1 devices controller, or on v2 an eBPF device program (package
// devicefilter). Which cores a guaranteed job owns and what remains as the
// shared pool is the daemon's placer's decision (daemon/internal/hostplacer);
// CoresOf gives it the host's cores, Manager.SetSharedCPUs applies the pool.
//
// Every filesystem root is an option, so the same code runs on a fixture
// tree in tests.
//
// It owns the job cgroups and may import topology (the host's cores),
// devices (device nodes), daemon/sched (the Tier vocabulary), containerd's
// cgroups, cilium/ebpf (through devicefilter) and the standard library;
// nothing of the daemon.
package cgroups

import (
	"errors"
	"fmt"
	"slices"

	"github.com/fusiond/fusiond/cgroups/devicefilter"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology"
)

// Tier is a job's QoS tier: the scheduling vocabulary's sched.Tier, the one
// definition of the tier (daemon/sched imports nothing, so a hardware package
// may depend on it). Plan's limits follow from it and its string is the name
// of the tier's cgroup directory.
type Tier = sched.Tier

// The three tiers, from most to least protected.
const (
	Guaranteed = sched.TierGuaranteed
	Burstable  = sched.TierBurstable
	BestEffort = sched.TierBestEffort
)

// Tiers lists every tier in order of protection.
var Tiers = sched.Tiers

// Sentinel errors callers branch on.
var (
	// ErrInvalidPlacement: the placement cannot be turned into limits.
	ErrInvalidPlacement = errors.New("cgroups: invalid placement")
	// ErrNotFound: no cgroup exists for the job.
	ErrNotFound = errors.New("cgroups: cgroup not found")
	// ErrNotEmpty: processes remain in the cgroup.
	ErrNotEmpty = errors.New("cgroups: cgroup still has processes")
	// ErrInvalidCPUList: a cpu list string could not be parsed.
	ErrInvalidCPUList = errors.New("cgroups: invalid cpu list")
)

// Placement is what the scheduler decided for one job.
type Placement struct {
	Tier Tier
	// CPURequestMilli and CPULimitMilli are in millicores (1000 = one CPU);
	// zero means "not set". CPU and memory are plain int64 in the units of
	// the daemon's resource vector (api.MilliCPU, api.Bytes): a hardware
	// package does not import the API.
	CPURequestMilli int64
	CPULimitMilli   int64
	// ExclusiveCPUs are the whole cores a guaranteed job owns (chosen by
	// the daemon's placer), on the NUMA node of its devices.
	ExclusiveCPUs []int
	// SharedCPUs is the shared pool burstable and best-effort jobs run on.
	SharedCPUs []int
	// MemNodes are the NUMA nodes the job may allocate memory from; empty
	// inherits the parent's.
	MemNodes []int
	// MemoryRequest and MemoryLimit are bytes; zero means "not set".
	MemoryRequest int64
	MemoryLimit   int64
	// PidsLimit caps the number of tasks; zero picks DefaultPidsLimit.
	PidsLimit int64
	// Devices are the device nodes the job was granted.
	Devices []devices.DeviceNode
}

// Limits is the concrete cgroup configuration of one job. The zero value of
// a field means "unset" (inherit or unlimited).
type Limits struct {
	// Cpus and Mems are cpuset lists ("0-3,8").
	Cpus string `json:"cpus,omitempty"`
	Mems string `json:"mems,omitempty"`
	// CPUWeight is the cgroup v2 weight, 1..10000 (v1 shares are derived).
	CPUWeight uint64 `json:"cpuWeight"`
	// CPUQuota is the CPU time in microseconds the job may use per
	// CPUPeriod; zero means unlimited.
	CPUQuota  int64  `json:"cpuQuota,omitempty"`
	CPUPeriod uint64 `json:"cpuPeriod"`
	// MemoryLow protects memory from reclaim, MemoryHigh throttles and
	// reclaims above it (v1: soft limit), MemoryMax is the OOM line.
	MemoryLow  int64 `json:"memoryLow,omitempty"`
	MemoryHigh int64 `json:"memoryHigh,omitempty"`
	MemoryMax  int64 `json:"memoryMax,omitempty"`
	PidsMax    int64 `json:"pidsMax"`
	// Devices is the complete allow list; everything else is denied.
	Devices []devicefilter.Rule `json:"devices"`
}

// Tunables of Plan.
const (
	// DefaultCPUPeriod is the CFS bandwidth period in microseconds.
	DefaultCPUPeriod uint64 = 100_000
	// DefaultPidsLimit is the pids limit when a placement sets none.
	DefaultPidsLimit int64 = 4096
	// MaxWeight is the guaranteed tier's weight; MinWeight best effort's.
	MaxWeight uint64 = 10_000
	MinWeight uint64 = 1
	// memoryHighFactor places burstable memory.high between request and
	// limit (as Kubernetes' MemoryQoS does), so the job is reclaimed and
	// slowed before it hits the OOM line.
	memoryHighFactor = 0.9
	pageSize         = 4096
)

// DefaultDevices are the device nodes every job may use.
var defaultDevices = []devicefilter.Rule{
	{Type: 'c', Major: 1, Minor: 3, Access: "rwm"},                       // /dev/null
	{Type: 'c', Major: 1, Minor: 5, Access: "rwm"},                       // /dev/zero
	{Type: 'c', Major: 1, Minor: 7, Access: "rwm"},                       // /dev/full
	{Type: 'c', Major: 1, Minor: 8, Access: "rwm"},                       // /dev/random
	{Type: 'c', Major: 1, Minor: 9, Access: "rwm"},                       // /dev/urandom
	{Type: 'c', Major: 5, Minor: 0, Access: "rwm"},                       // /dev/tty
	{Type: 'c', Major: 5, Minor: 2, Access: "rwm"},                       // /dev/ptmx
	{Type: 'c', Major: 136, Minor: devicefilter.Wildcard, Access: "rwm"}, // /dev/pts/*
}

// DefaultDevices returns the allow-list entries every job gets.
func DefaultDevices() []devicefilter.Rule { return slices.Clone(defaultDevices) }

// Plan computes the limits of a placement. It is pure.
func Plan(p Placement) (Limits, error) {
	bad := func(format string, a ...any) (Limits, error) {
		return Limits{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidPlacement}, a...)...)
	}
	if !p.Tier.Valid() {
		return bad("tier %q", p.Tier)
	}
	for _, v := range []struct {
		name string
		n    int64
	}{{"cpu request", p.CPURequestMilli}, {"cpu limit", p.CPULimitMilli}, {"memory request", p.MemoryRequest}, {"memory limit", p.MemoryLimit}, {"pids limit", p.PidsLimit}} {
		if v.n < 0 {
			return bad("negative %s %d", v.name, v.n)
		}
	}
	if p.CPULimitMilli > 0 && p.CPURequestMilli > p.CPULimitMilli {
		return bad("cpu request %dm above limit %dm", p.CPURequestMilli, p.CPULimitMilli)
	}
	if p.MemoryLimit > 0 && p.MemoryRequest > p.MemoryLimit {
		return bad("memory request %d above limit %d", p.MemoryRequest, p.MemoryLimit)
	}
	l := Limits{CPUPeriod: DefaultCPUPeriod, PidsMax: p.PidsLimit, Mems: FormatCPUList(p.MemNodes)}
	if l.PidsMax == 0 {
		l.PidsMax = DefaultPidsLimit
	}
	switch p.Tier {
	case Guaranteed:
		if len(p.ExclusiveCPUs) == 0 {
			return bad("guaranteed job without exclusive cpus")
		}
		if p.MemoryRequest == 0 {
			return bad("guaranteed job without a memory request")
		}
		if p.MemoryLimit != 0 && p.MemoryLimit != p.MemoryRequest {
			return bad("guaranteed job memory limit %d differs from request %d", p.MemoryLimit, p.MemoryRequest)
		}
		l.Cpus = FormatCPUList(p.ExclusiveCPUs)
		l.CPUWeight = MaxWeight
		l.MemoryLow = p.MemoryRequest
		l.MemoryMax = p.MemoryRequest
	case Burstable:
		if len(p.SharedCPUs) == 0 {
			return bad("burstable job without a shared cpu pool")
		}
		l.Cpus = FormatCPUList(p.SharedCPUs)
		l.CPUWeight = weightFromRequest(p.CPURequestMilli)
		l.CPUQuota = QuotaFor(p.CPULimitMilli, DefaultCPUPeriod)
		l.MemoryLow = p.MemoryRequest
		if p.MemoryLimit > 0 {
			high := p.MemoryRequest + int64(memoryHighFactor*float64(p.MemoryLimit-p.MemoryRequest))
			l.MemoryHigh = max(high/pageSize*pageSize, p.MemoryRequest)
			l.MemoryMax = p.MemoryLimit
		}
	case BestEffort:
		if len(p.SharedCPUs) == 0 {
			return bad("best-effort job without a shared cpu pool")
		}
		l.Cpus = FormatCPUList(p.SharedCPUs)
		l.CPUWeight = MinWeight
		l.CPUQuota = QuotaFor(p.CPULimitMilli, DefaultCPUPeriod)
		l.MemoryMax = p.MemoryLimit
	}
	rules, err := DeviceRules(p.Devices)
	if err != nil {
		return Limits{}, err
	}
	l.Devices = rules
	return l, nil
}

// DeviceRules returns the default device rules followed by one rule per
// granted node.
func DeviceRules(nodes []devices.DeviceNode) ([]devicefilter.Rule, error) {
	rules := DefaultDevices()
	for _, n := range nodes {
		access := n.Access
		if access == "" {
			access = "rw"
		}
		r := devicefilter.Rule{Type: byte(n.Type), Major: int64(n.Major), Minor: int64(n.Minor), Access: access}
		if r.Type == 'a' {
			return nil, fmt.Errorf("%w: device %s: type 'a' not allowed for a node", ErrInvalidPlacement, n.Path)
		}
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("%w: device %s: %w", ErrInvalidPlacement, n.Path, err)
		}
		r.Access, _ = devicefilter.ParseAccess(r.Access) // validated: canonical "rwm" order
		rules = append(rules, r)
	}
	return rules, nil
}

// QuotaFor converts a CPU limit in millicores to a CFS quota for period
// (both microseconds); zero stays zero (unlimited). The kernel's minimum
// quota is 1ms.
func QuotaFor(milli int64, period uint64) int64 {
	if milli <= 0 {
		return 0
	}
	return max(milli*int64(period)/1000, 1000)
}

// weightFromRequest maps a CPU request to a cgroup v2 weight the way the
// kubelet does (request → v1 shares → v2 weight), kept strictly between the
// best-effort and guaranteed weights.
func weightFromRequest(milli int64) uint64 {
	shares := uint64(max(milli*1024/1000, 2))
	shares = min(shares, 262_144)
	w := 1 + (shares-2)*9999/262_142
	return min(max(w, MinWeight+1), MaxWeight-1)
}

// SharesFromWeight converts a v2 weight (1..10000) to v1 cpu.shares
// (2..262144).
func SharesFromWeight(w uint64) uint64 {
	w = min(max(w, 1), MaxWeight)
	return 2 + (w-1)*262_142/9999
}

// FormatCPUList renders a set of CPU (or NUMA node) numbers as a cpuset
// list, "0-3,8"; duplicates and order do not matter.
func FormatCPUList(cpus []int) string {
	return topology.NewCPUSet(cpus...).String()
}

// ParseCPUList parses a cpuset list ("0-3,8", "" for none) into sorted,
// unique numbers; the syntax is topology's (the kernel's cpulist).
func ParseCPUList(s string) ([]int, error) {
	set, err := topology.ParseCPUList(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidCPUList, err)
	}
	return set.List(), nil
}
