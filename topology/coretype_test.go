package topology

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The hybrid tree of hwloc master (Core i7-1370P: 6 P-cores with SMT, 8
// E-cores without) has no PMU lists and no cpu_capacity, only
// cpufreq/base_frequency (1900 MHz on P-cores, 1400 MHz on E-cores) and a
// max frequency that differs between P-cores (Turbo Boost Max 3.0: 5200
// on CPUs 4-5 and 8-9, 5000 elsewhere). Discovery through the injected
// root, the production path, must find 6 performance and 8 efficiency
// cores, as hwloc master's expected output does.
func TestCoreKindsHybridTree(t *testing.T) {
	const name = "20em64t-hybrid-1p6c2t+2ca4co1t"
	root := unpackBz2Tree(t, hwlocMasterDir, name)
	h := discoverAt(t, root, WithoutNames())
	if !h.IsHybrid() || h.CoreKindSource != CoreKindSourceBaseFreq {
		t.Fatalf("hybrid %v source %q, want hybrid from base_frequency; warnings %q", h.IsHybrid(), h.CoreKindSource, h.Warnings)
	}
	perf, eff := 0, 0
	for _, c := range h.Cores {
		switch {
		case c.Kind == CoreKindPerformance && c.CPUs.Len() == 2 && c.Capacity == MaxCoreCapacity:
			perf++
		case c.Kind == CoreKindEfficiency && c.CPUs.Len() == 1 && c.Capacity == (1400*1024+950)/1900:
			eff++
		default:
			t.Errorf("core %s: kind %q capacity %d", c.CPUs, c.Kind, c.Capacity)
		}
	}
	if perf != 6 || eff != 8 {
		t.Errorf("%d performance and %d efficiency cores, want 6 and 8", perf, eff)
	}
	if got := h.CoreKindCPUs(CoreKindPerformance).String(); got != "0-11" {
		t.Errorf("performance CPUs %s, want 0-11", got)
	}
	if got := h.CoreKindCPUs(CoreKindEfficiency).String(); got != "12-19" {
		t.Errorf("efficiency CPUs %s, want 12-19", got)
	}
	// hwloc's own expected output says the same (the comparison in
	// TestHwlocTrees is not vacuous here).
	b, err := os.ReadFile(filepath.Join(hwlocMasterDir, name+".console"))
	if err != nil {
		t.Fatal(err)
	}
	exp, err := parseHwlocText(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := factsOfHwloc(exp).kinds, factsOfModel(h).kinds; got != want || got != "performance 0-11 efficiency 12-19" {
		t.Errorf("kinds: hwloc %q, fusiond %q", got, want)
	}
	var out bytes.Buffer
	if err := WriteTree(&out, h); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Hybrid cores (base_frequency) performance: 6 cores, CPUs 0-11, capacity 1024\n",
		"Hybrid cores (base_frequency) efficiency: 8 cores, CPUs 12-19, capacity 755\n",
	} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("tree lacks %q:\n%s", want, out.String())
		}
	}
}

// setPerCPU writes cpuN/file for every online CPU of a simhost tree.
func setPerCPU(t *testing.T, root, file string, h *Host, value func(cpu int) string) {
	t.Helper()
	for _, cpu := range h.OnlineCPUs.List() {
		if v := value(cpu); v != "" {
			writeFile(t, root, fmt.Sprintf("%s/cpu%d/%s", sysCPU, cpu, file), v+"\n")
		}
	}
}

func TestCoreKindsSources(t *testing.T) {
	root := writeSimhost(t)
	plain := discoverAt(t, root, WithoutNames())
	n := plain.OnlineCPUs.Len()
	if plain.IsHybrid() || plain.CoreKindSource != "" || plain.CoreKindCPUs(CoreKindUnknown).Len() != n {
		t.Fatalf("a host without hybrid information: hybrid %v source %q", plain.IsHybrid(), plain.CoreKindSource)
	}
	// The first core of the host and its siblings: the "big" ones below.
	big := plain.Cores[0].CPUs
	for _, tc := range []struct {
		name     string
		setup    func(t *testing.T, root string)
		hybrid   bool
		source   string
		bigCap   int
		smallCap int
		warn     string
	}{
		{name: "cpu_capacity", setup: func(t *testing.T, root string) {
			setPerCPU(t, root, "cpu_capacity", plain, func(c int) string {
				if big.Contains(c) {
					return "1024"
				}
				return "512"
			})
		}, hybrid: true, source: CoreKindSourceCapacity, bigCap: 1024, smallCap: 512},
		{name: "capacities within 10% are one kind", setup: func(t *testing.T, root string) {
			setPerCPU(t, root, "cpu_capacity", plain, func(c int) string {
				if big.Contains(c) {
					return "1024"
				}
				return "940"
			})
		}},
		{name: "cpu_capacity missing on some CPUs", setup: func(t *testing.T, root string) {
			setPerCPU(t, root, "cpu_capacity", plain, func(c int) string {
				if big.Contains(c) {
					return "1024"
				}
				if c == n-1 {
					return ""
				}
				return "300"
			})
		}, warn: "cpu_capacity missing or not a positive integer"},
		{name: "base_frequency", setup: func(t *testing.T, root string) {
			setPerCPU(t, root, "cpufreq/base_frequency", plain, func(c int) string {
				if big.Contains(c) {
					return "2000000"
				}
				return "1000000"
			})
		}, hybrid: true, source: CoreKindSourceBaseFreq, bigCap: 1024, smallCap: 512},
		{name: "PMU lists override capacities", setup: func(t *testing.T, root string) {
			// cpu_capacity says nothing (all equal); the PMUs say big is
			// the only performance core.
			setPerCPU(t, root, "cpu_capacity", plain, func(int) string { return "1024" })
			writeFile(t, root, "/sys/devices/cpu_core/cpus", big.String()+"\n")
			writeFile(t, root, "/sys/devices/cpu_atom/cpus", plain.OnlineCPUs.Difference(big).String()+"\n")
		}, hybrid: true, source: CoreKindSourcePMU, bigCap: 1024, smallCap: 1024},
		{name: "malformed PMU list", setup: func(t *testing.T, root string) {
			writeFile(t, root, "/sys/devices/cpu_core/cpus", "0-x\n")
		}, warn: "/sys/devices/cpu_core/cpus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := writeSimhost(t)
			tc.setup(t, root)
			h := discoverAt(t, root, WithoutNames())
			if h.IsHybrid() != tc.hybrid || h.CoreKindSource != tc.source {
				t.Fatalf("hybrid %v source %q, want %v %q; warnings %q", h.IsHybrid(), h.CoreKindSource, tc.hybrid, tc.source, h.Warnings)
			}
			if tc.warn != "" && !hasWarning(h, tc.warn) {
				t.Errorf("no warning %q in %q", tc.warn, h.Warnings)
			}
			for _, c := range h.Cores {
				kind, capacity := CoreKindEfficiency, tc.smallCap
				if c.CPUs.Equal(big) {
					kind, capacity = CoreKindPerformance, tc.bigCap
				}
				if !tc.hybrid {
					kind, capacity = CoreKindUnknown, 0
				}
				if c.Kind != kind || c.Capacity != capacity {
					t.Errorf("core %s: kind %q capacity %d, want %q %d", c.CPUs, c.Kind, c.Capacity, kind, capacity)
				}
			}
		})
	}
}
