package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology"
)

func TestGPUTable(t *testing.T) {
	l := api.GPUList{Simulated: "dgxh200", GPUs: []api.GPU{
		{Index: 0, Model: "H200", Memory: 141 << 30, NUMANode: 0, BDF: "0000:00:00.0", Health: devices.Health{Healthy: true},
			ShareMode: "time-slicing", MIGCapable: true, MIGEnabled: true,
			MIG:       []api.MIGInstance{{Profile: "3g.71gb"}, {Profile: "1g.18gb"}, {Profile: "1g.18gb", Health: &devices.Health{Reason: "Xid 94"}}},
			Telemetry: &api.GPUTelemetry{SMUtilPct: 42, PowerW: 300, TempC: 50, MemoryUsed: 1 << 30}, PowerLimitW: 700},
		{Index: 1, Model: "H200", Memory: 141 << 30, NUMANode: -1, Health: devices.Health{Reason: "Xid 79: GPU has fallen off the bus"},
			ShareMode: "mps", MIGCapable: true},
	}}
	var b bytes.Buffer
	if err := gpuTable(&b, l); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"SIMULATED GPUs (dgxh200)", "3g.71gb+1g.18gb+1g.18gb(UNHEALTHY)", "42%", "300W/700W", "50C", " 1Gi ",
		"UNHEALTHY: Xid 79", "mps", "141Gi"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "GPU") {
		t.Errorf("want banner, header and 2 rows:\n%s", out)
	}
	b.Reset()
	gpuTable(&b, api.GPUList{Notes: []string{"no NVIDIA driver"}})
	if !strings.Contains(b.String(), "No GPUs.") || !strings.Contains(b.String(), "Note: no NVIDIA driver") {
		t.Errorf("empty list: %q", b.String())
	}
}

func TestMIGPlanText(t *testing.T) {
	var b bytes.Buffer
	p := api.MIGPlan{Config: "c", ExpectedSeconds: 16.5, Actions: []api.MIGAction{
		{Description: "gpu 0: set MIG mode enabled=true"}, {Description: "gpu 0: create 1g.18gb at slot 0"}}}
	migPlanText(&b, p)
	want := "MIG config \"c\": 2 actions, would take 16.5s:\n   1. gpu 0: set MIG mode enabled=true\n   2. gpu 0: create 1g.18gb at slot 0\nNothing was changed (mig apply carries it out).\n"
	if b.String() != want {
		t.Errorf("plan text\n%q\nwant\n%q", b.String(), want)
	}
	b.Reset()
	p.Applied = true
	migPlanText(&b, p)
	if !strings.Contains(b.String(), "applied in an expected 16.5s") || strings.Contains(b.String(), "Nothing was changed") {
		t.Errorf("applied text: %q", b.String())
	}
	b.Reset()
	migPlanText(&b, api.MIGPlan{Config: "c"})
	if !strings.Contains(b.String(), "nothing to do") {
		t.Errorf("empty plan: %q", b.String())
	}
}

func TestRegionTable(t *testing.T) {
	var b bytes.Buffer
	regionTable(&b, []api.FPGARegion{
		{ID: "dfl/0000:3b:00.0/0", Kind: "dfl", LoadedName: "nlb0", Health: devices.Health{Healthy: true}},
		{ID: "xrt/0000:65:00.1", Kind: "xrt", LoadedAFU: "0e6b", Busy: true, Health: devices.Health{Healthy: true}},
		{ID: "fpga-mgr/fpga0", Kind: "fpga-mgr", Held: true, Health: devices.Health{Reason: "programming failed"}},
	})
	for _, want := range []string{"nlb0", "AFU 0e6b", "programming\n", "held by a job", "UNHEALTHY: programming failed"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("region table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestNodeTableDevices(t *testing.T) {
	var b bytes.Buffer
	nodeTable(&b, api.NodeStatus{StartedAt: time.Now(), Simulated: true, Devices: []api.DeviceStatus{
		{ID: "GPU-139c30cf-cad9-47f5-8053-127c13eced89", Kind: "gpu", Model: "H200", Healthy: true, Detail: "#0"},
		{ID: "dfl/0000:3b:00.0/0", Kind: "fpga", Healthy: false, Detail: "dfl, empty"},
	}})
	out := b.String()
	if !strings.Contains(out, "GPU-139c30cf ") || strings.Contains(out, "cad9") {
		t.Errorf("GPU UUID not abbreviated:\n%s", out)
	}
	if !strings.Contains(out, "dfl/0000:3b:00.0/0  fpga") || !strings.Contains(out, "UNHEALTHY") || !strings.Contains(out, "SIMULATED") {
		t.Errorf("node table:\n%s", out)
	}
}

func TestNodeTableIsolation(t *testing.T) {
	for _, c := range []struct {
		iso  api.Isolation
		want string
	}{
		{api.Isolation{Isolated: true, Mode: "v2"}, "Isolation:   cgroups v2: every job has its limits"},
		{api.Isolation{Reason: "fusiond is not running as root", JobsRefused: true}, "Isolation:   NONE (fusiond is not running as root): jobs are REFUSED"},
		{api.Isolation{Reason: "no memory controller"}, "Isolation:   NONE (no memory controller): jobs run WITHOUT limits"},
	} {
		var b bytes.Buffer
		if err := nodeTable(&b, api.NodeStatus{StartedAt: time.Now(), Isolation: c.iso}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("node table for %+v lacks %q:\n%s", c.iso, c.want, b.String())
		}
	}
}

// fusionctl node says how many cores of each type a hybrid host has, and
// says plainly when the host has one type.
func TestNodeCoreTypes(t *testing.T) {
	h := &topology.Host{OnlineCPUs: topology.NewCPUSet(0, 1, 2, 3), CoreKindSource: topology.CoreKindSourceCapacity, Cores: []topology.Core{
		{CPUs: topology.NewCPUSet(0, 1), Kind: topology.CoreKindPerformance, Capacity: 1024},
		{CPUs: topology.NewCPUSet(2), Kind: topology.CoreKindEfficiency, Capacity: 500},
		{CPUs: topology.NewCPUSet(3), Kind: topology.CoreKindEfficiency, Capacity: 510},
	}}
	var b bytes.Buffer
	if err := coreTypes(&b, h); err != nil {
		t.Fatal(err)
	}
	want := "\nCores: 3 (CPUs 0-3), hybrid: core types from cpu_capacity\n" +
		"  performance: 1 cores, CPUs 0-1, capacity 1024\n" +
		"  efficiency: 2 cores, CPUs 2-3, capacity 500-510\n"
	if b.String() != want {
		t.Errorf("hybrid:\n%q\nwant\n%q", b.String(), want)
	}
	for i := range h.Cores {
		h.Cores[i].Kind, h.Cores[i].Capacity = topology.CoreKindUnknown, 0
	}
	b.Reset()
	if err := coreTypes(&b, h); err != nil {
		t.Fatal(err)
	}
	if want := "\nCores: 3 (CPUs 0-3), one type: no hybrid core information\n"; b.String() != want {
		t.Errorf("not hybrid: %q, want %q", b.String(), want)
	}
}
