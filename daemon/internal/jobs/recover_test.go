package jobs_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// fakeRunner's processes end when their exit is sent; Attach answers from
// attached (ErrGone when absent). It stands in for the executor only here:
// this test scripts, for one restarted manager, the three answers Attach
// can give at once (a live monitor, a result recorded while no daemon ran,
// a monitor gone without one) with fixed usage figures to assert on, which
// real monitors cannot be made to give deterministically. The executor's
// own tests re-attach real monitors (daemon/internal/executor), and the
// end-to-end crash tests run the whole daemon (daemon/e2e).
type fakeRunner struct {
	mu       sync.Mutex
	started  map[string]*fakeProc
	attached map[string]*fakeProc
	reaped   []string
}

type fakeProc struct {
	pid  int
	exit chan api.ExitStatus
}

var (
	_ jobs.Runner        = (*fakeRunner)(nil)
	_ jobs.UsageReporter = (*fakeProc)(nil)
)

func (p *fakeProc) PID() int                      { return p.pid }
func (p *fakeProc) Wait() (api.ExitStatus, error) { return <-p.exit, nil }
func (p *fakeProc) Signal(syscall.Signal) error   { return nil }
func (p *fakeProc) Usage() (api.Usage, error) {
	return api.Usage{CPUSeconds: 1.5, MemoryPeak: 1 << 20}, nil
}
func newFakeProc(pid int) *fakeProc { return &fakeProc{pid: pid, exit: make(chan api.ExitStatus, 1)} }
func (r *fakeRunner) Reap(id string, _ int) (int, error) {
	r.mu.Lock()
	r.reaped = append(r.reaped, id)
	r.mu.Unlock()
	return 1, nil
}

func (r *fakeRunner) Start(_ context.Context, req jobs.RunRequest) (jobs.Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := newFakeProc(1000 + len(r.started))
	r.started[req.JobID] = p
	return p, nil
}

func (r *fakeRunner) Attach(id string, _ int) (jobs.Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.attached[id]; ok {
		return p, nil
	}
	return nil, jobs.ErrGone
}

// TestRecoverReattaches: after a daemon dies with three jobs running, the
// next one re-attaches to a live job (keeping its reservation), records the
// exit of one that ended meanwhile, and reports lost (and reaps) only the
// one whose monitor is gone.
func TestRecoverReattaches(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	cfg := jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r1 := &fakeRunner{started: map[string]*fakeProc{}}
	m1 := jobs.New(cfg, st, r1, jobstest.Placer(4000, 1<<30), log)
	if err := m1.Recover(); err != nil {
		t.Fatal(err)
	}
	m1.Start()
	var ids []string
	for range 3 {
		ids = append(ids, submit(t, m1, api.JobSpec{Command: []string{"x"}}).ID)
	}
	for _, id := range ids {
		waitFor(t, m1, id, state(api.StateRunning))
	}
	// The daemon "dies": its store is closed under it, nothing is stopped.
	st.Close()

	st2, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	live, ended := newFakeProc(2000), newFakeProc(2001)
	ended.exit <- api.ExitStatus{Code: 3}
	r2 := &fakeRunner{started: map[string]*fakeProc{}, attached: map[string]*fakeProc{ids[0]: live, ids[1]: ended}}
	placer := jobstest.Placer(4000, 1<<30)
	m2 := jobs.New(cfg, st2, r2, placer, log)
	if err := m2.Recover(); err != nil {
		t.Fatal(err)
	}
	m2.Start()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m2.Stop(ctx)
	}()
	if j, _ := m2.Get(context.Background(), root, ids[0]); j.State != api.StateRunning || j.Usage == nil || j.Usage.CPUSeconds != 1.5 {
		t.Errorf("live job after recovery: %s, usage %+v", j.State, j.Usage)
	}
	j := waitFor(t, m2, ids[1], state(api.StateFailed))
	if j.Exit == nil || j.Exit.Code != 3 || j.Usage == nil {
		t.Errorf("job that ended meanwhile: exit %+v usage %+v", j.Exit, j.Usage)
	}
	// The job that ended gives its reservation back just after its end
	// is recorded; the live one keeps its own.
	for deadline := time.Now().Add(5 * time.Second); placer.Allocated().CPU != 1000 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := placer.Allocated().CPU; got != 1000 {
		t.Errorf("re-attached job's reservation: %s CPU allocated, want 1", got)
	}
	j = waitFor(t, m2, ids[2], state(api.StateLost))
	if !strings.Contains(j.Reason, "did not survive") || !strings.Contains(j.Reason, "1 leftover processes killed") {
		t.Errorf("lost reason %q", j.Reason)
	}
	if len(r2.reaped) != 1 || r2.reaped[0] != ids[2] {
		t.Errorf("reaped %v, want only %s", r2.reaped, ids[2])
	}
	live.exit <- api.ExitStatus{Code: 0}
	waitFor(t, m2, ids[0], state(api.StateSucceeded))
	for deadline := time.Now().Add(5 * time.Second); placer.Allocated().CPU != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := placer.Allocated().CPU; got != 0 {
		t.Errorf("%s CPU still allocated after the re-attached job ended", got)
	}
}

// TestRecoverRequeuesNeverStarted: a job the last daemon recorded as
// starting whose monitor never existed (no attempt directory) is queued
// again and runs, its attempt not counted; one whose monitor recorded
// itself and then vanished is lost. Both over the daemon's executor.
func TestRecoverRequeuesNeverStarted(t *testing.T) {
	dir := t.TempDir()
	logDir := filepath.Join(dir, "logs")
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	starting := func(name string) string {
		j, err := createJob(st, func(id string) api.Job {
			return api.Job{
				ID: id, State: api.StateStarting, Attempt: 1, Tier: api.TierBurstable,
				Spec:       api.JobSpec{Name: name, Command: []string{"true"}, Resources: api.Resources{CPU: 500, Memory: 16 << 20}},
				Allocation: &api.Allocation{CPU: 500, Memory: 16 << 20, NUMANode: -1},
				Version:    1,
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	never, vanished := starting("never"), starting("vanished")
	// The vanished job's monitor had recorded itself before it died.
	att := filepath.Join(logDir, vanished, "attempt-1")
	if err := os.MkdirAll(att, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(att, "state.json"), []byte(`{"monitor_pid":999999}`), 0o600); err != nil {
		t.Fatal(err)
	}
	runner := jobstest.Runner(t, logDir, time.Second)
	m := jobs.New(jobs.Config{LogDir: logDir, CancelGrace: time.Second}, st, runner,
		jobstest.Placer(4000, 1<<30), slog.New(slog.DiscardHandler))
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Stop(ctx)
	}()
	j := waitFor(t, m, never, state(api.StateSucceeded))
	if j.Attempt != 1 {
		t.Errorf("re-queued job ran as attempt %d, want 1 (the attempt that never ran is not counted)", j.Attempt)
	}
	requeued := false
	for _, e := range j.Events {
		if e.From == api.StateStarting && e.To == api.StatePending && strings.Contains(e.Reason, "before attempt 1 started") {
			requeued = true
		}
	}
	if !requeued {
		t.Errorf("no starting → pending event among %+v", j.Events)
	}
	if j := waitFor(t, m, vanished, state(api.StateLost)); !strings.Contains(j.Reason, "did not survive") {
		t.Errorf("vanished job's reason %q", j.Reason)
	}
}

// TestRecoverUnreservableHoldsPlacement: a re-attached job whose
// allocation cannot be reserved again (its GPU not found) keeps running,
// and nothing else is placed until it ends, since a new job could be given
// what it still uses.
func TestRecoverUnreservableHoldsPlacement(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	held, err := createJob(st, func(id string) api.Job {
		return api.Job{
			ID: id, State: api.StateRunning, Attempt: 1, PID: 4242, Tier: api.TierBurstable,
			Spec:       api.JobSpec{Command: []string{"x"}, Resources: api.Resources{CPU: 500, Memory: 16 << 20}},
			Allocation: &api.Allocation{CPU: 500, Memory: 16 << 20, NUMANode: -1, GPUs: []string{"GPU-gone"}},
			Version:    1,
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	live := newFakeProc(4242)
	r := &fakeRunner{started: map[string]*fakeProc{}, attached: map[string]*fakeProc{held.ID: live}}
	m := jobs.New(jobs.Config{LogDir: filepath.Join(dir, "logs"), CancelGrace: time.Second}, st, r,
		jobstest.Placer(4000, 1<<30), slog.New(slog.DiscardHandler))
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Stop(ctx)
	}()
	next := submit(t, m, api.JobSpec{Command: []string{"x"}})
	j := waitFor(t, m, next.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "could not be reserved again") })
	if j.State != api.StatePending {
		t.Fatalf("new job is %s while a re-attached job's resources are unaccounted for", j.State)
	}
	live.exit <- api.ExitStatus{}
	waitFor(t, m, held.ID, state(api.StateSucceeded))
	waitFor(t, m, next.ID, state(api.StateRunning))
}

// createJob stores one job record built from its new ID.
func createJob(st *store.Store, build func(id string) api.Job) (api.Job, error) {
	js, err := st.CreateJobs(1, func(_ int, id string) api.Job { return build(id) })
	if err != nil {
		return api.Job{}, err
	}
	return js[0], nil
}
