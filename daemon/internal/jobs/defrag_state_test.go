package jobs

import (
	"log/slog"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/store"
	"github.com/fusiond/fusiond/daemon/sched"
)

// fakeDefragmenter places nothing and plans to move every job it is
// offered; it records what it was offered, pinned and unpinned.
type fakeDefragmenter struct {
	offered  [][]string
	pinned   []MovePlan
	unpinned []string
}

func (f *fakeDefragmenter) Admit(api.JobSpec) error { return nil }
func (f *fakeDefragmenter) Place([]*api.Job) ([]api.Allocation, string, bool) {
	return nil, "does not fit", false
}
func (f *fakeDefragmenter) Release(*api.Job)             {}
func (f *fakeDefragmenter) Capacity() api.NodeResources  { return api.NodeResources{} }
func (f *fakeDefragmenter) Allocated() api.NodeResources { return api.NodeResources{} }
func (f *fakeDefragmenter) Pin(p MovePlan)               { f.pinned = append(f.pinned, p) }
func (f *fakeDefragmenter) Unpin(ids []string)           { f.unpinned = append(f.unpinned, ids...) }
func (f *fakeDefragmenter) PlanMoves(j *api.Job, movable []string, budget int) (MovePlan, error) {
	f.offered = append(f.offered, slices.Clone(movable))
	if len(movable) == 0 {
		return MovePlan{}, ErrNoMoves
	}
	p := MovePlan{For: j.ID, Why: "test", Pins: map[string]sched.Assignment{j.ID: {}}}
	for _, id := range movable {
		p.Moves = append(p.Moves, JobMove{ID: id})
		p.Pins[id] = sched.Assignment{}
	}
	return p, nil
}

// fakeProc is a running process that records its signals.
type fakeProc struct{ signals []syscall.Signal }

func (p *fakeProc) PID() int                        { return 1 }
func (p *fakeProc) Wait() (api.ExitStatus, error)   { select {} }
func (p *fakeProc) Signal(sig syscall.Signal) error { p.signals = append(p.signals, sig); return nil }

// defragManager is a manager over f with defragmentation on and a store
// (closed when closed is set, so every write fails), its queue state set
// up as a first pass leaves it.
func defragManager(t *testing.T, f *fakeDefragmenter, closed bool) *Manager {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if closed {
		st.Close()
	} else {
		t.Cleanup(func() { st.Close() })
	}
	m := New(Config{Queue: QueueConfig{Defrag: DefragConfig{Enabled: true, MaxMoves: 4, Window: time.Hour, MinInterval: time.Hour}}},
		st, nil, f, slog.New(slog.DiscardHandler))
	q := &m.queue
	q.epoch, q.queuedAt, q.preempting = time.Now(), map[string]time.Time{}, map[string]string{}
	q.moving, q.madeRoom, q.budget = map[string]string{}, map[string]string{}, newMoveBudget(m.cfg.Queue.Defrag)
	return m
}

// running adds a running movable job of tier to m, with a fake process.
func running(m *Manager, id string, tier api.Tier) *fakeProc {
	p := &fakeProc{}
	m.jobs[id] = &api.Job{ID: id, Tier: tier, State: api.StateRunning, Spec: api.JobSpec{Tier: tier, Movable: true}}
	m.procs[id] = p
	return p
}

// A move whose mark cannot be stored changes nothing: no budget spent, no
// job queued ahead, no room claimed, no pins, no signal.
func TestDefragFailedMarkChangesNothing(t *testing.T) {
	f := &fakeDefragmenter{}
	m := defragManager(t, f, true)
	p := running(m, "1", api.TierBurstable)
	head := &api.Job{ID: "2", Tier: api.TierBurstable, State: api.StatePending}
	m.jobs[head.ID] = head
	if s := m.defrag(head); s != "" {
		t.Errorf("defrag says %q, want nothing", s)
	}
	q := &m.queue
	if left := q.budget.left(time.Now()); left != 4 || len(q.moving) != 0 || len(q.madeRoom) != 0 || q.preemptor != "" || len(f.pinned) != 0 || len(p.signals) != 0 {
		t.Errorf("after a failed mark: budget left %d (want 4), moving %v, made room %v, preemptor %q, pins %v, signals %v; want all untouched",
			left, q.moving, q.madeRoom, q.preemptor, f.pinned, p.signals)
	}
	if m.jobs["1"].MovingFor != "" {
		t.Errorf("job 1 marked moving for %q", m.jobs["1"].MovingFor)
	}
}

// Defragmentation moves only jobs of the head's tier or below: a
// best-effort head is offered none of the movable burstable and
// guaranteed jobs, a burstable head the burstable and best-effort ones.
func TestDefragOnlyAtOrBelowHeadTier(t *testing.T) {
	f := &fakeDefragmenter{}
	m := defragManager(t, f, false)
	running(m, "1", api.TierGuaranteed)
	running(m, "2", api.TierBurstable)
	running(m, "3", api.TierBestEffort)
	be := &api.Job{ID: "10", Tier: api.TierBestEffort, State: api.StatePending}
	m.jobs[be.ID] = be
	m.defrag(be)
	if len(f.offered) != 1 || !slices.Equal(f.offered[0], []string{"3"}) {
		t.Fatalf("best-effort head: offered %v, want only [3]", f.offered)
	}
	if m.jobs["3"].MovingFor != "10" || m.jobs["1"].MovingFor != "" || m.jobs["2"].MovingFor != "" {
		t.Errorf("marks: 1 %q, 2 %q, 3 %q; want only 3 moving for 10", m.jobs["1"].MovingFor, m.jobs["2"].MovingFor, m.jobs["3"].MovingFor)
	}
	if got := f.pinned; len(got) != 1 || len(got[0].Pins) != 2 {
		t.Errorf("pins %+v; want the head's and job 3's", got)
	}
}

// A moved job queued again keeps its place ahead of the queue and its pin
// only while the head it made room for waits: once the head is gone the
// queue forgets the move and the placer drops both pins.
func TestDefragForgetsMoveWhenHeadGone(t *testing.T) {
	f := &fakeDefragmenter{}
	m := defragManager(t, f, false)
	m.jobs["1"] = &api.Job{ID: "1", Tier: api.TierBurstable, State: api.StatePending, Spec: api.JobSpec{Movable: true}}
	m.jobs["10"] = &api.Job{ID: "10", Tier: api.TierBurstable, State: api.StateCancelled}
	q := &m.queue
	q.moving["1"], q.madeRoom["10"] = "10", "room made by moving 1 (test)"
	m.schedule()
	if len(q.moving) != 0 || len(q.madeRoom) != 0 {
		t.Errorf("after the head is gone: moving %v, made room %v; want both forgotten", q.moving, q.madeRoom)
	}
	slices.Sort(f.unpinned)
	if !slices.Equal(f.unpinned, []string{"1", "10"}) {
		t.Errorf("unpinned %v, want [1 10]", f.unpinned)
	}

	// While the head waits the moved job keeps both.
	f.unpinned = nil
	m.jobs["10"].State = api.StatePending
	q.moving["1"], q.madeRoom["10"] = "10", "room made by moving 1 (test)"
	m.schedule()
	if q.moving["1"] != "10" || len(f.unpinned) != 0 {
		t.Errorf("head waiting: moving %v, unpinned %v; want the move kept", q.moving, f.unpinned)
	}
}

// A head's shadow time only moves earlier while it is head: a later one
// computed by a pass, or none, keeps the earliest; another head, or a
// pass with none, starts afresh.
func TestEarliestShadow(t *testing.T) {
	m := defragManager(t, &fakeDefragmenter{}, false)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	for i, c := range []struct {
		head   string
		t      time.Time
		ok     bool
		want   time.Time
		wantOK bool
	}{
		{"1", at(10), true, at(10), true},
		{"1", at(12), true, at(10), true}, // later: the earlier kept
		{"1", at(8), true, at(8), true},   // earlier: taken
		{"1", time.Time{}, false, at(8), true},
		{"2", at(15), true, at(15), true}, // another head
		{"", time.Time{}, false, time.Time{}, false},
		{"2", at(20), true, at(20), true}, // head again after none: afresh
		{"3", time.Time{}, false, time.Time{}, false},
	} {
		got, ok := m.earliestShadow(c.head, c.t, c.ok)
		if ok != c.wantOK || !got.Equal(c.want) {
			t.Errorf("pass %d (head %q, shadow %v %v): %v %v, want %v %v", i, c.head, c.t, c.ok, got, ok, c.want, c.wantOK)
		}
	}
}
