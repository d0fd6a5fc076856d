package daemon

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// The live source reads GPU telemetry as 0..1 shares and CPU busy per
// NUMA node as the busy share of the jiffies since the previous reading.
func TestLiveLoad(t *testing.T) {
	stat := filepath.Join(t.TempDir(), "stat")
	write := func(s string) {
		if err := os.WriteFile(stat, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0 0 0\nintr 1 2\n")
	tel := func() []nvidia.Sample {
		return []nvidia.Sample{{UUID: "GPU-a", SMUtil: 40, MemUtil: 10, PowerW: 120}}
	}
	cores := func() []cgroups.Core { return []cgroups.Core{{Node: 0, CPUs: []int{0}}, {Node: 1, CPUs: []int{1}}} }
	l := &liveLoad{telemetry: tel, cores: cores, statPath: stat}
	l.cpuBusy()
	// cpu0: 90 busy of 100 more jiffies; cpu1: 10 of 100.
	write("cpu  300 0 100 900 0 0 0 0 0 0\ncpu0 100 0 90 410 0 0 0 0 0 0\ncpu1 60 0 50 490 0 0 0 0 0 0\n")
	got := l.Live()
	if g := got.GPUs["GPU-a"]; g.SMUtil != 0.4 || g.MemUtil != 0.1 || g.PowerW != 120 {
		t.Errorf("gpu %+v", g)
	}
	if math.Abs(got.NUMABusy[0]-0.9) > 1e-9 || math.Abs(got.NUMABusy[1]-0.1) > 1e-9 {
		t.Errorf("numa busy %v, want 0.9 and 0.1", got.NUMABusy)
	}
	if math.Abs(got.HostBusy-200.0/300) > 1e-9 {
		t.Errorf("host busy %v, want 2/3", got.HostBusy)
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
