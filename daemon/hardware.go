package daemon

import (
	"context"
	"log/slog"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices/nvidia"
	"github.com/fusiond/fusiond/topology"
)

// hardwareOf is the placement engine's view of the host: the real CPUs and
// memory jobs run on, and the GPUs and FPGA regions the host's drivers
// (real or simulated) report, with their NUMA nodes and NVLinks.
func hardwareOf(ctx context.Context, h *hardware.Host, capacity api.NodeResources, log *slog.Logger) hostplacer.Hardware {
	hw := hostplacer.Hardware{CPU: capacity.CPU, Memory: capacity.Memory}
	topo := h.Topology()
	numaOf := map[string]int{}
	if topo != nil {
		hw.Name = topo.Hostname
		for _, d := range topo.Devices {
			numaOf[strings.ToLower(string(d.Addr))] = int(d.Node)
		}
		if h.Simulated() == "" {
			// Exclusive cores must be real cores: only a live topology
			// says which exist.
			hw.CoresPerNUMA = coresPerNUMA(topo)
		}
	}
	if g := h.GPUs(); g != nil {
		state, err := g.State(ctx, nil)
		if err != nil {
			// Without the MIG state the engine could plan instances on
			// occupied slices: keep MIG GPUs out of service instead.
			log.Error("reading MIG state; MIG-enabled GPUs take no work until restart", "err", err)
		}
		index := map[string]int{}
		for i, gpu := range g.GPUs() {
			numa := gpu.NUMANode
			if n, ok := numaOf[strings.ToLower(gpu.BDF)]; ok && n >= 0 {
				numa = n
			}
			pg := hostplacer.GPU{
				ID: gpu.UUID, Model: gpu.Model, MemoryMB: int64(gpu.MemoryMB), NUMA: max(numa, 0),
				Healthy: g.Healthy(gpu.UUID) && (err == nil || !gpu.MIGEnabled), PerfPerWatt: 1,
			}
			if gpu.MIGEnabled {
				// MIG GPUs are modelled in memory slots, the unit NVIDIA
				// places instances in (a 3g instance takes 4 of 8).
				m := &hostplacer.MIG{TotalSlices: nvidia.MemorySlots, ReconfigMs: 1500, Profiles: map[string]int{}}
				for _, p := range gpu.Profiles {
					m.Profiles[p.Name] = p.MemSlots
				}
				for _, gs := range state.GPUs {
					if gs.UUID != gpu.UUID {
						continue
					}
					for _, in := range gs.Instances {
						m.Instances = append(m.Instances, hostplacer.MIGInstance{ID: in.UUID, Profile: in.Profile, Start: in.Start, Slices: in.Size})
					}
				}
				pg.MIG = m
			}
			index[gpu.BDF] = i
			hw.GPUs = append(hw.GPUs, pg)
		}
		links, _ := g.DeviceLinks(ctx)
		for _, l := range links {
			a, okA := index[l.A]
			b, okB := index[l.B]
			if okA && okB {
				hw.NVLink = append(hw.NVLink, [2]int{a, b})
			}
		}
	}
	if f := h.FPGAs(); f != nil {
		regions, _ := f.Regions(ctx)
		for _, r := range regions {
			numa := 0
			if n, ok := numaOf[strings.ToLower(r.PCI)]; ok && n >= 0 {
				numa = n
			}
			hw.FPGAs = append(hw.FPGAs, hostplacer.FPGARegion{
				ID: r.ID, Bitstream: r.LoadedBitstream, ProgramMs: 1000, NUMA: numa, Healthy: r.Health.Healthy,
			})
		}
	}
	return hw
}

// coresPerNUMA counts whole cores per NUMA node (index = node ID).
func coresPerNUMA(t *topology.Host) []int {
	var out []int
	for _, c := range t.Cores {
		n := int(c.Node)
		if n < 0 {
			n = 0
		}
		for len(out) <= n {
			out = append(out, 0)
		}
		out[n]++
	}
	return out
}

// placementOptions connects the engine to the bitstream library and the
// FPGA driver's programming-time estimates.
func placementOptions(h *hardware.Host) hostplacer.Options {
	var o hostplacer.Options
	if lib := h.Library(); lib != nil {
		o.ResolveBitstream = func(ref string) (string, error) {
			b, err := lib.Get(ref)
			if err != nil {
				return "", err
			}
			return b.ID, nil
		}
	}
	if f := h.FPGAs(); f != nil {
		o.ProgramEstimate = func(region, bitstream string) float64 {
			d, _ := f.Estimate(region, bitstream)
			return float64(d.Milliseconds())
		}
	}
	return o
}
