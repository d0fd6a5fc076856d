package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/reclaim"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
)

// ReclaimConfig tunes the reclaimed-capacity loop.
type ReclaimConfig struct {
	// Enabled lets best-effort jobs use what guaranteed and burstable jobs
	// reserved but are not predicted to use, within a budget the loop
	// enforces (needs job cgroups).
	Enabled bool `json:"enabled"`
	// Window is how often it accounts (default 1s); Lookback the usage
	// history a job's predicted peak is taken from (default 1m).
	Window   Duration `json:"window"`
	Lookback Duration `json:"lookback"`
	// Margin is kept per job as a fraction of its request, [0, 1)
	// (default 0.1).
	Margin float64 `json:"margin"`
	// EvictAfter is how long the best-effort tier may stay over its memory
	// budget, throttled, before its newest job is evicted (default 10s).
	EvictAfter Duration `json:"evict_after"`
}

// DefaultReclaimConfig accounts every second over the last minute with a
// 10% margin.
func DefaultReclaimConfig() ReclaimConfig {
	return ReclaimConfig{Enabled: true, Window: Duration(time.Second), Lookback: Duration(time.Minute), Margin: 0.1, EvictAfter: Duration(10 * time.Second)}
}

func (c ReclaimConfig) validate() (string, error) {
	switch {
	case c.Window < Duration(10*time.Millisecond):
		return "reclaim.window", fmt.Errorf("at least 10ms, got %v", time.Duration(c.Window))
	case c.Lookback < c.Window:
		return "reclaim.lookback", fmt.Errorf("at least reclaim.window (%v), got %v", time.Duration(c.Window), time.Duration(c.Lookback))
	case c.Margin < 0 || c.Margin >= 1:
		return "reclaim.margin", fmt.Errorf("in [0, 1), got %g", c.Margin)
	case c.EvictAfter < 0:
		return "reclaim.evict_after", fmt.Errorf("must not be negative")
	}
	return "", nil
}

// tierKnobs are the cgroup tier knobs beKnobs writes (*cgroups.Manager).
type tierKnobs interface {
	SetTierCPUQuota(t cgroups.Tier, milli int64) error
	SetTierMemoryHigh(t cgroups.Tier, bytes int64) error
}

// beJobCPU is the best-effort jobs' own CPU quotas as beKnobs writes them
// (mgrJobCPU).
type beJobCPU interface {
	// bestEffort lists the running best-effort jobs' CPU requests by ID.
	bestEffort() map[string]int64
	setJobCPUQuota(id string, milli int64) error
}

// beKnobs is the one writer of the best-effort tier's CPU quota and
// memory high: the QoS loop (latency) and the reclaim loop (budget) each
// set their limit, and the tighter one is written. It also writes each
// running best-effort job's own CPU quota (jobs, when set): its request
// plus the CPU the reclaim loop lends, at most the tier's quota. cgroup
// v1 refuses a job quota over its tier's and a tier quota under one of
// its jobs' (EINVAL), so a lowered tier quota is written after the jobs'
// are brought under it, and a raised one before theirs go up.
type beKnobs struct {
	mu                 sync.Mutex
	cg                 tierKnobs
	jobs               beJobCPU
	qosCPU, reclaimCPU int64 // 0: no limit
	qosMem, reclaimMem int64
	lend               int64
	cpu, mem           int64 // written
	wrote              bool
	jobCPU             map[string]int64 // job quotas written
}

func tighter(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

func (k *beKnobs) apply() error {
	cpu, mem := tighter(k.qosCPU, k.reclaimCPU), tighter(k.qosMem, k.reclaimMem)
	var errs []error
	if !k.wrote || cpu != k.cpu {
		// Under the old quota and the new one alike while it changes.
		if err := k.syncJobs(tighter(k.cpu, cpu)); err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	if !k.wrote || cpu != k.cpu {
		if err = k.cg.SetTierCPUQuota(cgroups.BestEffort, cpu); err == nil {
			k.cpu = cpu
		}
	}
	if !k.wrote || mem != k.mem {
		if merr := k.cg.SetTierMemoryHigh(cgroups.BestEffort, mem); merr == nil {
			k.mem = mem
		} else if err == nil {
			err = merr
		}
	}
	k.wrote = err == nil
	if jerr := k.syncJobs(k.cpu); jerr != nil {
		errs = append(errs, jerr)
	}
	return errors.Join(append([]error{err}, errs...)...)
}

// syncJobs writes the quota of every running best-effort job whose
// request plus what is lent, at most tierCPU (0: no tier quota), is not
// what was last written for it.
func (k *beKnobs) syncJobs(tierCPU int64) error {
	if k.jobs == nil {
		return nil
	}
	if k.jobCPU == nil {
		k.jobCPU = map[string]int64{}
	}
	running := k.jobs.bestEffort()
	var errs []error
	for id, req := range running {
		want := req + k.lend
		if tierCPU > 0 {
			want = min(want, tierCPU)
		}
		if w, ok := k.jobCPU[id]; ok && w == want {
			continue
		}
		if err := k.jobs.setJobCPUQuota(id, want); err != nil {
			errs = append(errs, fmt.Errorf("job %s: %w", id, err))
			continue
		}
		k.jobCPU[id] = want
	}
	for id := range k.jobCPU {
		if _, ok := running[id]; !ok {
			delete(k.jobCPU, id)
		}
	}
	return errors.Join(errs...)
}

// setLend lets every running best-effort job use milli beyond its own CPU
// request (0: its request again), within the tier's quota.
func (k *beKnobs) setLend(milli int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lend = milli
	return k.apply()
}

// mgrJobCPU sets the running best-effort jobs' CPU quotas in their
// cgroups.
type mgrJobCPU struct {
	mgr *jobs.Manager
	cg  *cgroups.Manager
}

func (m mgrJobCPU) bestEffort() map[string]int64 {
	out := map[string]int64{}
	for _, j := range m.mgr.Running() {
		if j.Tier == api.TierBestEffort {
			out[j.ID] = int64(j.Spec.Resources.CPU)
		}
	}
	return out
}

func (m mgrJobCPU) setJobCPUQuota(id string, milli int64) error {
	c, err := m.cg.Load(id)
	if err != nil {
		return err
	}
	return c.SetCPUQuota(milli)
}

func (k *beKnobs) setQoSCPU(milli int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.qosCPU = milli
	return k.apply()
}

func (k *beKnobs) setQoSMemory(bytes int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.qosMem = bytes
	return k.apply()
}

func (k *beKnobs) setReclaim(milli, bytes int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reclaimCPU, k.reclaimMem = milli, bytes
	return k.apply()
}

// reclaimPlacer is the placer as the reclaim loop feeds it
// (*hostplacer.Placer): best-effort jobs are placed on the reclaimable
// capacity it is offered, and it says which jobs hold some.
type reclaimPlacer interface {
	SetReclaimable(cpu api.MilliCPU, memory api.Bytes)
	OnReclaimed() map[string]api.NodeResources
}

// reclaimHost is the reclaim loop's view of the daemon.
type reclaimHost struct {
	mgr      *jobs.Manager
	placer   reclaimPlacer
	bus      telemetry.Reader
	knobs    *beKnobs
	capacity func() api.NodeResources
	lookback time.Duration
	// prior is a running job's reclaim prior from its task profile
	// (profileUse.reclaimPrior); nil: none.
	prior func(owner api.Owner, spec api.JobSpec) reclaim.Usage
}

var _ reclaim.Host = (*reclaimHost)(nil)

func (h *reclaimHost) Capacity() reclaim.Usage {
	c := h.capacity()
	return reclaim.Usage{CPU: float64(c.CPU), Memory: float64(c.Memory)}
}

func (h *reclaimHost) Running() []reclaim.Job {
	list := h.mgr.Running()
	placed := h.placer.OnReclaimed()
	out := make([]reclaim.Job, 0, len(list))
	for _, j := range list {
		rj := reclaim.Job{ID: j.ID, Tier: j.Tier, Request: reclaim.Usage{CPU: float64(j.Spec.Resources.CPU), Memory: float64(j.Spec.Resources.Memory)}}
		if p, ok := placed[j.ID]; ok {
			rj.Placed = reclaim.Usage{CPU: float64(p.CPU), Memory: float64(p.Memory)}
		}
		rj.Started = j.StartedAt
		if h.prior != nil {
			rj.Prior = h.prior(j.Owner, j.Spec)
		}
		for _, u := range h.bus.JobWindow(j.ID, h.lookback) {
			rj.Recent = append(rj.Recent, reclaim.Usage{CPU: u.CPUMilli, Memory: float64(u.Memory)})
		}
		out = append(out, rj)
	}
	return out
}

func (h *reclaimHost) Limit(cpuMilli, memoryHigh int64) error {
	return h.knobs.setReclaim(cpuMilli, memoryHigh)
}

// Lend raises every running best-effort job's CPU quota (its request, as
// the executor set it) by cpuMilli; the tier's quota bounds them together
// (beKnobs writes both).
func (h *reclaimHost) Lend(cpuMilli int64) error { return h.knobs.setLend(cpuMilli) }

// Evict stops a best-effort job like a preemption's victim: it goes back
// to pending with restart on-failure, else ends preempted.
func (h *reclaimHost) Evict(id, reason string) error {
	return h.mgr.EvictReclaimed(id, reason)
}

func (h *reclaimHost) Publish(ev api.Event) { h.mgr.PublishReclaim(ev) }

// startReclaim starts the reclaim loop; without cgroups or switched off
// it does not run and the status says why.
func startReclaim(ctx context.Context, cfg ReclaimConfig, cg *cgroups.Manager, knobs *beKnobs, mgr *jobs.Manager, placer reclaimPlacer, bus telemetry.Reader,
	capacity func() api.NodeResources, minCPU int64, prior func(api.Owner, api.JobSpec) reclaim.Usage, log *slog.Logger) (*reclaim.Loop, api.ReclaimStatus, func(), error) {
	switch {
	case !cfg.Enabled:
		return nil, api.ReclaimStatus{Reason: "off: reclaim.enabled is false"}, func() {}, nil
	case cg == nil:
		return nil, api.ReclaimStatus{Reason: "off: jobs run without cgroups"}, func() {}, nil
	}
	loop, err := reclaim.New(reclaim.Config{Window: time.Duration(cfg.Window), EvictAfter: time.Duration(cfg.EvictAfter), MinCPU: minCPU,
		Params: reclaim.Params{Margin: cfg.Margin, Lead: max(1, int(time.Duration(cfg.Lookback)/time.Duration(cfg.Window))/10)},
		// The placer admits best-effort jobs against what is reclaimable.
		Offer: func(a reclaim.Account) {
			placer.SetReclaimable(api.MilliCPU(a.Reclaimable.CPU), api.Bytes(a.Reclaimable.Memory))
		},
		// The tier's cgroup counts every best-effort job, the ones the
		// telemetry bus does not follow (telemetry.max_jobs reached) too.
		BestEffortMemory: func() (float64, error) {
			st, err := cg.TierStats(cgroups.BestEffort)
			return float64(st.MemoryCurrent), err
		}},
		&reclaimHost{mgr: mgr, placer: placer, bus: bus, knobs: knobs, capacity: capacity, lookback: time.Duration(cfg.Lookback), prior: prior}, log)
	if err != nil {
		return nil, api.ReclaimStatus{}, nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop.Run(runCtx)
	}()
	return loop, api.ReclaimStatus{}, func() { cancel(); <-done }, nil
}
