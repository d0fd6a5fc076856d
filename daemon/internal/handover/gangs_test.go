package handover_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// holder is a peer's job manager that holds gang members; its runner
// (fakeRunner) records every start.
type holder struct {
	name string
	m    *node
	r    *fakeRunner
}

func newHolder(t *testing.T, name string, cpu api.MilliCPU) *holder {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &holder{name: name, r: &fakeRunner{started: map[string]*fakeProc{}}}
	h.m = h.open(t, st, filepath.Join(dir, "logs"), cpu)
	return h
}

// open starts a manager over st that takes hand-overs (and offers none).
func (h *holder) open(t *testing.T, st *store.Store, logs string, cpu api.MilliCPU) *node {
	m := withPeers(jobs.New(jobs.Config{LogDir: logs, CancelGrace: time.Second}, st, h.r, jobstest.Placer(cpu, 1<<30), slog.New(slog.DiscardHandler)),
		&fakePeers{polls: map[string]int{}}, handover.Config{}, jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}})
	jobstest.Run(t, m)
	t.Cleanup(h.exitAll) // before the Stop: it waits for them
	return m
}

// starts is how many times the holder's runner started a job.
func (h *holder) starts() int {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	return len(h.r.started)
}

// exitAll ends every started job with exit code 0.
func (h *holder) exitAll() {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	for _, p := range h.r.started {
		select {
		case p.exit <- api.ExitStatus{}:
		default:
		}
	}
}

func (h *holder) job(t *testing.T, key string) api.Job {
	t.Helper()
	j, ok := h.m.AcceptedByKey(key)
	if !ok {
		t.Fatalf("%s holds no job of key %s", h.name, key)
	}
	return j
}

// holders is a GangOverflow whose "peers" are holders' managers, called
// directly where the peer API would call them: the origin's commitGang
// runs as it does over the wire. Member i goes to holder i mod n;
// attempts after the first find no room, so a failed gang is tried once.
type holders struct {
	hs      []*holder
	barrier time.Duration
	// beforeCommit runs before member i's commit; afterCommit after it.
	beforeCommit, afterCommit func(i int)

	mu       sync.Mutex
	attempts int
	calls    []string // "commit 1", "start 2", "release 1"
	index    map[string]int
}

func (w *holders) of(h api.Handover) *holder {
	for _, x := range w.hs {
		if x.name == h.Peer {
			return x
		}
	}
	panic("no holder " + h.Peer)
}

func (w *holders) note(what string, h api.Handover) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, fmt.Sprintf("%s %d", what, w.index[h.Key]+1))
}

func (w *holders) Calls() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.calls, ", ")
}

func (w *holders) Offer(context.Context, string, api.Job) (api.Handover, error) {
	return api.Handover{}, errors.New("gangs only")
}

func (w *holders) Poll(_ context.Context, h api.Handover, _ int64) (handover.RemoteStatus, error) {
	j, ok := w.of(h).m.AcceptedByKey(h.Key)
	if !ok {
		return handover.RemoteStatus{}, handover.ErrRemoteGone
	}
	return handover.RemoteStatus{ID: j.ID, State: j.State, Reason: j.Reason, Attempt: j.Attempt, PID: j.PID, Exit: j.Exit}, nil
}

func (w *holders) Cancel(ctx context.Context, h api.Handover) error {
	x := w.of(h)
	if j, ok := x.m.AcceptedByKey(h.Key); ok && !j.State.Terminal() {
		_, err := x.m.Cancel(ctx, root, j.ID)
		return err
	}
	return nil
}

func (w *holders) ReserveGang(_ context.Context, locals []string, members []api.Job) ([]api.Handover, error) {
	w.mu.Lock()
	w.attempts++
	again := w.attempts > 1
	if w.index == nil {
		w.index = map[string]int{}
	}
	w.mu.Unlock()
	if again {
		return nil, errors.New("no room left (the test reserves a gang once)")
	}
	var out []api.Handover
	for i, j := range members {
		x := w.hs[i%len(w.hs)]
		key := "o/" + locals[i]
		got, err := x.m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: j.ID, Key: key}, User: "nobody", Hold: time.Minute}, j.Spec)
		if err != nil {
			return nil, err
		}
		w.mu.Lock()
		w.index[key] = i
		w.mu.Unlock()
		out = append(out, api.Handover{Key: key, Peer: x.name, Address: x.name + ":1", RemoteID: got.ID, Why: "held"})
	}
	return out, nil
}

func (w *holders) CommitMember(_ context.Context, h api.Handover) (bool, error) {
	w.mu.Lock()
	i := w.index[h.Key]
	w.mu.Unlock()
	if w.beforeCommit != nil {
		w.beforeCommit(i)
	}
	w.note("commit", h)
	started, err := w.of(h).m.CommitHeld(h.Key, w.barrier)
	if w.afterCommit != nil {
		w.afterCommit(i)
	}
	return started, err
}

func (w *holders) StartMember(_ context.Context, h api.Handover) error {
	w.note("start", h)
	return w.of(h).m.StartCommitted(h.Key)
}

func (w *holders) ReleaseMember(ctx context.Context, h api.Handover, why string) error {
	w.note("release", h)
	if w.of(h).m.ReleaseHeld(h.Key, why) {
		return nil
	}
	return w.Cancel(ctx, h)
}

// submitGang submits a gang of n members of cpu each to the origin.
func submitGang(t *testing.T, m *node, name string, n int, cpu api.MilliCPU) []api.Job {
	var out []api.Job
	for i := range n {
		out = append(out, submit(t, m, api.JobSpec{Name: fmt.Sprintf("%s%d", name, i), Class: api.ClassTraining, Command: []string{"true"},
			Resources: api.Resources{CPU: cpu, Memory: 16 << 20}, Gang: &api.Gang{Name: name, Size: n}}))
	}
	return out
}

// A gang whose last commit fails (its holder's operator cancelled the
// held member between the reservation and the commit): no member ever
// started anywhere; the member that had committed is released with a
// reason naming the failed commit, and the gang waits on the origin.
func TestGangLastCommitFailsNothingStarts(t *testing.T) {
	h1, h2 := newHolder(t, "h1", 2000), newHolder(t, "h2", 2000)
	w := &holders{hs: []*holder{h1, h2}, barrier: 10 * time.Second}
	var committed1 api.Job
	w.beforeCommit = func(i int) {
		if i != 1 {
			return
		}
		committed1 = h1.job(t, firstKey(t, h1))
		for _, j := range h2.m.Accepted() {
			if _, err := h2.m.Cancel(context.Background(), root, j.ID); err != nil {
				t.Errorf("cancelling the held member on h2: %v", err)
			}
		}
	}
	m, _ := newOverflowManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30}, w, 0)
	gang := submitGang(t, m, "g", 2, 1000)
	j := waitFor(t, m, gang[0].ID, func(j api.Job) bool { return strings.Contains(j.Reason, "could not be committed") })
	for _, want := range []string{"the commit of member 2 of 2 on peer h2 failed", "while it was held for its gang", "no member started, every member was released"} {
		if !strings.Contains(j.Reason, want) {
			t.Errorf("the origin's reason lacks %q: %s", want, j.Reason)
		}
	}
	if got := w.Calls(); got != "commit 1, commit 2, release 1, release 2" {
		t.Errorf("calls %q, want both commits, then both released and no start", got)
	}
	if committed1.State != api.StatePlaced || !strings.Contains(reasons(committed1), "committed with its gang by origin o; waiting up to 10s") {
		t.Errorf("member 1 before the second commit: %s\n%s", committed1.State, reasons(committed1))
	}
	time.Sleep(200 * time.Millisecond) // anything that were to start, would have
	for _, x := range w.hs {
		if n := x.starts(); n != 0 {
			t.Errorf("%s's runner started %d jobs", x.name, n)
		}
	}
	r1 := h1.job(t, firstKey(t, h1))
	if r1.State != api.StateCancelled || r1.Attempt != 0 || r1.StartedAt != nil ||
		!strings.Contains(r1.Reason, "its gang was aborted by the origin: the commit of member 2 of 2 on peer h2 failed") ||
		!strings.HasSuffix(r1.Reason, "released, never started") {
		t.Errorf("h1's member: %s, attempt %d: %s", r1.State, r1.Attempt, r1.Reason)
	}
	r2 := h2.job(t, firstKey(t, h2))
	if r2.State != api.StateCancelled || r2.Attempt != 0 || !strings.Contains(r2.Reason, "cancelled by root") {
		t.Errorf("h2's member: %s, attempt %d: %s", r2.State, r2.Attempt, r2.Reason)
	}
	for _, g := range gang {
		if o, _ := m.Get(context.Background(), root, g.ID); o.State != api.StatePending {
			t.Errorf("origin's member %s is %s", g.ID, o.State)
		}
	}
}

// firstKey is the key of the one job h was handed.
func firstKey(t *testing.T, h *holder) string {
	t.Helper()
	page, _, err := h.m.ListPage(context.Background(), root, api.ListOptions{})
	if err != nil || len(page) != 1 {
		t.Fatalf("%s holds %d jobs (%v)", h.name, len(page), err)
	}
	j := page[0]
	if j.Origin == nil {
		t.Fatalf("%s's job %s has no origin", h.name, j.ID)
	}
	return j.Origin.Key
}

// The happy path: every member is committed (and stays placed, not
// started) before any starts; then all start.
func TestGangStartsOnlyAfterEveryCommit(t *testing.T) {
	hs := []*holder{newHolder(t, "h1", 2000), newHolder(t, "h2", 2000), newHolder(t, "h3", 2000)}
	w := &holders{hs: hs, barrier: 10 * time.Second}
	var early []string
	w.afterCommit = func(i int) {
		time.Sleep(50 * time.Millisecond) // a start that were due now would come meanwhile
		for _, x := range hs {
			if n := x.starts(); n != 0 {
				early = append(early, fmt.Sprintf("%s started %d jobs after commit %d", x.name, n, i+1))
			}
			for _, j := range x.m.Accepted() {
				if j.State != api.StatePlaced {
					early = append(early, fmt.Sprintf("%s's member is %s after commit %d", x.name, j.State, i+1))
				}
			}
		}
	}
	m, _ := newOverflowManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30}, w, 0)
	gang := submitGang(t, m, "g", 3, 1000)
	for _, g := range gang {
		waitFor(t, m, g.ID, state(api.StateRunning))
	}
	if len(early) > 0 {
		t.Errorf("members started before the last commit: %v", early)
	}
	if got := w.Calls(); !strings.HasPrefix(got, "commit 1, commit 2, commit 3, start ") || strings.Count(got, "start") != 3 || strings.Contains(got, "release") {
		t.Errorf("calls %q, want three commits, then three starts", got)
	}
	for _, x := range hs {
		if n := x.starts(); n != 1 {
			t.Errorf("%s started %d jobs, want 1", x.name, n)
		}
		x.exitAll()
	}
	for _, g := range gang {
		j := waitFor(t, m, g.ID, state(api.StateSucceeded))
		if j.Handover == nil || !strings.Contains(j.Handover.Why, "committed by every holder, then started") {
			t.Errorf("member %s: %+v", g.ID, j.Handover)
		}
	}
}

// On a holder: a committed member that hears no start within its barrier
// is released without running; a start after that, or before a commit,
// is refused; a second commit is answered as the first.
func TestCommittedGangMemberReleasedAtBarrier(t *testing.T) {
	h := newHolder(t, "h", 4000)
	spec := api.JobSpec{Name: "m", Class: api.ClassTraining, Command: []string{"true"}, Resources: api.Resources{CPU: 1000, Memory: 16 << 20},
		Gang: &api.Gang{Name: "g", Size: 2}}
	a, err := h.m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "1", Key: "o/1#1"}, User: "nobody", Hold: time.Minute}, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.StartCommitted("o/1#1"); !errors.Is(err, handover.ErrNotCommitted) {
		t.Errorf("a start before the commit: %v", err)
	}
	for range 2 {
		if started, err := h.m.CommitHeld("o/1#1", 300*time.Millisecond); err != nil || started {
			t.Fatalf("commit: started %v, %v", started, err)
		}
	}
	if j := h.job(t, "o/1#1"); j.State != api.StatePlaced || !strings.Contains(reasons(j), "placed: committed with its gang by origin o; waiting up to 300ms") {
		t.Fatalf("committed member: %s\n%s", j.State, reasons(j))
	}
	j := waitFor(t, h.m, a.ID, state(api.StateCancelled))
	if !strings.Contains(j.Reason, "the origin's start did not come within its 300ms start barrier: released, never started") {
		t.Errorf("released at the barrier: %s", j.Reason)
	}
	if err := h.m.StartCommitted("o/1#1"); !errors.Is(err, handover.ErrNotHeld) || !strings.Contains(err.Error(), "start barrier") {
		t.Errorf("a start after the barrier: %v", err)
	}
	if n := h.starts(); n != 0 || j.Attempt != 0 {
		t.Errorf("the runner started %d jobs; attempt %d", n, j.Attempt)
	}
	// Its CPUs came back: four members fit again.
	for i := range 4 {
		if _, err := h.m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: fmt.Sprint(10 + i), Key: fmt.Sprintf("o/%d#1", 10+i)}, User: "nobody", Hold: time.Minute}, spec); err != nil {
			t.Fatalf("member %d after the release: %v", i, err)
		}
	}
}

// A holder restarted while it holds a gang member (held or committed)
// releases it rather than queueing it to run without its gang.
func TestHeldGangMemberReleasedOnRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &holder{name: "h", r: &fakeRunner{started: map[string]*fakeProc{}}}
	logs := filepath.Join(dir, "logs")
	m := withPeers(jobs.New(jobs.Config{LogDir: logs, CancelGrace: time.Second, LeaveJobsRunning: true}, st, h.r, jobstest.Placer(4000, 1<<30), slog.New(slog.DiscardHandler)),
		&fakePeers{polls: map[string]int{}}, handover.Config{}, jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}})
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	m.Start()
	spec := api.JobSpec{Name: "m", Class: api.ClassTraining, Command: []string{"true"}, Resources: api.Resources{CPU: 1000, Memory: 16 << 20},
		Gang: &api.Gang{Name: "g", Size: 2}}
	held, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "1", Key: "o/1#1"}, User: "nobody", Hold: time.Minute}, spec)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "2", Key: "o/2#1"}, User: "nobody", Hold: time.Minute}, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CommitHeld("o/2#1", time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	m.Stop(ctx)
	cancel()
	m = h.open(t, st, logs, 4000)
	for _, id := range []string{held.ID, committed.ID} {
		j := waitFor(t, m, id, state(api.StateCancelled))
		if !strings.Contains(j.Reason, "restarted while the member was held for its gang: released, never started") {
			t.Errorf("member %s after the restart: %s", id, j.Reason)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n := h.starts(); n != 0 {
		t.Errorf("the runner started %d jobs", n)
	}
	if err := m.StartCommitted("o/2#1"); !errors.Is(err, handover.ErrNotHeld) {
		t.Errorf("a start after the restart: %v", err)
	}
}
