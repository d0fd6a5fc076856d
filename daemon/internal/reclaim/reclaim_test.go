package reclaim

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

const gib = float64(1 << 30)

func flat(u Usage, n int) []Usage {
	out := make([]Usage, n)
	for i := range out {
		out[i] = u
	}
	return out
}

func TestComputeAccounting(t *testing.T) {
	capacity := Usage{CPU: 4000, Memory: 8 * gib}
	jobs := []Job{
		// Reserved 2 CPU and 4 GiB, uses 500m and 1 GiB steadily: it may
		// need 500m + 10% of 2000m = 700m and 1 GiB + 0.4 GiB.
		{ID: "g", Tier: api.TierGuaranteed, Request: Usage{CPU: 2000, Memory: 4 * gib}, Recent: flat(Usage{CPU: 500, Memory: gib}, 10)},
		// Bursts over its 1 CPU request: it lends nothing.
		{ID: "b", Tier: api.TierBurstable, Request: Usage{CPU: 1000, Memory: gib}, Recent: flat(Usage{CPU: 1200, Memory: gib}, 10)},
		// Not measured yet: it lends nothing.
		{ID: "n", Tier: api.TierGuaranteed, Request: Usage{CPU: 500, Memory: gib}},
		{ID: "be", Tier: api.TierBestEffort, Request: Usage{CPU: 500, Memory: 2 * gib}, Recent: flat(Usage{CPU: 1800, Memory: 3 * gib}, 10)},
	}
	a := Compute(capacity, jobs, Params{Margin: 0.1, Lead: 5})
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	near("reserved cpu", a.Reserved.CPU, 3500)
	near("need cpu", a.Need.CPU, 700+1200+500)
	near("reclaimable cpu", a.Reclaimable.CPU, 1300)
	near("reclaimable memory", a.Reclaimable.Memory, 2.6*gib)
	near("budget cpu", a.Budget.CPU, 4000-2400)
	near("budget memory", a.Budget.Memory, 8*gib-(1.4*gib+gib+gib))
	// Best-effort asked for 500m and 2 GiB and uses 1800m and 3 GiB: 1300m
	// and 1 GiB of it runs on the reclaimable share.
	near("reclaimed cpu", a.Reclaimed.CPU, 1300)
	near("reclaimed memory", a.Reclaimed.Memory, gib)
	near("best-effort cpu", a.BestEffort.CPU, 1800)
}

// A job ramping its use is predicted to keep ramping: its need runs
// ahead of its usage, so the budget shrinks before the usage arrives.
func TestRampRaisesNeedAhead(t *testing.T) {
	var ramp []Usage
	for i := range 20 {
		ramp = append(ramp, Usage{CPU: 100 + 20*float64(i), Memory: gib})
	}
	j := Job{ID: "g", Tier: api.TierGuaranteed, Request: Usage{CPU: 2000, Memory: 2 * gib}, Recent: ramp}
	a := Compute(Usage{CPU: 4000, Memory: 4 * gib}, []Job{j}, Params{Margin: 0, Lead: 5})
	now := ramp[len(ramp)-1].CPU // 480
	if a.Need.CPU < now+5*20-1e-6 {
		t.Errorf("need %v for a job at %v rising 20 a reading, want at least %v (5 readings ahead)", a.Need.CPU, now, now+100)
	}
}

func TestControllerThrottlesBeforeEvicting(t *testing.T) {
	c := Controller{EvictAfter: 5 * time.Second, MinCPU: 100, MinChange: 50}
	t0 := time.Unix(1000, 0)
	be := []BestEffortJob{{ID: "old", Started: t0.Add(-time.Hour)}, {ID: "new", Started: t0.Add(-time.Minute)}}
	a := Account{Capacity: Usage{CPU: 4000, Memory: 8 * gib}, Budget: Usage{CPU: 1500, Memory: 2 * gib}, BestEffort: Usage{CPU: 2000, Memory: 3 * gib}}
	acts := c.Step(t0, a, be)
	if len(acts) != 1 || acts[0].Kind != ActThrottle || acts[0].CPUMilli != 1500 || acts[0].MemoryHigh != 2<<30 {
		t.Fatalf("first step %+v, want one throttle to 1500m and 2 GiB", acts)
	}
	for s := 1; s < 5; s++ {
		if acts := c.Step(t0.Add(time.Duration(s)*time.Second), a, be); len(acts) != 0 {
			t.Fatalf("%d s after the throttle: %+v, want nothing before evict_after", s, acts)
		}
	}
	acts = c.Step(t0.Add(5*time.Second), a, be)
	if len(acts) != 1 || acts[0].Kind != ActEvict || acts[0].JobID != "new" {
		t.Fatalf("at evict_after: %+v, want the newest best-effort job evicted", acts)
	}
	if acts := c.Step(t0.Add(7*time.Second), a, be[:1]); len(acts) != 0 {
		t.Fatalf("a second eviction 2 s after the first: %+v", acts)
	}
	// Under budget again: nothing is evicted, however long.
	a.BestEffort.Memory = gib
	for s := 10; s < 30; s++ {
		if acts := c.Step(t0.Add(time.Duration(s)*time.Second), a, be[:1]); len(acts) != 0 {
			t.Fatalf("under budget at %d s: %+v", s, acts)
		}
	}
	// The high-priority jobs' need falls: the limits are lifted.
	a.Budget = a.Capacity
	acts = c.Step(t0.Add(time.Minute), a, be[:1])
	if len(acts) != 1 || acts[0].Kind != ActThrottle || acts[0].CPUMilli != 0 || acts[0].MemoryHigh != 0 {
		t.Fatalf("budget back to the whole host: %+v, want the limits lifted", acts)
	}
}

func TestControllerFloorAndSmallChanges(t *testing.T) {
	c := Controller{EvictAfter: time.Second, MinCPU: 100, MinChange: 50}
	a := Account{Capacity: Usage{CPU: 4000, Memory: 8 * gib}, Budget: Usage{CPU: 0, Memory: 8 * gib}}
	if acts := c.Step(time.Unix(0, 0), a, nil); len(acts) != 1 || acts[0].CPUMilli != 100 {
		t.Fatalf("a zero CPU budget: %+v, want the 100m floor", acts)
	}
	a.Budget.CPU = 120
	if acts := c.Step(time.Unix(1, 0), a, nil); len(acts) != 0 {
		t.Fatalf("a 20m change: %+v, want none written", acts)
	}
	// Over budget with no best-effort job: nothing to evict.
	a.BestEffort.Memory, a.Budget.Memory = 9*gib, gib
	for s := 2; s < 10; s++ {
		for _, act := range c.Step(time.Unix(int64(s), 0), a, nil) {
			if act.Kind == ActEvict {
				t.Fatalf("evicted %+v with no best-effort jobs", act)
			}
		}
	}
}

// What guaranteed and burstable jobs reserved but do not use is lent to
// each best-effort job beyond its request; it shrinks with the need.
func TestControllerLendsReclaimableCPU(t *testing.T) {
	c := Controller{EvictAfter: time.Second, MinCPU: 100, MinChange: 50}
	a := Account{Capacity: Usage{CPU: 4000, Memory: 8 * gib}, Budget: Usage{CPU: 3300, Memory: 8 * gib}, Reclaimable: Usage{CPU: 1300}}
	acts := c.Step(time.Unix(0, 0), a, nil)
	if len(acts) != 1 || acts[0].LendCPU != 1300 || acts[0].CPUMilli != 3300 {
		t.Fatalf("actions %+v, want 1300m lent under a 3300m tier budget", acts)
	}
	a.Reclaimable.CPU, a.Budget.CPU = 200, 2200
	acts = c.Step(time.Unix(1, 0), a, nil)
	if len(acts) != 1 || acts[0].LendCPU != 200 || acts[0].CPUMilli != 2200 {
		t.Fatalf("after the need rose: %+v, want 200m lent under 2200m", acts)
	}
	if _, _, lend := c.Limits(); lend != 200 {
		t.Errorf("lent %d", lend)
	}
}

// The jobs placed on reclaimed capacity are evicted first (the newest of
// them), even when a job on unreserved capacity started later.
func TestEvictsReclaimedFirst(t *testing.T) {
	c := Controller{EvictAfter: time.Second, MinCPU: 100, MinChange: 50}
	t0 := time.Unix(1000, 0)
	be := []BestEffortJob{
		{ID: "lent-old", Started: t0.Add(-time.Hour), OnReclaimed: true},
		{ID: "lent-new", Started: t0.Add(-30 * time.Minute), OnReclaimed: true},
		{ID: "own", Started: t0.Add(-time.Minute)},
	}
	a := Account{Capacity: Usage{CPU: 4000, Memory: 8 * gib}, Budget: Usage{CPU: 1500, Memory: 2 * gib}, BestEffort: Usage{CPU: 2000, Memory: 3 * gib}}
	c.Step(t0, a, be)
	acts := c.Step(t0.Add(time.Second), a, be)
	if len(acts) != 1 || acts[0].Kind != ActEvict || acts[0].JobID != "lent-new" || !strings.Contains(acts[0].Reason, "evicted from reclaimed capacity") {
		t.Fatalf("eviction %+v, want lent-new, the newest job on reclaimed capacity, with a reason saying so", acts)
	}
	acts = c.Step(t0.Add(2*time.Second), a, be[2:])
	if len(acts) != 1 || acts[0].JobID != "own" || strings.Contains(acts[0].Reason, "reclaimed capacity") {
		t.Fatalf("with no job on reclaimed capacity left: %+v, want own evicted", acts)
	}
}

// offerHost is a Host of one burstable job and one best-effort job placed
// on reclaimed capacity, with fixed readings.
type offerHost struct{ evicted []string }

func (h *offerHost) Capacity() Usage { return Usage{CPU: 4000, Memory: 4 * gib} }
func (h *offerHost) Running() []Job {
	idle := []Usage{{CPU: 100, Memory: 0.5 * gib}, {CPU: 100, Memory: 0.5 * gib}}
	return []Job{
		{ID: "svc", Tier: api.TierBurstable, Request: Usage{CPU: 2000, Memory: 2 * gib}, Recent: idle},
		{ID: "be", Tier: api.TierBestEffort, Request: Usage{CPU: 1000, Memory: gib}, Recent: idle[:1], Placed: Usage{CPU: 1000, Memory: gib}},
	}
}
func (h *offerHost) Limit(int64, int64) error { return nil }
func (h *offerHost) Lend(int64) error         { return nil }
func (h *offerHost) Evict(id, _ string) error { h.evicted = append(h.evicted, id); return nil }
func (h *offerHost) Publish(api.Event)        {}

// Every step offers the account to placement, and the status says what
// jobs placed on reclaimed capacity hold; stopping withdraws the offer.
func TestLoopOffersReclaimable(t *testing.T) {
	var offered []Account
	l, err := New(Config{Params: Params{Margin: 0.1, Lead: 1}, Offer: func(a Account) { offered = append(offered, a) }}, &offerHost{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Step()
	if len(offered) != 1 {
		t.Fatalf("%d offers after a step, want 1", len(offered))
	}
	// need = 100 + 0.1·2000 = 300m, 0.5 Gi + 0.2 Gi: 1700m and 1.3 Gi reclaimable.
	if r := offered[0].Reclaimable; math.Abs(r.CPU-1700) > 1e-6 || math.Abs(r.Memory-1.3*gib) > 1 {
		t.Errorf("offered reclaimable %+v, want 1700m and 1.3 GiB", r)
	}
	if st := l.Status(); st.PlacedCPU != 1000 || st.PlacedMemory != api.Bytes(gib) {
		t.Errorf("status placed %v CPU and %v memory, want 1000m and 1Gi", st.PlacedCPU, st.PlacedMemory.Human())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Run(ctx)
	if last := offered[len(offered)-1]; last.Reclaimable != (Usage{}) {
		t.Errorf("after the loop stopped the last offer is %+v, want nothing reclaimable", last.Reclaimable)
	}
}

// unfollowedHost runs a burstable job that uses most of its memory and a
// best-effort job with no readings (the telemetry bus does not follow it:
// its bound was reached), which the kernel counts at tierMemory.
type unfollowedHost struct {
	offerHost
	tierMemory float64
}

func (h *unfollowedHost) Running() []Job {
	busy := []Usage{{CPU: 500, Memory: 2.5 * gib}, {CPU: 500, Memory: 2.5 * gib}}
	out := []Job{{ID: "svc", Tier: api.TierBurstable, Request: Usage{CPU: 2000, Memory: 3 * gib}, Recent: busy}}
	if len(h.evicted) == 0 {
		out = append(out, Job{ID: "be", Tier: api.TierBestEffort, Request: Usage{CPU: 500}, Started: time.Unix(100, 0)})
	} else {
		h.tierMemory = 0 // the tier's cgroup is empty
	}
	return out
}

// A best-effort job with no readings is not counted as using nothing:
// with the tier's memory read from the kernel, the tier over its budget
// (4 GiB − the service's 2.8 GiB need) is throttled and the job evicted
// after evict_after; counting only the readings, it never would be.
func TestUnfollowedBestEffortJobCountsByTier(t *testing.T) {
	for _, withTier := range []bool{false, true} {
		h := &unfollowedHost{tierMemory: 2 * gib}
		now := time.Unix(1000, 0)
		cfg := Config{Params: Params{Margin: 0.1, Lead: 1}, EvictAfter: time.Second, MinCPU: 100, Now: func() time.Time { return now }}
		reads := 0
		if withTier {
			cfg.BestEffortMemory = func() (float64, error) { reads++; return h.tierMemory, nil }
		}
		l, err := New(cfg, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		var beMem api.Bytes
		for range 4 {
			l.Step()
			now = now.Add(time.Second)
			if len(h.evicted) == 0 {
				beMem = l.Status().BestEffortMemory
			}
		}
		if withTier && beMem != api.Bytes(2*gib) {
			t.Errorf("best-effort memory before the eviction %s, want the tier's 2Gi", beMem.Human())
		}
		st := l.Status()
		switch {
		case withTier && (len(h.evicted) != 1 || h.evicted[0] != "be" || reads != 4):
			t.Errorf("with the tier's memory: evicted %v, %d reads; want be evicted once, 4 reads", h.evicted, reads)
		case !withTier && (len(h.evicted) != 0 || st.BestEffortMemory != 0):
			t.Errorf("readings only: evicted %v, best-effort memory %s; want the hazard the tier reading removes: nothing evicted, 0", h.evicted, st.BestEffortMemory.Human())
		}
	}
}

// A failing tier read keeps the readings' sum and the loop running.
func TestTierMemoryReadFails(t *testing.T) {
	h := &unfollowedHost{}
	l, err := New(Config{Params: Params{Margin: 0.1, Lead: 1}, EvictAfter: time.Second,
		BestEffortMemory: func() (float64, error) { return 0, fmt.Errorf("memory.current: permission denied") }}, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Step()
	l.Step()
	if st := l.Status(); st.BestEffortMemory != 0 || len(h.evicted) != 0 {
		t.Errorf("status %+v, evicted %v", st, h.evicted)
	}
}

// A job's task profile floors its predicted peak: a job that used 3 GiB
// and 1500m at its p95 in past runs, now at 1 GiB and 500m early in a run,
// lends only what lies above its profile's peak (plus the margin); a
// prior below the current use changes nothing, and a job not measured yet
// still lends nothing.
func TestProfilePriorFloorsPeak(t *testing.T) {
	capacity := Usage{CPU: 4000, Memory: 8 * gib}
	job := Job{ID: "g", Tier: api.TierGuaranteed, Request: Usage{CPU: 2000, Memory: 4 * gib}, Recent: flat(Usage{CPU: 500, Memory: gib}, 10)}
	p := Params{Margin: 0.1, Lead: 5}
	without := Compute(capacity, []Job{job}, p)
	job.Prior = Usage{CPU: 1500, Memory: 3 * gib}
	with := Compute(capacity, []Job{job}, p)
	if math.Abs(without.Reclaimable.Memory-2.6*gib) > 1 || math.Abs(with.Reclaimable.Memory-0.6*gib) > 1 {
		t.Fatalf("reclaimable memory %v without a prior, %v with, want 2.6 and 0.6 GiB", without.Reclaimable.Memory/gib, with.Reclaimable.Memory/gib)
	}
	if math.Abs(with.Reclaimable.CPU-300) > 1e-6 {
		t.Fatalf("reclaimable CPU with a prior %v, want 2000 − (1500 + 200) = 300", with.Reclaimable.CPU)
	}
	job.Prior = Usage{CPU: 100, Memory: 0.5 * gib}
	if low := Compute(capacity, []Job{job}, p); low.Reclaimable != without.Reclaimable {
		t.Fatalf("a prior below use changed the account: %+v, want %+v", low.Reclaimable, without.Reclaimable)
	}
	job.Recent = nil
	if a := Compute(capacity, []Job{job}, p); a.Reclaimable != (Usage{}) {
		t.Fatalf("unmeasured job with a prior lends %+v", a.Reclaimable)
	}
}
