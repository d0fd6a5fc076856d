package hardware_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	fpgasim "github.com/fusiond/fusiond/devices/fpga/simhost"
	"github.com/fusiond/fusiond/devices/nvidia"
	"github.com/fusiond/fusiond/topology"
	toposim "github.com/fusiond/fusiond/topology/simhost"
)

func openSim(t *testing.T, dir string) *hardware.Host {
	t.Helper()
	return openSimTrees(t, dir, "")
}

// openSimTrees opens a simulated host whose topology tree is kept in
// simTrees (Config.SimTreeDir).
func openSimTrees(t *testing.T, dir, simTrees string) *hardware.Host {
	t.Helper()
	h, err := hardware.Open(context.Background(), hardware.Config{StateDir: dir, Simulate: "dgxh200", SampleInterval: 10 * time.Millisecond, SimTreeDir: simTrees}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestOpenSimulated(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := openSim(t, dir)
	if h.Simulated() != "dgxh200" {
		t.Errorf("Simulated() = %q", h.Simulated())
	}
	if h.GPUs() == nil || len(h.GPUs().GPUs()) != 8 {
		t.Fatalf("want 8 simulated GPUs, got %v", h.GPUs())
	}
	if h.FPGAs() == nil {
		t.Fatal("simulated host has no FPGA manager")
	}
	capa := h.Capacity()
	if capa.GPUs != 8 || capa.FPGAs != 4 {
		t.Errorf("capacity %+v, want 8 GPUs and the 4 simulated FPGA regions", capa)
	}
	if n := h.Notes(); len(n) == 0 || !strings.Contains(n[0], "SIMULATED") {
		t.Errorf("notes %q do not say the devices are simulated", n)
	}

	// Topology: the simhost tree with the GPU manager's NVLinks joined in.
	topo := h.Topology()
	var gpus []string
	for _, d := range topo.Accelerators() {
		if d.Kind == topology.KindGPU {
			gpus = append(gpus, string(d.Addr))
		}
	}
	if !slices.Equal(gpus, toposim.GPUAddrs()) {
		t.Errorf("topology GPUs %v, want %v", gpus, toposim.GPUAddrs())
	}
	if len(topo.Links) != 8*7/2 {
		t.Errorf("%d NVLink pairs, want every pair of 8 GPUs (28)", len(topo.Links))
	}
	for _, g := range h.GPUs().GPUs() {
		if topo.Device(topology.PCIAddr(g.BDF)) == nil {
			t.Errorf("GPU %d at %s is not in the topology", g.Index, g.BDF)
		}
	}

	// Devices: 8 GPUs then the 4 regions, all healthy.
	devs := h.Devices(context.Background())
	var kinds []string
	for _, d := range devs {
		kinds = append(kinds, d.Kind)
		if !d.Healthy || d.Detail == "" || d.ID == "" {
			t.Errorf("device %+v: want healthy with an ID and detail", d)
		}
	}
	if strings.Count(strings.Join(kinds, " "), "gpu") != 8 || strings.Count(strings.Join(kinds, " "), "fpga") != 4 {
		t.Errorf("device kinds %v", kinds)
	}
	if !slices.ContainsFunc(devs, func(d api.DeviceStatus) bool { return d.ID == fpgasim.DFL0 && strings.Contains(d.Detail, "holds") }) {
		t.Errorf("region %s (holding NLB0) missing or not showing what it holds: %+v", fpgasim.DFL0, devs)
	}

	// Telemetry is sampled in the background at 10 ms here.
	deadline := time.Now().Add(5 * time.Second)
	for len(h.Telemetry()) != 8 {
		if time.Now().After(deadline) {
			t.Fatalf("no telemetry after 5 s: %v", h.Telemetry())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Close stops the sampler: the latest sweep no longer changes.
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	last := h.Telemetry()[0].At
	time.Sleep(50 * time.Millisecond)
	if at := h.Telemetry()[0].At; !at.Equal(last) {
		t.Errorf("telemetry still sampled after Close (%v then %v)", last, at)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// Sample bitstreams exist for the demo but are not in the library.
	if entries, err := os.ReadDir(h.SampleBitstreams()); err != nil || len(entries) < 3 {
		t.Errorf("sample bitstreams in %s: %v %v", h.SampleBitstreams(), entries, err)
	}
	if list, err := h.Library().List(); err != nil || len(list) != 0 {
		t.Errorf("library starts with %v %v, want empty", list, err)
	}
}

func TestOpenSimulatedTwiceReusesTrees(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := openSimTrees(t, dir, "-")
	h.Close()
	marker := filepath.Join(dir, "sim", "topology", "marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	openSimTrees(t, dir, "-")
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("second open rewrote the simulated topology tree: %v", err)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, "sim", ".*tmp*")); len(tmp) > 0 {
		t.Errorf("temporary trees left behind: %v", tmp)
	}
}

// TestSimTreesShared: daemons on different state directories, two of them
// opening at once, share one topology tree in the shared directory, named
// by its digest and written once; nothing is written under their state
// directories; stale trees of other builds are pruned, recent ones kept.
func TestSimTreesShared(t *testing.T) {
	t.Parallel()
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	old, recent, tmp := filepath.Join(shared, "topology-0000000000000000"), filepath.Join(shared, "topology-1111111111111111"), filepath.Join(shared, ".topology-2222.tmp-1")
	for _, d := range []string{old, recent, tmp} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for d, age := range map[string]time.Duration{old: 2 * time.Hour, tmp: 20 * time.Minute, recent: 5 * time.Minute} {
		if err := os.Chtimes(d, time.Now().Add(-age), time.Now().Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	a, b := t.TempDir(), t.TempDir()
	var wg sync.WaitGroup
	for _, dir := range []string{a, b} {
		wg.Go(func() { openSimTrees(t, dir, shared) })
	}
	wg.Wait()
	want := filepath.Join(shared, "topology-"+toposim.Plan(toposim.WithSharedContent()).Digest()[:16])
	trees, _ := filepath.Glob(filepath.Join(shared, "*topology-*"))
	slices.Sort(trees)
	if w := []string{recent, want}; !slices.Equal(trees, w) {
		t.Errorf("shared directory holds %v, want %v (the stale tree and temporary one pruned, the recent one kept)", trees, w)
	}
	for _, dir := range []string{a, b} {
		if _, err := os.Stat(filepath.Join(dir, "sim", "topology")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a topology tree under the state directory: %v", dir, err)
		}
	}
	marker := filepath.Join(want, "marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h := openSimTrees(t, t.TempDir(), shared)
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("a third daemon rewrote the shared tree: %v", err)
	}
	if len(h.Topology().Accelerators()) != 8 {
		t.Errorf("topology from the shared tree: %d accelerators", len(h.Topology().Accelerators()))
	}
}

// TestSimTreesNotPrivate: a shared directory another user could write to,
// or a symlink in its place, is not used: the tree goes under the state
// directory and a note says why.
func TestSimTreesNotPrivate(t *testing.T) {
	t.Parallel()
	open := t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	for shared, why := range map[string]string{open: "open to other users (mode 0777", link: "is not a directory"} {
		dir := t.TempDir()
		h := openSimTrees(t, dir, shared)
		if _, err := os.Stat(filepath.Join(dir, "sim", "topology")); err != nil {
			t.Errorf("%s: no tree under the state directory: %v", shared, err)
		}
		if n := strings.Join(h.Notes(), "\n"); !strings.Contains(n, why) {
			t.Errorf("%s: notes %q do not say %q", shared, n, why)
		}
		if ents, _ := os.ReadDir(shared); len(ents) > 0 {
			t.Errorf("%s: written into: %v", shared, ents)
		}
	}
}

// TestSimTreesDefault: by default the tree lives in /dev/shm/fusiond-UID
// (mode 0700) where /dev/shm is a tmpfs, as on this machine and CI's,
// else under the state directory.
func TestSimTreesDefault(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	openSim(t, dir)
	var st unix.Statfs_t
	tmpfs := unix.Statfs("/dev/shm", &st) == nil && st.Type == unix.TMPFS_MAGIC
	shared := filepath.Join("/dev/shm", fmt.Sprintf("fusiond-%d", os.Geteuid()))
	_, inState := os.Stat(filepath.Join(dir, "sim", "topology"))
	if !tmpfs {
		if inState != nil {
			t.Errorf("no tmpfs at /dev/shm and no tree under the state directory: %v", inState)
		}
		return
	}
	fi, err := os.Stat(shared)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v, %v", shared, fi, err)
	}
	want := filepath.Join(shared, "topology-"+toposim.Plan(toposim.WithSharedContent()).Digest()[:16])
	if _, err := os.Stat(filepath.Join(want, "sys", "devices", "system", "cpu", "online")); err != nil {
		t.Errorf("tree not in %s: %v", want, err)
	}
	if inState == nil {
		t.Error("a tree under the state directory too")
	}
}

// TestOpenLive opens this machine: no NVIDIA driver and no FPGAs here (as
// on CI), so both are absent and the notes say so.
func TestOpenLive(t *testing.T) {
	h, err := hardware.Open(context.Background(), hardware.Config{StateDir: t.TempDir(), TopologyPeriod: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.Simulated() != "" {
		t.Errorf("live host says simulated %q", h.Simulated())
	}
	if len(h.Topology().Nodes) == 0 || h.Topology().OnlineCPUs.Len() == 0 {
		t.Errorf("live topology has no nodes or CPUs: %+v", h.Topology())
	}
	notes := strings.Join(h.Notes(), "\n")
	if h.GPUs() == nil && !strings.Contains(notes, "NVIDIA") {
		t.Errorf("no GPU manager but no note about the driver: %q", notes)
	}
	if h.FPGAs() == nil && !strings.Contains(notes, "no FPGA regions") {
		t.Errorf("no FPGA manager but no note: %q", notes)
	}
	if h.Library() == nil {
		t.Error("no bitstream library on a live host")
	}
	capa := h.Capacity()
	if h.GPUs() == nil && capa.GPUs != 0 || h.FPGAs() == nil && capa.FPGAs != 0 {
		t.Errorf("capacity %+v without devices", capa)
	}
}

func TestCheckSimulate(t *testing.T) {
	for _, name := range append(hardware.SimulatedHosts(), "") {
		if err := hardware.CheckSimulate(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
	if err := hardware.CheckSimulate("dgxz900"); !errors.Is(err, hardware.ErrUnknownSimulation) || !strings.Contains(err.Error(), "dgxh200") {
		t.Errorf("unknown name: %v, want ErrUnknownSimulation listing the valid names", err)
	}
	if _, err := hardware.Open(context.Background(), hardware.Config{StateDir: t.TempDir(), Simulate: "nope"}, nil); !errors.Is(err, hardware.ErrUnknownSimulation) {
		t.Errorf("Open with an unknown simulation: %v", err)
	}
}

// BenchmarkOpenSimulated measures opening the simulated dgxh200 host once
// its trees exist (every daemon start after the first).
func BenchmarkOpenSimulated(b *testing.B) {
	dir := b.TempDir()
	h, err := hardware.Open(context.Background(), hardware.Config{StateDir: dir, Simulate: "dgxh200"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	h.Close()
	b.ResetTimer()
	for b.Loop() {
		h, err := hardware.Open(context.Background(), hardware.Config{StateDir: dir, Simulate: "dgxh200"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		h.Close()
	}
}

// BenchmarkDevices measures the node-status device list (8 GPUs, 4 FPGA
// regions rediscovered).
func BenchmarkDevices(b *testing.B) {
	h, err := hardware.Open(context.Background(), hardware.Config{StateDir: b.TempDir(), Simulate: "dgxh200"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	for b.Loop() {
		if len(h.Devices(context.Background())) != 12 {
			b.Fatal("want 12 devices")
		}
	}
}

// A simulated host keeps its GPUs' MIG layout across a restart, as a real
// GPU's driver does: MIG mode and instances are there again when the next
// daemon opens it.
func TestSimulatedMIGLayoutSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := openSimTrees(t, dir, "-")
	g := h.GPUs().GPUs()[7]
	actions := []nvidia.Action{{Kind: nvidia.SetMIGMode, GPU: 7, GPUUUID: g.UUID, Enable: true},
		{Kind: nvidia.CreateInstance, GPU: 7, GPUUUID: g.UUID, Profile: "3g.71gb", Start: 4}}
	if err := h.GPUs().Apply(context.Background(), actions, nvidia.Busy{}); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(dir, "sim", "gpu-mig.json")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if data, err := os.ReadFile(saved); err == nil && strings.Contains(string(data), "3g.71gb") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the MIG layout was not saved to %s", saved)
		}
	}
	h.Close()

	h = openSimTrees(t, dir, "-")
	st, err := h.GPUs().State(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := st.GPUs[7]
	if !got.MIGEnabled || len(got.Instances) != 1 || got.Instances[0].Profile != "3g.71gb" || got.Instances[0].Start != 4 {
		t.Errorf("after a restart GPU 7 is %+v, want MIG mode with a 3g.71gb instance at slot 4", got)
	}
	if st.GPUs[0].MIGEnabled {
		t.Error("GPU 0 came back in MIG mode")
	}
}
