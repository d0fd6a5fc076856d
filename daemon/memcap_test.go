package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fusiond/fusiond/devices/nvidia"
)

// memCapRecorder is the job manager as the watch sees it: it records what
// it is told; refuse makes the next calls fail (a job not running yet).
type memCapRecorder struct {
	mu     sync.Mutex
	notes  []string // "job: reason"
	stops  []string
	refuse bool
}

func (r *memCapRecorder) NoteGPUMemory(id, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse {
		return os.ErrDeadlineExceeded
	}
	r.notes = append(r.notes, id+": "+reason)
	return nil
}

func (r *memCapRecorder) StopOverGPUCap(id, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse {
		return os.ErrDeadlineExceeded
	}
	r.stops = append(r.stops, id+": "+reason)
	return nil
}

type fixedOwners map[uint32]string

func (f fixedOwners) owners([]string) func(uint32) string {
	return func(p uint32) string { return f[p] }
}

// simShares is a simulated DGX H200 whose GPU 0 holds time-sliced shares
// 7 (1 GiB cap) and 8 (4 GiB cap), sampled through the production sampler.
func simShares(t *testing.T) (*nvidia.Manager, *nvidia.SimHost, func() []nvidia.Sample) {
	t.Helper()
	h, err := nvidia.NewSimHost("dgxh200")
	if err != nil {
		t.Fatal(err)
	}
	m, err := nvidia.Open(nvidia.WithNVML(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	g := m.GPUs()[0].UUID
	for _, s := range []nvidia.Share{{ID: "7", GPU: g, Milli: 250, MemoryMB: 1024}, {ID: "8", GPU: g, Milli: 250, MemoryMB: 4096}} {
		if err := m.AdmitShare(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	sample := func() []nvidia.Sample {
		ss, err := m.SampleAll(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ss
	}
	return m, h, sample
}

func procs(ps ...[2]uint64) []nvml.ProcessInfo {
	var out []nvml.ProcessInfo
	for _, p := range ps {
		out = append(out, nvml.ProcessInfo{Pid: uint32(p[0]), UsedGpuMemory: p[1] << 20, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
	}
	return out
}

// TestMemCapWatchKill: a job over its cap is stopped once per episode,
// with a reason naming its use, cap and GPU; a job under its cap and a
// process of no job are left alone; a refused stop is tried again.
func TestMemCapWatchKill(t *testing.T) {
	m, h, sample := simShares(t)
	gpu := m.GPUs()[0].UUID
	r := &memCapRecorder{}
	w := newMemCapWatch(OverCapKill, sample, m.ShareStatuses, fixedOwners{100: "7", 101: "7", 200: "8"}, r, slog.New(slog.DiscardHandler))
	if err := h.SetProcesses(0, procs([2]uint64{100, 1536}, [2]uint64{101, 600}, [2]uint64{200, 4000}, [2]uint64{300, 50000})); err != nil {
		t.Fatal(err)
	}
	r.refuse = true
	w.check()
	if st := w.stats(); st.Episodes != 0 || st.Kills != 0 || st.Over != 0 {
		t.Fatalf("refused stop counted: %+v", st)
	}
	r.refuse = false
	for range 3 {
		w.check()
	}
	want := "7: GPU memory 2.1 GiB over its cap of 1 GiB on " + gpu + " (time-sliced share; processes 100, 101)"
	if len(r.stops) != 1 || r.stops[0] != want || len(r.notes) != 0 {
		t.Fatalf("stops %q notes %q, want one stop %q", r.stops, r.notes, want)
	}
	if st := w.stats(); st.Episodes != 1 || st.Kills != 1 || st.Over != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The share released (the job ended): the episode ends; a new job on
	// its ID over again is a new episode.
	if err := m.ReleaseShare(context.Background(), gpu, "7"); err != nil {
		t.Fatal(err)
	}
	w.check()
	if st := w.stats(); st.Over != 0 {
		t.Fatalf("episode outlived its share: %+v", st)
	}
	if err := m.AdmitShare(context.Background(), nvidia.Share{ID: "7", GPU: gpu, Milli: 250, MemoryMB: 1024}); err != nil {
		t.Fatal(err)
	}
	w.check()
	if st := w.stats(); len(r.stops) != 2 || st.Episodes != 2 || st.Kills != 2 {
		t.Fatalf("second episode: stops %q stats %+v", r.stops, st)
	}
}

// TestMemCapWatchWarn: under warn the job is told once per episode and
// once when back under its cap; an MPS GPU's shares are not watched.
func TestMemCapWatchWarn(t *testing.T) {
	m, h, sample := simShares(t)
	gpu := m.GPUs()[0].UUID
	r := &memCapRecorder{}
	w := newMemCapWatch(OverCapWarn, sample, m.ShareStatuses, fixedOwners{100: "7", 200: "8"}, r, slog.New(slog.DiscardHandler))
	h.SetProcesses(0, procs([2]uint64{100, 2048}, [2]uint64{200, 1000}))
	w.check()
	w.check()
	h.SetProcesses(0, procs([2]uint64{100, 512}))
	w.check()
	w.check()
	if len(r.stops) != 0 || len(r.notes) != 2 ||
		r.notes[0] != "7: GPU memory 2 GiB over its cap of 1 GiB on "+gpu+" (time-sliced share; processes 100); over_cap: warn, left running" ||
		r.notes[1] != "7: GPU memory back under its cap: 0.5 GiB of 1 GiB on "+gpu {
		t.Fatalf("notes %q stops %q", r.notes, r.stops)
	}
	if st := w.stats(); st.Episodes != 1 || st.Kills != 0 || st.Over != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Shares shown as MPS: MPS's to enforce.
	mps := func() []nvidia.ShareStatus {
		st := m.ShareStatuses()
		for i := range st {
			st[i].Mode = nvidia.ModeMPS
		}
		return st
	}
	w = newMemCapWatch(OverCapKill, sample, mps, fixedOwners{100: "7"}, r, slog.New(slog.DiscardHandler))
	h.SetProcesses(0, procs([2]uint64{100, 9000}))
	w.check()
	if len(r.stops) != 0 {
		t.Fatalf("MPS share stopped: %q", r.stops)
	}
}

// TestProcOwners attributes processes by /proc/PID/cgroup (v2 and v1
// lines, nested cgroups) and, without cgroups, by ancestry, on a fake
// /proc.
func TestProcOwners(t *testing.T) {
	root := t.TempDir()
	write := func(pid, name, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10", "cgroup", "0::/fusiond/guaranteed/7\n")
	write("11", "cgroup", "0::/fusiond/guaranteed/7/inner\n")
	write("12", "cgroup", "12:memory:/fusiond/besteffort/8\n11:cpu,cpuacct:/fusiond/besteffort/8\n")
	write("13", "cgroup", "0::/fusiond/guaranteed/70\n")
	write("14", "cgroup", "0::/user.slice\n")
	paths := map[string]string{"/fusiond/guaranteed/7": "7", "/fusiond/besteffort/8": "8"}
	o := procOwners{procRoot: root}
	for pid, want := range map[uint32]string{10: "7", 11: "7", 12: "8", 13: "", 14: "", 99: ""} {
		if got := o.byCgroup(pid, paths); got != want {
			t.Errorf("pid %d: owner %q, want %q", pid, got, want)
		}
	}
	// Ancestry: 30 (job 9's PID) ← 31 ← 32 "(a b) c"; 40 is init's.
	write("32", "stat", "32 (a b) c) S 31 32 32 0")
	write("31", "stat", "31 (python) S 30 31 31 0")
	write("30", "stat", "30 (sh) S 1 30 30 0")
	write("40", "stat", "40 (x) S 1 40 40 0")
	write("41", "stat", "garbage")
	pids := map[int]string{30: "9"}
	for pid, want := range map[int]string{32: "9", 31: "9", 30: "9", 40: "", 41: "", 98: ""} {
		if got := o.byAncestry(pid, pids); got != want {
			t.Errorf("pid %d: ancestry owner %q, want %q", pid, got, want)
		}
	}
	if !strings.HasSuffix(gib(9318), "9.1 GiB") || gib(8192) != "8 GiB" {
		t.Errorf("gib: %s %s", gib(9318), gib(8192))
	}
}
