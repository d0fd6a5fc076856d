package jobs_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/reclaim"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// reclaimHost is the reclaim loop's view of a manager and its placer, as
// the daemon's (daemon/reclaim.go), with fake telemetry: each job's usage
// is what the test sets.
type reclaimHost struct {
	m *jobs.Manager
	p *hostplacer.Placer

	mu        sync.Mutex
	usage     map[string]reclaim.Usage
	published []api.Event
}

func (h *reclaimHost) set(id string, u reclaim.Usage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.usage[id] = u
}

func (h *reclaimHost) Capacity() reclaim.Usage {
	c := h.p.Capacity()
	return reclaim.Usage{CPU: float64(c.CPU), Memory: float64(c.Memory)}
}

func (h *reclaimHost) Running() []reclaim.Job {
	h.mu.Lock()
	defer h.mu.Unlock()
	placed := h.p.OnReclaimed()
	var out []reclaim.Job
	for _, j := range h.m.Running() {
		rj := reclaim.Job{ID: j.ID, Tier: j.Tier, Request: reclaim.Usage{CPU: float64(j.Spec.Resources.CPU), Memory: float64(j.Spec.Resources.Memory)}}
		rj.Started = j.StartedAt
		if u, ok := h.usage[j.ID]; ok {
			rj.Recent = []reclaim.Usage{u, u, u}
		}
		if b, ok := placed[j.ID]; ok {
			rj.Placed = reclaim.Usage{CPU: float64(b.CPU), Memory: float64(b.Memory)}
		}
		out = append(out, rj)
	}
	return out
}

func (h *reclaimHost) Limit(int64, int64) error { return nil }
func (h *reclaimHost) Lend(int64) error         { return nil }
func (h *reclaimHost) Evict(id, reason string) error {
	return h.m.EvictReclaimed(id, reason)
}
func (h *reclaimHost) Publish(ev api.Event) {
	h.mu.Lock()
	h.published = append(h.published, ev)
	h.mu.Unlock()
	h.m.PublishReclaim(ev)
}

// A best-effort job that fits only on what a burstable service reserved
// and does not use is placed there; when the service's usage rises the
// job is throttled, then evicted, and goes back to pending (restart
// on-failure), where it waits: nothing is reclaimable any more.
func TestBestEffortOnReclaimedCapacityEvicted(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p := jobstest.Placer(2000, 1<<30)
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}, st,
		jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second), p, slog.New(slog.DiscardHandler))
	jobstest.Run(t, m)
	h := &reclaimHost{m: m, p: p, usage: map[string]reclaim.Usage{}}
	now := time.Unix(1_000_000, 0)
	loop, err := reclaim.New(reclaim.Config{EvictAfter: 2 * time.Second, Params: reclaim.Params{Margin: 0.1, Lead: 1},
		Now: func() time.Time { return now },
		Offer: func(a reclaim.Account) {
			p.SetReclaimable(api.MilliCPU(a.Reclaimable.CPU), api.Bytes(a.Reclaimable.Memory))
		}}, h, nil)
	if err != nil {
		t.Fatal(err)
	}

	svc := submit(t, m, api.JobSpec{Tier: api.TierBurstable, Command: []string{"sleep", "60"}, Resources: api.Resources{CPU: 1500, Memory: 768 << 20}})
	waitFor(t, m, svc.ID, state(api.StateRunning))
	h.set(svc.ID, reclaim.Usage{CPU: 100, Memory: 64 << 20})
	loop.Step()
	if st := loop.Status(); st.ReclaimableCPU < 1000 || st.ReclaimableMemory < 512<<20 {
		t.Fatalf("reclaimable %v CPU and %v memory with the service idle, want at least 1000m and 512Mi", st.ReclaimableCPU, st.ReclaimableMemory.Human())
	}
	// 500m and 256 MiB are unreserved: the job fits only on reclaimed capacity.
	be := submit(t, m, api.JobSpec{Tier: api.TierBestEffort, Command: []string{"sleep", "60"}, Resources: api.Resources{CPU: 1000, Memory: 512 << 20},
		Restart: &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 0}})
	j := waitFor(t, m, be.ID, state(api.StateRunning))
	if a := j.Allocation; a == nil || a.ReclaimedCPU != 1000 || a.ReclaimedMemory != 512<<20 {
		t.Fatalf("best-effort allocation %+v, want 1000m and 512Mi on reclaimed capacity", a)
	}
	h.set(be.ID, reclaim.Usage{CPU: 900, Memory: 500 << 20})
	now = now.Add(time.Second)
	loop.Step()
	if st := loop.Status(); st.PlacedCPU != 1000 || st.PlacedMemory != 512<<20 || st.Evictions != 0 {
		t.Fatalf("status %+v, want 1000m and 512Mi placed on reclaimed capacity, no eviction", st)
	}

	// The service ramps: the best-effort tier is throttled first ...
	h.set(svc.ID, reclaim.Usage{CPU: 1500, Memory: 760 << 20})
	now = now.Add(time.Second)
	loop.Step()
	if j, _ := m.Get(context.Background(), root, be.ID); j.State != api.StateRunning {
		t.Fatalf("best-effort job %s at the ramp, before evict_after: want it throttled, still running", j.State)
	}
	// ... and evicted once it stays over its memory budget.
	now = now.Add(2 * time.Second)
	loop.Step()
	j = waitFor(t, m, be.ID, func(j api.Job) bool { return j.State == api.StatePending && j.Preemptions == 1 })
	// Its history says why: the eviction while it ran, then back to pending.
	if !slices.ContainsFunc(j.Events, func(e api.Event) bool {
		return e.To == api.StateRunning && strings.Contains(e.Reason, "evicted from reclaimed capacity") && strings.Contains(e.Reason, "stopping")
	}) {
		t.Errorf("no event of the eviction while it ran in %+v", j.Events)
	}
	if !slices.ContainsFunc(j.Events, func(e api.Event) bool {
		return e.From == api.StateRunning && e.To == api.StatePending && strings.Contains(e.Reason, "evicted from reclaimed capacity") && strings.Contains(e.Reason, "queued again")
	}) {
		t.Errorf("no running → pending event saying it was evicted from reclaimed capacity and queued again in %+v", j.Events)
	}
	h.mu.Lock()
	published := slices.ContainsFunc(h.published, func(e api.Event) bool {
		return e.Kind == api.EventReclaim && e.JobID == be.ID && strings.Contains(e.Reason, "evicted")
	})
	h.mu.Unlock()
	if !published {
		t.Error("no reclaim event published for the eviction")
	}
	if s, _ := m.Get(context.Background(), root, svc.ID); s.State != api.StateRunning {
		t.Errorf("service %s, want it untouched", s.State)
	}
	// Nothing is reclaimable now: the job waits.
	time.Sleep(1500 * time.Millisecond)
	if j, _ := m.Get(context.Background(), root, be.ID); j.State != api.StatePending {
		t.Errorf("evicted job %s with nothing reclaimable, want it pending", j.State)
	}
	m.Cancel(context.Background(), root, svc.ID)
	m.Cancel(context.Background(), root, be.ID)
}
