package cli

import (
	"bytes"
	"strings"
	"testing"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

func testFrame() topFrame {
	return topFrame{
		Node: api.NodeStatus{Hostname: "h1", Version: "1.0", Cordoned: true, Simulated: true,
			Capacity:  api.NodeResources{CPU: 8000, Memory: 32 << 30, GPUs: 2, FPGAs: 1},
			Allocated: api.NodeResources{CPU: 2500, Memory: 4 << 30, GPUs: 1},
			Jobs:      map[api.State]int{api.StateRunning: 1, api.StatePending: 1, api.StateFailed: 1},
			Notes:     []string{"no FPGA regions found"}},
		GPUs: api.GPUList{Simulated: "dgxh200", GPUs: []api.GPU{
			{Index: 1, Model: "H200", Memory: 141 << 30, Health: devices.Health{Reason: "Xid 79"}, Xid: 79, ShareMode: "mps"},
			{Index: 0, Model: "H200", Memory: 141 << 30, Health: devices.Health{Healthy: true}, MIGEnabled: true,
				MIG:       []api.MIGInstance{{Profile: "3g.71gb", Busy: true}, {Profile: "1g.18gb"}},
				Telemetry: &api.GPUTelemetry{SMUtilPct: 42, PowerW: 300, TempC: 50, MemoryUsed: 1 << 30},
				Sharing:   &api.GPUSharing{Mode: "time-slicing", UsedMilli: 250, Shares: []api.GPUShareStatus{{Job: "3"}}}},
		}},
		FPGAs: []api.FPGARegion{{ID: "r0", Kind: "dfl", LoadedName: "dma", Health: devices.Health{Healthy: true}, Held: true}},
		Jobs: []api.Job{
			{ID: "3", Spec: api.JobSpec{Name: "train", Class: api.ClassTraining}, Tier: api.TierBurstable, State: api.StateRunning,
				Allocation: &api.Allocation{CPU: 2500, Memory: 4 << 30, Devices: []string{"GPU-0123456789abcdef"}},
				Usage:      &api.Usage{CPUSeconds: 12.5, MemoryCurrent: 1 << 30, MemoryPeak: 2 << 30}},
			{ID: "4", Spec: api.JobSpec{Name: "wait", Class: api.ClassBatch}, Tier: api.TierBestEffort, State: api.StatePending},
			{ID: "2", Spec: api.JobSpec{Class: api.ClassBatch}, Tier: api.TierBestEffort, State: api.StateFailed},
		},
	}
}

func TestRenderFrame(t *testing.T) {
	var b bytes.Buffer
	if err := renderFrame(&b, testFrame(), plainStyle); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"NODE h1 — fusiond 1.0, devices SIMULATED (dgxh200) — CORDONED",
		"CPU 2500m/8 cores  MEM 4Gi/32Gi  GPU 1/2  FPGA 0/1  JOBS 1 pending, 1 running, 1 failed\nnote: no FPGA regions found\n",
		"burstable   1        0       2500m         4Gi           12.5s     1Gi",
		"besteffort  0        1       0             0             0.0s      0",
		// sorted by index; MIG instances with the busy ones starred
		"0    H200   ok                  42%   1Gi / 141Gi  300W   50C   time-slicing  1 jobs, 250 milli  3g.71gb* 1g.18gb",
		"1    H200   UNHEALTHY (Xid 79)  -     - / 141Gi",
		"r0      dfl   dma    ok      held by a job",
		"3   train  running  training  burstable   2500m  4Gi  GPU-01234567  12.5s     2Gi",
		"2   -      failed   batch     besteffort  -",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "\n0    H200") > strings.Index(out, "\n1    H200") {
		t.Errorf("GPUs not in index order:\n%s", out)
	}
}

// The terminal model quits on q, shows a fetch error and keeps the last
// good frame.
func TestTopModel(t *testing.T) {
	m := topModel{interval: 1}
	next, cmd := m.Update(frameMsg{f: testFrame()})
	if cmd == nil {
		t.Fatal("no refresh scheduled after a frame")
	}
	m = next.(topModel)
	if v := m.View(); !strings.Contains(v, "train") || !strings.Contains(v, "q quits") {
		t.Errorf("view:\n%s", v)
	}
	next, _ = m.Update(frameMsg{err: errTest("connection refused")})
	m = next.(topModel)
	if v := m.View(); !strings.Contains(v, "connection refused") || !strings.Contains(v, "train") {
		t.Errorf("view after an error:\n%s", v)
	}
	_, cmd = m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("q")})
	if cmd == nil {
		t.Fatal("q does nothing")
	}
	if _, ok := cmd().(tea.QuitMsg); !ok {
		t.Error("q does not quit")
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }
