package jobs_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
)

// mountTmpfs mounts a tmpfs of size bytes at a new directory (as root) and
// unmounts it when the test ends.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs for the state directory (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes to path until the filesystem is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	// The last partial pages too.
	for {
		if _, err := f.Write(buf[:512]); err != nil {
			break
		}
	}
}

// TestStateFilesystemFull: with the state directory (store and attempt
// directories) on a small tmpfs that fills up, submissions fail and
// readiness says why; a job that exits 0 meanwhile is not recorded lost;
// once space is freed readiness comes back by itself and the job is
// recorded succeeded from its monitor's result.
func TestStateFilesystemFull(t *testing.T) {
	stateDir := mountTmpfs(t, "16m")
	logDir := filepath.Join(stateDir, "jobs")
	runner := jobstest.Runner(t, logDir, time.Second)
	st, err := store.Open(filepath.Join(stateDir, "fusiond.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
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
	gate := filepath.Join(t.TempDir(), "go") // off the full filesystem
	// A's record is large (400 KB of environment), so that storing its end
	// needs more than the free pages a full store file still has.
	pad := map[string]string{}
	for _, k := range []string{"PAD1", "PAD2", "PAD3", "PAD4"} {
		pad[k] = strings.Repeat("x", 100_000)
	}
	a := submit(t, m, api.JobSpec{Command: []string{"/bin/sh", "-c", "while [ ! -e " + gate + " ]; do sleep 0.05; done"}, Env: pad})
	waitFor(t, m, a.ID, state(api.StateRunning))

	filler := filepath.Join(stateDir, "filler")
	fill(t, filler)
	var submitErr error
	for i := 0; i < 200 && submitErr == nil; i++ {
		_, submitErr = m.Submit(context.Background(), root, api.JobSpec{
			Command: []string{"true"}, Env: map[string]string{"PAD": strings.Repeat("x", 8<<10)},
			Resources: api.Resources{CPU: 100, Memory: 1 << 20},
		})
	}
	if submitErr == nil {
		t.Fatal("200 submissions stored on a full state filesystem")
	}
	if !strings.Contains(submitErr.Error(), "could not store the job") {
		t.Fatalf("submission on a full state filesystem: %v", submitErr)
	}
	if err := m.Ready(); err == nil {
		t.Fatalf("ready with the state filesystem full (submitting failed: %v)", submitErr)
	}
	// The job ends well while nothing can be stored.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if j, _ := m.Get(context.Background(), root, a.ID); j.State.Terminal() {
		t.Fatalf("job recorded %s (%s) on a full state filesystem", j.State, j.Reason)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("still not ready 10 s after space was freed: %v", m.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	j := waitFor(t, m, a.ID, func(j api.Job) bool { return j.State.Terminal() })
	if j.State != api.StateSucceeded || j.Exit == nil || j.Exit.Code != 0 {
		t.Fatalf("job that exited 0 while the disk was full: %s (%s)", j.State, j.Reason)
	}
	mlog, _ := os.ReadFile(filepath.Join(logDir, a.ID, "attempt-1", "monitor.log"))
	if !strings.Contains(string(mlog), "retrying in the space reserved for it") {
		t.Errorf("the monitor did not need its reserved space to record the result: the filesystem was not full?\n%s", mlog)
	}
	b := submit(t, m, api.JobSpec{Command: []string{"true"}})
	waitFor(t, m, b.ID, state(api.StateSucceeded))
}
