package nvidia

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// publishedProfiles are NVIDIA's published MIG profile tables (MIG user
// guide, "Supported MIG Profiles"): name -> maximum instance count.
var publishedProfiles = map[string]map[string]int{
	"A100-40GB":  {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
	"A100-80GB":  {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
	"H100-80GB":  {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
	"H200-141GB": {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
	"B200-180GB": {"1g.23gb": 7, "1g.23gb+me": 1, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1},
}

func TestProfileNamesMatchPublishedTables(t *testing.T) {
	cases := []struct {
		table string
		gpu   gpus.Config
	}{
		{"A100-40GB", gpus.A100_SXM4_40GB},
		{"A100-80GB", gpus.A100_SXM4_80GB},
		{"H100-80GB", gpus.H100_SXM5_80GB},
		{"H200-141GB", gpus.H200_SXM5_141GB},
		{"B200-180GB", gpus.B200_SXM5_180GB},
	}
	for _, c := range cases {
		t.Run(c.table, func(t *testing.T) {
			s, err := server.New(server.WithGPUs(c.gpu))
			if err != nil {
				t.Fatal(err)
			}
			m, err := Open(WithNVML(s))
			if err != nil {
				t.Fatal(err)
			}
			g := m.GPUs()[0]
			got := map[string]int{}
			for _, p := range g.Profiles {
				got[p.Name] = p.MaxCount
			}
			want := publishedProfiles[c.table]
			if len(got) != len(want) {
				t.Errorf("profiles %v, want %v", got, want)
			}
			for name, n := range want {
				if got[name] != n {
					t.Errorf("%s: max %d, want %d (derived %v)", name, got[name], n, g.Profiles.Names())
				}
			}
		})
	}
}

func TestInventoryAllMocks(t *testing.T) {
	models := map[string]string{"dgxa100": "A100", "dgxh100": "H100", "dgxh200": "H200", "dgxb200": "B200"}
	cc := map[string]string{"dgxa100": "8.0", "dgxh100": "9.0", "dgxh200": "9.0", "dgxb200": "10.0"}
	bdfRE := regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	for _, name := range dgxHosts() {
		t.Run(name, func(t *testing.T) {
			m, _ := openSim(t, name)
			gs := m.GPUs()
			if len(gs) != 8 {
				t.Fatalf("%d GPUs, want 8", len(gs))
			}
			seen := map[string]bool{}
			for i, g := range gs {
				if g.Index != i || !strings.HasPrefix(g.UUID, "GPU-") || seen[g.UUID] {
					t.Errorf("gpu %d: index %d uuid %q", i, g.Index, g.UUID)
				}
				seen[g.UUID] = true
				if !strings.Contains(g.Model, models[name]) {
					t.Errorf("gpu %d model %q, want %s", i, g.Model, models[name])
				}
				if !bdfRE.MatchString(g.BDF) {
					t.Errorf("gpu %d BDF %q not lower-case domain:bus:dev.fn", i, g.BDF)
				}
				if g.ComputeCapability != cc[name] || g.MemoryMB < 40000 || !g.MIGCapable || g.MIGEnabled {
					t.Errorf("gpu %d: %+v", i, g)
				}
				if g.NUMANode != i*2/8 || g.PowerLimitW <= 0 || g.PowerMaxLimitW < g.PowerLimitW || len(g.Profiles) != 7 {
					t.Errorf("gpu %d: numa %d power %v/%v profiles %d", i, g.NUMANode, g.PowerLimitW, g.PowerMaxLimitW, len(g.Profiles))
				}
			}
			links, err := m.DeviceLinks(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(links) != 8*7/2 {
				t.Fatalf("%d links, want 28", len(links))
			}
			for _, l := range links {
				if l.Lanes != 2 || l.A >= l.B || !bdfRE.MatchString(l.A) || !bdfRE.MatchString(l.B) {
					t.Errorf("link %+v", l)
				}
			}
		})
	}
}

// A bare go-nvml mock lacks most queries; inventory must degrade, not panic.
func TestInventoryBareMock(t *testing.T) {
	m, err := Open(WithNVML(dgxa100.New()))
	if err != nil {
		t.Fatal(err)
	}
	gs := m.GPUs()
	if len(gs) != 8 || gs[0].NUMANode != -1 || gs[0].PowerLimitW != 0 || gs[0].Profiles.Names()[0] != "1g.5gb" {
		t.Fatalf("bare mock inventory: %+v", gs[0])
	}
	links, err := m.DeviceLinks(context.Background())
	if err != nil || len(links) != 0 {
		t.Fatalf("links %v err %v", links, err)
	}
	samples, err := m.SampleAll(context.Background())
	if err != nil || len(samples) != 8 || !slices.Contains(samples[0].Missing, "power") {
		t.Fatalf("samples %+v err %v", samples, err)
	}
}

// Without a driver, Open fails with ErrNoDriver (the real library here has
// no libnvidia-ml.so).
func TestOpenNoDriver(t *testing.T) {
	_, err := Open()
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Open() = %v, want ErrNoDriver", err)
	}
}

func TestNvmlErrMapping(t *testing.T) {
	for ret, want := range map[nvml.Return]error{
		nvml.ERROR_LIBRARY_NOT_FOUND: ErrNoDriver,
		nvml.ERROR_NOT_SUPPORTED:     ErrNotSupported,
		nvml.ERROR_GPU_IS_LOST:       ErrGPULost,
		nvml.ERROR_TIMEOUT:           nvml.ERROR_TIMEOUT,
	} {
		if err := nvmlErr("op", ret); !errors.Is(err, want) {
			t.Errorf("%v -> %v, want %v", ret, err, want)
		}
	}
	if nvmlErr("op", nvml.SUCCESS) != nil {
		t.Error("SUCCESS is not nil")
	}
}

func TestSimulatedUnknown(t *testing.T) {
	if _, err := Simulated("dgx-1"); err == nil {
		t.Fatal("want error for unknown host")
	}
}

func TestStatusSaysSimulated(t *testing.T) {
	m, err := Open(WithSimulated("dgxh200"))
	if err != nil {
		t.Fatal(err)
	}
	st := m.Status()
	if st.Simulated != "dgxh200" || len(st.GPUs) != 8 || !st.GPUs[0].Health.Healthy || st.GPUs[0].ShareMode != ModeTimeSlicing {
		t.Fatalf("status %+v", st)
	}
	m.MarkUnhealthy(st.GPUs[3].UUID, st.GPUs[3].UUID, 79, "Xid 79")
	if m.Status().GPUs[3].Health.Healthy {
		t.Fatal("unhealthy GPU reported healthy")
	}
}

// The mixed simulated host: an H100 SXM (MIG-capable) and two L4s (no
// MIG, no NVLink), each reported under its own model, memory and power.
func TestSimulatedMixedHost(t *testing.T) {
	m, err := Open(WithSimulated("mixed"))
	if err != nil {
		t.Fatal(err)
	}
	gs := m.GPUs()
	if len(gs) != 3 {
		t.Fatalf("%d GPUs, want 3", len(gs))
	}
	if gs[0].Model != "NVIDIA H100 80GB HBM3" || gs[1].Model != "NVIDIA L4" || gs[2].Model != "NVIDIA L4" {
		t.Fatalf("models %q %q %q", gs[0].Model, gs[1].Model, gs[2].Model)
	}
	if len(gs[0].Profiles) == 0 || len(gs[1].Profiles) != 0 {
		t.Fatalf("MIG profiles: H100 %d, L4 %d; want some and none", len(gs[0].Profiles), len(gs[1].Profiles))
	}
	if gs[1].MemoryMB != 23034 {
		t.Fatalf("L4 memory %d MB", gs[1].MemoryMB)
	}
	for _, g := range gs {
		if g.NUMANode != 0 {
			t.Fatalf("GPU %d on NUMA %d, want 0 (the tree's first socket)", g.Index, g.NUMANode)
		}
	}
	if ids := SimPCIDeviceIDs("mixed"); !slices.Equal(ids, []uint16{0x2330, 0x27b8, 0x27b8}) {
		t.Fatalf("PCI device ids %#x", ids)
	}
}
