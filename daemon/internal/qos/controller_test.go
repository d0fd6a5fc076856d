package qos

import (
	"strings"
	"testing"
	"time"
)

func params() Params {
	return Params{PoolMilli: 4000, MinMilli: 200, Shrink: 0.5, RestoreStep: 500, RestoreAfter: 3 * time.Second, MinEvents: 10, MinMemory: 64 << 20}
}

func sample(p99 time.Duration) Sample {
	return Sample{JobID: "job-1", RunqueueP99: 2 * time.Millisecond, P99: p99, Events: 100}
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
		return c.Step(now, []Sample{s}, 0)
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
	// A breach during the restore starts shrinking from where it is.
	if acts := tick(sample(3 * time.Millisecond)); len(acts) != 1 || c.Quota() != 2000 {
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
	acts := c.Step(now, []Sample{s}, 1<<30)
	if len(acts) != 1 || acts[0].Kind != "memory" || acts[0].MemoryHigh != 512<<20 || !strings.Contains(acts[0].Reason, "12.50% > SLO 5.00%") {
		t.Fatalf("memory breach: %+v", acts)
	}
	if c.Quota() != 0 {
		t.Errorf("memory pressure moved the CPU quota to %d", c.Quota())
	}
	low := 1.0
	s.MemoryPSI = &low
	now = now.Add(4 * time.Second)
	acts = c.Step(now, []Sample{s}, 400<<20)
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
	p.MinMilli = 5000
	if _, err := NewController(p); err == nil {
		t.Error("floor above the pool accepted")
	}
}
