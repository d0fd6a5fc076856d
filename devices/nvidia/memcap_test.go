package nvidia

import (
	"context"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestTimeSlicedShareMemory injects compute processes into the simulated
// H200s, samples them through the production sampler and sums them per
// share: each job's processes against its own cap, others' and unowned
// processes against nobody, a lost GPU and MPS GPUs left out.
func TestTimeSlicedShareMemory(t *testing.T) {
	m, h := openSim(t, "dgxh200")
	gs := m.GPUs()
	ctx := context.Background()
	for _, s := range []Share{
		{ID: "7", GPU: gs[0].UUID, Milli: 250, MemoryMB: 1024},
		{ID: "8", GPU: gs[0].UUID, Milli: 250, MemoryMB: 4096},
		{ID: "9", GPU: gs[0].UUID, Milli: 250}, // no cap
		{ID: "10", GPU: gs[2].UUID, Milli: 500, MemoryMB: 1024},
	} {
		if err := m.AdmitShare(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	const none = 0xFFFFFFFF
	proc := func(pid uint32, mib uint64) nvml.ProcessInfo {
		return nvml.ProcessInfo{Pid: pid, UsedGpuMemory: mib << 20, GpuInstanceId: none, ComputeInstanceId: none}
	}
	if err := h.SetProcesses(0, []nvml.ProcessInfo{proc(100, 1536), proc(101, 512), proc(200, 1000), proc(300, 9000), proc(400, 5000)}); err != nil {
		t.Fatal(err)
	}
	if err := h.SetProcesses(2, []nvml.ProcessInfo{proc(500, 4000)}); err != nil {
		t.Fatal(err)
	}
	// Job 7 is over elsewhere too, but only its own GPU counts.
	if err := h.SetProcesses(1, []nvml.ProcessInfo{proc(102, 70000)}); err != nil {
		t.Fatal(err)
	}
	owners := map[uint32]string{100: "7", 101: "7", 102: "7", 200: "8", 300: "9", 500: "10"} // 400: no job's
	owner := func(pid uint32) string { return owners[pid] }

	ss, err := m.SampleAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := ss[0].Processes; len(got) != 5 || got[0] != (ProcessUsage{PID: 100, MemoryMB: 1536, GIID: -1}) {
		t.Fatalf("GPU 0 processes sampled: %+v", got)
	}
	got := TimeSlicedShareMemory(ss, m.ShareStatuses(), owner)
	want := []ShareMemory{
		{GPU: gs[0].UUID, Job: "7", UsedMB: 2048, CapMB: 1024, PIDs: []uint32{100, 101}},
		{GPU: gs[0].UUID, Job: "8", UsedMB: 1000, CapMB: 4096, PIDs: []uint32{200}},
		{GPU: gs[2].UUID, Job: "10", UsedMB: 4000, CapMB: 1024, PIDs: []uint32{500}},
	}
	if gs[2].UUID < gs[0].UUID {
		want = append(want[2:], want[:2]...)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("share memory\n got %+v\nwant %+v", got, want)
	}
	over := map[string]bool{}
	for _, s := range got {
		over[s.Job] = s.Over()
	}
	if !over["7"] || over["8"] || !over["10"] {
		t.Fatalf("over cap: %v", over)
	}

	// Cleared processes: every capped share at 0.
	if err := h.SetProcesses(0, nil); err != nil {
		t.Fatal(err)
	}
	ss, _ = m.SampleAll(ctx)
	for _, s := range TimeSlicedShareMemory(ss, m.ShareStatuses(), owner) {
		if s.GPU == gs[0].UUID && (s.UsedMB != 0 || s.PIDs != nil) {
			t.Fatalf("after clearing: %+v", s)
		}
	}

	// A GPU whose processes cannot be read is not reported (its use is
	// unknown, not 0).
	if err := h.InjectXid(2, 79, true); err != nil {
		t.Fatal(err)
	}
	ss, _ = m.SampleAll(ctx)
	for _, s := range TimeSlicedShareMemory(ss, m.ShareStatuses(), owner) {
		if s.GPU == gs[2].UUID {
			t.Fatalf("lost GPU reported: %+v", s)
		}
	}

	// MPS GPUs are MPS's to enforce.
	st := m.ShareStatuses()
	for i := range st {
		st[i].Mode = ModeMPS
	}
	if err := h.SetProcesses(0, []nvml.ProcessInfo{proc(100, 9000)}); err != nil {
		t.Fatal(err)
	}
	ss, _ = m.SampleAll(ctx)
	if got := TimeSlicedShareMemory(ss, st, owner); got != nil {
		t.Fatalf("MPS GPUs reported: %+v", got)
	}
}

func TestSimSetProcessesBadInput(t *testing.T) {
	_, h := openSim(t, "mixed")
	if err := h.SetProcesses(3, nil); err == nil {
		t.Error("GPU 3 of a 3-GPU host accepted")
	}
	if err := h.SetProcesses(-1, nil); err == nil {
		t.Error("GPU -1 accepted")
	}
	if err := h.SetProcesses(0, make([]nvml.ProcessInfo, MaxSimProcesses+1)); err == nil {
		t.Error("too many processes accepted")
	}
}

// SetProcessUsage reports what it is given through the sampler, MIG
// instance included.
func TestSimSetProcessUsage(t *testing.T) {
	m, h := openSim(t, "dgxa100")
	in := []ProcessUsage{{PID: 7, MemoryMB: 2048, GIID: -1}, {PID: 8, MemoryMB: 10, GIID: 3}}
	if err := h.SetProcessUsage(4, in); err != nil {
		t.Fatal(err)
	}
	ss, err := m.SampleAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ss[4].Processes, in) || len(ss[3].Processes) != 0 {
		t.Fatalf("sampled %+v (GPU 3: %+v), want %+v", ss[4].Processes, ss[3].Processes, in)
	}
}
