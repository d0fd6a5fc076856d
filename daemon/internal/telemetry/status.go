package telemetry

import (
	"time"
	"unsafe"

	"github.com/fusiond/fusiond/daemon/api"
)

// MemoryBound is the most memory the rings hold, in bytes, for a host of
// cpus CPUs, nodes NUMA nodes, packages CPU packages and gpus GPUs: each
// host sample is a fixed part plus 4 bytes per CPU, 8 per node and
// package and one GPU reading per GPU (its ID string's header included,
// the bytes shared with the driver's); each per-minute point and job
// reading is fixed. With the defaults (3000 samples, 1440 minutes, 512
// jobs × 300 readings) it is 11.7 MB on a 2-CPU host and 14.3 MB on one
// of 128 CPUs, 2 nodes, 2 packages and 8 GPUs (TestMemoryBound logs
// both); 11.1 MB of it is the jobs' rings, allocated only for jobs that run.
func (c Config) MemoryBound(cpus, nodes, packages, gpus int) int64 {
	c.defaults()
	sample := int64(unsafe.Sizeof(Sample{})) + int64(4*cpus+8*nodes+8*packages) + int64(gpus)*int64(unsafe.Sizeof(GPU{}))
	job := int64(unsafe.Sizeof(JobUsage{})+unsafe.Sizeof(PSI{})) * int64(c.JobRing)
	return int64(c.Ring)*sample + int64(c.History)*int64(unsafe.Sizeof(Point{})) + int64(c.MaxJobs)*job
}

// Status is the bus's summary for fusionctl status.
func (b *Bus) Status() api.TelemetryStatus {
	latest, ok := b.Latest()
	busy, _ := b.HostBusy(time.Second)
	b.mu.RLock()
	defer b.mu.RUnlock()
	st := api.TelemetryStatus{
		Interval: api.Duration(b.cfg.Interval), JobInterval: api.Duration(b.cfg.JobInterval),
		Samples: b.count, Ring: len(b.ring), HistoryMinutes: len(b.history),
		CPUBusy: busy, Jobs: len(b.jobs), LastError: b.lastErr,
		MaxJobs: b.follows.Max, UnfollowedJobs: b.follows.Unfollowed, UnfollowedJobsTotal: b.follows.UnfollowedTotal,
		Power: "RAPL (powercap)", JobPSI: "per-cgroup pressure files",
	}
	if b.total > 0 {
		st.SampleCost = api.Duration(b.cost / time.Duration(b.total))
	}
	if b.cfg.Power == nil {
		st.Power = "none: " + b.cfg.PowerNote
	}
	if b.cfg.JobPSINote != "" {
		st.JobPSI = "none: " + b.cfg.JobPSINote
	}
	packages := 0
	if ok {
		packages = len(latest.PackageW)
		st.GPUs = len(latest.GPUs)
		st.MemoryUsed = api.Bytes(latest.MemTotal - min(latest.MemAvailable, latest.MemTotal))
		if latest.PSIValid {
			st.PSI = &api.PressureStatus{CPU: latest.PSI.CPU, Memory: latest.PSI.Memory, IO: latest.PSI.IO}
		}
		if packages > 0 {
			var w float64
			for _, p := range latest.PackageW {
				w += p
			}
			st.PackagePowerW = &w
		}
		for _, g := range latest.GPUs {
			st.GPUPowerW += g.PowerW
			if m, ok := b.gpuLocked(g.ID, idleWindow); ok && m.SMUtil < 1 {
				st.IdleGPUs++
				st.IdleGPUPowerW += m.PowerW
			}
		}
		for n := range latest.Nodes {
			v, _ := b.nodeBusyLocked(n, time.Second)
			st.NodeBusy = append(st.NodeBusy, v)
		}
	}
	st.MemoryBound = api.Bytes(b.cfg.MemoryBound(len(latest.CPUs), b.nNodes, packages, st.GPUs))
	st.Forecasts = b.fc.status()
	st.GPUEnergy = b.energy.status()
	st.GPUEnergyRecent = b.recentEnergyLocked(recentEnergy)
	return st
}

// idleWindow is how long a GPU must stay under 1% SM utilisation to
// count as idle in the status.
const idleWindow = 10 * time.Second

func (b *Bus) nodeBusyLocked(node int, d time.Duration) (float64, bool) {
	var sum float64
	n := 0
	b.window(d, func(s *Sample) {
		if node < len(s.Nodes) {
			sum += s.Nodes[node]
			n++
		}
	})
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}
