// Package reclaim lets best-effort jobs use the CPU and memory that
// guaranteed and burstable jobs reserved but do not use, and takes it back
// when they need it. It owns the accounting — a job's reclaimable share is
// its request less its predicted peak (the largest of its recent peak, a
// short Holt forecast and the p95 peak of its task profile) less a safety
// margin — and the order of taking it
// back: the best-effort tier is throttled first (its CPU quota and memory
// high set to the budget left to it) and a best-effort job is evicted only
// when the tier stays over its memory budget for EvictAfter. Guaranteed
// and burstable jobs are never throttled or evicted by it. Applying
// (cgroup knobs, cancelling a job) is the Host's.
package reclaim

import (
	"fmt"
	"math"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/forecast"
)

// Usage is one reading of a job's CPU (millicores) and memory (bytes).
type Usage struct {
	CPU    float64
	Memory float64
}

// Job is a running job as the accounting sees it.
type Job struct {
	ID   string
	Tier api.Tier
	// Request is what the placer reserved for it.
	Request Usage
	// Recent are its usage readings over the accounting window, oldest
	// first (empty before the first reading).
	Recent []Usage
	// Started orders best-effort jobs for eviction (the newest goes first).
	Started time.Time
	// Placed is the part of a best-effort job's request the placer put on
	// reclaimed capacity (zero for a job placed on unreserved capacity
	// only); such jobs are evicted first.
	Placed Usage
	// Prior is the p95 peak of the past runs of jobs of its kind (its
	// task profile, when one holds enough runs; zero otherwise): its
	// predicted peak is never below it, so what a job has used before is
	// not lent out while it has not yet reached it this run.
	Prior Usage
}

// Params tune the accounting.
type Params struct {
	// Margin is the safety margin kept per job, as a fraction of its
	// request (default 0.1).
	Margin float64
	// Lead is how many readings ahead a job's usage is forecast.
	Lead int
}

// Account is the reclaim picture at one moment.
type Account struct {
	// Capacity is the host's.
	Capacity Usage
	// Reserved is the guaranteed and burstable jobs' requests; Need what
	// they may use soon: per job max(min(request, predicted peak + margin),
	// usage now).
	Reserved, Need Usage
	// Reclaimable is Reserved − Need, summed per job (never negative).
	Reclaimable Usage
	// Budget is what the best-effort tier may use: Capacity − Need.
	Budget Usage
	// BestEffort is the best-effort jobs' usage now, BestEffortRequest
	// their requests; Reclaimed the part of the usage beyond the requests
	// (what they run on lent capacity), at most Reclaimable.
	BestEffort, BestEffortRequest, Reclaimed Usage
	// Placed is what best-effort jobs placed on reclaimed capacity hold of
	// it (their Job.Placed summed).
	Placed Usage
}

// Compute does the accounting for the running jobs on a host of capacity.
func Compute(capacity Usage, jobs []Job, p Params) Account {
	a := Account{Capacity: capacity}
	for _, j := range jobs {
		now := Usage{}
		if len(j.Recent) > 0 {
			now = j.Recent[len(j.Recent)-1]
		}
		if j.Tier == api.TierBestEffort {
			a.BestEffort.CPU += now.CPU
			a.BestEffort.Memory += now.Memory
			a.BestEffortRequest.CPU += j.Request.CPU
			a.BestEffortRequest.Memory += j.Request.Memory
			a.Placed.CPU += j.Placed.CPU
			a.Placed.Memory += j.Placed.Memory
			continue
		}
		peak := predictPeak(j.Recent, p.Lead)
		peak.CPU, peak.Memory = max(peak.CPU, j.Prior.CPU), max(peak.Memory, j.Prior.Memory)
		need := Usage{
			CPU:    max(min(j.Request.CPU, peak.CPU+p.Margin*j.Request.CPU), now.CPU),
			Memory: max(min(j.Request.Memory, peak.Memory+p.Margin*j.Request.Memory), now.Memory),
		}
		if len(j.Recent) == 0 {
			need = j.Request // nothing measured yet: nothing to lend
		}
		a.Reserved.CPU += j.Request.CPU
		a.Reserved.Memory += j.Request.Memory
		a.Need.CPU += need.CPU
		a.Need.Memory += need.Memory
		a.Reclaimable.CPU += max(0, j.Request.CPU-need.CPU)
		a.Reclaimable.Memory += max(0, j.Request.Memory-need.Memory)
	}
	a.Budget = Usage{CPU: max(0, capacity.CPU-a.Need.CPU), Memory: max(0, capacity.Memory-a.Need.Memory)}
	a.Reclaimed = Usage{
		CPU:    min(max(0, a.BestEffort.CPU-a.BestEffortRequest.CPU), a.Reclaimable.CPU),
		Memory: min(max(0, a.BestEffort.Memory-a.BestEffortRequest.Memory), a.Reclaimable.Memory),
	}
	return a
}

// floorBestEffortMemory raises the best-effort memory use to tier, the
// kernel's count for the whole tier, when the jobs' readings add up to
// less (a job with no readings counts as using nothing in them).
func (a *Account) floorBestEffortMemory(tier float64) {
	if tier <= a.BestEffort.Memory {
		return
	}
	a.BestEffort.Memory = tier
	a.Reclaimed.Memory = min(max(0, a.BestEffort.Memory-a.BestEffortRequest.Memory), a.Reclaimable.Memory)
}

// predictPeak is the larger of the readings' peak and a Holt forecast
// lead readings ahead (α 0.5, β 0.2: quick to follow a ramp).
func predictPeak(rs []Usage, lead int) Usage {
	var peak Usage
	cpu, mem := make([]float64, len(rs)), make([]float64, len(rs))
	for i, r := range rs {
		peak.CPU, peak.Memory = max(peak.CPU, r.CPU), max(peak.Memory, r.Memory)
		cpu[i], mem[i] = r.CPU, r.Memory
	}
	if len(rs) >= 3 && lead > 0 {
		h := forecast.Method{Kind: forecast.Holt, Alpha: 0.5, Beta: 0.2, Phi: 1}
		if f := h.Forecast(cpu, lead); !math.IsNaN(f) {
			peak.CPU = max(peak.CPU, f)
		}
		if f := h.Forecast(mem, lead); !math.IsNaN(f) {
			peak.Memory = max(peak.Memory, f)
		}
	}
	return peak
}

// Action is one thing the controller asks the host to do.
type Action struct {
	// Kind is ActThrottle (set the tier's CPU quota and memory high, and
	// what each best-effort job may use beyond its own CPU request) or
	// ActEvict (end JobID).
	Kind string
	// CPUMilli and MemoryHigh are the best-effort tier's new limits for a
	// throttle; 0 lifts one. LendCPU is the reclaimable CPU each
	// best-effort job may use beyond its request (the tier limit bounds
	// them together).
	CPUMilli   int64
	MemoryHigh int64
	LendCPU    int64
	JobID      string
	Reason     string
}

// Action kinds.
const (
	ActThrottle = "throttle"
	ActEvict    = "evict"
)

// Controller turns accounts into actions. It is not safe for concurrent
// use.
type Controller struct {
	// EvictAfter is how long the tier must stay over its memory budget,
	// throttled, before a job is evicted; MinCPU the floor of its quota.
	EvictAfter time.Duration
	MinCPU     int64
	// MinChange is the least change of the CPU limit worth writing, in
	// millicores; the memory limit is rewritten when it moves by 16 MiB or
	// more.
	MinChange int64

	cpu, mem  int64 // limits in force (0: none)
	lend      int64
	overSince time.Time
	lastEvict time.Time
}

// BestEffortJob is a best-effort job the controller may evict.
type BestEffortJob struct {
	ID      string
	Started time.Time
	// OnReclaimed is true for a job placed (partly) on reclaimed
	// capacity: those go first.
	OnReclaimed bool
}

// Limits are the best-effort tier's limits in force (0: none) and the CPU
// lent to each best-effort job beyond its request.
func (c *Controller) Limits() (cpuMilli, memoryHigh, lendCPU int64) { return c.cpu, c.mem, c.lend }

// Step decides from the account at now. The CPU budget becomes the
// tier's quota at once (throttle); the memory budget its memory high; a
// tier still over its memory budget EvictAfter after that loses a job,
// one per EvictAfter: the newest of those placed on reclaimed capacity, or
// the newest of all when none is.
func (c *Controller) Step(now time.Time, a Account, be []BestEffortJob) []Action {
	var acts []Action
	cpu := max(int64(a.Budget.CPU), c.MinCPU)
	if float64(cpu) >= a.Capacity.CPU {
		cpu = 0 // the whole host: no quota
	}
	mem := int64(a.Budget.Memory) &^ 4095
	if float64(mem) >= a.Capacity.Memory {
		mem = 0
	}
	lend := int64(a.Reclaimable.CPU)
	if differs(cpu, c.cpu, c.MinChange) || differs(mem>>20, c.mem>>20, 16) || differs(lend, c.lend, c.MinChange) {
		c.cpu, c.mem, c.lend = cpu, mem, lend
		acts = append(acts, Action{Kind: ActThrottle, CPUMilli: cpu, MemoryHigh: mem, LendCPU: lend,
			Reason: fmt.Sprintf("best-effort budget %s CPU, %s memory, %s CPU lent to each job beyond its request: guaranteed and burstable jobs may need %s CPU and %s of the %s and %s they reserved",
				limit(cpu, true), limit(mem, false), api.MilliCPU(lend), api.MilliCPU(a.Need.CPU), api.Bytes(a.Need.Memory).Human(), api.MilliCPU(a.Reserved.CPU), api.Bytes(a.Reserved.Memory).Human())})
	}
	over := a.BestEffort.Memory > a.Budget.Memory && len(be) > 0
	switch {
	case !over:
		c.overSince = time.Time{}
	case c.overSince.IsZero():
		c.overSince = now
	case now.Sub(c.overSince) >= c.EvictAfter && now.Sub(c.lastEvict) >= c.EvictAfter:
		victim := be[0]
		for _, j := range be[1:] {
			if j.OnReclaimed != victim.OnReclaimed {
				if j.OnReclaimed {
					victim = j
				}
				continue
			}
			if j.Started.After(victim.Started) {
				victim = j
			}
		}
		c.lastEvict = now
		acts = append(acts, Action{Kind: ActEvict, JobID: victim.ID,
			Reason: fmt.Sprintf("evicted%s: best-effort jobs use %s, over their %s memory budget for %v after being throttled",
				onReclaimed(victim), api.Bytes(a.BestEffort.Memory).Human(), api.Bytes(a.Budget.Memory).Human(), now.Sub(c.overSince).Round(time.Second))})
	}
	return acts
}

func onReclaimed(j BestEffortJob) string {
	if j.OnReclaimed {
		return " from reclaimed capacity"
	}
	return ""
}

func differs(a, b, step int64) bool {
	if (a == 0) != (b == 0) {
		return true
	}
	d := a - b
	return d >= step || -d >= step
}

func limit(v int64, cpu bool) string {
	switch {
	case v == 0:
		return "unlimited"
	case cpu:
		return api.MilliCPU(v).String()
	}
	return api.Bytes(v).Human()
}
