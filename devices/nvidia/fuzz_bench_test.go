package nvidia

import (
	"context"
	"testing"
	"time"
)

func FuzzParseLayout(f *testing.F) {
	for _, host := range SimulatedHosts() {
		f.Add([]byte(layoutFor(host)))
	}
	f.Add([]byte("version: v1\nmig-configs: {a: [{devices: [0, 1], mig-enabled: true, mig-devices: {\"1g.10gb+me\": 1}}]}"))
	f.Add([]byte("version: v1\nmig-configs: {a: [{device-filter: [\"0x233010DE\"], devices: all, mig-enabled: false}]}"))
	f.Add([]byte("{"))
	gpus := []GPU{{Index: 0}, {Index: 1}, {Index: 2}}
	f.Fuzz(func(t *testing.T, data []byte) {
		lf, err := ParseLayout(data)
		if err != nil {
			return
		}
		if lf.Version != "v1" || len(lf.MigConfigs) == 0 {
			t.Fatalf("accepted invalid layout %+v", lf)
		}
		for _, name := range lf.ConfigNames() {
			tgt, err := lf.Resolve(name, gpus)
			if err != nil {
				continue
			}
			for idx, g := range tgt {
				if idx < 0 || idx >= len(gpus) {
					t.Fatalf("target for GPU %d", idx)
				}
				for _, n := range g.Counts {
					if n <= 0 {
						t.Fatalf("non-positive count in %+v", g)
					}
				}
			}
		}
	})
}

func FuzzParseSharingConfig(f *testing.F) {
	f.Add([]byte("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"))
	f.Add([]byte("version: v1\nflags: {migStrategy: none}\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0, \"GPU-x\"]}]}}"))
	f.Add([]byte("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb, replicas: 3, devices: all}]}}"))
	f.Add([]byte("- 1"))
	gpus := []GPU{{Index: 0, UUID: "GPU-x"}, {Index: 1, UUID: "GPU-y"}}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseSharingConfig(data)
		if err != nil {
			return
		}
		for u, n := range c.Replicas(gpus) {
			if n < 1 || (u != "GPU-x" && u != "GPU-y") {
				t.Fatalf("replicas %s=%d", u, n)
			}
		}
	})
}

// BenchmarkInventory measures a full inventory of an 8-GPU simulated host.
func BenchmarkInventory(b *testing.B) {
	for _, host := range []string{"dgxa100", "dgxh200"} {
		b.Run(host, func(b *testing.B) {
			m, _ := openSim(b, host)
			ctx := context.Background()
			b.ResetTimer()
			for b.Loop() {
				if _, err := m.Refresh(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPlanFullLayout plans mixed layouts on all eight GPUs of a host.
func BenchmarkPlanFullLayout(b *testing.B) {
	for _, host := range SimulatedHosts() {
		b.Run(host, func(b *testing.B) {
			m, _ := openSim(b, host)
			lf, err := ParseLayout([]byte(layoutFor(host)))
			if err != nil {
				b.Fatal(err)
			}
			tgt, err := lf.Resolve("mixed", m.GPUs())
			if err != nil {
				b.Fatal(err)
			}
			st := mustState(b, m, nil)
			b.ResetTimer()
			for b.Loop() {
				if _, err := Plan(st, tgt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTelemetryPerGPU reports the cost of one telemetry sample of one
// GPU (8 NVML queries) over the simulated host.
func BenchmarkTelemetryPerGPU(b *testing.B) {
	m, _ := openSim(b, "dgxh200")
	m.mu.Lock()
	d, uuid := m.handles[0], m.gpus[0].UUID
	m.mu.Unlock()
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		s := m.sampleDevice(uuid, d, now)
		if len(s.Missing) != 0 {
			b.Fatal(s.Missing)
		}
	}
}

// BenchmarkPlanOnDemand finds on-demand candidates for a 1g instance over a
// host whose eight GPUs carry the mixed layout.
func BenchmarkPlanOnDemand(b *testing.B) {
	m, _ := openSim(b, "dgxh200")
	lf, err := ParseLayout([]byte(layoutFor("dgxh200")))
	if err != nil {
		b.Fatal(err)
	}
	tgt, _ := lf.Resolve("mixed", m.GPUs())
	acts, err := Plan(mustState(b, m, nil), tgt)
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Apply(context.Background(), acts, nil); err != nil {
		b.Fatal(err)
	}
	st := mustState(b, m, nil)
	b.ResetTimer()
	for b.Loop() {
		if _, err := PlanOnDemand(st, "2g.35gb"); err != nil {
			b.Fatal(err)
		}
	}
}
