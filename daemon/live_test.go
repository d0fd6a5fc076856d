package daemon

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
	"github.com/fusiond/fusiond/daemon/sched"
)

// newTestBus is a telemetry bus over a fixture /proc (stat, meminfo) whose
// GPUs report what gpus returns, with the clock set by the caller.
func newTestBus(t *testing.T, gpus func() []telemetry.GPU, cpuNode map[int]int, now *time.Time) (*telemetry.Bus, func(stat string)) {
	t.Helper()
	proc := t.TempDir()
	if err := os.WriteFile(filepath.Join(proc, "meminfo"), []byte("MemTotal: 1000 kB\nMemAvailable: 500 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bus, err := telemetry.New(telemetry.Config{Proc: proc, CPUNode: cpuNode, GPUs: gpus, Now: func() time.Time { return *now }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return bus, func(stat string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(proc, "stat"), []byte(stat), 0o600); err != nil {
			t.Fatal(err)
		}
		*now = now.Add(100 * time.Millisecond)
		if err := bus.Sample(); err != nil && !strings.Contains(err.Error(), "pressure") {
			t.Fatal(err)
		}
	}
}

// The placer's live load is the telemetry bus's last second: GPU
// utilisation as 0..1 shares, power in watts, CPU busy per NUMA node and
// of the host as the busy share of the jiffies between samples.
func TestLiveLoad(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	gpus := func() []telemetry.GPU { return []telemetry.GPU{{ID: "GPU-a", SMUtil: 40, MemUtil: 10, PowerW: 120}} }
	bus, sample := newTestBus(t, gpus, map[int]int{0: 0, 1: 1}, &now)
	l := busLive{r: bus, over: liveOver}
	if got := l.Live(); len(got.GPUs) != 0 || got.HostBusy != 0 {
		t.Errorf("live load before any sample: %+v", got)
	}
	sample("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0 0 0\nintr 1 2\n")
	// cpu0: 90 busy of 100 more jiffies; cpu1: 10 of 100.
	sample("cpu  200 0 100 900 0 0 0 0 0 0\ncpu0 100 0 90 410 0 0 0 0 0 0\ncpu1 60 0 50 490 0 0 0 0 0 0\n")
	got := l.Live()
	if g := got.GPUs["GPU-a"]; math.Abs(g.SMUtil-0.4) > 1e-9 || math.Abs(g.MemUtil-0.1) > 1e-9 || g.PowerW != 120 {
		t.Errorf("gpu %+v, want SM 0.4, memory 0.1, 120 W", g)
	}
	if math.Abs(got.NUMABusy[0]-0.9) > 1e-9 || math.Abs(got.NUMABusy[1]-0.1) > 1e-9 {
		t.Errorf("numa busy %v, want 0.9 and 0.1", got.NUMABusy)
	}
	if math.Abs(got.HostBusy-0.5) > 1e-9 {
		t.Errorf("host busy %v, want 0.5", got.HostBusy)
	}
}

func TestPlacementConfig(t *testing.T) {
	parse := func(y string) error {
		cfg := DefaultConfig()
		return ParseConfig([]byte(y), &cfg)
	}
	cfg := DefaultConfig()
	if err := ParseConfig([]byte("placement:\n  profiles:\n    training:\n      load: 0.5\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	p := cfg.Placement.profiles()
	if p[sched.ClassTraining][sched.DimLoad] != 0.5 || p[sched.ClassTraining][sched.DimCompute] != sched.DefaultProfiles()[sched.ClassTraining][sched.DimCompute] {
		t.Errorf("training profile %v: load 0.5 over the defaults wanted", p[sched.ClassTraining])
	}
	for y, field := range map[string]string{
		"placement:\n  profiles:\n    training:\n      speed: 0.5\n":                                                         "placement.profiles.training.speed",
		"placement:\n  profiles:\n    training:\n      load: -1\n":                                                           "placement.profiles.training.load",
		"placement:\n  profiles:\n    gaming:\n      load: 1\n":                                                              "placement.profiles.gaming",
		"placement:\n  profiles:\n    batch: {compute: 0, locality: 0, fragmentation: 0, energy: 0, load: 0, priority: 0}\n": "placement.profiles.batch",
	} {
		err := parse(y)
		var e *api.Error
		if !errors.As(err, &e) || e.Field != field || !strings.Contains(e.Message, " ") {
			t.Errorf("%q: got %v, want an error on %s", y, err, field)
		}
	}
}

// On the simulated DGX H200, with the daemon's live source over GPU
// telemetry, a one-GPU inference job goes to the quiet GPU, and the next
// one follows the telemetry when another GPU becomes the quiet one; the
// explanation fusionctl show prints carries the load part.
func TestLiveLoadDecidesOnSimulatedDGXH200(t *testing.T) {
	ctx := context.Background()
	h, err := hardware.Open(ctx, hardware.Config{StateDir: t.TempDir(), Simulate: "dgxh200"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	uuids := []string{}
	for _, g := range h.GPUs().GPUs() {
		uuids = append(uuids, g.UUID)
	}
	if len(uuids) != 8 {
		t.Fatalf("simulated DGX H200 with %d GPUs", len(uuids))
	}
	var mu sync.Mutex
	quiet := uuids[5]
	tel := func() []telemetry.GPU {
		mu.Lock()
		defer mu.Unlock()
		var out []telemetry.GPU
		for _, u := range uuids {
			s := telemetry.GPU{ID: u, SMUtil: 85, MemUtil: 40, PowerW: 500}
			if u == quiet {
				s.SMUtil, s.MemUtil, s.PowerW = 2, 1, 90
			}
			out = append(out, s)
		}
		return out
	}
	now := time.Now()
	bus, sample := newTestBus(t, tel, nil, &now)
	stat := "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\n"
	sample(stat)
	sample(stat)
	o := placementOptions(h)
	o.Live = busLive{r: bus, over: liveOver}
	p := hostplacer.New(hardwareOf(ctx, h, api.NodeResources{CPU: 64000, Memory: 256 << 30}, slog.New(slog.DiscardHandler)), o)
	place := func(id string) api.Allocation {
		t.Helper()
		j := &api.Job{ID: id, Tier: api.TierBurstable, Spec: api.JobSpec{Class: api.ClassInference, Command: []string{"x"},
			Resources: api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}}}}
		allocs, why, ok := p.Place([]*api.Job{j})
		if !ok {
			t.Fatalf("job %s not placed: %s", id, why)
		}
		return allocs[0]
	}
	a := place("1")
	if len(a.GPUs) != 1 || a.GPUs[0] != uuids[5] {
		t.Fatalf("job 1 got %v, want the quiet GPU %s\n%s", a.GPUs, uuids[5], a.Explain)
	}
	if !strings.Contains(a.Explain, "load=") {
		t.Errorf("explanation without the load part:\n%s", a.Explain)
	}
	mu.Lock()
	quiet = uuids[2]
	mu.Unlock()
	for range 10 { // a second of samples: the old readings leave the window
		sample(stat)
	}
	time.Sleep(hostplacer.LiveEvery + 10*time.Millisecond)
	if a := place("2"); len(a.GPUs) != 1 || a.GPUs[0] != uuids[2] {
		t.Fatalf("job 2 got %v, want %s, the quiet one now\n%s", a.GPUs, uuids[2], a.Explain)
	}
}
