package hardware

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SetSimulatedGPUProcesses sets the compute processes simulated GPU index
// reports (NVML's running compute processes, which the memory caps of
// time-sliced shares are checked against); nil clears them. Live hosts
// refuse with ErrNotSimulated.
func (h *Host) SetSimulatedGPUProcesses(index int, ps []nvml.ProcessInfo) error {
	if h.gpuSim == nil {
		return ErrNotSimulated
	}
	if err := h.gpuSim.SetProcesses(index, ps); err != nil {
		return fmt.Errorf("set GPU processes: %w", err)
	}
	return nil
}
