package nvidia

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fusiond/fusiond/devices"
)

// ProcessUsage is one process's use of a GPU.
type ProcessUsage struct {
	PID      uint32 `json:"pid"`
	MemoryMB uint64 `json:"memoryMB"`
	// GIID is the GPU instance the process runs in (MIG), else -1.
	GIID int `json:"giID"`
}

// Sample is one telemetry reading of a GPU. Fields NVML could not provide
// are zero and named in Missing.
type Sample struct {
	UUID        string         `json:"uuid"`
	At          time.Time      `json:"at"`
	SMUtil      uint32         `json:"smUtilPct"`
	MemUtil     uint32         `json:"memUtilPct"`
	MemUsedMB   uint64         `json:"memUsedMB"`
	MemTotalMB  uint64         `json:"memTotalMB"`
	PowerW      float64        `json:"powerW"`
	PowerLimitW float64        `json:"powerLimitW"`
	TempC       uint32         `json:"tempC"`
	SMClockMHz  uint32         `json:"smClockMHz"`
	MemClockMHz uint32         `json:"memClockMHz"`
	Processes   []ProcessUsage `json:"processes,omitempty"`
	Missing     []string       `json:"missing,omitempty"`
}

// sampleDevice reads one telemetry sample of one GPU.
func (m *Manager) sampleDevice(uuid string, d nvml.Device, now time.Time) Sample {
	s := Sample{UUID: uuid, At: now}
	miss := func(what string, err error) bool {
		if err != nil {
			s.Missing = append(s.Missing, what)
			return false
		}
		return true
	}
	if u, err := call("GetUtilizationRates", d.GetUtilizationRates); miss("utilization", err) {
		s.SMUtil, s.MemUtil = u.Gpu, u.Memory
	}
	if mem, err := call("GetMemoryInfo", d.GetMemoryInfo); miss("memory", err) {
		s.MemUsedMB, s.MemTotalMB = mem.Used>>20, mem.Total>>20
	}
	if p, err := call("GetPowerUsage", d.GetPowerUsage); miss("power", err) {
		s.PowerW = float64(p) / 1000
	}
	if p, err := call("GetEnforcedPowerLimit", d.GetEnforcedPowerLimit); miss("powerLimit", err) {
		s.PowerLimitW = float64(p) / 1000
	}
	if t, err := call("GetTemperature", func() (uint32, nvml.Return) { return d.GetTemperature(nvml.TEMPERATURE_GPU) }); miss("temperature", err) {
		s.TempC = t
	}
	if c, err := call("GetClockInfo", func() (uint32, nvml.Return) { return d.GetClockInfo(nvml.CLOCK_SM) }); miss("smClock", err) {
		s.SMClockMHz = c
	}
	if c, err := call("GetClockInfo", func() (uint32, nvml.Return) { return d.GetClockInfo(nvml.CLOCK_MEM) }); miss("memClock", err) {
		s.MemClockMHz = c
	}
	if ps, err := call("GetComputeRunningProcesses", d.GetComputeRunningProcesses); miss("processes", err) {
		for _, p := range ps {
			gi := -1
			if p.GpuInstanceId != 0xFFFFFFFF {
				gi = int(p.GpuInstanceId)
			}
			s.Processes = append(s.Processes, ProcessUsage{PID: p.Pid, MemoryMB: p.UsedGpuMemory >> 20, GIID: gi})
		}
	}
	return s
}

// SampleAll reads one telemetry sample of every GPU.
func (m *Manager) SampleAll(ctx context.Context) ([]Sample, error) {
	m.mu.Lock()
	gpus, handles := m.gpus, m.handles
	m.mu.Unlock()
	now := m.clock.Now()
	out := make([]Sample, 0, len(handles))
	for i, d := range handles {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out = append(out, m.sampleDevice(gpus[i].UUID, d, now))
	}
	return out, nil
}

// Sampler samples every GPU at a fixed rate (≥10 Hz by default) and keeps
// the latest samples for the placement engine and status.
type Sampler struct {
	m        *Manager
	interval time.Duration

	mu     sync.RWMutex
	latest []Sample
}

// NewSampler returns a sampler at the given interval (default 100 ms).
func (m *Manager) NewSampler(interval time.Duration) *Sampler {
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	return &Sampler{m: m, interval: interval}
}

// Run samples until ctx ends, calling each (if non-nil) with every sweep.
func (s *Sampler) Run(ctx context.Context, each func([]Sample)) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		samples, err := s.m.SampleAll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		s.mu.Lock()
		s.latest = samples
		s.mu.Unlock()
		for _, x := range samples {
			s.m.hub.Publish(devices.Update{Kind: devices.Telemetry, Device: x.UUID, At: x.At, Sample: &devices.Sample{
				Util: float64(x.SMUtil) / 100, MemUsedMB: int64(x.MemUsedMB), PowerW: x.PowerW, TempC: float64(x.TempC),
			}})
		}
		if each != nil {
			each(samples)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Latest returns the most recent sweep.
func (s *Sampler) Latest() []Sample {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]Sample(nil), s.latest...)
}

// PowerPolicy is the admin's power-cap policy from the config. Nothing is
// changed unless Enabled.
type PowerPolicy struct {
	Enabled bool `json:"enabled"`
	// BestEffortCapW caps GPUs that run only best-effort work.
	BestEffortCapW float64 `json:"bestEffortCapW"`
}

// SetPowerLimit sets a GPU's power limit in watts, within the device's
// constraints. It is a no-op when the limit is already in force.
func (m *Manager) SetPowerLimit(uuid string, watts float64) error {
	g, d, err := m.gpu(uuid)
	if err != nil {
		return err
	}
	if g.PowerMaxLimitW > 0 && (watts < g.PowerMinLimitW || watts > g.PowerMaxLimitW) {
		return fmt.Errorf("gpu %s: power limit %.0f W outside %.0f..%.0f W: %w", uuid, watts, g.PowerMinLimitW, g.PowerMaxLimitW, ErrNotSupported)
	}
	mw := uint32(watts * 1000)
	if cur, err := call("GetPowerManagementLimit", d.GetPowerManagementLimit); err == nil && cur == mw {
		return nil
	}
	if err := call0("SetPowerManagementLimit", func() nvml.Return { return d.SetPowerManagementLimit(mw) }); err != nil {
		return fmt.Errorf("gpu %s: %w", uuid, err)
	}
	m.log.Info("nvidia: power limit set", "gpu", uuid, "watts", watts)
	_, err = m.Refresh(context.Background())
	return err
}

// ApplyPowerPolicy caps the GPUs in bestEffortOnly (UUIDs running only
// best-effort work) and restores the others to their maximum limit — only
// when the policy is enabled.
func (m *Manager) ApplyPowerPolicy(p PowerPolicy, bestEffortOnly map[string]bool) error {
	if !p.Enabled {
		return nil
	}
	for _, g := range m.GPUs() {
		if g.PowerMaxLimitW == 0 {
			continue
		}
		w := g.PowerMaxLimitW
		if bestEffortOnly[g.UUID] {
			w = max(g.PowerMinLimitW, min(p.BestEffortCapW, g.PowerMaxLimitW))
		}
		if err := m.SetPowerLimit(g.UUID, w); err != nil {
			return err
		}
	}
	return nil
}
