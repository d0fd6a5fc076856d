package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/qos"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
	"github.com/fusiond/fusiond/ebpf"
)

// qosHost is the QoS loop's view of this host: the job manager's running
// jobs, the cgroups manager's job and tier cgroups, and the placer's
// shared pool.
type qosHost struct {
	cfg QoSConfig
	// shared is the placer's shared pool (hostplacer.Placer.SharedCPUs):
	// the CPUs of the cores no guaranteed job holds.
	shared func() []int
	mgr    *jobs.Manager
	cg     *cgroups.Manager
	knobs  *beKnobs
	// bus has the jobs' pressure (read from their cgroups each
	// telemetry.job_interval).
	bus telemetry.Reader
}

var _ qos.Host = (*qosHost)(nil)

func (h *qosHost) Running() []qos.Job {
	list := h.mgr.Running()
	out := make([]qos.Job, 0, len(list))
	for _, j := range list {
		qj := qos.Job{ID: j.ID, Tier: j.Tier, Class: j.Spec.Class}
		// A best-effort job is what the loop squeezes: it is never
		// protected, whatever its spec says.
		if j.Tier != api.TierBestEffort {
			qj.SLO = h.cfg.SLO(j.Spec)
		}
		out = append(out, qj)
	}
	return out
}

func (h *qosHost) CgroupID(jobID string) (uint64, error) {
	c, err := h.cg.Load(jobID)
	if err != nil {
		return 0, err
	}
	return ebpf.CgroupID(c.CPUDir())
}

func (h *qosHost) MemoryPSI(jobID string) (*float64, error) {
	u, ok := h.bus.Job(jobID, time.Second)
	if !ok || u.PSI == nil {
		return nil, nil // not read yet, or no per-cgroup PSI (cgroup v1)
	}
	v := u.PSI.Memory
	return &v, nil
}

func (h *qosHost) BestEffortMemory() (int64, error) {
	st, err := h.cg.TierStats(cgroups.BestEffort)
	return int64(st.MemoryCurrent), err
}

// SharedPoolMilli is the placer's shared pool; the host's CPUs where the
// placer knows no cores.
func (h *qosHost) SharedPoolMilli() int64 {
	if h.shared != nil {
		if n := len(h.shared()); n > 0 {
			return int64(n) * 1000
		}
	}
	return int64(runtime.NumCPU()) * 1000
}

func (h *qosHost) TierCgroupID(t api.Tier) (uint64, error) {
	return ebpf.CgroupID(h.cg.TierCPUDir(cgroups.Tier(t)))
}

func (h *qosHost) CgroupPath(id uint64) (string, error) {
	return h.cg.FindCPUCgroup(id)
}

func (h *qosHost) SetBestEffortCPU(milli int64) error {
	return h.knobs.setQoSCPU(milli)
}

func (h *qosHost) SetBestEffortMemoryHigh(bytes int64) error {
	return h.knobs.setQoSMemory(bytes)
}

// startQoS loads the latency probes and starts the QoS loop. Without
// cgroups, without a kernel that runs the probes, or switched off, the
// daemon runs without them: the returned status says why, and the loop is
// nil. stop detaches the probes and stops the loop (lifting its limits).
func startQoS(ctx context.Context, cfg QoSConfig, cg *cgroups.Manager, knobs *beKnobs, mgr *jobs.Manager, bus telemetry.Reader, shared func() []int, log *slog.Logger) (loop *qos.Loop, off api.QoSStatus, stop func()) {
	off = api.QoSStatus{Window: api.Duration(cfg.Window)}
	switch {
	case !cfg.Enabled:
		off.Probes = "off: qos.enabled is false"
		return nil, off, func() {}
	case cg == nil:
		off.Probes = "off: jobs run without cgroups"
		return nil, off, func() {}
	}
	probe, err := ebpf.Load(ebpf.WithCgroupV1(cg.Mode() == cgroups.ModeV1), ebpf.WithLogger(log), ebpf.WithMaxCgroups(cfg.MaxJobs))
	if err != nil {
		log.Warn("running without latency probes: no QoS loop", "err", err)
		off.Probes = "off: " + err.Error()
		return nil, off, func() {}
	}
	loop, err = qos.New(qos.Config{Window: time.Duration(cfg.Window), Params: cfg.params(), Publish: mgr.PublishQoS},
		probe, &qosHost{cfg: cfg, mgr: mgr, cg: cg, knobs: knobs, bus: bus, shared: shared}, log)
	if err != nil {
		_ = probe.Close()
		off.Probes = fmt.Sprintf("off: %v", err)
		return nil, off, func() {}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop.Run(runCtx)
	}()
	return loop, off, func() {
		cancel()
		<-done
		if err := probe.Close(); err != nil {
			log.Warn("closing the latency probes", "err", err)
		}
	}
}
