package handover_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
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

// fakePeers is an Overflow over scripted peers: each Offer goes to the
// next peer of order; a peer's polls answer its script, one entry a
// poll, the last one repeated (an error entry: unreachable).
type fakePeers struct {
	mu      sync.Mutex
	order   []string
	scripts map[string][]pollAnswer
	polls   map[string]int
	offered []string // keys
	cancels []string // peers
}

type pollAnswer struct {
	st  handover.RemoteStatus
	err error
}

func (f *fakePeers) Offer(_ context.Context, local string, job api.Job) (api.Handover, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.order) == 0 {
		return api.Handover{}, errors.New("no peer has room")
	}
	p := f.order[0]
	f.order = f.order[1:]
	f.offered = append(f.offered, "me/"+local)
	return api.Handover{Key: "me/" + local, Peer: p, Address: p + ":1", RemoteID: "r" + job.ID, Why: "ranked first"}, nil
}

func (f *fakePeers) Poll(_ context.Context, h api.Handover, _ int64) (handover.RemoteStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.scripts[h.Peer]
	i := min(f.polls[h.Peer], len(s)-1)
	f.polls[h.Peer]++
	a := s[i]
	a.st.ID = h.RemoteID
	if i > 0 && s[i-1].st.State == a.st.State {
		a.st.Log = nil // output comes once
	}
	return a.st, a.err
}

func (f *fakePeers) Cancel(_ context.Context, h api.Handover) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancels = append(f.cancels, h.Peer)
	return nil
}

var unreachable = pollAnswer{err: errors.New("connection refused")}

// newOverflowManager is newManager with peers: every class is offered
// after budget; a peer unreachable for 300ms is lost.
func newOverflowManager(t *testing.T, capacity api.NodeResources, o handover.Overflow, budget time.Duration) (*node, string) {
	t.Helper()
	dir := t.TempDir()
	runner := jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mgr := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}, st,
		runner, jobstest.Placer(capacity.CPU, capacity.Memory), slog.New(slog.DiscardHandler))
	b := map[api.Class]time.Duration{}
	for _, c := range api.Classes {
		b[c] = budget
	}
	// nobody (uid 65534) stands for a regular user of the host here;
	// the policy's own rules are admission's tests.
	m := withPeers(mgr, o, handover.Config{Budget: b, Poll: 20 * time.Millisecond, Lost: 300 * time.Millisecond, Retry: 50 * time.Millisecond},
		jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}})
	jobstest.Run(t, m)
	return m, filepath.Join(dir, "logs")
}

func remote(s api.State, log string) pollAnswer {
	a := pollAnswer{st: handover.RemoteStatus{State: s, Attempt: 1, PID: 7, Log: []byte(log)}}
	if s.Terminal() {
		a.st.Exit = &api.ExitStatus{}
		a.st.Reason = "exit code 0"
	}
	return a
}

func reasons(j api.Job) string {
	var out []string
	for _, e := range j.Events {
		out = append(out, string(e.To)+": "+e.Reason)
	}
	return strings.Join(out, "\n")
}

// A job too big for this host goes to a peer; the peer is lost before the
// job started there: it is queued again and goes to the next peer, where
// it runs; its output lands in the origin's log.
func TestHandoverPeerLostBeforeStartIsReplaced(t *testing.T) {
	f := &fakePeers{order: []string{"p1", "p2"}, polls: map[string]int{}, scripts: map[string][]pollAnswer{
		"p1": {remote(api.StatePlaced, ""), unreachable},
		"p2": {remote(api.StateRunning, "hello\n"), remote(api.StateRunning, ""), remote(api.StateSucceeded, "bye\n")},
	}}
	m, logs := newOverflowManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30}, f, time.Hour)
	j := submit(t, m, api.JobSpec{Name: "big", Class: api.ClassBatch, Command: []string{"true"}, Resources: api.Resources{CPU: 4000}})
	j = waitFor(t, m, j.ID, state(api.StateSucceeded))
	if j.Handover == nil || j.Handover.Peer != "p2" {
		t.Fatalf("handover %+v\n%s", j.Handover, reasons(j))
	}
	r := reasons(j)
	for _, want := range []string{"handed over to peer p1: cannot run on this host", "peer p1 unreachable", "it had not started there: queued again",
		"handed over to peer p2", "running on peer p2 as job r" + j.ID, "succeeded: on peer p2"} {
		if !strings.Contains(r, want) {
			t.Errorf("events lack %q:\n%s", want, r)
		}
	}
	if len(f.offered) != 2 || f.offered[0] == f.offered[1] {
		t.Errorf("offered keys %v: want two different keys", f.offered)
	}
	if len(f.cancels) == 0 || f.cancels[0] != "p1" {
		t.Errorf("the lost peer was not told to cancel: %v", f.cancels)
	}
	out, err := os.ReadFile(filepath.Join(logs, j.ID, "output.log"))
	if err != nil || string(out) != "hello\nbye\n" {
		t.Errorf("origin's log %q, %v", out, err)
	}
}

// A peer lost after the job started there: lost without a restart
// policy; queued again (and run elsewhere) with one.
func TestHandoverPeerLostAfterStartFollowsRestartPolicy(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprint("restart=", restart), func(t *testing.T) {
			f := &fakePeers{order: []string{"p1", "p2"}, polls: map[string]int{}, scripts: map[string][]pollAnswer{
				"p1": {remote(api.StateRunning, "part\n"), unreachable},
				"p2": {remote(api.StateSucceeded, "")},
			}}
			m, _ := newOverflowManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30}, f, time.Hour)
			spec := api.JobSpec{Name: "big", Class: api.ClassTraining, Command: []string{"true"}, Resources: api.Resources{CPU: 4000}}
			if restart {
				spec.Restart = &api.Restart{Policy: api.RestartOnFailure, MaxRetries: 1}
			}
			j := submit(t, m, spec)
			want := api.StateLost
			if restart {
				want = api.StateSucceeded
			}
			j = waitFor(t, m, j.ID, state(want))
			r := reasons(j)
			if !restart && !strings.Contains(r, "after it started there; its restart policy does not run it again") {
				t.Errorf("events:\n%s", r)
			}
			if restart && (!strings.Contains(r, "restarting (retry 1 of 1)") || j.Handover.Peer != "p2" || j.Attempt != 2) {
				t.Errorf("attempt %d, handover %+v, events:\n%s", j.Attempt, j.Handover, r)
			}
		})
	}
}

// A job that fits waits its budget here before it is offered; a peer
// refusing everything leaves it queued with the refusals as its reason.
func TestHandoverOnlyAfterBudgetAndRefusalsShow(t *testing.T) {
	f := &fakePeers{polls: map[string]int{}}
	m, _ := newOverflowManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30}, f, 200*time.Millisecond)
	hog := submit(t, m, api.JobSpec{Name: "hog", Class: api.ClassBatch, Command: []string{"sleep", "30"}, Resources: api.Resources{CPU: 1000}})
	waitFor(t, m, hog.ID, state(api.StateRunning))
	j := submit(t, m, api.JobSpec{Name: "waits", Class: api.ClassBatch, Command: []string{"true"}, Resources: api.Resources{CPU: 1000}})
	j = waitFor(t, m, j.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "no peer took it: no peer has room") })
	if j.State != api.StatePending {
		t.Fatalf("job is %s", j.State)
	}
	if _, err := m.Cancel(context.Background(), root, hog.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, m, j.ID, state(api.StateSucceeded)) // placed here once there is room
}

// The peer side: a handed-over job runs as the user of the same name
// here, a user this host lacks is refused, root is refused (by default), a key offered again gets the
// same job, and a job that does not fit now is refused and leaves no
// record.
func TestAcceptHandover(t *testing.T) {
	m, _ := newOverflowManager(t, api.NodeResources{CPU: 2000, Memory: 1 << 30}, &fakePeers{polls: map[string]int{}}, time.Hour)
	spec := api.JobSpec{Name: "x", Class: api.ClassBatch, Command: []string{"sleep", "30"}, Resources: api.Resources{CPU: 2000, Memory: 16 << 20}}
	from := api.Provenance{Node: "o", JobID: "5", Key: "o/5#2"}
	var ref *admission.Refusal
	if _, err := m.AcceptHandover(context.Background(), jobs.Offer{From: from, User: "no-such-user-fusiond"}, spec); !errors.As(err, &ref) || !strings.Contains(ref.Why, "no user") {
		t.Fatalf("unknown user: %v", err)
	}
	// A peer's certificate never means root here unless the config says so.
	if _, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "4", Key: "o/4#1"}, User: "root"}, spec); !errors.As(err, &ref) || ref.Rule != admission.RuleRoot {
		t.Fatalf("a root job from a peer: %v, want it refused", err)
	}
	j, err := m.AcceptHandover(context.Background(), jobs.Offer{From: from, User: "nobody"}, spec)
	if err != nil {
		t.Fatal(err)
	}
	if j.Owner.User != "nobody" || j.Owner.UID != 65534 || j.Origin == nil || j.Origin.Key != from.Key || j.State == api.StatePending || j.State.Terminal() {
		t.Fatalf("accepted job %+v", j)
	}
	again, err := m.AcceptHandover(context.Background(), jobs.Offer{From: from, User: "nobody"}, spec)
	if err != nil || again.ID != j.ID {
		t.Fatalf("the same key again: %s, %v (first %s)", again.ID, err, j.ID)
	}
	waitFor(t, m, j.ID, state(api.StateRunning))
	if _, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "6", Key: "o/6#2"}, User: "nobody"}, spec); !errors.As(err, &ref) {
		t.Fatalf("a job that does not fit now: %v", err)
	}
	if ids, _, _ := m.ListPage(context.Background(), root, api.ListOptions{}); len(ids) != 1 {
		t.Fatalf("jobs after a refusal: %v", ids)
	}
	if got, ok := m.AcceptedByKey(from.Key); !ok || got.ID != j.ID || len(m.Accepted()) != 1 {
		t.Fatalf("AcceptedByKey %+v %v; Accepted %d", got, ok, len(m.Accepted()))
	}
}

// A held gang member is placed but not started until its commit; one not
// committed within its hold is released; an aborted one too.
func TestHeldGangMembers(t *testing.T) {
	m, _ := newOverflowManager(t, api.NodeResources{CPU: 4000, Memory: 1 << 30}, &fakePeers{polls: map[string]int{}}, time.Hour)
	spec := api.JobSpec{Name: "m", Class: api.ClassTraining, Command: []string{"true"}, Resources: api.Resources{CPU: 1000, Memory: 16 << 20}}
	held, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "1", Key: "o/1#1"}, User: "nobody", Hold: time.Minute}, spec)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if j, _ := m.Get(context.Background(), root, held.ID); j.State != api.StatePlaced {
		t.Fatalf("a held member is %s before its commit", j.State)
	}
	// An origin that predates the start barrier commits without one: the
	// member starts at its commit.
	if started, err := m.CommitHeld("o/1#1", 0); err != nil || !started {
		t.Fatalf("commit without a barrier: started %v, %v", started, err)
	}
	waitFor(t, m, held.ID, state(api.StateSucceeded))
	if started, err := m.CommitHeld("o/1#1", 0); err != nil || !started {
		t.Errorf("a second commit: started %v, %v", started, err)
	}

	expires, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "2", Key: "o/2#1"}, User: "nobody", Hold: 100 * time.Millisecond}, spec)
	if err != nil {
		t.Fatal(err)
	}
	j := waitFor(t, m, expires.ID, state(api.StateCancelled))
	if !strings.Contains(j.Reason, "not committed within") {
		t.Errorf("expired hold: %s", j.Reason)
	}
	if _, err := m.CommitHeld("o/2#1", time.Second); !errors.Is(err, handover.ErrNotHeld) || !strings.Contains(err.Error(), "not committed within") {
		t.Errorf("commit after the hold ended: %v", err)
	}

	aborted, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "3", Key: "o/3#1"}, User: "nobody", Hold: time.Minute}, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !m.ReleaseHeld("o/3#1", "its gang was aborted by the origin") || m.ReleaseHeld("o/3#1", "again") {
		t.Fatal("ReleaseHeld did not release exactly once")
	}
	if j := waitFor(t, m, aborted.ID, state(api.StateCancelled)); j.Reason != "its gang was aborted by the origin: released, never started" {
		t.Errorf("aborted: %s", j.Reason)
	}
	// Released members gave their CPUs back: four 1-CPU members fit.
	for i := range 4 {
		if _, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: fmt.Sprint(10 + i), Key: fmt.Sprintf("o/%d#1", 10+i)}, User: "nobody", Hold: time.Minute}, spec); err != nil {
			t.Fatalf("member %d after the releases: %v", i, err)
		}
	}
}

// fakeGangPeers reserves a gang's members on p1 and p2 in turn.
type fakeGangPeers struct {
	*fakePeers
	reserved, committed int
	fail                string
}

func (f *fakeGangPeers) ReserveGang(_ context.Context, locals []string, members []api.Job) ([]api.Handover, error) {
	f.fakePeers.mu.Lock()
	fail := f.fail
	f.fakePeers.mu.Unlock()
	if fail != "" {
		return nil, errors.New(fail)
	}
	var hs []api.Handover
	for i, j := range members {
		p := []string{"p1", "p2"}[i%2]
		hs = append(hs, api.Handover{Key: "me/" + locals[i], Peer: p, Address: p + ":1", RemoteID: "r" + j.ID, Why: "held"})
	}
	f.reserved += len(hs)
	return hs, nil
}

func (f *fakeGangPeers) CommitMember(context.Context, api.Handover) (bool, error) {
	f.committed++
	return false, nil
}

func (f *fakeGangPeers) StartMember(context.Context, api.Handover) error { return nil }

func (f *fakeGangPeers) ReleaseMember(context.Context, api.Handover, string) error { return nil }

// A gang bigger than this host goes to peers whole or stays queued.
func TestGangHandedOverWhole(t *testing.T) {
	f := &fakeGangPeers{fakePeers: &fakePeers{polls: map[string]int{}, scripts: map[string][]pollAnswer{
		"p1": {remote(api.StateSucceeded, "")}, "p2": {remote(api.StateSucceeded, "")},
	}}, fail: "member 2 of 2: no peer has room"}
	m, _ := newOverflowManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30}, f, 0)
	gang := &api.Gang{Name: "g", Size: 2}
	a := submit(t, m, api.JobSpec{Name: "g0", Class: api.ClassTraining, Command: []string{"true"}, Resources: api.Resources{CPU: 1000}, Gang: gang})
	b := submit(t, m, api.JobSpec{Name: "g1", Class: api.ClassTraining, Command: []string{"true"}, Resources: api.Resources{CPU: 1000}, Gang: gang})
	j := waitFor(t, m, a.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "could not be reserved across peers") })
	if j.State != api.StatePending || f.committed != 0 {
		t.Fatalf("after a failed reservation: %s, %d committed", j.State, f.committed)
	}
	f.fakePeers.mu.Lock()
	f.fail = ""
	f.fakePeers.mu.Unlock()
	ja := waitFor(t, m, a.ID, state(api.StateSucceeded))
	jb := waitFor(t, m, b.ID, state(api.StateSucceeded))
	if f.committed != 2 || ja.Handover == nil || jb.Handover == nil || ja.Handover.Peer == jb.Handover.Peer ||
		!strings.Contains(ja.Handover.Why, "gang of 2 did not fit here") {
		t.Fatalf("committed %d; handovers %+v %+v", f.committed, ja.Handover, jb.Handover)
	}
}

// A restarted origin resumes following its handed-over jobs (and records
// them lost when it runs without peers now); a stopping one that stops
// its jobs asks the peers to cancel them.
func TestHandoverSurvivesOriginRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	open := func(o handover.Overflow) *node {
		mgr := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second, LeaveJobsRunning: true}, st,
			jobstest.Runner(t, filepath.Join(dir, "logs"), time.Second), jobstest.Placer(1000, 1<<30), slog.New(slog.DiscardHandler))
		m := &node{Manager: mgr}
		if o != nil {
			m = withPeers(mgr, o, handover.Config{Budget: map[api.Class]time.Duration{api.ClassBatch: 0}, Poll: 20 * time.Millisecond, Lost: time.Hour}, jobs.PeerPolicy{})
		}
		if err := m.Recover(); err != nil {
			t.Fatal(err)
		}
		m.Start()
		return m
	}
	stop := func(m *node) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Stop(ctx)
	}
	running := &fakePeers{order: []string{"p1", "p1"}, polls: map[string]int{}, scripts: map[string][]pollAnswer{"p1": {remote(api.StateRunning, "")}}}
	m := open(running)
	spec := api.JobSpec{Name: "big", Class: api.ClassBatch, Command: []string{"true"}, Resources: api.Resources{CPU: 4000, Memory: 16 << 20}}
	a := submit(t, m, spec)
	b := submit(t, m, spec)
	waitFor(t, m, a.ID, state(api.StateRunning))
	waitFor(t, m, b.ID, state(api.StateRunning))
	stop(m) // leaves them running there

	done := &fakePeers{polls: map[string]int{}, scripts: map[string][]pollAnswer{"p1": {remote(api.StateSucceeded, "")}}}
	m = open(done)
	if j := waitFor(t, m, a.ID, state(api.StateSucceeded)); j.Handover == nil || j.Handover.Peer != "p1" {
		t.Fatalf("after the restart: %+v", j.Handover)
	}
	stop(m)

	// b too finished, per the restarted daemon; now a daemon without
	// peers over a record still handed over.
	j, err := st.GetJob(b.ID)
	if err != nil || j.State != api.StateSucceeded {
		t.Fatalf("b after the restart: %s, %v", j.State, err)
	}
	j.State, j.Version = api.StateRunning, j.Version+1
	j.FinishedAt = nil
	if err := st.PutJob(j); err != nil {
		t.Fatal(err)
	}
	m = open(nil)
	if j := waitFor(t, m, b.ID, state(api.StateLost)); !strings.Contains(j.Reason, "runs without peers") {
		t.Errorf("without peers: %s", j.Reason)
	}
	stop(m)
}

// A daemon that stops its jobs when it stops asks the peers to cancel
// the jobs it handed over.
func TestStopCancelsHandedOverJobs(t *testing.T) {
	f := &fakePeers{order: []string{"p1"}, polls: map[string]int{}, scripts: map[string][]pollAnswer{"p1": {remote(api.StateRunning, "")}}}
	t.Cleanup(func() { // runs after the manager's Stop
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.cancels) != 1 || f.cancels[0] != "p1" {
			t.Errorf("cancels sent on stop: %v", f.cancels)
		}
	})
	m, _ := newOverflowManager(t, api.NodeResources{CPU: 1000, Memory: 1 << 30}, f, time.Hour)
	j := submit(t, m, api.JobSpec{Name: "big", Class: api.ClassBatch, Command: []string{"true"}, Resources: api.Resources{CPU: 4000}})
	waitFor(t, m, j.ID, state(api.StateRunning))
}
