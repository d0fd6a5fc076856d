package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/audit"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// records is an Auditor that keeps what it is given.
type records struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (r *records) Record(rec audit.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
}

func (r *records) last() audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recs) == 0 {
		return audit.Record{}
	}
	return r.recs[len(r.recs)-1]
}

// nobody stands for a regular local user (the tests' managers let peers
// name uid 65534).
var nobody = api.Caller{UID: 65534, GID: 65534, User: "nobody"}

// admitManager is a manager with peers (none reachable) and an auditor.
func admitManager(t *testing.T, cfg jobs.Config) (*jobs.Manager, *records) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rec := &records{}
	cfg.LogDir, cfg.CancelGrace, cfg.Audit = filepath.Join(dir, "logs"), time.Second, rec
	m := jobs.New(cfg, st, jobstest.Runner(t, cfg.LogDir, time.Second), jobstest.Placer(2000, 1<<30), slog.New(slog.DiscardHandler))
	withPeers(m, handover.Config{Lost: time.Hour}, jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}})
	jobstest.Run(t, m)
	return m, rec
}

var offers atomic.Int64

// enter admits spec for nobody through src, as that source does in the
// daemon: the socket's Submit and SubmitAll, a peer's AcceptHandover
// (with a hold for a gang member), the elastic scaler's Admit.
func enter(m *jobs.Manager, src admission.Source, spec api.JobSpec) (api.Job, error) {
	ctx := context.Background()
	offer := func(hold time.Duration) jobs.Offer {
		n := offers.Add(1)
		return jobs.Offer{From: api.Provenance{Node: "o", JobID: fmt.Sprint(n), Key: fmt.Sprintf("o/%d#1", n)}, User: "nobody", Hold: hold}
	}
	switch src {
	case admission.Socket:
		return m.Submit(ctx, nobody, spec)
	case admission.Batch:
		js, err := m.SubmitAll(ctx, nobody, []api.JobSpec{spec})
		if err != nil {
			return api.Job{}, err
		}
		return js[0], nil
	case admission.Peer:
		return m.AcceptHandover(ctx, offer(0), spec)
	case admission.Gang:
		return m.AcceptHandover(ctx, offer(time.Minute), spec)
	case admission.Replica:
		js, err := m.Admit(ctx, jobs.Entry{Source: admission.Replica, Caller: nobody, Specs: []api.JobSpec{spec}})
		if err != nil {
			return api.Job{}, err
		}
		return js[0], nil
	}
	return api.Job{}, fmt.Errorf("no source %q", src)
}

func small() api.JobSpec {
	return api.JobSpec{Name: "a", Class: api.ClassBatch, Command: []string{"sleep", "30"}, Resources: api.Resources{CPU: 1000, Memory: 16 << 20}}
}

// Every rule of every admission step, against every source: each source
// is refused by the same rule with the same error, and each admission is
// audited with its source, accepted or refused.
func TestAdmissionStepsEverySource(t *testing.T) {
	type rule struct {
		name  string
		cfg   jobs.Config
		spec  func() api.JobSpec
		setup func(t *testing.T, m *jobs.Manager)
		// check judges the admission's outcome.
		check func(t *testing.T, m *jobs.Manager, src admission.Source, j api.Job, err error)
	}
	limitIs := func(limit string) func(*testing.T, *jobs.Manager, admission.Source, api.Job, error) {
		return func(t *testing.T, _ *jobs.Manager, _ admission.Source, _ api.Job, err error) {
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Limit != limit {
				t.Errorf("refused with %v, want the limit %s", err, limit)
			}
		}
	}
	rules := []rule{
		{name: "validate/spec", spec: func() api.JobSpec { s := small(); s.Command = nil; return s },
			check: func(t *testing.T, _ *jobs.Manager, _ admission.Source, _ api.Job, err error) {
				var ae *api.Error
				if !errors.As(err, &ae) || ae.Code != api.CodeInvalid || !strings.Contains(ae.Field, "command") {
					t.Errorf("refused with %v, want the field command invalid", err)
				}
			}},
		{name: "validate/max_spec_bytes", cfg: jobs.Config{Limits: jobs.Limits{MaxSpecBytes: 512}},
			spec:  func() api.JobSpec { s := small(); s.Env = map[string]string{"X": strings.Repeat("x", 1024)}; return s },
			check: limitIs(jobs.LimitMaxSpecBytes)},
		{name: "validate/never fits", spec: func() api.JobSpec { s := small(); s.Resources.CPU = 64000; return s },
			check: func(t *testing.T, _ *jobs.Manager, src admission.Source, _ api.Job, err error) {
				var ae *api.Error
				if !errors.As(err, &ae) || ae.Code != api.CodeUnsatisfiable {
					t.Errorf("refused with %v, want unsatisfiable", err)
				}
			}},
		{name: "identity/daemon uid", cfg: jobs.Config{DaemonUID: 4242},
			check: func(t *testing.T, _ *jobs.Manager, _ admission.Source, _ api.Job, err error) {
				var ae *api.Error
				if !errors.As(err, &ae) || ae.Code != api.CodeForbidden || !strings.Contains(ae.Message, "uid 4242") {
					t.Errorf("refused with %v, want forbidden: only uid 4242", err)
				}
			}},
		{name: "limits/per-user spec bytes", cfg: jobs.Config{Limits: jobs.Limits{SpecBytes: 64}}, check: limitIs(jobs.LimitSpecBytes)},
		{name: "limits/node spec budget", cfg: jobs.Config{Limits: jobs.Limits{SpecBudget: 64}}, check: limitIs(jobs.LimitSpecBudget)},
		{name: "limits/per-user pending", cfg: jobs.Config{Limits: jobs.Limits{PendingJobs: 1}},
			setup: func(t *testing.T, m *jobs.Manager) {
				// One job of nobody's runs on the whole host, one waits.
				big := small()
				big.Resources.CPU = 2000
				first, err := m.Submit(context.Background(), nobody, big)
				if err != nil {
					t.Fatal(err)
				}
				waitFor(t, m, first.ID, state(api.StateRunning))
				if _, err := m.Submit(context.Background(), nobody, big); err != nil {
					t.Fatal(err)
				}
			},
			check: limitIs(jobs.LimitPendingJobs)},
		{name: "queue/behind the head",
			setup: func(t *testing.T, m *jobs.Manager) {
				// Half the host is used; the head needs all of it and
				// holds the reservation.
				if _, err := m.Submit(context.Background(), root, small()); err != nil {
					t.Fatal(err)
				}
				head := small()
				head.Resources.CPU = 2000
				h, err := m.Submit(context.Background(), root, head)
				if err != nil {
					t.Fatal(err)
				}
				waitFor(t, m, h.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "reserved") })
			},
			check: func(t *testing.T, m *jobs.Manager, src admission.Source, j api.Job, err error) {
				time.Sleep(300 * time.Millisecond) // a few passes
				if src.FromPeer() {
					var ref *admission.Refusal
					if !errors.As(err, &ref) || ref.Rule != "queue" {
						t.Errorf("a peer's job that would delay the head: %v, want refused by the queue", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("queued: %v", err)
				}
				if got, _ := m.Get(context.Background(), root, j.ID); got.State != api.StatePending {
					t.Errorf("a job behind the head is %s (%s), want it pending", got.State, got.Reason)
				}
			}},
		{name: "accepted",
			check: func(t *testing.T, _ *jobs.Manager, src admission.Source, j api.Job, err error) {
				if err != nil || j.ID == "" || j.Owner.UID != nobody.UID {
					t.Errorf("accepted %+v, %v", j.Owner, err)
				}
				if src.FromPeer() && (j.Origin == nil || j.State == api.StatePending) {
					t.Errorf("a peer's job is %s with origin %v, want it placed", j.State, j.Origin)
				}
			}},
	}
	for _, r := range rules {
		for _, src := range admission.Sources {
			if src == admission.Kubelet {
				// Its specs are device holds, not processes: the same
				// steps are run over them in pods_test.go.
				continue
			}
			t.Run(r.name+"/"+string(src), func(t *testing.T) {
				m, rec := admitManager(t, r.cfg)
				if r.setup != nil {
					r.setup(t, m)
				}
				spec := small()
				if r.spec != nil {
					spec = r.spec()
				}
				j, err := enter(m, src, spec)
				r.check(t, m, src, j, err)
				// The audit step recorded this admission.
				got := rec.last()
				want := audit.OK
				if err != nil {
					want = audit.Refused
				}
				if got.Source != string(src) || got.Outcome != want {
					t.Errorf("audit record %+v, want source %s, outcome %s", got, src, want)
				}
				if src.FromPeer() && (got.Peer != "o" || got.Action != "peer.offer") {
					t.Errorf("a peer's admission audited as %+v, want peer o, action peer.offer", got)
				}
				if err == nil && !slices.Contains(strings.Split(got.Target, ","), j.ID) {
					t.Errorf("audit record's target %q, want job %s", got.Target, j.ID)
				}
			})
		}
	}
}

// Jobs a peer holds here are bounded per peer: jobs and spec bytes.
func TestAdmissionPeerLimits(t *testing.T) {
	m, _ := admitManager(t, jobs.Config{})
	withPeers(m, handover.Config{Lost: time.Hour},
		jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}, Limits: jobs.PeerLimits{Jobs: 1, SpecBytes: 4096}})
	tiny := small()
	tiny.Resources.CPU = 100
	if _, err := enter(m, admission.Peer, tiny); err != nil {
		t.Fatal(err)
	}
	var ae *api.Error
	if _, err := enter(m, admission.Peer, tiny); !errors.As(err, &ae) || ae.Limit != jobs.LimitPeerJobs {
		t.Fatalf("a second job of the peer: %v, want %s", err, jobs.LimitPeerJobs)
	}
	// A local submission of the same user is not counted against the peer.
	if _, err := enter(m, admission.Socket, tiny); err != nil {
		t.Fatalf("local submission: %v", err)
	}
}

// One hand-over key makes one job, however many offers of it arrive at
// once: each answer is that job (a retried offer never runs twice).
func TestAdmissionOneJobPerKey(t *testing.T) {
	m, _ := admitManager(t, jobs.Config{})
	tiny := small()
	tiny.Resources.CPU = 20
	o := jobs.Offer{From: api.Provenance{Node: "o", JobID: "1", Key: "o/1#1"}, User: "nobody"}
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Go(func() {
			if j, err := m.AcceptHandover(context.Background(), o, tiny); err == nil {
				ids[i] = j.ID
			}
		})
	}
	wg.Wait()
	live := 0
	for _, j := range m.Accepted() {
		if j.Origin.Key == o.From.Key {
			live++
		}
	}
	if live != 1 {
		t.Errorf("one hand-over key made %d jobs (answers %v)", live, ids)
	}
	for _, id := range ids {
		if id != "" && id != m.Accepted()[0].ID {
			t.Errorf("answers %v: not all the one job", ids)
		}
	}
}

// Offers in flight count against their peer's limits: 40 at once from a
// peer allowed 2 jobs leave it holding 2.
func TestAdmissionPeerLimitsConcurrent(t *testing.T) {
	m, _ := admitManager(t, jobs.Config{})
	withPeers(m, handover.Config{Lost: time.Hour},
		jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}, Limits: jobs.PeerLimits{Jobs: 2}})
	tiny := small()
	tiny.Resources.CPU, tiny.Resources.Memory = 20, 1<<20
	var ok, limited atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 40 {
		wg.Go(func() {
			<-start
			o := jobs.Offer{From: api.Provenance{Node: "evil", JobID: fmt.Sprint(i), Key: fmt.Sprintf("evil/%d#1", i)}, User: "nobody"}
			_, err := m.AcceptHandover(context.Background(), o, tiny)
			var ae *api.Error
			switch {
			case err == nil:
				ok.Add(1)
			case errors.As(err, &ae) && ae.Limit == jobs.LimitPeerJobs:
				limited.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok.Load() != 2 || limited.Load() != 38 {
		t.Errorf("accepted %d, refused by %s %d; want 2 and 38", ok.Load(), jobs.LimitPeerJobs, limited.Load())
	}
}

// A peer's job left pending by a stop or a crash (stored, no verdict yet)
// is forgotten when fusiond starts again, never queued here: a gang
// member among them never starts without its gang's commit.
func TestAdmissionPendingPeerJobForgottenAtRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now()
	spec := small()
	spec.Gang = &api.Gang{Name: "g", Size: 2}
	spec.ApplyDefaults()
	js, err := st.CreateJobs(1, func(_ int, id string) api.Job {
		return api.Job{ID: id, Spec: spec, Owner: api.Owner{UID: nobody.UID, GID: nobody.GID, User: nobody.User},
			Origin: &api.Provenance{Node: "o", JobID: "7", Key: "o/7#1g1"}, Tier: api.TierBurstable, State: api.StatePending,
			Events: []api.Event{{Time: now, To: api.StatePending, Reason: "handed over by peer o"}}, CreatedAt: now, Version: 1}
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}
	m := jobs.New(cfg, st, jobstest.Runner(t, cfg.LogDir, time.Second), jobstest.Placer(2000, 1<<30), slog.New(slog.DiscardHandler))
	withPeers(m, handover.Config{Lost: time.Hour}, jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}})
	jobstest.Run(t, m)
	time.Sleep(1500 * time.Millisecond) // a pass or two
	if j, ok := m.Records().Job(js[0].ID); ok {
		t.Errorf("a peer's pending job after a restart: %s (%s), attempt %d; want it forgotten", j.State, j.Reason, j.Attempt)
	}
	if _, ok := m.AcceptedByKey("o/7#1g1"); ok {
		t.Error("its key still names a job")
	}
}

// A peer's accepted job is placed by the pass in memory and its start
// stores the placement (its record, once started, holds the allocation
// and the placed event); a refused offer of a second key, retried at once,
// is admitted anew (it was forgotten before the answer), and its record
// is removed from the store after the answer.
func TestAdmissionPeerJobRecords(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}
	m := jobs.New(cfg, st, jobstest.Runner(t, cfg.LogDir, time.Second), jobstest.Placer(2000, 1<<30), slog.New(slog.DiscardHandler))
	withPeers(m, handover.Config{Lost: time.Hour}, jobs.PeerPolicy{Users: admission.PeerUsers{MinUID: 1000, MaxUID: 65534}})
	jobstest.Run(t, m)
	big := small()
	big.Resources.CPU = 2000
	a, err := m.AcceptHandover(context.Background(), jobs.Offer{From: api.Provenance{Node: "o", JobID: "1", Key: "o/1#1"}, User: "nobody"}, big)
	// The answer is the job as it is after the pass placed it: placed,
	// or already on its way to running when its start came first (a
	// loaded host's slow store write is enough).
	if err != nil || !slices.Contains([]api.State{api.StatePlaced, api.StateStarting, api.StateRunning}, a.State) || a.Allocation == nil {
		t.Fatalf("accepted: %s %+v, %v", a.State, a.Allocation, err)
	}
	var stored api.Job
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if stored, err = st.GetJob(a.ID); err == nil && stored.State == api.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored record of the accepted job: %s, %v", stored.State, err)
		}
	}
	var placed bool
	for _, e := range stored.Events {
		placed = placed || e.To == api.StatePlaced && strings.HasPrefix(e.Reason, "placed: ")
	}
	if stored.Allocation == nil || stored.Allocation.CPU != 2000 || !placed || stored.Origin == nil || stored.Origin.Key != "o/1#1" {
		t.Fatalf("stored record once started: allocation %+v, placed event %v, origin %+v", stored.Allocation, placed, stored.Origin)
	}
	o := jobs.Offer{From: api.Provenance{Node: "o", JobID: "2", Key: "o/2#1"}, User: "nobody"}
	var ref *admission.Refusal
	for range 2 {
		if _, err := m.AcceptHandover(context.Background(), o, big); !errors.As(err, &ref) || ref.Rule != "queue" {
			t.Fatalf("an offer that does not fit now: %v, want refused by the queue", err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := 0
		if err := st.Jobs(func(api.Job) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records stored after two refusals, want only the accepted job's", n)
		}
	}
}
