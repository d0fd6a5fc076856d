package daemon

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// simState is a state directory shared by the tests that open a simulated
// host: the simulated sysfs trees are written once (seconds) and each test
// still gets its own host, so their faults and settings do not mix.
var simState struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	// Job monitors are this test binary re-executed (TestNewThenServe).
	if code, ok := Reexec(os.Args); ok {
		os.Exit(code)
	}
	code := m.Run()
	if simState.dir != "" {
		os.RemoveAll(simState.dir)
	}
	os.Exit(code)
}

// openSim opens a simulated DGX H200 over the shared state directory.
func openSim(t *testing.T, cfg hardware.Config) *hardware.Host {
	t.Helper()
	simState.once.Do(func() { simState.dir, simState.err = os.MkdirTemp("", "fusiond-daemon-sim-") })
	if simState.err != nil {
		t.Fatal(simState.err)
	}
	cfg.StateDir, cfg.Simulate = simState.dir, "dgxh200"
	h, err := hardware.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

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
	hc := cfg.GPU.hostConfig(hardware.Config{})
	if hc.HealthProbation != 90*time.Second || hc.HealthProbe != 2*time.Second {
		t.Errorf("host config: %+v", hc)
	}
	if d := DefaultConfig().GPU; time.Duration(d.HealthProbation) != 5*time.Minute || d.Power.Enabled || len(d.Sharing) != 0 {
		t.Errorf("gpu defaults: %+v", d)
	}
	if p, err := cfg.GPU.OverCap(); p != OverCapWarn || err != nil {
		t.Errorf("over_cap default: %q %v", p, err)
	}
}

// TestGPUConfigOverCap: gpu.sharing.over_cap is fusiond's key beside the
// device plugin's, taken out before they are decoded; alone it leaves no
// sharing config.
func TestGPUConfigOverCap(t *testing.T) {
	for in, want := range map[string]OverCapPolicy{
		"gpu: {sharing: {over_cap: kill, timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}}": OverCapKill,
		"gpu: {sharing: {over_cap: warn}}": OverCapWarn,
		"gpu: {sharing: {over_cap: kill}}": OverCapKill,
	} {
		cfg := DefaultConfig()
		if err := ParseConfig([]byte(in), &cfg); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		p, err := cfg.GPU.OverCap()
		if err != nil || p != want {
			t.Errorf("%s: over_cap %q %v, want %q", in, p, err, want)
		}
		sc, err := cfg.GPU.SharingConfig()
		if err != nil {
			t.Fatalf("%s: sharing: %v", in, err)
		}
		if strings.Contains(in, "timeSlicing") != (sc != nil && sc.Sharing.TimeSlicing != nil && sc.Sharing.TimeSlicing.Resources[0].Replicas == 4) {
			t.Errorf("%s: sharing config %+v", in, sc)
		}
	}
	cfg := DefaultConfig()
	err := ParseConfig([]byte("gpu: {sharing: {over_cap: evict}}"), &cfg)
	if err == nil || !strings.Contains(err.Error(), "want warn or kill") || !strings.Contains(err.Error(), "evict") {
		t.Errorf("bad over_cap: %v", err)
	}
}

func TestGPUConfigInvalid(t *testing.T) {
	cases := map[string]string{
		"gpu: {health_probation: -1s}":  "gpu.health_probation",
		"gpu: {health_probation: soon}": "",
		"gpu: {health_probe: -1s}":      "gpu.health_probe",
		"gpu: {power: {enabled: true}}": "gpu.power.besteffort_cap_watts",
		"gpu: {sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}}":              "gpu.sharing",
		"gpu: {sharing: {timeSlicing: {resources: [{name: amd.com/gpu, replicas: 2}]}}}":                 "gpu.sharing",
		"gpu: {sharing: {timeSlice: {}}}":                                                                "gpu.sharing",
		"gpu: {probation: 5m}":                                                                           "",
		"gpu: {sharing: {over_cap: stop}}":                                                               "gpu.sharing.over_cap",
		"gpu: {sharing: {over_cap: 1, timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}}": "gpu.sharing.over_cap",
		"gpu: {sharing: [warn]}":                                                                         "gpu.sharing",
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
	h := openSim(t, hardware.Config{})
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

type fakeBestEffort struct {
	mu  sync.Mutex
	set map[string]bool
}

func (f *fakeBestEffort) BestEffortOnly() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.set)
}

func (f *fakeBestEffort) put(s map[string]bool) {
	f.mu.Lock()
	f.set = s
	f.mu.Unlock()
}

// TestPowerCaps runs the power policy over the simulated host: a GPU that
// holds only best-effort work is capped, and restored once it does not.
func TestPowerCaps(t *testing.T) {
	h := openSim(t, hardware.Config{})
	m := h.GPUs()
	gpus := m.GPUs()
	limit := func(i int) float64 {
		for _, g := range m.GPUs() {
			if g.UUID == gpus[i].UUID {
				return g.PowerLimitW
			}
		}
		return -1
	}
	waitLimit := func(i int, want float64) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if limit(i) == want {
				return
			}
		}
		t.Fatalf("GPU %d power limit %.0f W, want %.0f W", i, limit(i), want)
	}
	src := &fakeBestEffort{set: map[string]bool{gpus[2].UUID: true}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		powerCaps(ctx, m, PowerConfig{Enabled: true, BestEffortCapWatts: 300, Period: Duration(10 * time.Millisecond)}, src, slog.New(slog.DiscardHandler))
	}()
	defer func() { cancel(); <-done }()
	g2 := gpus[2]
	waitLimit(2, max(g2.PowerMinLimitW, min(300, g2.PowerMaxLimitW)))
	if limit(2) == g2.PowerMaxLimitW {
		t.Fatalf("the cap did not lower GPU 2's limit (%.0f W)", limit(2))
	}
	if max := gpus[1].PowerMaxLimitW; limit(1) != max {
		t.Errorf("GPU 1 (idle) limit %.0f W, want its maximum %.0f W", limit(1), max)
	}
	src.put(map[string]bool{})
	waitLimit(2, gpus[2].PowerMaxLimitW)

	// Disabled: nothing is touched.
	before := limit(0)
	powerCaps(context.Background(), m, PowerConfig{Enabled: false, BestEffortCapWatts: 100}, &fakeBestEffort{set: map[string]bool{gpus[0].UUID: true}}, slog.New(slog.DiscardHandler))
	if limit(0) != before {
		t.Errorf("disabled policy changed GPU 0's limit")
	}
}

type recordingPublisher struct {
	mu     sync.Mutex
	events []api.Event
}

func (r *recordingPublisher) PublishDevice(e api.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recordingPublisher) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// TestConnectHealth wires the simulated host's health watch to a real
// placer: an Xid stops placement on the GPU and publishes the event; after
// a reset and the probation it is placeable again.
func TestConnectHealth(t *testing.T) {
	ctx := context.Background()
	h := openSim(t, hardware.Config{HealthProbe: 20 * time.Millisecond, HealthProbation: 200 * time.Millisecond})
	inventory := func() hostplacer.Hardware {
		return hardwareOf(ctx, h, api.NodeResources{CPU: 64000, Memory: 256 << 30}, slog.New(slog.DiscardHandler))
	}
	p := hostplacer.New(inventory(), placementOptions(h))
	pub := &recordingPublisher{}
	defer connectDevices(h, p, pub, inventory)()
	uuid := h.GPUs().GPUs()[5].UUID
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if cond() {
				return
			}
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	if err := h.InjectGPUFault(5, 48, true); err != nil {
		t.Fatal(err)
	}
	waitFor("the unhealthy event", func() bool { return pub.count() == 1 })
	if got := p.Unhealthy(); len(got) != 1 || got[0] != uuid {
		t.Fatalf("placer out of service: %v, want [%s]", got, uuid)
	}
	all := &api.Job{ID: "all", Tier: api.TierBurstable, Spec: api.JobSpec{Command: []string{"x"}, Resources: api.Resources{CPU: 100, Memory: 1 << 20, GPU: &api.GPURequest{Count: 8}}}}
	if _, why, ok := p.Place([]*api.Job{all}); ok || !strings.Contains(why, uuid) {
		t.Fatalf("8 GPUs placed=%v (%s) while GPU 5 is out of service", ok, why)
	}
	// A lost GPU keeps failing its probes until it is reset.
	time.Sleep(300 * time.Millisecond)
	if len(p.Unhealthy()) != 1 {
		t.Fatal("GPU returned without a reset")
	}
	if err := h.ResetSimulatedGPU(5); err != nil {
		t.Fatal(err)
	}
	waitFor("the healthy event", func() bool { return pub.count() == 2 })
	if len(p.Unhealthy()) != 0 {
		t.Fatalf("still out of service: %v", p.Unhealthy())
	}
	if _, why, ok := p.Place([]*api.Job{all}); !ok {
		t.Fatalf("8 GPUs not placed after recovery: %s", why)
	}
	if evs := h.HealthEvents(); len(evs) != 2 || evs[0].Xid != 48 || *evs[1].Healthy != true {
		t.Errorf("host health events %+v", evs)
	}
	if err := h.InjectGPUFault(99, 79, false); err == nil {
		t.Error("fault on GPU 99 accepted")
	}
}

// FuzzGPUConfig feeds arbitrary gpu: sections to the config decoder: it
// must never panic, and whatever it accepts must have a sharing section
// that decodes again and valid durations.
func FuzzGPUConfig(f *testing.F) {
	for _, s := range []string{
		"gpu: {health_probation: 5m}",
		"gpu: {sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}}",
		"gpu: {sharing: {mps: {resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2, devices: all}]}}}",
		"gpu: {sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0, GPU-x]}]}}}",
		"gpu: {power: {enabled: true, besteffort_cap_watts: 250, period: 1s}}",
		"gpu: {sharing: null}",
		"gpu: {sharing: 3}",
		"gpu: {sharing: {over_cap: kill, timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := DefaultConfig()
		if ParseConfig(data, &cfg) != nil {
			return
		}
		if _, err := cfg.GPU.SharingConfig(); err != nil {
			t.Fatalf("accepted config whose sharing section fails: %v", err)
		}
		if p, err := cfg.GPU.OverCap(); err != nil || (p != OverCapWarn && p != OverCapKill) {
			t.Fatalf("accepted config whose over_cap is %q: %v", p, err)
		}
		if cfg.GPU.HealthProbation < 0 || cfg.GPU.HealthProbe < 0 || (cfg.GPU.Power.Enabled && cfg.GPU.Power.BestEffortCapWatts <= 0) {
			t.Fatalf("accepted invalid gpu section %+v", cfg.GPU)
		}
	})
}

// TestConnectHealthOnDemandMIG follows a MIG instance created on demand
// for a job (after the daemon started) through a fault: a 3g job on the
// simulated DGX H200 gets its instance created by the driver, an Xid 94
// contained in that instance (the event carries its GPU-instance id)
// takes the instance, not its GPU, out of service for the placer, a second
// 3g job then waits naming it, and after the probation it lands on that
// instance.
func TestConnectHealthOnDemandMIG(t *testing.T) {
	ctx := context.Background()
	h := openSim(t, hardware.Config{HealthProbe: 20 * time.Millisecond, HealthProbation: 300 * time.Millisecond})
	inventory := func() hostplacer.Hardware {
		return hardwareOf(ctx, h, api.NodeResources{CPU: 64000, Memory: 256 << 30}, slog.New(slog.DiscardHandler))
	}
	p := hostplacer.New(inventory(), placementOptions(h))
	pub := &recordingPublisher{}
	defer connectDevices(h, p, pub, inventory)()
	prep := &devicePreparer{drivers: h.Drivers(), log: slog.New(slog.DiscardHandler)}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if cond() {
				return
			}
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	// GPU 0 in MIG mode with one 1g instance at slot 0: a 3g instance
	// (4 of 8 slots) fits only at slot 4, and none is there yet.
	layout := "version: v1\nmig-configs:\n  one:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.18gb\": 1}\n"
	if _, err := hardware.NewBackend(h, nil).ApplyMIG(ctx, api.MIGRequest{Layout: layout, Config: "one"}); err != nil {
		t.Fatalf("mig apply: %v", err)
	}
	gpu0 := h.GPUs().GPUs()[0].UUID
	mig3g := func(id string) *api.Job {
		return &api.Job{ID: id, Tier: api.TierBurstable, Spec: api.JobSpec{Command: []string{"x"},
			Resources: api.Resources{CPU: 100, Memory: 1 << 20, GPU: &api.GPURequest{MIG: "3g.71gb"}}}}
	}
	place := func(j *api.Job) (string, bool) {
		t.Helper()
		allocs, why, ok := p.Place([]*api.Job{j})
		if ok {
			j.Allocation = &allocs[0]
		}
		return why, ok
	}

	a := mig3g("a")
	if why, ok := place(a); !ok {
		t.Fatalf("3g job not placed: %s", why)
	}
	if m := a.Allocation.MIG; m == nil || m.GPU != gpu0 || m.Instance != "" {
		t.Fatalf("3g allocation %+v, want an instance to create on %s", a.Allocation.MIG, gpu0)
	}
	if _, err := prep.Prepare(ctx, a); err != nil {
		t.Fatalf("creating the 3g instance: %v", err)
	}
	inst := a.Allocation.MIG.Instance
	if inst == "" {
		t.Fatal("Prepare recorded no instance")
	}
	waitFor("the placer to see the new instance", func() bool {
		g := p.Hardware().GPUs[0]
		return g.MIG != nil && slices.ContainsFunc(g.MIG.Instances, func(in devices.MIGInstance) bool { return in.ID == inst })
	})

	if err := h.InjectMIGFault(ctx, inst, 94); err != nil {
		t.Fatal(err)
	}
	waitFor("the instance out of service", func() bool { return slices.Contains(p.Unhealthy(), inst) })
	if got := p.Unhealthy(); len(got) != 1 {
		t.Errorf("out of service %v, want only the instance %s (not its GPU)", got, inst)
	}
	pub.mu.Lock()
	if ev := pub.events[0]; ev.Device != inst || ev.Xid != 94 || ev.Healthy == nil || *ev.Healthy {
		t.Errorf("device event %+v, want %s unhealthy with Xid 94", ev, inst)
	}
	pub.mu.Unlock()
	// gpu list shows the instance out of service, its GPU healthy.
	backend := hardware.NewBackend(h, nil)
	list, err := backend.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g0 := list.GPUs[0]
	i := slices.IndexFunc(g0.MIG, func(in api.MIGInstance) bool { return in.UUID == inst })
	if !g0.Health.Healthy || i < 0 || g0.MIG[i].Health == nil || !strings.Contains(g0.MIG[i].Health.Reason, "Xid 94") {
		t.Errorf("gpu list GPU 0: health %+v, instances %+v; want the GPU healthy and %s unhealthy with Xid 94", g0.Health, g0.MIG, inst)
	}
	p.Release(a)
	prep.Release(a)
	// The instance that existed before the job is still offered. Held by a
	// job, it also keeps the 3g below off slot 0: an idle 1g there would
	// be destroyed for a new 3g instance (docs/scheduling.md, "Resource
	// model"), and the faulty instance is the only other room for one.
	one := &api.Job{ID: "1g", Tier: api.TierBurstable, Spec: api.JobSpec{Command: []string{"x"},
		Resources: api.Resources{CPU: 100, Memory: 1 << 20, GPU: &api.GPURequest{MIG: "1g.18gb"}}}}
	if why, ok := place(one); !ok {
		t.Errorf("1g job not placed beside the faulty 3g instance: %s", why)
	}
	b := mig3g("b")
	if why, ok := place(b); ok {
		t.Fatalf("second 3g job placed (%+v) while the only 3g instance is out of service", b.Allocation.MIG)
	} else if !strings.Contains(why, inst) {
		t.Errorf("second 3g job waits with %q; want it to name %s", why, inst)
	}

	waitFor("the instance back in service", func() bool { return len(p.Unhealthy()) == 0 })
	if why, ok := place(b); !ok {
		t.Fatalf("second 3g job not placed after the probation: %s", why)
	}
	if m := b.Allocation.MIG; m == nil || m.Instance != inst {
		t.Errorf("second 3g job on %+v, want the recovered instance %s", b.Allocation.MIG, inst)
	}
	if err := h.InjectMIGFault(ctx, "MIG-no-such-instance", 94); !errors.Is(err, nvidia.ErrUnknownDevice) {
		t.Errorf("fault on an unknown instance: %v", err)
	}
}
