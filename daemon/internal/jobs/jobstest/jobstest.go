// Package jobstest builds, for tests of the job manager and of what serves
// it, the parts the daemon itself runs jobs with: the placement engine
// applied to a host (hostplacer.Placer) and the executor
// (executor.MonitorRunner), whose monitors are the test binary re-executed
// the way fusiond re-executes itself, over a cgroup subtree of the test's
// own that is removed, with anything left in it, when the test ends.
//
// Tests only; it may import the packages it assembles (hostplacer,
// executor, exectest, cgroups).
package jobstest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
)

// Reexec must open the TestMain of a package whose tests run jobs through
// Runner: the test binary is fusiond for them, so when Runner re-executes
// it as a job monitor or a job's first process, Reexec runs that mode and
// exits (as cmd/fusiond does); otherwise it returns and the tests run.
func Reexec() {
	if code, ok := executor.Dispatch(os.Args); ok {
		os.Exit(code)
	}
}

// Placer is the daemon's placer for a host of cpu and memory and no
// devices (tests that need GPUs or FPGAs build their hostplacer.Hardware).
func Placer(cpu api.MilliCPU, memory api.Bytes) *hostplacer.Placer {
	return hostplacer.New(hostplacer.Hardware{Name: "test", CPU: cpu, Memory: memory}, hostplacer.Options{Seed: 1})
}

// CgroupRoot is where the tests' cgroups live: $FUSIOND_CGROUP_ROOT, or
// the host's cgroup mount.
func CgroupRoot() string {
	if r := os.Getenv("FUSIOND_CGROUP_ROOT"); r != "" {
		return r
	}
	return cgroups.DefaultRoot
}

// Runner is the daemon's executor keeping its attempts under jobsDir (the
// job manager's LogDir, as in the daemon): every job attempt runs under a
// monitor (the test binary, see Reexec) in a cgroup of a parent named after
// the test. It needs root, as fusiond does for cgroups. When the test ends
// (after the cleanups registered later, such as stopping a manager) it
// kills the monitors and jobs left under jobsDir and removes the cgroups.
func Runner(t testing.TB, jobsDir string, grace time.Duration) *executor.MonitorRunner {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("tests that run jobs under monitors and cgroups need root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if jobsDir, err = filepath.Abs(jobsDir); err != nil {
		t.Fatal(err)
	}
	root := CgroupRoot()
	name := strings.ToLower(strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()))
	parent := fmt.Sprintf("fusiond-jobstest-%d-%s", os.Getpid(), name)
	log := slog.New(slog.DiscardHandler)
	cg, err := cgroups.NewManager(cgroups.WithRoot(root), cgroups.WithParent(parent), cgroups.WithLogger(log),
		cgroups.WithKillTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("cgroups unusable at %s: %v", root, err)
	}
	t.Cleanup(func() {
		if err := exectest.Cleanup(root, parent, jobsDir, 10*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := cg.EnsureHierarchy(); err != nil {
		t.Fatalf("cgroup hierarchy: %v", err)
	}
	return executor.NewMonitorRunner(executor.MonitorConfig{
		JobsDir: jobsDir, Executable: exe,
		Cgroups: cg, CgroupRoot: root, CgroupParent: parent,
		Grace: grace,
	}, log)
}

// Manager is the lifecycle of a job manager (jobs.Manager).
type Manager interface {
	Recover() error
	Start()
	Stop(ctx context.Context)
}

// Run recovers m and starts it, and stops it when the test ends.
func Run(t testing.TB, m Manager) {
	t.Helper()
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	m.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Stop(ctx)
	})
}

// Getter reads a job (jobs.Manager).
type Getter interface {
	Get(ctx context.Context, c api.Caller, id string) (api.Job, error)
}

// WaitFor polls job id as an admin until cond holds, for at most 10 s,
// and returns it; the test fails with the job's state and reason if it
// never does.
func WaitFor(t testing.TB, m Getter, id string, cond func(api.Job) bool) api.Job {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		j, err := m.Get(context.Background(), api.Caller{Admin: true, User: "root"}, id)
		if err != nil {
			t.Fatal(err)
		}
		if cond(j) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: condition not met; state %s (%s)", id, j.State, j.Reason)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
