package reclaim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// Host is the loop's view of the daemon: capacity, the running jobs with
// their recent usage, and the best-effort tier's knobs and jobs.
type Host interface {
	Capacity() Usage
	Running() []Job
	// Limit sets the best-effort tier's CPU quota and memory high as far
	// as reclaiming goes (0: no limit from it).
	Limit(cpuMilli, memoryHigh int64) error
	// Lend lets every running best-effort job use cpuMilli beyond its own
	// CPU request (0: its request again). It is called every step, so
	// jobs started since get it; the host writes only what changed.
	Lend(cpuMilli int64) error
	// Evict ends a best-effort job.
	Evict(jobID, reason string) error
	// Publish sends an event to the event stream.
	Publish(api.Event)
}

// Config configures the loop.
type Config struct {
	// Window is how often it accounts (default 1s).
	Window     time.Duration
	Params     Params
	EvictAfter time.Duration
	MinCPU     int64
	Now        func() time.Time
	// Offer, when set, is given every account (and a zero one when the
	// loop stops): the placer admits best-effort jobs against its
	// Reclaimable (hostplacer.SetReclaimable).
	Offer func(Account)
	// BestEffortMemory, when set, reads the best-effort tier's memory
	// from the kernel (its cgroup's memory.current): the best-effort
	// usage is at least that, so a job with no readings — one the
	// telemetry bus does not follow because its bound was reached, or one
	// not read yet — is not counted as using nothing. A read error keeps
	// the jobs' sum, and is logged once until a read succeeds.
	BestEffortMemory func() (float64, error)
}

// Loop accounts and acts every window.
type Loop struct {
	cfg  Config
	host Host
	log  *slog.Logger

	mu     sync.Mutex
	ctrl   Controller
	status api.ReclaimStatus
	// tierErr is true while reading the tier's memory fails (logged once).
	tierErr bool
}

// New builds the loop.
func New(cfg Config, host Host, log *slog.Logger) (*Loop, error) {
	if cfg.Window == 0 {
		cfg.Window = time.Second
	}
	switch {
	case cfg.Window < 10*time.Millisecond:
		return nil, fmt.Errorf("reclaim window %v: at least 10ms", cfg.Window)
	case cfg.Params.Margin < 0 || cfg.Params.Margin >= 1:
		return nil, fmt.Errorf("reclaim margin %g: in [0, 1)", cfg.Params.Margin)
	case cfg.EvictAfter < 0:
		return nil, fmt.Errorf("reclaim evict_after %v: must not be negative", cfg.EvictAfter)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Loop{cfg: cfg, host: host, log: log,
		ctrl: Controller{EvictAfter: cfg.EvictAfter, MinCPU: cfg.MinCPU, MinChange: 50}}
	l.status.Enabled = true
	return l, nil
}

// Run steps every window until ctx ends, then lifts its limits.
func (l *Loop) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.Window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if l.cfg.Offer != nil {
				l.cfg.Offer(Account{})
			}
			if cpu, mem, lend := l.ctrl.Limits(); cpu != 0 || mem != 0 || lend != 0 {
				if err := l.host.Limit(0, 0); err != nil {
					l.log.Warn("reclaim: lifting the best-effort limits", "err", err)
				}
				if err := l.host.Lend(0); err != nil {
					l.log.Warn("reclaim: taking back lent CPU", "err", err)
				}
			}
			return
		case <-t.C:
			l.Step()
		}
	}
}

// Step accounts once and applies what the controller decides.
func (l *Loop) Step() {
	now := l.cfg.Now()
	jobs := l.host.Running()
	a := Compute(l.host.Capacity(), jobs, l.cfg.Params)
	if l.cfg.BestEffortMemory != nil {
		switch m, err := l.cfg.BestEffortMemory(); {
		case err != nil && !l.tierErr:
			l.tierErr = true
			l.log.Warn("reclaim: reading the best-effort tier's memory: counting only the jobs' readings (logged once until a read succeeds)", "err", err)
		case err == nil:
			l.tierErr = false
			a.floorBestEffortMemory(m)
		}
	}
	var be []BestEffortJob
	for _, j := range jobs {
		if j.Tier == api.TierBestEffort {
			be = append(be, BestEffortJob{ID: j.ID, Started: j.Started, OnReclaimed: j.Placed.CPU > 0 || j.Placed.Memory > 0})
		}
	}
	if l.cfg.Offer != nil {
		l.cfg.Offer(a)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, act := range l.ctrl.Step(now, a, be) {
		var err error
		switch act.Kind {
		case ActThrottle:
			// The tier limit is written first and what each job may
			// use after it: whatever a job is lent, the tier's quota
			// holds the jobs together to the budget.
			err = l.host.Limit(act.CPUMilli, act.MemoryHigh)
		case ActEvict:
			err = l.host.Evict(act.JobID, act.Reason)
			if err == nil {
				l.status.Evictions++
			}
		}
		reason := act.Reason
		if err != nil {
			reason = fmt.Sprintf("%s: failed: %v", reason, err)
			l.log.Error("reclaim: "+act.Kind, "job", act.JobID, "err", err)
		} else {
			l.log.Info("reclaim: "+act.Reason, "job", act.JobID)
		}
		t := now.UTC()
		l.status.LastAction, l.status.LastActionAt = reason, &t
		l.host.Publish(api.Event{Time: t, Kind: api.EventReclaim, JobID: act.JobID, Reason: reason})
	}
	cpu, mem, lend := l.ctrl.Limits()
	if err := l.host.Lend(lend); err != nil {
		l.log.Warn("reclaim: lending CPU to best-effort jobs", "err", err)
	}
	l.status.LentCPU = api.MilliCPU(lend)
	l.status.ReclaimableCPU, l.status.ReclaimableMemory = api.MilliCPU(a.Reclaimable.CPU), api.Bytes(a.Reclaimable.Memory)
	l.status.ReclaimedCPU, l.status.ReclaimedMemory = api.MilliCPU(a.Reclaimed.CPU), api.Bytes(a.Reclaimed.Memory)
	l.status.PlacedCPU, l.status.PlacedMemory = api.MilliCPU(a.Placed.CPU), api.Bytes(a.Placed.Memory)
	l.status.BestEffortCPU, l.status.BestEffortMemory = api.MilliCPU(a.BestEffort.CPU), api.Bytes(a.BestEffort.Memory)
	l.status.BudgetCPU, l.status.BudgetMemory = api.MilliCPU(cpu), api.Bytes(mem)
}

// Status is the loop's state for node status.
func (l *Loop) Status() api.ReclaimStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status
}
