package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// The status line carries the energy, the idle floor and the energy per
// delivered compute, and says so when nothing was delivered.
func TestGPUEnergyLine(t *testing.T) {
	e := api.GPUEnergy{Window: api.Duration(90 * time.Second), EnergyWh: 12.5, MeasuredWh: 10, IdleFloorWh: 2.25,
		BusyGPUHours: 0.05, A100EqHours: 0.04, WhPerA100EqHour: 312.5, FloorWhPerA100EqHour: 56.25, WhPerBusyGPUHour: 250, UnknownGPUs: 1}
	r := &api.GPUEnergy{Window: api.Duration(time.Minute), A100EqHours: 0.01, WhPerA100EqHour: 300}
	got := gpuEnergyLine(e, r)
	for _, want := range []string{"12.5 Wh over 1m30s", "10.0 Wh measured", "idle floor 2.2 Wh", "delivered 0.040 A100-eq GPU-hours",
		"312.5 Wh per A100-eq GPU-hour (idle floor 56.2 of it)", "250.0 Wh per busy GPU-hour", "last 1m0s: 300.0 Wh per A100-eq GPU-hour", "1 GPUs of a model the table lacks"} {
		if !strings.Contains(got, want) {
			t.Errorf("line lacks %q:\n%s", want, got)
		}
	}
	e.A100EqHours, e.UnknownGPUs = 0, 0
	r.A100EqHours = 0
	got = gpuEnergyLine(e, r)
	if !strings.Contains(got, "no compute delivered (SM utilisation 0)") || !strings.Contains(got, "last 1m0s: no compute delivered") || strings.Contains(got, "per A100-eq") || strings.Contains(got, "lacks") {
		t.Errorf("idle line: %s", got)
	}
}
