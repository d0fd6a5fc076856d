package jobs_test

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
)

func TestExclusiveCPUPlacer(t *testing.T) {
	cores := []cgroups.Core{{Node: 0, CPUs: []int{0, 4}}, {Node: 0, CPUs: []int{1, 5}}, {Node: 1, CPUs: []int{2, 6}}, {Node: 1, CPUs: []int{3, 7}}}
	var pools [][]int
	p, err := jobs.NewExclusiveCPUPlacer(jobstest.Placer(8000, 1<<30), cores, 1,
		func(s []int) error { pools = append(pools, s); return nil }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	job := func(id string, tier api.Tier, cpu api.MilliCPU) *api.Job {
		return &api.Job{ID: id, Tier: tier, Spec: api.JobSpec{Resources: api.Resources{CPU: cpu, Memory: 1 << 20}}}
	}
	g := job("g", api.TierGuaranteed, 1500)
	b := job("b", api.TierBurstable, 1500)
	allocs, why, ok := p.Place([]*api.Job{g, b})
	if !ok {
		t.Fatal(why)
	}
	if allocs[0].CPUSet != "0-1,4-5" || allocs[0].NUMANode != 0 || !strings.Contains(allocs[0].Explain, "exclusive cores") {
		t.Errorf("guaranteed allocation %+v: want both cores of node 0 (the first with most free cores)", allocs[0])
	}
	if allocs[1].CPUSet != "" {
		t.Errorf("burstable job pinned: %+v", allocs[1])
	}
	if got := p.SharedCPUs(); !reflect.DeepEqual(got, []int{2, 3, 6, 7}) || !reflect.DeepEqual(pools[len(pools)-1], got) {
		t.Errorf("shared pool %v, published %v", got, pools)
	}
	// Two more cores would leave none shared: refused, and nothing kept.
	g2 := job("g2", api.TierGuaranteed, 2000)
	if _, why, ok := p.Place([]*api.Job{g2}); ok || !strings.Contains(why, "exclusive cores") {
		t.Errorf("placed beyond the shared minimum: %q", why)
	}
	if got := p.Allocated().CPU; got != 3000 {
		t.Errorf("refused placement left %s CPU allocated", got)
	}
	p.Release(g)
	if got := p.SharedCPUs(); len(got) != 8 {
		t.Errorf("after release the pool is %v", got)
	}
	// A re-attached job gets its cores back.
	g.Allocation = &allocs[0]
	if err := p.Reclaim(g); err != nil {
		t.Fatal(err)
	}
	if got := p.SharedCPUs(); !reflect.DeepEqual(got, []int{2, 3, 6, 7}) {
		t.Errorf("after reclaim the pool is %v", got)
	}
}

// nodePlacer places every job on NUMA node 1 (as the engine does for a job
// whose GPU sits there).
type nodePlacer struct{ *hostplacer.Placer }

func (p nodePlacer) Place(group []*api.Job) ([]api.Allocation, string, bool) {
	a, why, ok := p.Placer.Place(group)
	for i := range a {
		a[i].NUMANode = 1
	}
	return a, why, ok
}

func TestExclusiveCPUPlacerFollowsDeviceNode(t *testing.T) {
	cores := []cgroups.Core{{Node: 0, CPUs: []int{0}}, {Node: 0, CPUs: []int{1}}, {Node: 1, CPUs: []int{2}}, {Node: 1, CPUs: []int{3}}}
	p, err := jobs.NewExclusiveCPUPlacer(nodePlacer{jobstest.Placer(4000, 1<<30)},
		cores, 1, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	g := &api.Job{ID: "g", Tier: api.TierGuaranteed, Spec: api.JobSpec{Resources: api.Resources{CPU: 2000, Memory: 1 << 20}}}
	a, why, ok := p.Place([]*api.Job{g})
	if !ok || a[0].CPUSet != "2-3" || a[0].NUMANode != 1 {
		t.Fatalf("placed %v (%s): want node 1's cores 2-3", a, why)
	}
	// Node 1 is full: a single-numa-node job must wait, a best-effort
	// topology job takes cores elsewhere.
	strict := &api.Job{ID: "s", Tier: api.TierGuaranteed, Spec: api.JobSpec{Topology: api.TopologySingleNUMANode, Resources: api.Resources{CPU: 1000, Memory: 1 << 20}}}
	if _, _, ok := p.Place([]*api.Job{strict}); ok {
		t.Error("single-numa-node job got cores off its devices' node")
	}
	loose := &api.Job{ID: "l", Tier: api.TierGuaranteed, Spec: api.JobSpec{Topology: api.TopologyBestEffort, Resources: api.Resources{CPU: 1000, Memory: 1 << 20}}}
	if a, why, ok := p.Place([]*api.Job{loose}); !ok || a[0].CPUSet != "0" || a[0].NUMANode != 0 {
		t.Errorf("best-effort topology job: %v (%s), want core 0 on node 0", a, why)
	}
}
