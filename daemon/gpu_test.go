package daemon

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/host"
	"github.com/fusiond/fusiond/devices/nvidia"
)

func TestGPUConfigDecode(t *testing.T) {
	cfg := DefaultConfig()
	err := ParseConfig([]byte(`
gpu:
  health_probation: 90s
  health_probe: 2s
  sharing:
    timeSlicing:
      resources:
      - name: nvidia.com/gpu
        replicas: 4
        devices: [0, 1]
    mps:
      resources:
      - {name: nvidia.com/gpu, replicas: 2, devices: [2]}
  power: {enabled: true, besteffort_cap_watts: 300}
`), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(cfg.GPU.HealthProbation) != 90*time.Second || time.Duration(cfg.GPU.HealthProbe) != 2*time.Second {
		t.Errorf("health keys: %+v", cfg.GPU)
	}
	if !cfg.GPU.Power.Enabled || cfg.GPU.Power.BestEffortCapWatts != 300 {
		t.Errorf("power: %+v", cfg.GPU.Power)
	}
	sc, err := cfg.GPU.SharingConfig()
	if err != nil || sc == nil || sc.Sharing.TimeSlicing == nil || sc.Sharing.MPS == nil {
		t.Fatalf("sharing: %+v %v", sc, err)
	}
	if r := sc.Sharing.TimeSlicing.Resources; len(r) != 1 || r[0].Replicas != 4 {
		t.Errorf("timeSlicing resources: %+v", r)
	}
	hc := cfg.GPU.hostConfig(host.Config{})
	if hc.HealthProbation != 90*time.Second || hc.HealthProbe != 2*time.Second {
		t.Errorf("host config: %+v", hc)
	}
	if d := DefaultConfig().GPU; time.Duration(d.HealthProbation) != 5*time.Minute || d.Power.Enabled || len(d.Sharing) != 0 {
		t.Errorf("gpu defaults: %+v", d)
	}
}

func TestGPUConfigInvalid(t *testing.T) {
	cases := map[string]string{
		"gpu: {health_probation: -1s}":  "gpu.health_probation",
		"gpu: {health_probation: soon}": "",
		"gpu: {health_probe: -1s}":      "gpu.health_probe",
		"gpu: {power: {enabled: true}}": "gpu.power.besteffort_cap_watts",
		"gpu: {sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}}": "gpu.sharing",
		"gpu: {sharing: {timeSlicing: {resources: [{name: amd.com/gpu, replicas: 2}]}}}":    "gpu.sharing",
		"gpu: {sharing: {timeSlice: {}}}":                                                   "gpu.sharing",
		"gpu: {probation: 5m}":                                                              "",
	}
	for in, field := range cases {
		cfg := DefaultConfig()
		err := ParseConfig([]byte(in), &cfg)
		if err == nil {
			t.Errorf("%s: accepted", in)
			continue
		}
		var e *api.Error
		if field != "" && (!errors.As(err, &e) || e.Field != field) {
			t.Errorf("%s: got %v, want an error on %s", in, err, field)
		}
	}
}

// TestApplyGPUConfig applies a sharing section to the simulated DGX H200
// and checks the per-GPU mode and replicas gpu list shows.
func TestApplyGPUConfig(t *testing.T) {
	h, err := host.Open(context.Background(), host.Config{StateDir: t.TempDir(), Simulate: "dgxh200"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cfg := DefaultConfig()
	if err := ParseConfig([]byte("gpu: {sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 3, devices: [1]}]}, mps: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [2]}]}}}"), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := applyGPUConfig(h, cfg.GPU, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	gpus := h.GPUs().GPUs()
	replicas := map[string]int{}
	for _, s := range h.GPUs().ShareStatuses() {
		replicas[s.GPU] = s.Replicas
	}
	if replicas[gpus[1].UUID] != 3 || replicas[gpus[2].UUID] != 2 || replicas[gpus[0].UUID] != 0 {
		t.Errorf("replicas by GPU %v", replicas)
	}
	for _, g := range h.GPUs().Status().GPUs {
		// The simulated host has no MPS control daemon: MPS falls back
		// to time-slicing, stated per GPU.
		if g.ShareMode != nvidia.ModeTimeSlicing {
			t.Errorf("GPU %d share mode %q", g.Index, g.ShareMode)
		}
	}
}
