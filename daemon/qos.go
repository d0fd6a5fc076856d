package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/cgroups/resctrl"
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

// resctrlGroup is the resctrl control group best-effort work runs in.
const resctrlGroup = "fusiond-besteffort"

// qosCache is the QoS loop's second actuator: the best-effort tier's
// resctrl group (cache ways, memory bandwidth).
type qosCache struct {
	fs *resctrl.FS
	g  *resctrl.Group
	cg *cgroups.Manager
}

var _ qos.Cache = (*qosCache)(nil)

func (c *qosCache) SetBestEffortShare(share float64) error { return c.g.SetShare(share) }

// Sync moves the best-effort tier's threads that are not in the group
// into it (a thread's children start in its group, so this catches the
// threads a job made before its first window).
func (c *qosCache) Sync() error {
	want, err := c.cg.TierThreads(cgroups.BestEffort)
	if err != nil || len(want) == 0 {
		return err
	}
	have, err := c.g.Tasks()
	if err != nil {
		return err
	}
	in := make(map[int]bool, len(have))
	for _, t := range have {
		in[t] = true
	}
	var missing []int
	for _, t := range want {
		if !in[t] {
			missing = append(missing, t)
		}
	}
	_, err = c.g.Add(missing)
	return err
}

func (c *qosCache) Describe() string { return "resctrl " + c.fs.Resources() }

// openResctrl opens the best-effort resctrl group, unrestricted; off says
// why there is none.
func openResctrl(cfg QoSConfig, cg *cgroups.Manager) (c *qosCache, off string) {
	if !cfg.Resctrl {
		return nil, "off: qos.resctrl is false"
	}
	fs, err := resctrl.Open(cfg.ResctrlRoot)
	if err != nil {
		return nil, "off: " + err.Error()
	}
	g, err := fs.Group(resctrlGroup)
	if err == nil {
		err = g.SetShare(1)
	}
	if err != nil {
		return nil, "off: " + err.Error()
	}
	return &qosCache{fs: fs, g: g, cg: cg}, ""
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
	qcfg := qos.Config{Window: time.Duration(cfg.Window), Params: cfg.params(), Publish: mgr.PublishQoS}
	cache, cacheOff := openResctrl(cfg, cg)
	if cache != nil {
		qcfg.Cache = cache
		log.Info("qos: best-effort cache and memory bandwidth follow its CPU quota", "resctrl", cache.Describe(), "group", resctrlGroup)
	} else {
		qcfg.CacheOff = cacheOff
		log.Info("qos: no second actuator", "resctrl", cacheOff)
	}
	loop, err = qos.New(qcfg, probe, &qosHost{cfg: cfg, mgr: mgr, cg: cg, knobs: knobs, bus: bus, shared: shared}, log)
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
		if cache != nil {
			// Its threads go back to the root's group.
			if err := cache.g.Remove(); err != nil {
				log.Warn("removing the best-effort resctrl group", "err", err)
			}
		}
	}
}
