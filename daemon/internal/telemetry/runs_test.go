package telemetry

import (
	"math"
	"testing"
	"time"
)

func TestRunSummaries(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(0, 0)}
	jobs := &fakeJobs{jobs: []JobRef{
		{ID: "1", GPUs: []GPUHold{{ID: "GPU-a", Milli: 1000}}},
		{ID: "2", GPUs: []GPUHold{{ID: "GPU-b", Milli: 300, MemMiB: 1000}}},
		{ID: "3"},
	}, usage: map[string]time.Duration{"1": 0, "2": 0, "3": 0}}
	gpus := func() []GPU {
		return []GPU{{ID: "GPU-a", SMUtil: 40, MemUsedMiB: 2000}, {ID: "GPU-b", SMUtil: 80, MemUsedMiB: 2000}}
	}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Jobs: jobs, GPUs: gpus, JobInterval: time.Second})
	// 21 job readings a second apart: the first primes the CPU counters,
	// the next 20 are folded in. Job 1 uses 100m for 19 readings and
	// 3000m for one; job 3 a steady 250m.
	for i := range 21 {
		if i > 0 {
			clk.add(time.Second)
			jobs.mu.Lock()
			d := 100 * time.Millisecond
			if i == 20 {
				d = 3 * time.Second
			}
			jobs.usage["1"] += d
			jobs.usage["2"] += 500 * time.Millisecond
			jobs.usage["3"] += 250 * time.Millisecond
			jobs.mu.Unlock()
		}
		p.advance(50)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	// Job 1 ends: its summary waits to be taken.
	jobs.mu.Lock()
	jobs.jobs = jobs.jobs[1:]
	jobs.mu.Unlock()
	clk.add(time.Second)
	p.advance(50)
	if err := b.Sample(); err != nil {
		t.Fatal(err)
	}
	s, ok := b.TakeRun("1", time.Time{})
	if !ok || s.Readings != 20 {
		t.Fatalf("job 1 summary %+v %v, want 20 readings", s, ok)
	}
	typ, peak := s.Typical(), s.Peak()
	if math.Abs(typ.CPUMilli-100) > 1e-6 || math.Abs(peak.CPUMilli-100) > 1e-6 {
		// p95 of 19 × 100 and one 3000 is 100 (the 19th of 20).
		t.Errorf("job 1 CPU typical %v peak %v, want 100 and 100", typ.CPUMilli, peak.CPUMilli)
	}
	if typ.MemMiB != 1024 || typ.GPUMilli != 400 || typ.GPUMemMiB != 2000 {
		t.Errorf("job 1 typical %+v, want 1024 MiB, 400m GPU, 2000 MiB GPU memory", typ)
	}
	if _, ok := b.TakeRun("1", time.Time{}); ok {
		t.Error("a summary taken twice")
	}
	s2, ok := b.TakeRun("2", time.Time{})
	if !ok || s2.Typical().GPUMilli != 300 || s2.Typical().GPUMemMiB != 1000 || math.Abs(s2.Peak().CPUMilli-500) > 1e-6 {
		t.Errorf("job 2 (a share) %+v %v, want 300m GPU and 1000 MiB (its share and cap), 500m CPU", s2.Typical(), ok)
	}
	// Job 3 ends and is never taken: forgotten after endedKeep.
	jobs.mu.Lock()
	jobs.jobs = nil
	jobs.mu.Unlock()
	clk.add(time.Second)
	_ = b.Sample()
	clk.add(endedKeep + time.Second)
	_ = b.Sample()
	if _, ok := b.TakeRun("3", time.Time{}); ok {
		t.Error("an ended job's summary kept past endedKeep")
	}
}

func TestEndedRunsBounded(t *testing.T) {
	b := newBus(t, Config{Proc: newFakeProc(t, 1).root})
	t0 := time.Unix(0, 0)
	for i := range endedMax + 10 {
		id := string(rune('a'+i%26)) + time.Duration(i).String()
		b.runs[id] = &RunSummary{Readings: 1}
		b.endRuns(map[string]bool{}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(b.ended) != endedMax {
		t.Fatalf("%d ended summaries kept, bound %d", len(b.ended), endedMax)
	}
	// The oldest went first.
	if _, ok := b.TakeRun("a0s", time.Time{}); ok {
		t.Error("the oldest ended summary was kept")
	}
	last := endedMax + 9
	if _, ok := b.TakeRun(string(rune('a'+last%26))+time.Duration(last).String(), time.Time{}); !ok {
		t.Error("the newest ended summary was dropped")
	}
}

// An attempt that ends without its summary being taken (preempted, moved,
// cancelled) and restarts before the bus sees the job gone leaves no
// readings in the next attempt's summary.
func TestRunSummaryPerAttempt(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(0, 0)}
	first, second := time.Unix(-100, 0), time.Unix(5, 0)
	jobs := &fakeJobs{jobs: []JobRef{{ID: "1", Started: first}}, usage: map[string]time.Duration{"1": 0}}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Jobs: jobs, JobInterval: time.Second})
	sample := func(n int, cpu time.Duration) {
		t.Helper()
		for range n {
			clk.add(time.Second)
			jobs.mu.Lock()
			jobs.usage["1"] += cpu
			jobs.mu.Unlock()
			p.advance(50)
			if err := b.Sample(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Sample(); err != nil { // primes the CPU counter
		t.Fatal(err)
	}
	sample(5, 2*time.Second) // the first attempt: 2000m
	jobs.mu.Lock()
	jobs.jobs[0].Started = second
	jobs.mu.Unlock()
	sample(3, 100*time.Millisecond) // the second: 100m
	if _, ok := b.TakeRun("1", first); ok {
		t.Error("the first attempt's summary handed over after the job restarted")
	}
	s, ok := b.TakeRun("1", second)
	if !ok || s.Readings != 3 || math.Abs(s.Peak().CPUMilli-100) > 1e-6 {
		t.Fatalf("second attempt's summary %d readings, peak %vm (%v), want 3 readings of 100m", s.Readings, s.Peak().CPUMilli, ok)
	}
	// Ended and seen gone, an attempt's summary goes to no other attempt.
	sample(2, 100*time.Millisecond)
	jobs.mu.Lock()
	jobs.jobs = nil
	jobs.mu.Unlock()
	sample(1, 0)
	if _, ok := b.TakeRun("1", time.Unix(9, 0)); ok {
		t.Error("an ended attempt's summary handed over for another attempt")
	}
	if s, ok := b.TakeRun("1", second); !ok || s.Readings != 2 {
		t.Errorf("the ended attempt's summary %d readings (%v), want 2", s.Readings, ok)
	}
}
