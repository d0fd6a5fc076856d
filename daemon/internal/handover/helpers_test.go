package handover_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/handover"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
)

func TestMain(m *testing.M) {
	jobstest.Reexec() // the job monitors of the managers' runners
	os.Exit(m.Run())
}

// node is a job manager with its hand-over, wired as the daemon wires
// them (daemon/peersconfig.go); Agent is nil for one without peers.
type node struct {
	*jobs.Manager
	*handover.Agent
}

// withPeers gives m a hand-over to the peers o.
func withPeers(m *jobs.Manager, o handover.Overflow, cfg handover.Config, p jobs.PeerPolicy) *node {
	a := handover.New(m.Records(), cfg, slog.New(slog.DiscardHandler))
	a.Connect(o)
	m.SetHandover(a, p)
	return &node{m, a}
}

var root = api.Caller{UID: 0, Admin: true, User: "root"}

func submit(t *testing.T, m *node, spec api.JobSpec) api.Job {
	t.Helper()
	if spec.Resources.CPU == 0 {
		spec.Resources.CPU = 1000
	}
	if spec.Resources.Memory == 0 {
		spec.Resources.Memory = 16 << 20
	}
	j, err := m.Submit(context.Background(), root, spec)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func waitFor(t *testing.T, m *node, id string, cond func(api.Job) bool) api.Job {
	t.Helper()
	return jobstest.WaitFor(t, m, id, cond)
}

func state(s api.State) func(api.Job) bool { return func(j api.Job) bool { return j.State == s } }

// fakeRunner records every start; its processes end when told.
type fakeRunner struct {
	mu      sync.Mutex
	started map[string]*fakeProc
}

type fakeProc struct {
	pid  int
	exit chan api.ExitStatus
}

var _ jobs.Runner = (*fakeRunner)(nil)

func (p *fakeProc) PID() int                      { return p.pid }
func (p *fakeProc) Wait() (api.ExitStatus, error) { return <-p.exit, nil }
func (p *fakeProc) Signal(syscall.Signal) error   { return nil }

func (r *fakeRunner) Reap(string, int) (int, error) { return 1, nil }

func (r *fakeRunner) Start(_ context.Context, req jobs.RunRequest) (jobs.Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := &fakeProc{pid: 1000 + len(r.started), exit: make(chan api.ExitStatus, 1)}
	r.started[req.JobID] = p
	return p, nil
}

func (r *fakeRunner) Attach(string, int) (jobs.Process, error) { return nil, jobs.ErrGone }
