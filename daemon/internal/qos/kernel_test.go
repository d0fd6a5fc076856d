package qos

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// On the real kernel (v1 here, v2 in make test-vm): a protected job that
// wakes every millisecond beside best-effort CPU hogs, with an SLO it
// cannot meet, makes the loop shrink the best-effort tier's quota to its
// floor — the kernel's cpu.cfs_quota_us / cpu.max says so, and the hogs'
// work rate falls; with a generous SLO the loop restores the quota step by
// step until it is gone.
func TestKernelLoopShrinksAndRestores(t *testing.T) {
	e := newKernelEnv(t, 10*time.Microsecond)
	startProc(t, e.svc, "wake")
	var hogs []*proc
	for range 2 * int(e.pool/1000) {
		hogs = append(hogs, startProc(t, e.be, "hog"))
	}
	work := func() uint64 {
		var n uint64
		for _, h := range hogs {
			n += h.work()
		}
		return n
	}
	rate := func(d time.Duration) float64 {
		w0, t0 := work(), time.Now()
		time.Sleep(d)
		return float64(work()-w0) / time.Since(t0).Seconds()
	}
	time.Sleep(300 * time.Millisecond)
	free := rate(time.Second)

	l, events := runLoop(t, e, Params{MinMilli: 100, Shrink: 0.5, RestoreStep: e.pool / 2, RestoreAfter: 600 * time.Millisecond, MinEvents: 20})

	deadline := time.Now().Add(15 * time.Second)
	for e.tierQuota(t) != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("best-effort quota %dm after 15 s, want the 100m floor; status %+v", e.tierQuota(t), l.Status())
		}
		time.Sleep(100 * time.Millisecond)
	}
	lat := l.JobLatency("svc")
	t.Logf("shrunk: status %+v; svc %s p99 %v", l.Status(), lat.State, lat.P99)
	held := rate(time.Second)
	t.Logf("hog work rate: %.3g/s free, %.3g/s at 100m", free, held)
	if held > free*0.5 {
		t.Errorf("hogs at a 100m quota still did %.0f%% of their free work rate", 100*held/free)
	}
	if evs := events(); len(evs) == 0 || evs[0].Kind != api.EventQoS || evs[0].JobID != "svc" || !strings.Contains(evs[0].Reason, "p99") ||
		!strings.Contains(evs[0].Reason, "the wait: ") || !strings.Contains(evs[0].Reason, "besteffort") {
		t.Errorf("first event %+v, want a qos shrink naming svc, its p99 and best-effort's share of the wait", evs)
	}

	e.setSLO(time.Second)
	deadline = time.Now().Add(15 * time.Second)
	for e.tierQuota(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("best-effort quota still %dm 15 s after the SLO was met; status %+v", e.tierQuota(t), l.Status())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Within SLO, or (under emulation, beside hogs at full speed) too few
	// events to measure — but not in breach.
	if lat := l.JobLatency("svc"); lat.State == "breach" {
		t.Errorf("svc after restore: %+v", lat)
	}
	all := events()
	last := all[len(all)-1]
	if !strings.Contains(last.Reason, "remove the best-effort CPU quota") {
		t.Errorf("last event %+v, want the quota's removal", last)
	}
}

// On the real kernel: the protected job shares its CPU with a hog in a
// cgroup outside fusiond's (best-effort work runs on another CPU). The
// wait is charged to "outside", so the loop leaves the best-effort tier
// alone and says whose breach it was, naming the hog's cgroup.
func TestKernelLoopSparesBestEffortForOutsideLoad(t *testing.T) {
	e := newKernelEnv(t, 10*time.Microsecond)
	cpus := affinityCPUs(t)
	svc := startProc(t, e.svc, "wake")
	pinProc(t, svc, cpus[0])
	outside := newOutsideCgroup(t)
	hog := startOutsideHog(t, outside)
	pinProc(t, hog, cpus[0])
	var be *proc
	if len(cpus) > 1 {
		be = startProc(t, e.be, "hog")
		pinProc(t, be, cpus[len(cpus)-1])
	}

	l, events := runLoop(t, e, Params{MinMilli: 100, Shrink: 0.5, RestoreStep: e.pool / 2, RestoreAfter: 600 * time.Millisecond, MinEvents: 20, MinBlame: 0.1})

	// A breach noted as someone else's: the spare event.
	deadline := time.Now().Add(15 * time.Second)
	var spare api.Event
	for spare.Reason == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no spare event after 15 s; status %+v, events %+v", l.Status(), events())
		}
		time.Sleep(100 * time.Millisecond)
		for _, ev := range events() {
			if strings.Contains(ev.Reason, "best-effort not throttled") {
				spare = ev
			}
		}
	}
	time.Sleep(2 * time.Second) // more windows in breach
	st := l.Status()
	t.Logf("spare: %s; status %+v", spare.Reason, st)
	if q := e.tierQuota(t); q != 0 {
		t.Errorf("best-effort quota %dm with only outside load on the job's CPU, want none", q)
	}
	for _, ev := range events() {
		if strings.Contains(ev.Reason, "shrink") {
			t.Errorf("the loop shrank best-effort for outside load: %s", ev.Reason)
		}
	}
	if spare.JobID != "svc" || !strings.Contains(spare.Reason, "outside") || !strings.Contains(spare.Reason, outside.path) {
		t.Errorf("spare event %+v, want it to name svc, outside and the hog's cgroup %s", spare, outside.path)
	}
	lat := l.JobLatency("svc")
	if lat == nil || lat.DelayedBy == nil || lat.DelayedBy.Outside <= lat.DelayedBy.BestEffort {
		t.Errorf("svc's wait by runner %+v: want outside over best-effort", lat)
	}
	found := false
	for _, o := range st.TopOutside {
		found = found || o.Cgroup == outside.path
	}
	if !found && len(st.TopOutside) > 0 {
		// The last window may have been quiet; the event named it.
		t.Logf("top outside in the last window: %+v", st.TopOutside)
	}
}

// runLoop runs a loop over e with p and a 200 ms window until the test
// ends; events returns what it published so far.
func runLoop(t *testing.T, e *kernelEnv, p Params) (l *Loop, events func() []api.Event) {
	t.Helper()
	var mu sync.Mutex
	var evs []api.Event
	l, err := New(Config{Window: 200 * time.Millisecond, Params: p, Publish: func(ev api.Event) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	}}, e.probe, e.host, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return l, func() []api.Event {
		mu.Lock()
		defer mu.Unlock()
		return append([]api.Event(nil), evs...)
	}
}
