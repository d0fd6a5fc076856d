package daemon

import (
	"context"
	"log/slog"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices"
)

// hardwareOf is the placement engine's view of the host: the real CPUs and
// memory jobs run on (the exclusive cores are added by the daemon where
// cgroups can pin them, see hostCores), and the devices every driver (real or simulated)
// reports, with their NUMA nodes (the topology's, where it knows the
// device's PCI address) and NVLinks. It is read again whenever a device
// changes (see connectDevices).
func hardwareOf(ctx context.Context, h *hardware.Host, capacity api.NodeResources, log *slog.Logger) hostplacer.Hardware {
	hw := hostplacer.Hardware{CPU: capacity.CPU, Memory: capacity.Memory}
	topo := h.Topology()
	numaOf := map[string]int{}
	if topo != nil {
		hw.Name = topo.Hostname
		for _, d := range topo.Devices {
			numaOf[strings.ToLower(string(d.Addr))] = int(d.Node)
		}
	}
	for _, drv := range h.Drivers() {
		inv, err := drv.Inventory(ctx)
		if err != nil {
			// The driver marks what it could not read unhealthy (MIG
			// GPUs without a MIG state could otherwise get instances
			// planned on occupied slots); it is read again on the next
			// device change.
			log.Error("device inventory incomplete; devices it could not read take no work", "driver", drv.Kind(), "err", err)
		}
		gpuAt := map[string]int{} // PCI address → index into hw.GPUs
		for _, d := range inv.Devices {
			if n, ok := numaOf[strings.ToLower(d.PCI)]; ok && n >= 0 {
				d.NUMA = n
			}
			d.NUMA = max(d.NUMA, 0)
			switch d.Kind {
			case devices.GPU:
				gpuAt[d.PCI] = len(hw.GPUs)
				hw.GPUs = append(hw.GPUs, d)
			case devices.FPGA:
				hw.FPGAs = append(hw.FPGAs, d)
			default:
				log.Warn("device of a kind the placer does not model", "driver", drv.Kind(), "device", d.ID, "kind", d.Kind)
			}
		}
		for _, l := range inv.Links {
			a, okA := gpuAt[l.A]
			b, okB := gpuAt[l.B]
			if okA && okB {
				hw.NVLink = append(hw.NVLink, [2]int{a, b})
			}
		}
	}
	return hw
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
