package hostplacer

import (
	"archive/tar"
	"compress/bzip2"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/topology"
)

func TestCorePreference(t *testing.T) {
	for _, tc := range []struct {
		tier  sched.Tier
		class sched.Class
		want  corePref
	}{
		{sched.TierGuaranteed, sched.ClassService, preferPerformance},
		{sched.TierGuaranteed, sched.ClassInference, preferPerformance},
		{sched.TierGuaranteed, sched.ClassTraining, preferPerformance},
		{sched.TierBurstable, sched.ClassInference, preferPerformance},
		{sched.TierGuaranteed, sched.ClassBatch, preferEfficiency},
		{sched.TierBestEffort, sched.ClassService, preferEfficiency},
		{sched.TierBestEffort, sched.ClassBatch, preferEfficiency},
	} {
		if got := corePreference(&sched.Request{Tier: tc.tier, Class: tc.class}); got != tc.want {
			t.Errorf("%s %s: %s, want %s", tc.tier, tc.class, got, tc.want)
		}
	}
}

// coreScore orders cores by type first, capacity second, in opposite
// directions for the two preferences; cores without a type all score
// alike.
func TestCoreScore(t *testing.T) {
	perfBig := cgroups.Core{CPUs: []int{0}, Kind: topology.CoreKindPerformance, Capacity: 1024}
	perfSmall := cgroups.Core{CPUs: []int{1}, Kind: topology.CoreKindPerformance, Capacity: 997}
	unknown := cgroups.Core{CPUs: []int{2}}
	effBig := cgroups.Core{CPUs: []int{3}, Kind: topology.CoreKindEfficiency, Capacity: 755}
	effSmall := cgroups.Core{CPUs: []int{4}, Kind: topology.CoreKindEfficiency, Capacity: 300}
	all := []cgroups.Core{effBig, unknown, perfSmall, effSmall, perfBig}
	order := func(pref corePref) []int {
		cs := slices.Clone(all)
		slices.SortStableFunc(cs, func(a, b cgroups.Core) int { return coreScore(b, pref) - coreScore(a, pref) })
		var out []int
		for _, c := range cs {
			out = append(out, c.CPUs[0])
		}
		return out
	}
	if got := order(preferPerformance); !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Errorf("performance order %v, want 0 1 2 3 4", got)
	}
	if got := order(preferEfficiency); !slices.Equal(got, []int{4, 3, 2, 1, 0}) {
		t.Errorf("efficiency order %v, want 4 3 2 1 0", got)
	}
	if coreScore(unknown, preferPerformance) != coreScore(cgroups.Core{CPUs: []int{9}}, preferEfficiency) {
		t.Error("cores without a type score differently by preference")
	}
}

// hybridCores discovers hwloc's Core i7-1370P tree (6 P-cores with SMT,
// CPUs 0-11; 8 E-cores, CPUs 12-19) the way the daemon does: topology
// discovery on the tree, cgroups.CoresOf for the placer.
func hybridCores(t *testing.T) []cgroups.Core {
	t.Helper()
	const tree = "../../../topology/testdata/hwloc-master/20em64t-hybrid-1p6c2t+2ca4co1t.tar.bz2"
	f, err := os.Open(tree)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(bzip2.NewReader(f))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.Clean("/"+hdr.Name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(hdr.Linkname, dst)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(dst, b, 0o644)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	h, err := topology.Discover(context.Background(), topology.WithRoot(filepath.Join(dir, "20em64t-hybrid-1p6c2t+2ca4co1t")), topology.WithoutNames())
	if err != nil {
		t.Fatal(err)
	}
	cores := cgroups.CoresOf(h)
	if len(cores) != 14 || !h.IsHybrid() {
		t.Fatalf("%d cores, hybrid %v; warnings %q", len(cores), h.IsHybrid(), h.Warnings)
	}
	return cores
}

func TestExclusiveCoresHybrid(t *testing.T) {
	cores := hybridCores(t)
	// Performance cores are not the lowest CPUs here, so that the
	// preference, not first-CPU order, is what is tested: the placer sees
	// the cores as discovered but numbered from the E-cores up.
	renum := func(cpu int) int { return (cpu + 8) % 20 } // E 12-19 → 0-7, P 0-11 → 8-19
	for i := range cores {
		for j, c := range cores[i].CPUs {
			cores[i].CPUs[j] = renum(c)
		}
		slices.Sort(cores[i].CPUs)
	}
	p := New(Hardware{Name: "hybrid", CPU: 20000, Memory: 1 << 30, Cores: cores}, Options{Seed: 1, KeepSharedCores: 1})
	svc := cpuJob("svc", api.TierGuaranteed, 2000)
	svc.Spec.Class = api.ClassService
	allocs, why, ok := p.Place([]*api.Job{svc})
	if !ok {
		t.Fatal(why)
	}
	// Two whole P-cores (two threads each), the lowest of them first.
	if allocs[0].CPUSet != "8-11" {
		t.Errorf("guaranteed service job got %q, want P-cores 8-11", allocs[0].CPUSet)
	}
	// A guaranteed batch job takes E-cores (Place with its preference).
	bj := cpuJob("batch", api.TierGuaranteed, 3000)
	bj.Spec.Class = api.ClassBatch
	allocs, why, ok = p.Place([]*api.Job{bj})
	if !ok {
		t.Fatal(why)
	}
	if allocs[0].CPUSet != "0-2" {
		t.Errorf("guaranteed batch job got %q, want E-cores 0-2", allocs[0].CPUSet)
	}
	p.mu.Lock()
	perf, err := p.takeCoresFor(map[int]int{0: 3}, preferPerformance)
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if got := cgroups.FormatCPUList(perf); got != "12-17" {
		t.Errorf("performance cores %s, want the next free P-cores 12-17", got)
	}
	if shared := cgroups.FormatCPUList(p.SharedCPUs()); shared != "3-7,12-19" {
		t.Errorf("shared pool %s, want every core but the service and batch jobs'", shared)
	}
}
