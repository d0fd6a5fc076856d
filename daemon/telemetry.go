package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/devices/rapl"
	"github.com/fusiond/fusiond/topology"
)

// TelemetryConfig is the telemetry bus's sampling and ring sizes.
type TelemetryConfig struct {
	// Interval between host samples (≥ 10ms; default 100ms, 10 Hz).
	Interval Duration `json:"interval"`
	// JobInterval between readings of the running jobs' cgroups (≥
	// interval; default 1s).
	JobInterval Duration `json:"job_interval"`
	// Ring is how many host samples are kept (10..1000000; default 3000).
	Ring int `json:"ring"`
	// HistoryMinutes is how many per-minute points the forecasters keep
	// (60..100000; default 1440, a day).
	HistoryMinutes int `json:"history_minutes"`
	// PowercapRoot is where RAPL zones are read (default
	// /sys/class/powercap).
	PowercapRoot string `json:"powercap_root,omitempty"`
	// MaxJobs is how many running jobs the bus follows at once (1..8192;
	// default 512): 21.6 KB of readings each at most. A job that starts
	// while MaxJobs are followed has no usage readings until a followed
	// one ends; fusionctl status notes it, fusiond_telemetry_jobs_unfollowed
	// counts it and one warning is logged per episode.
	MaxJobs int `json:"max_jobs"`
}

// DefaultTelemetryConfig samples at 10 Hz and keeps 5 minutes of samples
// and a day of minutes.
func DefaultTelemetryConfig() TelemetryConfig {
	return TelemetryConfig{Interval: Duration(100 * time.Millisecond), JobInterval: Duration(time.Second), Ring: 3000, HistoryMinutes: 1440,
		MaxJobs: telemetry.DefaultMaxJobs}
}

func (c TelemetryConfig) validate() (string, error) {
	switch {
	case c.Interval < Duration(10*time.Millisecond):
		return "telemetry.interval", fmt.Errorf("at least 10ms, got %v", time.Duration(c.Interval))
	case c.JobInterval < c.Interval:
		return "telemetry.job_interval", fmt.Errorf("at least telemetry.interval (%v), got %v", time.Duration(c.Interval), time.Duration(c.JobInterval))
	case c.Ring < 10 || c.Ring > 1_000_000:
		return "telemetry.ring", fmt.Errorf("between 10 and 1000000 samples, got %d", c.Ring)
	case c.HistoryMinutes < 60 || c.HistoryMinutes > 100_000:
		return "telemetry.history_minutes", fmt.Errorf("between 60 and 100000, got %d", c.HistoryMinutes)
	case c.MaxJobs < 1 || c.MaxJobs > telemetry.MaxJobsLimit:
		// The upper bound keeps the job rings' memory (21.6 KB a job) and
		// the sampler's cgroup reads each job_interval bounded.
		return "telemetry.max_jobs", fmt.Errorf("between 1 and %d jobs, got %d", telemetry.MaxJobsLimit, c.MaxJobs)
	}
	return "", nil
}

// telemetryJobs is the bus's view of the running jobs and their cgroups.
// The bus is built before the job manager (the placer the manager is built
// with reads it), so it finds the manager through mgr. The bus reads jobs
// only while it runs, and its "telemetry" part needs the "jobs" part
// (daemon.New), so mgr is set by then; nil is still read as no jobs.
type telemetryJobs struct {
	mgr func() *jobs.Manager
	cg  *cgroups.Manager
}

func (t telemetryJobs) Running() []telemetry.JobRef {
	m := t.mgr()
	if m == nil {
		return nil
	}
	list := m.Running()
	out := make([]telemetry.JobRef, len(list))
	for i, j := range list {
		out[i] = telemetry.JobRef{ID: j.ID, Started: j.StartedAt, GPUs: gpuHolds(j)}
	}
	return out
}

func (t telemetryJobs) Stats(id string) (cgroups.Stats, error) {
	c, err := t.cg.Load(id)
	if errors.Is(err, cgroups.ErrNotFound) {
		// Not made yet, or gone with the job: the bus skips it.
		return cgroups.Stats{}, fmt.Errorf("%w: %w", fs.ErrNotExist, err)
	}
	if err != nil {
		return cgroups.Stats{}, err
	}
	return c.Stats()
}

// cpuNodes maps each online CPU of this machine to its NUMA node. A
// simulated host's topology is not this machine's CPUs, so the real one
// is discovered then.
func cpuNodes(ctx context.Context, h *hardware.Host) (map[int]int, error) {
	t := h.Topology()
	if t == nil || h.Simulated() != "" {
		var err error
		if t, err = topology.Discover(ctx); err != nil {
			return nil, fmt.Errorf("telemetry: topology: %w", err)
		}
	}
	out := map[int]int{}
	for _, n := range t.Nodes {
		for _, cpu := range n.CPUs.List() {
			out[cpu] = int(n.ID)
		}
	}
	return out, nil
}

// newTelemetry builds the telemetry bus over this host; startTelemetry
// runs it.
func newTelemetry(ctx context.Context, cfg TelemetryConfig, h *hardware.Host, mgr func() *jobs.Manager, cg *cgroups.Manager, log *slog.Logger) (*telemetry.Bus, error) {
	nodes, err := cpuNodes(ctx, h)
	if err != nil {
		return nil, err
	}
	tc := telemetry.Config{
		Interval: time.Duration(cfg.Interval), JobInterval: time.Duration(cfg.JobInterval),
		Ring: cfg.Ring, History: cfg.HistoryMinutes, MaxJobs: cfg.MaxJobs, CPUNode: nodes,
		GPUs: func() []telemetry.GPU {
			var out []telemetry.GPU
			for _, s := range h.Telemetry() {
				out = append(out, telemetry.GPU{ID: s.UUID, SMUtil: float64(s.SMUtil), MemUtil: float64(s.MemUtil), PowerW: s.PowerW, LimitW: s.PowerLimitW,
					MemUsedMiB: float64(s.MemUsedMB)})
			}
			return out
		},
		GPUModel: gpuModels(h),
	}
	switch m, err := rapl.Open(cfg.PowercapRoot); {
	case err == nil:
		tc.Power = m
	case errors.Is(err, rapl.ErrNoZones):
		tc.PowerNote = err.Error()
	default:
		log.Warn("CPU package power unreadable", "err", err)
		tc.PowerNote = err.Error()
	}
	if cg != nil {
		tc.Jobs = telemetryJobs{mgr: mgr, cg: cg}
		if cg.Mode() == cgroups.ModeV1 {
			tc.JobPSINote = "cgroup v1 has no per-cgroup pressure files"
		}
	} else {
		tc.JobPSINote = "jobs run without cgroups"
	}
	return telemetry.New(tc, log)
}

// gpuModels gives each of the host's GPUs (by UUID) its figures from the
// GPU model table, as the placer's nodes get them; a GPU the table does
// not know, or one that appears later, has none.
func gpuModels(h *hardware.Host) func(id string) (sched.GPUSpec, bool) {
	specs := map[string]sched.GPUSpec{}
	if m := h.GPUs(); m != nil {
		for _, g := range m.Status().GPUs {
			if s, ok := sched.LookupGPU(g.Model); ok {
				specs[g.UUID] = s
			}
		}
	}
	return func(id string) (sched.GPUSpec, bool) {
		s, ok := specs[id]
		return s, ok
	}
}

// startTelemetry starts the bus's sampler; stop ends it.
func startTelemetry(ctx context.Context, bus *telemetry.Bus) (stop func()) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		bus.Run(runCtx)
	}()
	return func() { cancel(); <-done }
}

// boundNotes are the status notes of the bounds on followed jobs while
// one is reached: the telemetry bus's (telemetry.max_jobs) and the
// latency probe's (qos.max_jobs). Nil when neither is.
func boundNotes(tel *api.TelemetryStatus, q *api.QoSStatus) []string {
	var out []string
	if tel != nil && tel.UnfollowedJobs > 0 {
		out = append(out, fmt.Sprintf("telemetry: %d running %s not followed: telemetry.max_jobs (%d) reached; %s no usage readings "+
			"(elastic sizing and memory-pressure SLOs do not see them; reclaim counts a guaranteed or burstable one at its whole request, "+
			"best-effort ones by their tier's cgroup); %d refused since start",
			tel.UnfollowedJobs, boundWord(tel.UnfollowedJobs, "job", "jobs"), tel.MaxJobs, boundWord(tel.UnfollowedJobs, "it has", "they have"), tel.UnfollowedJobsTotal))
	}
	if q != nil && q.UntimedJobs > 0 {
		out = append(out, fmt.Sprintf("qos: %d running %s not timed: all %d latency probe slots (qos.max_jobs) are taken; "+
			"%s run-queue latency is not watched (protected jobs take unprotected jobs' slots first); %d refused since start",
			q.UntimedJobs, boundWord(q.UntimedJobs, "job", "jobs"), q.ProbeSlots, boundWord(q.UntimedJobs, "its", "their"), q.UntimedJobsTotal))
	}
	return out
}

func boundWord(n int, one, more string) string {
	if n == 1 {
		return one
	}
	return more
}

// gpuHolds are the GPUs a running job's readings are attributed from:
// each whole GPU's utilisation and used memory, and a share's up to its
// compute share and memory cap. A MIG instance is not attributed (the
// device's readings cover every instance on it).
func gpuHolds(j jobs.RunningJob) []telemetry.GPUHold {
	var out []telemetry.GPUHold
	for _, id := range j.GPUs {
		out = append(out, telemetry.GPUHold{ID: id, Milli: 1000})
	}
	if sh := j.Share; sh != nil {
		out = append(out, telemetry.GPUHold{ID: sh.GPU, Milli: float64(sh.Milli), MemMiB: float64(sh.MemoryMB)})
	}
	return out
}
