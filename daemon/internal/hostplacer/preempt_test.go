package hostplacer

import (
	"slices"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// Behind an 8-GPU head, a 1-GPU job is refused (it would take a GPU the
// head waits for) and leaves the node as it was; a CPU-only job is placed.
func TestPlaceBehind(t *testing.T) {
	p := New(dgx(), Options{})
	hog := job("1", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 4}})
	if _, why, ok := p.Place([]*api.Job{hog}); !ok {
		t.Fatal(why)
	}
	head := job("2", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 8}})
	if _, _, ok := p.Place([]*api.Job{head}); ok {
		t.Fatal("8 GPUs placed beside 4 held")
	}
	before := p.Allocated()
	one := job("3", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}})
	if _, why, ok := p.PlaceBehind([]*api.Job{one}, []*api.Job{head}); ok || !strings.Contains(why, "job 2, first in the queue") {
		t.Errorf("1-GPU job behind an 8-GPU head: placed %v (%s); want refused naming the head", ok, why)
	}
	if after := p.Allocated(); after != before {
		t.Errorf("a refused backfill left %+v allocated, was %+v", after, before)
	}
	cpu := job("4", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30})
	if _, why, ok := p.PlaceBehind([]*api.Job{cpu}, []*api.Job{head}); !ok {
		t.Errorf("CPU-only job behind a GPU head refused: %s", why)
	}
}

// FitsEmpty: a gang over the host's GPUs never fits; with a GPU out of
// service an 8-GPU job fits ever but not now.
func TestFitsEmpty(t *testing.T) {
	p := New(dgx(), Options{})
	g := func(id string, n int) *api.Job {
		return job(id, api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: n}})
	}
	if ever, now := p.FitsEmpty([]*api.Job{g("1", 4), g("2", 4)}); !ever || !now {
		t.Errorf("gang of 4+4 GPUs on 8: ever %v now %v, want both", ever, now)
	}
	if ever, _ := p.FitsEmpty([]*api.Job{g("1", 4), g("2", 8)}); ever {
		t.Error("gang of 4+8 GPUs fits 8 GPUs")
	}
	p.SetHealthy("GPU-c", false)
	if ever, now := p.FitsEmpty([]*api.Job{g("5", 8)}); !ever || now {
		t.Errorf("8 GPUs with one out of service: ever %v now %v, want true false", ever, now)
	}
}

// PlanPreemption evicts best-effort before burstable, never a job of the
// preemptor's tier, and only jobs the caller offers.
func TestPlanPreemptionOnHost(t *testing.T) {
	p := New(dgx(), Options{})
	place := func(id string, tier api.Tier) {
		t.Helper()
		if _, why, ok := p.Place([]*api.Job{job(id, tier, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 2}})}); !ok {
			t.Fatal(why)
		}
	}
	place("b1", api.TierBestEffort)
	place("b2", api.TierBestEffort)
	place("u1", api.TierBurstable)
	place("g1", api.TierGuaranteed)
	costs := map[string]float64{"b1": 5, "b2": 1, "u1": 0, "g1": 0}
	want := job("new", api.TierGuaranteed, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 2}})
	v, err := p.PlanPreemption(want, costs, 8)
	if err != nil || !slices.Equal(v, []string{"b2"}) {
		t.Errorf("2 GPUs for a guaranteed job: victims %v (%v), want the cheaper best-effort b2", v, err)
	}
	four := job("big", api.TierGuaranteed, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 6}})
	if v, err := p.PlanPreemption(four, costs, 8); err != nil || len(v) != 3 || slices.Contains(v, "g1") {
		t.Errorf("6 GPUs: victims %v (%v), want b1, b2, u1", v, err)
	}
	if v, err := p.PlanPreemption(four, costs, 2); err == nil {
		t.Errorf("6 GPUs within a budget of 2: victims %v, want none", v)
	}
	burst := job("bu", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 6}})
	if v, err := p.PlanPreemption(burst, costs, 8); err == nil {
		t.Errorf("burstable job preempting for 6 GPUs: victims %v, want none (only 2 best-effort jobs below it)", v)
	}
	if v, err := p.PlanPreemption(want, map[string]float64{"u1": 0}, 8); err != nil || !slices.Equal(v, []string{"u1"}) {
		t.Errorf("only u1 offered: victims %v (%v)", v, err)
	}
}
