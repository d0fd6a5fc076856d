package hardware

import (
	"fmt"

	"github.com/fusiond/fusiond/devices/nvidia"
)

// SetSimulatedGPUProcesses sets the compute processes simulated GPU index
// reports (NVML's running compute processes, which the memory caps of
// time-sliced shares are checked against); nil clears them. Live hosts
// refuse with ErrNotSimulated.
func (h *Host) SetSimulatedGPUProcesses(index int, ps []nvidia.ProcessUsage) error {
	if h.gpuSim == nil {
		return ErrNotSimulated
	}
	if err := h.gpuSim.SetProcessUsage(index, ps); err != nil {
		return fmt.Errorf("set GPU processes: %w", err)
	}
	return nil
}

// SetSimulatedGPUUtilization sets the SM utilisation (percent) simulated
// GPU index reports to telemetry. Live hosts refuse with ErrNotSimulated.
func (h *Host) SetSimulatedGPUUtilization(index int, smPct uint32) error {
	if h.gpuSim == nil {
		return ErrNotSimulated
	}
	if err := h.gpuSim.SetUtilization(index, smPct); err != nil {
		return fmt.Errorf("set GPU utilisation: %w", err)
	}
	return nil
}
