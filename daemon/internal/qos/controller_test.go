package qos

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/ebpf"
)

func params() Params {
	return Params{MinMilli: 200, Shrink: 0.5, RestoreStep: 500, RestoreAfter: 3 * time.Second, MinEvents: 10, MinMemory: 64 << 20}
}

func sample(p99 time.Duration) Sample {
	return Sample{JobID: "job-1", RunqueueP99: 2 * time.Millisecond, P99: p99, Events: 100}
}

// step runs one window over a pool of poolMilli and commits every action
// (the host applied them all).
func step(c *Controller, now time.Time, samples []Sample, beMem, poolMilli int64) []Action {
	acts := c.Step(now, samples, beMem, poolMilli)
	for _, a := range acts {
		c.Commit(now, a)
	}
	return acts
}

// A synthetic breach on a fake clock: the quota halves every breaching
// window down to the floor, holds while healthy for less than the restore
// period, then comes back one step per period until the cap is removed.
func TestControllerShrinksAndRestores(t *testing.T) {
	c, err := NewController(params())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	tick := func(s Sample) []Action {
		now = now.Add(time.Second)
		return step(c, now, []Sample{s}, 0, 4000)
	}
	if acts := tick(sample(time.Millisecond)); len(acts) != 0 || c.Quota() != 0 {
		t.Fatalf("healthy start: %+v, quota %d", acts, c.Quota())
	}
	var quotas []int64
	for range 6 {
		acts := tick(sample(5 * time.Millisecond))
		if c.Quota() > 200 && (len(acts) != 1 || acts[0].JobID != "job-1" || !strings.Contains(acts[0].Reason, "p99 5ms > SLO 2ms")) {
			t.Fatalf("breach: actions %+v", acts)
		}
		quotas = append(quotas, c.Quota())
	}
	want := []int64{2000, 1000, 500, 250, 200, 200}
	for i := range want {
		if quotas[i] != want[i] {
			t.Fatalf("quotas while breaching %v, want %v", quotas, want)
		}
	}
	// Too few events: no measurement, no action, but no health either
	// before the restore period.
	if acts := tick(Sample{JobID: "job-1", RunqueueP99: 2 * time.Millisecond, P99: time.Second, Events: 3}); len(acts) != 0 {
		t.Fatalf("a window of 3 events acted: %+v", acts)
	}
	if acts := tick(sample(time.Millisecond)); len(acts) != 0 {
		t.Fatalf("restored before the healthy period: %+v", acts)
	}
	acts := tick(sample(time.Millisecond))
	if len(acts) != 1 || acts[0].CPUMilli != 700 || acts[0].JobID != "" {
		t.Fatalf("after 3 s healthy: %+v (quota %d), want one restore to 700m", acts, c.Quota())
	}
	// One step per period.
	for range 2 {
		if acts := tick(sample(time.Millisecond)); len(acts) != 0 {
			t.Fatalf("restored twice within a period: %+v", acts)
		}
	}
	for c.Quota() != 0 {
		tick(sample(time.Millisecond))
		if now.After(time.Unix(1100, 0)) {
			t.Fatalf("quota never removed: %d", c.Quota())
		}
	}
	// A breach during the restore starts shrinking from where it is (the
	// pool); 3 ms over an SLO of 2 ms overshoots by half: half the cut.
	if acts := tick(sample(3 * time.Millisecond)); len(acts) != 1 || c.Quota() != 3000 {
		t.Fatalf("breach after restore: %+v quota %d", acts, c.Quota())
	}
}

func TestControllerMemoryPressure(t *testing.T) {
	c, err := NewController(params())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	psi := 12.5
	s := Sample{JobID: "svc", PSISomeAvg10: 5, MemoryPSI: &psi}
	acts := step(c, now, []Sample{s}, 1<<30, 4000)
	if len(acts) != 1 || acts[0].Kind != "memory" || acts[0].MemoryHigh != 512<<20 || !strings.Contains(acts[0].Reason, "12.50% > SLO 5.00%") {
		t.Fatalf("memory breach: %+v", acts)
	}
	if c.Quota() != 0 {
		t.Errorf("memory pressure moved the CPU quota to %d", c.Quota())
	}
	low := 1.0
	s.MemoryPSI = &low
	now = now.Add(4 * time.Second)
	acts = step(c, now, []Sample{s}, 400<<20, 4000)
	if len(acts) != 1 || acts[0].Kind != "memory" || acts[0].MemoryHigh != 0 {
		t.Fatalf("after the healthy period: %+v", acts)
	}
}

func TestParamsValidate(t *testing.T) {
	p := params()
	p.Shrink = 1
	if _, err := NewController(p); err == nil || !strings.Contains(err.Error(), "shrink") {
		t.Errorf("shrink 1: %v", err)
	}
	p = params()
	p.MinMilli = 0
	if _, err := NewController(p); err == nil || !strings.Contains(err.Error(), "min best-effort quota") {
		t.Errorf("no floor: %v", err)
	}
	p = params()
	p.MinBlame = 1
	if _, err := NewController(p); err == nil || !strings.Contains(err.Error(), "min blame") {
		t.Errorf("min blame 1: %v", err)
	}
	p = params()
	p.BreachWindows = -1
	if _, err := NewController(p); err == nil || !strings.Contains(err.Error(), "breach windows") {
		t.Errorf("breach windows -1: %v", err)
	}
}

// An action the host did not apply moves nothing: the controller stays
// where the cgroup is and plans the same change again next window, and a
// restore it was not told of is not taken as done either.
func TestControllerStateOnlyAfterCommit(t *testing.T) {
	c, err := NewController(params())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	for range 3 { // three failed writes
		now = now.Add(time.Second)
		acts := c.Step(now, []Sample{sample(5 * time.Millisecond)}, 0, 4000)
		if len(acts) != 1 || acts[0].CPUMilli != 2000 {
			t.Fatalf("breach with nothing applied: %+v, want a shrink to 2000m again", acts)
		}
		if c.Quota() != 0 {
			t.Fatalf("quota %d after a failed write, want none", c.Quota())
		}
	}
	now = now.Add(time.Second)
	if acts := step(c, now, []Sample{sample(5 * time.Millisecond)}, 0, 4000); len(acts) != 1 || c.Quota() != 2000 {
		t.Fatalf("applied shrink: %+v, quota %d", acts, c.Quota())
	}
	// Healthy past the period: a restore is planned; unapplied, the quota
	// stays and the restore is planned again the next window.
	now = now.Add(4 * time.Second)
	for range 2 {
		now = now.Add(time.Second)
		acts := c.Step(now, []Sample{sample(time.Millisecond)}, 0, 4000)
		if len(acts) != 1 || acts[0].Op != "restore" || acts[0].CPUMilli != 2500 || c.Quota() != 2000 {
			t.Fatalf("restore not applied: %+v, quota %d", acts, c.Quota())
		}
	}
}

// The quota is cut from the shared pool of the window: with half the
// host's cores held exclusively the first shrink halves what is left, the
// floor is at most the pool, and a restore reaching the pool removes the
// quota.
func TestControllerCutsTheSharedPool(t *testing.T) {
	c, err := NewController(params())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	acts := step(c, now, []Sample{sample(5 * time.Millisecond)}, 0, 2000)
	if len(acts) != 1 || c.Quota() != 1000 || !strings.Contains(acts[0].Reason, "of a 2000m shared pool") {
		t.Fatalf("shrink over a 2-CPU pool: %+v, quota %d; want 1000m", acts, c.Quota())
	}
	// The guaranteed job ends: the pool is 4 CPUs again; health restores
	// 1000 → 1500 → … and removes the quota once it reaches the pool.
	var quotas []int64
	for i := 0; c.Quota() != 0 && i < 100; i++ {
		now = now.Add(time.Second)
		if len(step(c, now, []Sample{sample(time.Millisecond)}, 0, 4000)) > 0 {
			quotas = append(quotas, c.Quota())
		}
	}
	if want := []int64{1500, 2000, 2500, 3000, 3500, 0}; !slices.Equal(quotas, want) {
		t.Fatalf("restores %v, want %v", quotas, want)
	}
	// A pool below the floor: the floor is the pool, and nothing is cut
	// from a pool already at it.
	now = now.Add(time.Second)
	if acts := step(c, now, []Sample{sample(5 * time.Millisecond)}, 0, 300); len(acts) != 1 || c.Quota() != 200 {
		t.Fatalf("shrink over a 300m pool: %+v, quota %d; want 200m", acts, c.Quota())
	}
	c2, _ := NewController(params())
	if acts := step(c2, now, []Sample{sample(5 * time.Millisecond)}, 0, 150); len(acts) != 0 || c2.Quota() != 0 {
		t.Fatalf("a pool under the floor was cut: %+v, quota %d", acts, c2.Quota())
	}
	// The pool shrank below a quota: the quota limits nothing, so the
	// next shrink cuts the pool, not the quota.
	c3, _ := NewController(params())
	step(c3, now, []Sample{sample(5 * time.Millisecond)}, 0, 4000) // 2000m
	now = now.Add(time.Second)
	if step(c3, now, []Sample{sample(5 * time.Millisecond)}, 0, 1000); c3.Quota() != 500 {
		t.Fatalf("shrink after the pool fell under the quota: quota %d, want 500m", c3.Quota())
	}
}

// blamed is a breaching sample whose wait is charged be ns to best-effort
// and out ns to outside.
func blamed(be, out uint64) Sample {
	s := sample(5 * time.Millisecond)
	s.Blame[ebpf.RunnerBestEffort], s.Blame[ebpf.RunnerOutside] = be, out
	return s
}

// The cut follows best-effort's share of the wait: all of it halves the
// quota, a quarter cuts an eighth, less than MinBlame cuts nothing; and
// the p99's overshoot: just over the SLO cuts little.
func TestControllerCutsInProportionToBlame(t *testing.T) {
	p := params()
	p.MinBlame = 0.1
	for _, tc := range []struct {
		be, out uint64
		want    int64
	}{{100, 0, 2000}, {25, 75, 3500}, {5, 95, 0}, {0, 0, 2000}} {
		c, err := NewController(p)
		if err != nil {
			t.Fatal(err)
		}
		acts := step(c, time.Unix(1000, 0), []Sample{blamed(tc.be, tc.out)}, 0, 4000)
		if c.Quota() != tc.want {
			t.Errorf("best-effort %d, outside %d: quota %dm, want %dm (actions %+v)", tc.be, tc.out, c.Quota(), tc.want, acts)
		}
		if tc.be+tc.out > 0 && tc.want > 0 && !strings.Contains(acts[0].Reason, "the wait: ") {
			t.Errorf("shrink reason %q does not say whose the wait was", acts[0].Reason)
		}
	}
	c, _ := NewController(p)
	just := blamed(100, 0)
	just.P99 = 2200 * time.Microsecond // 10% over
	if step(c, time.Unix(1000, 0), []Sample{just}, 0, 4000); c.Quota() != 3800 {
		t.Errorf("p99 10%% over its SLO, all best-effort's: quota %dm, want 3800m", c.Quota())
	}
	// Of two breaching jobs, the one best-effort delayed most decides.
	c, _ = NewController(p)
	other := blamed(10, 90)
	other.JobID = "job-2"
	acts := step(c, time.Unix(1000, 0), []Sample{other, blamed(80, 20)}, 0, 4000)
	if len(acts) != 1 || acts[0].JobID != "job-1" || c.Quota() != 2400 {
		t.Errorf("two breaching jobs: actions %+v, quota %d; want job-1's cut to 2400m", acts, c.Quota())
	}
}

// A breach best-effort did not cause writes nothing, is noted once per
// RestoreAfter, and does not hold back the restore of a quota an earlier,
// best-effort breach set.
func TestControllerSparesBestEffortForOthersBreaches(t *testing.T) {
	p := params()
	p.MinBlame = 0.1
	c, err := NewController(p)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	step(c, now, []Sample{blamed(100, 0)}, 0, 4000)
	if c.Quota() != 2000 {
		t.Fatalf("quota %d after a best-effort breach", c.Quota())
	}
	var spares, restores int
	for range 10 {
		now = now.Add(time.Second)
		for _, a := range step(c, now, []Sample{blamed(1, 99)}, 0, 4000) {
			switch a.Op {
			case "spare":
				spares++
				if a.JobID != "job-1" || !strings.Contains(a.Reason, "not throttled") || !strings.Contains(a.Reason, "outside 99%") {
					t.Errorf("spare %+v", a)
				}
			case "restore":
				restores++
			default:
				t.Errorf("outside breach: %+v", a)
			}
		}
	}
	// Spares at 1 s, 4 s, 7 s, 10 s; restores at 3 s, 6 s, 9 s (each
	// RestoreAfter since the last change).
	if spares != 4 || restores != 3 || c.Quota() != 3500 {
		t.Errorf("10 s of outside breaches: %d spares, %d restores, quota %d; want 4, 3 and 3500m", spares, restores, c.Quota())
	}
}

func TestDescribeBlame(t *testing.T) {
	var b [ebpf.Runners]uint64
	if got := DescribeBlame(b); got != "not attributed" {
		t.Errorf("empty: %q", got)
	}
	b[ebpf.RunnerOutside], b[ebpf.RunnerBestEffort], b[ebpf.RunnerIdle], b[ebpf.RunnerKernel] = 850, 100, 45, 5
	if got, want := DescribeBlame(b), "outside 85%, besteffort 10%, idle 4%"; got != want {
		t.Errorf("DescribeBlame %q, want %q", got, want)
	}
}

// With BreachWindows 2, one breaching window cuts nothing (and restores
// nothing); the second in a row cuts; a healthy window between starts the
// count again.
func TestControllerWaitsForBreachWindows(t *testing.T) {
	p := params()
	p.BreachWindows = 2
	c, err := NewController(p)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	tick := func(s Sample) []Action {
		now = now.Add(time.Second)
		return step(c, now, []Sample{s}, 0, 4000)
	}
	var quotas []int64
	for _, p99 := range []time.Duration{5, 1, 5, 1, 5, 5, 5} {
		tick(sample(p99 * time.Millisecond))
		quotas = append(quotas, c.Quota())
	}
	if want := []int64{0, 0, 0, 0, 0, 2000, 1000}; !slices.Equal(quotas, want) {
		t.Errorf("quotas %v, want %v", quotas, want)
	}
}
