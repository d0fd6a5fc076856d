package nvidia

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

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/devices"
)

type fakeMPS struct {
	mu           sync.Mutex
	starts, stop []string
	limits       []MPSLimits
}

func (f *fakeMPS) Available() bool { return true }
func (f *fakeMPS) Start(_ context.Context, g string, _ MPSOwner) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, g)
	return nil
}
func (f *fakeMPS) SetLimits(_ context.Context, _ string, l MPSLimits) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limits = append(f.limits, l)
	return nil
}
func (f *fakeMPS) Stop(_ context.Context, g string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stop = append(f.stop, g)
	return nil
}
func (f *fakeMPS) Dirs(g string) (string, string) {
	return "/run/mps/" + g + "/pipe", "/run/mps/" + g + "/log"
}

var _ MPSControl = (*fakeMPS)(nil)

func TestShareAdmissionAllMocks(t *testing.T) {
	for _, host := range SimulatedHosts() {
		t.Run(host, func(t *testing.T) {
			mps := &fakeMPS{}
			m, _ := openSim(t, host, WithMPS(mps))
			g := m.GPUs()[0]
			ctx := context.Background()
			half := g.MemoryMB / 2
			if err := m.AdmitShare(ctx, Share{ID: "a", GPU: g.UUID, Milli: 600, MemoryMB: half}); err != nil {
				t.Fatal(err)
			}
			if err := m.AdmitShare(ctx, Share{ID: "b", GPU: g.UUID, Milli: 500, MemoryMB: 1}); !errors.Is(err, ErrShareExceeded) {
				t.Fatalf("compute oversubscription: %v", err)
			}
			if err := m.AdmitShare(ctx, Share{ID: "b", GPU: g.UUID, Milli: 400, MemoryMB: g.MemoryMB - half + 1}); !errors.Is(err, ErrShareExceeded) {
				t.Fatalf("memory oversubscription: %v", err)
			}
			if err := m.AdmitShare(ctx, Share{ID: "b", GPU: g.UUID, Milli: 400, MemoryMB: g.MemoryMB - half}); err != nil {
				t.Fatalf("exact fit: %v", err)
			}
			st := m.ShareStatuses()[0]
			if st.Mode != ModeMPS || st.UsedMilli != 1000 || st.UsedMemMB != g.MemoryMB || len(st.Shares) != 2 {
				t.Fatalf("status %+v", st)
			}
			if len(mps.starts) != 1 || mps.starts[0] != g.UUID {
				t.Fatalf("MPS starts %v", mps.starts)
			}
			if err := m.ReleaseShare(ctx, g.UUID, "a"); err != nil || len(mps.stop) != 0 {
				t.Fatalf("release a: %v stops %v", err, mps.stop)
			}
			if err := m.ReleaseShare(ctx, g.UUID, "b"); err != nil || len(mps.stop) != 1 {
				t.Fatalf("release b: %v stops %v", err, mps.stop)
			}
			if err := m.AdmitShare(ctx, Share{ID: "z", GPU: g.UUID, Milli: 0}); !errors.Is(err, ErrShareExceeded) {
				t.Fatalf("zero share: %v", err)
			}
		})
	}
}

func TestShareTimeSlicingReplicas(t *testing.T) {
	m, _ := openSim(t, "dgxh100")
	cfg, err := ParseSharingConfig([]byte(`version: v1
flags: {migStrategy: none}
sharing:
  timeSlicing:
    renameByDefault: false
    resources:
    - name: nvidia.com/gpu
      replicas: 2
      devices: [0, 1]
`))
	if err != nil {
		t.Fatal(err)
	}
	gs := m.GPUs()
	reps := cfg.Replicas(gs)
	if reps[gs[0].UUID] != 2 || reps[gs[1].UUID] != 2 || reps[gs[2].UUID] != 0 {
		t.Fatalf("replicas %v", reps)
	}
	for u, n := range reps {
		if err := m.SetReplicas(u, n); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for i := range 2 {
		if err := m.AdmitShare(ctx, Share{ID: fmt.Sprint(i), GPU: gs[0].UUID, Milli: 100}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.AdmitShare(ctx, Share{ID: "3", GPU: gs[0].UUID, Milli: 100}); !errors.Is(err, ErrShareExceeded) {
		t.Fatalf("third replica: %v", err)
	}
	if st := m.ShareStatuses()[0]; st.Mode != ModeTimeSlicing || st.Replicas != 2 {
		t.Fatalf("status %+v", st)
	}
	// Time-slicing grants carry no MPS limits.
	gr, err := m.Grant(Alloc{Share: &Share{ID: "0", GPU: gs[0].UUID}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := gr.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]; ok || gr.Env["CUDA_VISIBLE_DEVICES"] != gs[0].UUID {
		t.Fatalf("env %v", gr.Env)
	}
}

func TestParseSharingConfigErrors(t *testing.T) {
	for field, doc := range map[string]string{
		"version":  "version: v0\nsharing: {}",
		"replicas": "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}",
		"name":     "version: v1\nsharing: {timeSlicing: {resources: [{name: amd.com/gpu, replicas: 2}]}}",
		"replica":  "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replica: 2}]}}",
		"devices":  "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: some}]}}",
	} {
		_, err := ParseSharingConfig([]byte(doc))
		if !errors.Is(err, ErrSharingConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
}

func TestMPSDaemonCommands(t *testing.T) {
	root := t.TempDir()
	var calls []string
	d := &MPSDaemon{Root: root, Binary: "mpsctl", Run: func(_ context.Context, env []string, stdin, name string, args ...string) (string, error) {
		calls = append(calls, fmt.Sprintf("%s %v stdin=%q env=%v", name, args, stdin, env))
		if slices.Contains(args, "-d") {
			pipe, _ := filepath.Split(filepath.Join(root, "GPU-1", "pipe", "control"))
			return "", os.WriteFile(filepath.Join(pipe, "control"), nil, 0o600)
		}
		return "", nil
	}}
	ctx := context.Background()
	for range 2 {
		if err := d.Start(ctx, "GPU-1", MPSOwner{UID: 1000, GID: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Stop(ctx, "GPU-1"); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !strings.Contains(calls[0], "[-d]") || !strings.Contains(calls[0], "CUDA_VISIBLE_DEVICES=GPU-1") ||
		!strings.Contains(calls[1], `stdin="quit\n"`) || !strings.Contains(calls[1], "CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(root, "GPU-1", "pipe")) {
		t.Fatalf("calls %q", calls)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if err := d.Start(ctx, bad, MPSOwner{}); !errors.Is(err, ErrUnknownDevice) {
			t.Errorf("Start(%q): %v", bad, err)
		}
	}
	if err := d.SetLimits(ctx, "GPU-1", MPSLimits{ThreadPercentage: 0, PinnedMemMB: 1}); !errors.Is(err, ErrShareExceeded) {
		t.Errorf("0%% limit: %v", err)
	}
}

// makeDevTree creates real device nodes (we run as root) and a mig-minors
// table.
func makeDevTree(t *testing.T) (dev, proc string) {
	t.Helper()
	dev, proc = t.TempDir(), t.TempDir()
	mk := func(name string, major, minor uint32) {
		p := filepath.Join(dev, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatalf("mknod %s (needs root): %v", p, err)
		}
	}
	mk("nvidiactl", 195, 255)
	mk("nvidia-uvm", 509, 0)
	mk("nvidia-uvm-tools", 509, 1)
	var minors strings.Builder
	minors.WriteString("config 1\nmonitor 2\n")
	for g := range 8 {
		mk(fmt.Sprintf("nvidia%d", g), 195, uint32(g))
		for gi := range 15 {
			a := 3 + g*200 + gi*10
			fmt.Fprintf(&minors, "gpu%d/gi%d/access %d\n", g, gi, a)
			mk(fmt.Sprintf("nvidia-caps/nvidia-cap%d", a), 238, uint32(a))
			for ci := range 8 {
				fmt.Fprintf(&minors, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, a+1+ci)
				mk(fmt.Sprintf("nvidia-caps/nvidia-cap%d", a+1+ci), 238, uint32(a+1+ci))
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(proc, "driver/nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "driver/nvidia-caps/mig-minors"), []byte(minors.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dev, proc
}

func TestGrantNodesAndEnv(t *testing.T) {
	dev, proc := makeDevTree(t)
	h, err := NewSimHost("dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	mps := &fakeMPS{}
	// Hidden behind a plain nvml.Interface the manager does not know it is
	// simulated and treats nodes as required, as on a real host.
	m, err := Open(WithNVML(struct{ nvml.Interface }{h}), WithDevRoot(dev), WithProcRoot(proc), WithMPS(mps))
	if err != nil {
		t.Fatal(err)
	}
	gs := m.GPUs()
	gr, err := m.Grant(Alloc{GPUs: []string{gs[3].UUID, gs[5].UUID}})
	if err != nil {
		t.Fatal(err)
	}
	want := []devices.DeviceNode{
		{Path: "/dev/nvidiactl", Type: devices.CharDevice, Major: 195, Minor: 255, Access: "rw"},
		{Path: "/dev/nvidia-uvm", Type: devices.CharDevice, Major: 509, Minor: 0, Access: "rw"},
		{Path: "/dev/nvidia-uvm-tools", Type: devices.CharDevice, Major: 509, Minor: 1, Access: "rw"},
		{Path: "/dev/nvidia3", Type: devices.CharDevice, Major: 195, Minor: 3, Access: "rw"},
		{Path: "/dev/nvidia5", Type: devices.CharDevice, Major: 195, Minor: 5, Access: "rw"},
	}
	if !slices.Equal(gr.Nodes, want) {
		t.Fatalf("nodes %+v\nwant %+v", gr.Nodes, want)
	}
	if gr.Env["CUDA_VISIBLE_DEVICES"] != gs[3].UUID+","+gs[5].UUID || gr.Env["NVIDIA_VISIBLE_DEVICES"] != gr.Env["CUDA_VISIBLE_DEVICES"] {
		t.Fatalf("env %v", gr.Env)
	}

	// MIG: GPU 2 with two 3g instances; grant the second.
	acts, err := Plan(mustState(t, m, nil), Target{2: {MIGEnabled: true, Counts: map[string]int{"3g.20gb": 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(context.Background(), acts, nil); err != nil {
		t.Fatal(err)
	}
	inst := mustState(t, m, nil).GPUs[2].Instances[1]
	gr, err = m.Grant(Alloc{MIG: []string{inst.UUID}})
	if err != nil {
		t.Fatal(err)
	}
	capA := 3 + 2*200 + inst.GIID*10
	var paths []string
	for _, n := range gr.Nodes {
		paths = append(paths, n.Path)
	}
	wantPaths := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia2",
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", capA), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", capA+1)}
	if !slices.Equal(paths, wantPaths) || gr.Nodes[4].Major != 238 || gr.Nodes[4].Minor != uint32(capA) {
		t.Fatalf("MIG nodes %+v, want %v", gr.Nodes, wantPaths)
	}
	if gr.Env["CUDA_VISIBLE_DEVICES"] != inst.UUID {
		t.Fatalf("MIG env %v", gr.Env)
	}

	// Shared GPU with MPS limits.
	s := Share{ID: "j1", GPU: gs[0].UUID, Milli: 255, MemoryMB: 4096}
	if err := m.AdmitShare(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	gr, err = m.Grant(Alloc{Share: &s})
	if err != nil {
		t.Fatal(err)
	}
	if gr.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "26" || gr.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" ||
		gr.Env["CUDA_MPS_PIPE_DIRECTORY"] != "/run/mps/"+gs[0].UUID+"/pipe" || len(gr.Nodes) != 4 {
		t.Fatalf("share grant %+v", gr)
	}
	if _, err := m.Grant(Alloc{Share: &Share{ID: "nope", GPU: gs[0].UUID}}); err == nil {
		t.Fatal("grant for unadmitted share")
	}

	// A missing node on a real host is an error.
	if err := os.Remove(filepath.Join(dev, "nvidia6")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Grant(Alloc{GPUs: []string{gs[6].UUID}}); !errors.Is(err, ErrNoDeviceNode) {
		t.Fatalf("missing node: %v", err)
	}
}

func TestApplySharingConfigModes(t *testing.T) {
	m, _ := openSim(t, "dgxa100", WithMPS(&fakeMPS{}))
	cfg, err := ParseSharingConfig([]byte(`version: v1
sharing:
  timeSlicing:
    resources: [{name: nvidia.com/gpu, replicas: 4, devices: [0]}]
  mps:
    resources: [{name: nvidia.com/gpu, replicas: 2, devices: [1]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplySharingConfig(cfg); err != nil {
		t.Fatal(err)
	}
	st := m.ShareStatuses()
	if st[0].Mode != ModeTimeSlicing || st[0].Replicas != 4 || st[1].Mode != ModeMPS || st[1].Replicas != 2 || st[2].Replicas != 0 {
		t.Fatalf("statuses %+v %+v %+v", st[0], st[1], st[2])
	}
	// Without MPS the mps section falls back to time-slicing.
	m2, _ := openSim(t, "dgxa100")
	if err := m2.ApplySharingConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if m2.ShareStatuses()[1].Mode != ModeTimeSlicing {
		t.Fatal("MPS mode without MPS")
	}
}
