package hostplacer

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/profile"
	"github.com/fusiond/fusiond/daemon/sched"
)

// fakeLive is a LiveSource whose reading a test sets.
type fakeLive struct {
	mu sync.Mutex
	l  Live
}

func (f *fakeLive) Live() Live {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.l
}

func (f *fakeLive) set(busy map[string]float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.l.GPUs = map[string]GPULive{}
	for id, u := range busy {
		f.l.GPUs[id] = GPULive{SMUtil: u, MemUtil: u / 2, PowerW: 75 + 600*u}
	}
}

// The daemon's decisions change when live inputs change: on the DGX H200
// host, a one-GPU inference job goes to the one quiet GPU; when another
// GPU becomes the quiet one, the next job goes there, and the placement's
// explanation (what fusionctl show prints) carries the load part.
func TestLiveLoadChangesTheGPU(t *testing.T) {
	src := &fakeLive{}
	p := New(dgx(), Options{Seed: 1, Live: src})
	busyBut := func(quiet string) map[string]float64 {
		m := map[string]float64{}
		for _, g := range dgx().GPUs {
			m[g.ID] = 0.8
		}
		m[quiet] = 0.05
		return m
	}
	place := func(id string) api.Allocation {
		t.Helper()
		j := job(id, api.TierBurstable, gpus(1))
		j.Spec.Class = api.ClassInference
		allocs, why, ok := p.Place([]*api.Job{j})
		if !ok {
			t.Fatalf("job %s not placed: %s", id, why)
		}
		return allocs[0]
	}
	src.set(busyBut("GPU-f"))
	a := place("1")
	if len(a.GPUs) != 1 || a.GPUs[0] != "GPU-f" {
		t.Fatalf("job 1 got %v, want the quiet GPU-f\n%s", a.GPUs, a.Explain)
	}
	for _, want := range []string{"top 3 candidates", "load=", "energy=", "5=GPU-f"} {
		if !strings.Contains(a.Explain, want) {
			t.Errorf("explanation lacks %q:\n%s", want, a.Explain)
		}
	}
	src.set(busyBut("GPU-c"))
	time.Sleep(LiveEvery + 10*time.Millisecond) // the placer keeps a reading LiveEvery
	if a := place("2"); len(a.GPUs) != 1 || a.GPUs[0] != "GPU-c" {
		t.Fatalf("job 2 got %v, want GPU-c, the quiet one now\n%s", a.GPUs, a.Explain)
	}
}

// Without a live source every GPU is alike: the same job takes the first
// GPU, whatever a source would have said (the test above is not passing
// by accident of index order).
func TestNoLiveSourceFirstGPU(t *testing.T) {
	p := New(dgx(), Options{Seed: 1})
	j := job("1", api.TierBurstable, gpus(1))
	j.Spec.Class = api.ClassInference
	allocs, why, ok := p.Place([]*api.Job{j})
	if !ok {
		t.Fatal(why)
	}
	if allocs[0].GPUs[0] == "GPU-f" || allocs[0].GPUs[0] == "GPU-c" {
		t.Fatalf("without live load the job took %v", allocs[0].GPUs)
	}
}

// The shape learner is read: after learnAfter jobs the fragmentation model
// is rebuilt from what was seen, and a job seen twice counts once.
func TestShapesSeenAreCounted(t *testing.T) {
	p := New(dgx(), Options{Seed: 1})
	for i := range learnAfter {
		j := job(string(rune('A'+i)), api.TierBurstable, share(250))
		for range 2 { // placed or not, a job counts once
			p.Place([]*api.Job{j})
		}
	}
	if p.observed != learnAfter {
		t.Fatalf("observed %d, want %d", p.observed, learnAfter)
	}
}

// PowerHeadroom is each GPU's power limit in force less its measured
// draw, from the live reading: a GPU near its cap has little, one over it
// none, and a GPU without a draw or a limit is not in it; a lower cap in
// the next reading lowers it.
func TestPowerHeadroom(t *testing.T) {
	src := &fakeLive{}
	p := New(dgx(), Options{Seed: 1, Live: src})
	ids := []string{}
	for _, g := range dgx().GPUs {
		ids = append(ids, g.ID)
	}
	src.mu.Lock()
	src.l.GPUs = map[string]GPULive{
		ids[0]: {PowerW: 90, LimitW: 700},
		ids[1]: {PowerW: 650, LimitW: 700},
		ids[2]: {PowerW: 320, LimitW: 300}, // over its cap: no headroom, never negative
		ids[3]: {PowerW: 90},               // no limit read
		ids[4]: {LimitW: 700},              // no draw read
	}
	src.mu.Unlock()
	got := p.PowerHeadroom()
	want := map[string]float64{ids[0]: 610, ids[1]: 50, ids[2]: 0}
	if len(got) != len(want) {
		t.Fatalf("headroom %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Fatalf("headroom %v, want %v", got, want)
		}
	}
	src.mu.Lock()
	src.l.GPUs[ids[0]] = GPULive{PowerW: 90, LimitW: 200} // a power policy capped it
	src.mu.Unlock()
	time.Sleep(LiveEvery + 10*time.Millisecond)
	if got := p.PowerHeadroom(); got[ids[0]] != 110 {
		t.Fatalf("after the cap: headroom %v, want 110 W on %s", got, ids[0])
	}
}

// SeedProfiles primes the learner with the profiles' request shapes by
// their decayed weight: enough weight replaces the prior model at once
// (here 40 jobs' worth, 3:1 for the 2-GPU shape); a profile that asks
// for nothing or has no finite weight adds nothing; the jobs seen later
// count on top of the seeded weight.
func TestSeedProfilesPrimesShapes(t *testing.T) {
	p := New(dgx(), Options{Seed: 1})
	p.SeedProfiles([]profile.Profile{
		{Key: profile.Key{Name: "train"}, Requested: profile.Usage{CPUMilli: 8000, GPUMilli: 2000}, Weight: 30},
		{Key: profile.Key{Name: "notebook"}, Requested: profile.Usage{CPUMilli: 1000, GPUMilli: 250}, Weight: 10},
		{Key: profile.Key{Name: "empty"}, Weight: 5},
		{Key: profile.Key{Name: "nan"}, Requested: profile.Usage{CPUMilli: 1000}, Weight: math.NaN()},
		{Key: profile.Key{Name: "bad"}, Requested: profile.Usage{CPUMilli: -1}, Weight: 3},
	})
	if p.seeded != 40 || p.shapes == nil {
		t.Fatalf("seeded %d, model %v", p.seeded, p.shapes)
	}
	want := []sched.Shape{
		{CPUMilli: 8000, GPUs: 2, GPUMilli: 1000, P: 0.75},
		{CPUMilli: 1000, GPUs: 1, GPUMilli: 250, P: 0.25},
	}
	if !slices.Equal(p.shapes.Shapes, want) {
		t.Fatalf("shapes %+v, want %+v", p.shapes.Shapes, want)
	}
	// Few profiles: the prior stays until jobs make up the rest.
	q := New(dgx(), Options{Seed: 1})
	q.SeedProfiles([]profile.Profile{{Key: profile.Key{Name: "x"}, Requested: profile.Usage{CPUMilli: 2000}, Weight: 15}})
	if q.shapes != nil {
		t.Fatal("15 jobs' weight replaced the prior")
	}
	for i := range learnAfter - 15 {
		q.Place([]*api.Job{job(string(rune('A'+i)), api.TierBurstable, share(250))})
	}
	if q.shapes == nil || len(q.shapes.Shapes) != 2 {
		t.Fatalf("after %d jobs on 15 seeded: model %+v", learnAfter-15, q.shapes)
	}
}
