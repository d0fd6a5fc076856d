package hostplacer

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// smtCores is nodes NUMA nodes of perNode cores each, two SMT threads per
// core: core c has CPUs c and c+nodes*perNode.
func smtCores(nodes, perNode int) []cgroups.Core {
	var out []cgroups.Core
	total := nodes * perNode
	for c := range total {
		out = append(out, cgroups.Core{Node: c / perNode, CPUs: []int{c, c + total}})
	}
	return out
}

func cpuJob(id string, tier api.Tier, cpu api.MilliCPU) *api.Job {
	return &api.Job{ID: id, Tier: tier, Spec: api.JobSpec{Topology: api.TopologyBestEffort, Resources: api.Resources{CPU: cpu, Memory: 1 << 20}}}
}

func TestExclusiveCores(t *testing.T) {
	// 2 NUMA nodes × 2 cores × 2 SMT threads: {0,4} {1,5} on node 0,
	// {2,6} {3,7} on node 1.
	var pools [][]int
	p := New(Hardware{Name: "t", CPU: 8000, Memory: 1 << 30, Cores: smtCores(2, 2)}, Options{
		Seed: 1, KeepSharedCores: 1,
		OnShared: func(s []int) error { pools = append(pools, s); return nil },
	})
	if got := p.SharedCPUs(); len(got) != 8 || len(pools) != 0 {
		t.Fatalf("fresh pool %v, published %v", got, pools)
	}
	g := cpuJob("g", api.TierGuaranteed, 1500)
	b := cpuJob("b", api.TierBurstable, 1500)
	allocs, why, ok := p.Place([]*api.Job{g, b})
	if !ok {
		t.Fatal(why)
	}
	// 1.5 CPUs round up to two whole cores, both SMT threads each, on one
	// node (node 0: the first with most free cores).
	if allocs[0].CPUSet != "0-1,4-5" || allocs[0].NUMANode != 0 || allocs[0].CPU != 2000 || !strings.Contains(allocs[0].Explain, "exclusive cores 0-1,4-5 (NUMA node 0)") {
		t.Errorf("guaranteed allocation %+v: want both cores of node 0", allocs[0])
	}
	if allocs[1].CPUSet != "" {
		t.Errorf("burstable job pinned: %+v", allocs[1])
	}
	if got := p.SharedCPUs(); !reflect.DeepEqual(got, []int{2, 3, 6, 7}) || len(pools) != 1 || !reflect.DeepEqual(pools[0], got) {
		t.Errorf("shared pool %v, published %v", got, pools)
	}
	// Two more cores would leave none shared: refused by the engine, and
	// nothing kept.
	g2 := cpuJob("g2", api.TierGuaranteed, 2000)
	if _, why, ok := p.Place([]*api.Job{g2}); ok || !strings.Contains(why, "exclusive cores") {
		t.Errorf("placed beyond the shared minimum: %q", why)
	}
	if got := p.Allocated().CPU; got != 3500 {
		t.Errorf("refused placement left %s CPU allocated, want 3500 (2 cores + 1.5 shared)", got)
	}
	// One more core fits, on node 1 (the only one with free cores).
	g3 := cpuJob("g3", api.TierGuaranteed, 1000)
	if a, why, ok := p.Place([]*api.Job{g3}); !ok || a[0].CPUSet != "2,6" || a[0].NUMANode != 1 {
		t.Fatalf("third core: %+v (%s), want 2,6 on node 1", a, why)
	}
	p.Release(g3)
	p.Release(g)
	if got := p.SharedCPUs(); len(got) != 8 || !reflect.DeepEqual(pools[len(pools)-1], got) {
		t.Errorf("after release the pool is %v, published %v", got, pools)
	}
	// A re-attached job gets its cores back, the engine's count with them.
	g.Allocation = &allocs[0]
	if err := p.Reclaim(g); err != nil {
		t.Fatal(err)
	}
	if got := p.SharedCPUs(); !reflect.DeepEqual(got, []int{2, 3, 6, 7}) || !reflect.DeepEqual(pools[len(pools)-1], got) {
		t.Errorf("after reclaim the pool is %v, published %v", got, pools)
	}
	if _, _, ok := p.Place([]*api.Job{g2}); ok {
		t.Error("reclaimed cores were handed out again")
	}
	if a, why, ok := p.Place([]*api.Job{g3}); !ok || a[0].CPUSet != "2,6" {
		t.Errorf("after reclaim: %+v (%s), want the free core 2,6", a, why)
	}
}

func TestReclaimRefusesHeldOrForeignCores(t *testing.T) {
	p := New(Hardware{Name: "t", CPU: 8000, Memory: 1 << 30, Cores: smtCores(2, 2)}, Options{KeepSharedCores: 1})
	a, why, ok := p.Place([]*api.Job{cpuJob("g", api.TierGuaranteed, 1000)})
	if !ok {
		t.Fatal(why)
	}
	for _, tc := range []struct{ cpuset, want string }{
		{a[0].CPUSet, "which job g holds"},
		{"1", "part of core"},
		{"1,5,9", "not cores of this host"},
	} {
		j := cpuJob("r", api.TierGuaranteed, 1000)
		j.Allocation = &api.Allocation{CPU: 1000, Memory: 1 << 20, NUMANode: 0, CPUSet: tc.cpuset}
		if err := p.Reclaim(j); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("reclaim of %s: %v, want %q", tc.cpuset, err, tc.want)
		}
	}
	if got := p.SharedCPUs(); !reflect.DeepEqual(got, []int{1, 2, 3, 5, 6, 7}) {
		t.Errorf("refused reclaims changed the pool: %v", got)
	}
}

// The engine's NUMA choice is the cores' node: a guaranteed job's cores
// sit on its GPU's node; a single-numa-node job waits when that node has
// none left, a best-effort-topology job takes cores elsewhere.
func TestExclusiveCoresFollowDeviceNode(t *testing.T) {
	ok := devices.Health{Healthy: true}
	hw := Hardware{Name: "t", CPU: 4000, Memory: 1 << 30, Cores: []cgroups.Core{
		{Node: 0, CPUs: []int{0}}, {Node: 0, CPUs: []int{1}}, {Node: 1, CPUs: []int{2}}, {Node: 1, CPUs: []int{3}},
	}}
	for i := range 3 {
		hw.GPUs = append(hw.GPUs, devices.Device{ID: "GPU-" + string(rune('a'+i)), Kind: devices.GPU, Model: "H200", MemoryMB: 1000, NUMA: 1, Health: ok})
	}
	p := New(hw, Options{Seed: 1, KeepSharedCores: 1})
	gpuJob := func(id string, topo api.TopologyPolicy, cpu api.MilliCPU) *api.Job {
		j := cpuJob(id, api.TierGuaranteed, cpu)
		j.Spec.Topology = topo
		j.Spec.Resources.GPU = &api.GPURequest{Count: 1}
		return j
	}
	a, why, placed := p.Place([]*api.Job{gpuJob("g", api.TopologySingleNUMANode, 2000)})
	if !placed || a[0].CPUSet != "2-3" || a[0].NUMANode != 1 {
		t.Fatalf("placed %+v (%s): want node 1's cores 2-3", a, why)
	}
	for _, topo := range []api.TopologyPolicy{api.TopologySingleNUMANode, api.TopologyRestricted} {
		if _, why, placed := p.Place([]*api.Job{gpuJob("s-"+string(topo), topo, 1000)}); placed || !strings.Contains(why, "topology") {
			t.Errorf("%s job got cores off its devices' node: %q", topo, why)
		}
	}
	a, why, placed = p.Place([]*api.Job{gpuJob("l", api.TopologyBestEffort, 1000)})
	if !placed || a[0].CPUSet != "0" || a[0].NUMANode != 0 {
		t.Errorf("best-effort topology job: %+v (%s), want core 0 on node 0", a, why)
	}
}

// Without cores (no cgroups to pin them) guaranteed jobs share the CPUs:
// no cpuset, their CPU counted as asked.
func TestNoCoresNoExclusive(t *testing.T) {
	p := New(Hardware{Name: "t", CPU: 4000, Memory: 1 << 30}, Options{KeepSharedCores: 1})
	a, why, ok := p.Place([]*api.Job{cpuJob("g", api.TierGuaranteed, 1500)})
	if !ok || a[0].CPUSet != "" || a[0].CPU != 1500 || p.SharedCPUs() != nil {
		t.Errorf("%+v (%s), pool %v", a, why, p.SharedCPUs())
	}
}

// A hardware update (a topology refresh) keeps what jobs hold by CPU and
// counts it on the cores' new nodes; a failing OnShared is logged, not
// fatal.
func TestCoresFollowHardwareUpdate(t *testing.T) {
	calls := 0
	hw := Hardware{Name: "t", CPU: 4000, Memory: 1 << 30, Cores: smtCores(1, 4)}
	p := New(hw, Options{KeepSharedCores: 1, OnShared: func([]int) error { calls++; return errors.New("cgroup gone") }})
	a, why, ok := p.Place([]*api.Job{cpuJob("g", api.TierGuaranteed, 2000)})
	if !ok || a[0].CPUSet != "0-1,4-5" {
		t.Fatalf("%+v (%s)", a, why)
	}
	// Core {3,7} goes offline: 2 held, 1 free, and 1 must stay shared.
	hw.Cores = hw.Cores[:3]
	p.UpdateHardware(hw)
	if got := p.SharedCPUs(); !reflect.DeepEqual(got, []int{2, 6}) || calls != 2 {
		t.Errorf("pool %v after the refresh, OnShared called %d times", got, calls)
	}
	if _, why, ok := p.Place([]*api.Job{cpuJob("g2", api.TierGuaranteed, 1000)}); ok || !strings.Contains(why, "exclusive cores") {
		t.Errorf("took the last shared core: %q", why)
	}
	p.Release(&api.Job{ID: "g"})
	if got := p.SharedCPUs(); len(got) != 6 {
		t.Errorf("after release: %v", got)
	}
}

// BenchmarkPlaceGuaranteed places and releases a guaranteed 8-core 1-GPU
// job on the 2 × 56-core (224 CPU) dgx host beside 10 held guaranteed
// jobs: the engine's decision plus the choice of concrete cores.
//
//	go test -run '^$' -bench PlaceGuaranteed ./daemon/internal/hostplacer/
func BenchmarkPlaceGuaranteed(b *testing.B) {
	p := New(dgx(), Options{Seed: 1, KeepSharedCores: 1})
	for i := range 10 {
		if _, why, ok := p.Place([]*api.Job{job(string(rune('a'+i)), api.TierGuaranteed, api.Resources{CPU: 4000, Memory: 1 << 30})}); !ok {
			b.Fatal(why)
		}
	}
	j := job("bench", api.TierGuaranteed, api.Resources{CPU: 8000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}})
	for b.Loop() {
		a, why, ok := p.Place([]*api.Job{j})
		if !ok || a[0].CPUSet == "" {
			b.Fatal(why)
		}
		p.Release(j)
	}
}
