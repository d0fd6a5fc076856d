package qos

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/ebpf"
)

// Probe is what the loop needs of the eBPF probe (*ebpf.Probe).
type Probe interface {
	Register(cgroupID uint64, tier uint32) error
	Unregister(cgroupID uint64) error
	Histogram(cgroupID uint64) (ebpf.Histogram, error)
}

// Job is one running job as the loop sees it.
type Job struct {
	ID   string
	Tier api.Tier
	// SLO is the effective SLO; nil for an unprotected job.
	SLO *api.QoS
}

// Host is what the loop reads and moves: the running jobs, their cgroups
// and the best-effort tier's knobs (the daemon implements it over
// jobs.Manager and cgroups.Manager).
type Host interface {
	Running() []Job
	// CgroupID is the id the probe keys the job's cgroup by.
	CgroupID(jobID string) (uint64, error)
	// MemoryPSI is the job's memory pressure (some avg10), nil where the
	// kernel has none per cgroup (cgroup v1).
	MemoryPSI(jobID string) (*float64, error)
	BestEffortMemory() (int64, error)
	SetBestEffortCPU(milli int64) error
	SetBestEffortMemoryHigh(bytes int64) error
}

// Config is the loop's configuration.
type Config struct {
	Window time.Duration
	Params Params
	// Publish sends an event to `fusionctl events`.
	Publish func(api.Event)
	Now     func() time.Time
}

// Loop runs the controller over the probe's histograms.
type Loop struct {
	cfg   Config
	probe Probe
	host  Host
	log   *slog.Logger

	mu      sync.Mutex
	ctrl    *Controller
	jobs    map[string]*tracked
	status  api.QoSStatus
	applied bool
}

type tracked struct {
	cgroup uint64
	slo    *api.QoS
	prev   ebpf.Histogram
	last   ebpf.Histogram // the last window
	total  ebpf.Histogram
	psi    *float64
	state  string
}

// TierNumber is the probe's number for a tier (0 is "not a job").
func TierNumber(t api.Tier) uint32 {
	switch t {
	case api.TierGuaranteed:
		return 1
	case api.TierBurstable:
		return 2
	case api.TierBestEffort:
		return 3
	}
	return 4
}

// New builds the loop; Run drives it.
func New(cfg Config, probe Probe, host Host, log *slog.Logger) (*Loop, error) {
	if cfg.Window <= 0 {
		return nil, fmt.Errorf("qos: window must be positive")
	}
	ctrl, err := NewController(cfg.Params)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Publish == nil {
		cfg.Publish = func(api.Event) {}
	}
	return &Loop{cfg: cfg, probe: probe, host: host, log: log, ctrl: ctrl, jobs: map[string]*tracked{},
		status: api.QoSStatus{Probes: "attached", Enabled: true, Window: api.Duration(cfg.Window)}}, nil
}

// Run steps the loop every window until ctx ends, then lifts the
// best-effort limits it set.
func (l *Loop) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.Window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.applied {
				if err := l.host.SetBestEffortCPU(0); err != nil {
					l.log.Warn("qos: lifting the best-effort quota", "err", err)
				}
				if err := l.host.SetBestEffortMemoryHigh(0); err != nil {
					l.log.Warn("qos: lifting the best-effort memory high", "err", err)
				}
			}
			for _, j := range l.jobs {
				_ = l.probe.Unregister(j.cgroup)
			}
			return
		case <-t.C:
			l.Step()
		}
	}
}

// Step runs one window: follow the running jobs, read their histograms,
// let the controller decide, apply and publish what it decided.
func (l *Loop) Step() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	running := l.host.Running()
	seen := map[string]bool{}
	var samples []Sample
	protected := 0
	for _, rj := range running {
		seen[rj.ID] = true
		j, ok := l.jobs[rj.ID]
		if !ok {
			id, err := l.host.CgroupID(rj.ID)
			if err != nil {
				l.log.Debug("qos: job has no cgroup yet", "job", rj.ID, "err", err)
				continue
			}
			if err := l.probe.Register(id, TierNumber(rj.Tier)); err != nil {
				l.log.Warn("qos: registering the job's cgroup with the probe", "job", rj.ID, "err", err)
				continue
			}
			j = &tracked{cgroup: id, state: "no-data"}
			l.jobs[rj.ID] = j
			l.log.Info("qos: timing run-queue latency", "job", rj.ID, "cgroup_id", id, "protected", rj.SLO != nil)
		}
		j.slo = rj.SLO
		h, err := l.probe.Histogram(j.cgroup)
		if err != nil {
			l.log.Warn("qos: reading the histogram", "job", rj.ID, "err", err)
			continue
		}
		j.last, j.prev, j.total = h.Sub(j.prev), h, h
		if j.slo == nil {
			j.state = "unprotected"
			continue
		}
		protected++
		s := Sample{JobID: rj.ID, RunqueueP99: time.Duration(j.slo.RunqueueP99), PSISomeAvg10: j.slo.PSISomeAvg10,
			P99: j.last.Quantile(0.99), Events: j.last.Count}
		if j.slo.PSISomeAvg10 > 0 {
			if psi, err := l.host.MemoryPSI(rj.ID); err == nil {
				s.MemoryPSI, j.psi = psi, psi
			}
		}
		samples = append(samples, s)
	}
	for id, j := range l.jobs {
		if !seen[id] {
			if err := l.probe.Unregister(j.cgroup); err != nil {
				l.log.Warn("qos: unregistering", "job", id, "err", err)
			}
			delete(l.jobs, id)
		}
	}
	breaching := l.ctrl.Breaching(samples)
	for _, s := range samples {
		j := l.jobs[s.JobID]
		switch {
		case breaching[s.JobID] != "":
			j.state = "breach"
		case s.Events < l.cfg.Params.MinEvents && s.MemoryPSI == nil:
			j.state = "no-data"
		default:
			j.state = "ok"
		}
	}
	var beMem int64
	if len(breaching) > 0 {
		if m, err := l.host.BestEffortMemory(); err == nil {
			beMem = m
		}
	}
	for _, a := range l.ctrl.Step(now, samples, beMem) {
		var err error
		if a.Kind == "cpu" {
			err = l.host.SetBestEffortCPU(a.CPUMilli)
		} else {
			err = l.host.SetBestEffortMemoryHigh(a.MemoryHigh)
		}
		reason := a.Reason
		if err != nil {
			reason = fmt.Sprintf("%s: failed: %v", a.Reason, err)
			l.log.Error("qos: applying", "action", a.Reason, "err", err)
		} else {
			l.applied = true
			l.log.Info("qos: "+a.Reason, "job", a.JobID)
		}
		t := now.UTC()
		l.status.LastAction, l.status.LastActionAt = reason, &t
		l.cfg.Publish(api.Event{Time: t, Kind: api.EventQoS, JobID: a.JobID, Reason: reason})
	}
	l.status.BestEffortQuota = api.MilliCPU(l.ctrl.Quota())
	l.status.BestEffortMemoryHigh = api.Bytes(l.ctrl.MemoryHigh())
	l.status.Protected, l.status.Breaching = protected, len(breaching)
}

// Status is the loop's state for node status.
func (l *Loop) Status() api.QoSStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.status
	if ps, ok := l.probe.(interface {
		Stats() ([]ebpf.ProgramStats, error)
	}); ok {
		if st, err := ps.Stats(); err == nil {
			var runs, ns uint64
			for _, p := range st {
				runs, ns = runs+p.RunCount, ns+p.RunTimeNs
			}
			if runs > 0 {
				s.ProbeEvents, s.ProbeNsPerEvent = runs, float64(ns)/float64(runs)
			}
		}
	}
	return s
}

// JobLatency is a job's latency for `fusionctl show`; nil when the loop
// does not follow the job (not running, or no cgroup).
func (l *Loop) JobLatency(id string) *api.Latency {
	l.mu.Lock()
	defer l.mu.Unlock()
	j, ok := l.jobs[id]
	if !ok {
		return nil
	}
	out := &api.Latency{State: j.state, P50: api.Duration(j.last.Quantile(0.5)), P99: api.Duration(j.last.Quantile(0.99)),
		Count: j.last.Count, Histogram: j.total.Buckets[:], Preemptions: j.total.Preemptions, MemoryPressure: j.psi}
	out.Histogram = append([]uint64(nil), out.Histogram...)
	if j.slo != nil {
		s := *j.slo
		out.SLO = &s
	}
	return out
}
