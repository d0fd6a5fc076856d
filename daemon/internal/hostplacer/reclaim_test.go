package hostplacer

import (
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// smallHost is 4 CPUs and 4 GiB, no cores, no devices.
func smallHost() Hardware { return Hardware{Name: "small", CPU: 4000, Memory: 4 << 30} }

func placeOne(t *testing.T, p *Placer, j *api.Job) api.Allocation {
	t.Helper()
	out, why, ok := p.Place([]*api.Job{j})
	if !ok {
		t.Fatalf("job %s (%s) not placed: %s", j.ID, j.Tier, why)
	}
	return out[0]
}

// A best-effort job fits only thanks to the reclaimable capacity: it
// borrows that first, the node keeps counting only what it takes of the
// unreserved capacity, and a burstable job still gets that; a burstable
// job that would need the reclaimable capacity waits.
func TestBestEffortPlacedOnReclaimable(t *testing.T) {
	p := New(smallHost(), Options{})
	placeOne(t, p, job("1", api.TierBurstable, api.Resources{CPU: 3000, Memory: 3 << 30}))
	p.SetReclaimable(2000, 2<<30)
	big := job("2", api.TierBurstable, api.Resources{CPU: 2000, Memory: 512 << 20})
	if _, why, ok := p.Place([]*api.Job{big}); ok {
		t.Fatal("a burstable job of 2000m placed on 1000m unreserved: it saw reclaimed capacity")
	} else if !strings.Contains(why, "cpu") {
		t.Errorf("burstable job waits for %q, want the CPU named", why)
	}
	be := job("3", api.TierBestEffort, api.Resources{CPU: 2500, Memory: 2 << 30})
	a := placeOne(t, p, be)
	if a.CPU != 2500 || a.Memory != 2<<30 || a.ReclaimedCPU != 2000 || a.ReclaimedMemory != 2<<30 {
		t.Errorf("best-effort allocation %v CPU %v memory, %v and %v of it reclaimed; want 2500m 2Gi, 2000m and 2Gi reclaimed",
			a.CPU, a.Memory.Human(), a.ReclaimedCPU, a.ReclaimedMemory.Human())
	}
	if !strings.Contains(a.Explain, "on reclaimed capacity: 2 CPU and 2Gi memory") {
		t.Errorf("explain %q does not say it is on reclaimed capacity", a.Explain)
	}
	if got := p.OnReclaimed()["3"]; got.CPU != 2000 || got.Memory != 2<<30 {
		t.Errorf("OnReclaimed()[3] = %+v, want 2000m and 2Gi", got)
	}
	if al := p.Allocated(); al.CPU != 3500 || al.Memory != 3<<30 {
		t.Errorf("allocated %v CPU %v memory, want 3500m and 3Gi (the borrowed part not taken from the node)", al.CPU, al.Memory.Human())
	}
	// The unreserved capacity left (500m, 1 GiB) is there for a burstable
	// job: the best-effort job on reclaimed capacity does not make it wait.
	placeOne(t, p, job("4", api.TierBurstable, api.Resources{CPU: 500, Memory: 1 << 30}))
	p.Release(be)
	if len(p.OnReclaimed()) != 0 {
		t.Errorf("released job still on reclaimed capacity: %v", p.OnReclaimed())
	}
	if al := p.Allocated(); al.CPU != 3500 || al.Memory != 4<<30 {
		t.Errorf("after the release: allocated %v CPU %v memory, want 3500m and 4Gi", al.CPU, al.Memory.Human())
	}
}

// What is lent is lent once; reclaimable capacity going to 0 makes the
// next best-effort job wait; a burstable job leaving takes its share with
// it until the next account.
func TestReclaimableGoneMakesBestEffortWait(t *testing.T) {
	p := New(smallHost(), Options{})
	svc := job("1", api.TierBurstable, api.Resources{CPU: 3000, Memory: 3 << 30})
	placeOne(t, p, svc)
	p.SetReclaimable(2000, 2<<30)
	placeOne(t, p, job("2", api.TierBestEffort, api.Resources{CPU: 1500, Memory: 1 << 30}))
	be := func(id string) *api.Job {
		return job(id, api.TierBestEffort, api.Resources{CPU: 1500, Memory: 512 << 20})
	}
	// 1000m unreserved + 500m still lendable.
	if a := placeOne(t, p, be("3")); a.ReclaimedCPU != 500 {
		t.Errorf("second best-effort job borrowed %v CPU, want the 500m left to lend", a.ReclaimedCPU)
	}
	p.Release(be("3"))
	p.SetReclaimable(0, 0)
	if _, _, ok := p.Place([]*api.Job{be("4")}); ok {
		t.Fatal("best-effort job of 1500m placed on 1000m unreserved with nothing reclaimable")
	}
	p.SetReclaimable(2000, 2<<30)
	p.Release(svc)
	// 4000m unreserved now, and 500m would be lendable on the old account.
	if _, _, ok := p.Place([]*api.Job{job("5", api.TierBestEffort, api.Resources{CPU: 4500})}); ok {
		t.Fatal("best-effort job placed on the reclaimable share of a job that has left")
	}
}

// Devices are never lent: a best-effort job asking for a GPU waits while
// every GPU is held, however much CPU and memory is reclaimable.
func TestReclaimLendsNoDevices(t *testing.T) {
	p := New(dgx(), Options{})
	placeOne(t, p, job("1", api.TierBurstable, api.Resources{CPU: 8000, Memory: 64 << 30, GPU: &api.GPURequest{Count: 8}}))
	p.SetReclaimable(8000, 64<<30)
	if _, _, ok := p.Place([]*api.Job{job("2", api.TierBestEffort, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}})}); ok {
		t.Fatal("best-effort GPU job placed with every GPU held")
	}
}

// A best-effort job re-attached after a restart holds again what its
// allocation records of reclaimed capacity as borrowed, not from the node.
func TestReattachKeepsReclaimed(t *testing.T) {
	p := New(smallHost(), Options{})
	placeOne(t, p, job("1", api.TierBurstable, api.Resources{CPU: 3000, Memory: 3 << 30}))
	j := job("2", api.TierBestEffort, api.Resources{CPU: 2500, Memory: 2 << 30})
	j.Allocation = &api.Allocation{CPU: 2500, Memory: 2 << 30, ReclaimedCPU: 2000, ReclaimedMemory: 2 << 30, NUMANode: -1}
	if err := p.Reclaim(j); err != nil {
		t.Fatal(err)
	}
	if got := p.OnReclaimed()["2"]; got.CPU != 2000 || got.Memory != 2<<30 {
		t.Errorf("re-attached job on reclaimed capacity %+v, want 2000m and 2Gi", got)
	}
	if al := p.Allocated(); al.CPU != 3500 || al.Memory != 3<<30 {
		t.Errorf("allocated %v CPU %v memory, want 3500m and 3Gi", al.CPU, al.Memory.Human())
	}
}

// A gang borrows what is lendable member by member; a best-effort job
// behind the head that would take unreserved capacity the head waits for
// is refused and leaves nothing borrowed or allocated.
func TestReclaimGangAndBackfill(t *testing.T) {
	p := New(smallHost(), Options{})
	placeOne(t, p, job("1", api.TierBurstable, api.Resources{CPU: 3000, Memory: 2 << 30}))
	p.SetReclaimable(1500, 1<<30)
	gang := []*api.Job{
		job("2", api.TierBestEffort, api.Resources{CPU: 1000, Memory: 256 << 20}),
		job("3", api.TierBestEffort, api.Resources{CPU: 1000, Memory: 256 << 20}),
	}
	out, why, ok := p.Place(gang)
	if !ok {
		t.Fatalf("gang of 2×1000m on 1000m unreserved + 1500m reclaimable: %s", why)
	}
	if out[0].ReclaimedCPU != 1000 || out[1].ReclaimedCPU != 500 {
		t.Errorf("gang borrowed %v and %v CPU, want 1000m and 500m", out[0].ReclaimedCPU, out[1].ReclaimedCPU)
	}
	for _, j := range gang {
		p.Release(j)
	}
	before := p.Allocated()
	head := job("4", api.TierBurstable, api.Resources{CPU: 1000, Memory: 256 << 20})
	cand := job("5", api.TierBestEffort, api.Resources{CPU: 2000, Memory: 256 << 20})
	if _, why, ok := p.PlaceBehind([]*api.Job{cand}, []*api.Job{head}); ok || !strings.Contains(why, "job 4, first in the queue") {
		t.Fatalf("best-effort job taking 500m of the head's 1000m: placed %v (%s), want refused", ok, why)
	}
	if after := p.Allocated(); after != before || len(p.OnReclaimed()) != 0 {
		t.Errorf("refused backfill left %+v allocated (was %+v), %v on reclaimed capacity", after, before, p.OnReclaimed())
	}
	// One that fits on what is lendable takes nothing from the head.
	if _, why, ok := p.PlaceBehind([]*api.Job{job("6", api.TierBestEffort, api.Resources{CPU: 1500, Memory: 256 << 20})}, []*api.Job{head}); !ok {
		t.Errorf("best-effort job on reclaimed capacity only, behind the head: refused (%s)", why)
	}
	placeOne(t, p, head)
}
