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
