package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// TestKernelMonitorKilled, as root on the real kernel's cgroups: kill -9 of
// a guaranteed job's monitor gets the job recorded lost only once its
// processes are dead and its cgroup removed; the next guaranteed job,
// given the same exclusive core, checks from inside that nothing of the
// first is left.
func TestKernelMonitorKilled(t *testing.T) {
	dir := t.TempDir()
	logDir := filepath.Join(dir, "logs")
	runner := jobstest.Runner(t, logDir, time.Second)
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slog.New(slog.DiscardHandler)
	// Two cores, one kept shared: a single exclusive core, which both
	// guaranteed jobs must get in turn.
	cores := []cgroups.Core{{Node: 0, CPUs: []int{0}}, {Node: 0, CPUs: []int{1}}}
	placer := hostplacer.New(hostplacer.Hardware{Name: "test", CPU: 2000, Memory: 1 << 30, Cores: cores},
		hostplacer.Options{Seed: 1, KeepSharedCores: 1, Logger: log})
	m := jobs.New(jobs.Config{LogDir: logDir, CancelGrace: time.Second}, st, runner, placer, log)
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Stop(ctx)
	}()
	guaranteed := func(cmd ...string) api.JobSpec {
		return api.JobSpec{Command: cmd, Tier: api.TierGuaranteed, Resources: api.Resources{CPU: 1000, Memory: 32 << 20}}
	}
	a := submit(t, m, guaranteed("/bin/sh", "-c", "sleep 300 & sleep 300; wait"))
	a = waitFor(t, m, a.ID, state(api.StateRunning))
	var ms struct {
		MonitorPID int    `json:"monitor_pid"`
		Cgroup     string `json:"cgroup"`
	}
	raw, err := os.ReadFile(filepath.Join(logDir, a.ID, "attempt-1", "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &ms); err != nil || ms.MonitorPID <= 0 || ms.Cgroup == "" {
		t.Fatalf("monitor state %s: %v", raw, err)
	}
	cgDirs := []string{filepath.Join(jobstest.CgroupRoot(), ms.Cgroup), filepath.Join(jobstest.CgroupRoot(), "pids", ms.Cgroup)}
	var pids []string
	for _, d := range cgDirs {
		if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
			pids = strings.Fields(string(b))
			break
		}
	}
	// The shell waits for its two sleeps: three processes once both run.
	for deadline := time.Now().Add(5 * time.Second); len(pids) < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		for _, d := range cgDirs {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
				pids = strings.Fields(string(b))
			}
		}
	}
	if len(pids) < 3 {
		t.Fatalf("job's cgroup %s holds %v, want its shell and two sleeps", ms.Cgroup, pids)
	}
	// The second guaranteed job waits for the only exclusive core, then
	// fails (exit 7 or 8) if any process or the cgroup of the first is
	// still there.
	// (A killed process init has not reaped yet is a zombie: dead.)
	check := fmt.Sprintf("for p in %s; do s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null) && [ \"$s\" != Z ] && exit 7; done; for d in %s; do [ -e $d ] && exit 8; done; exit 0",
		strings.Join(pids, " "), strings.Join(cgDirs, " "))
	b := submit(t, m, guaranteed("/bin/sh", "-c", check))
	waitFor(t, m, b.ID, func(j api.Job) bool { return strings.Contains(j.Reason, "waiting") })

	if err := syscall.Kill(ms.MonitorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a = waitFor(t, m, a.ID, state(api.StateLost))
	if !strings.Contains(a.Reason, "monitor died: 3 processes of the job killed and its cgroup removed") {
		t.Errorf("lost job's reason %q", a.Reason)
	}
	b = waitFor(t, m, b.ID, func(j api.Job) bool { return j.State.Terminal() })
	if b.State != api.StateSucceeded {
		t.Fatalf("second guaranteed job %s (%s): the first job's processes or cgroup outlived its monitor", b.State, b.Reason)
	}
	if b.Allocation == nil || a.Allocation == nil || b.Allocation.CPUSet != a.Allocation.CPUSet {
		t.Errorf("second job's cores %+v, first's %+v: want the same exclusive core", b.Allocation, a.Allocation)
	}
}
