package executor

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// TestUnisolatedJobsRefused: without cgroups a runner refuses every job,
// saying why, unless running them unisolated was allowed; the node status
// says which.
func TestUnisolatedJobsRefused(t *testing.T) {
	exe, _ := os.Executable()
	dir := t.TempDir()
	cfg := MonitorConfig{JobsDir: filepath.Join(dir, "jobs"), Executable: exe, NoCgroups: "fusiond is not running as root"}
	req := jobs.RunRequest{
		JobID: "u", Attempt: 1, Command: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"},
		Workdir: "/", LogPath: filepath.Join(dir, "u.log"), UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
		Tier: api.TierBurstable, Allocation: api.Allocation{CPU: 100, Memory: 64 << 20, NUMANode: -1},
	}
	r := NewMonitorRunner(cfg, slog.New(slog.DiscardHandler))
	if iso := r.Isolation(); iso.Isolated || !iso.JobsRefused || iso.Reason != cfg.NoCgroups {
		t.Errorf("refusing runner's isolation %+v", iso)
	}
	_, err := r.Start(t.Context(), req)
	if !errors.Is(err, ErrUnisolated) || !strings.Contains(err.Error(), "allow_unisolated_jobs") || !strings.Contains(err.Error(), cfg.NoCgroups) {
		t.Fatalf("unisolated start: %v", err)
	}
	if _, err := os.Stat(r.AttemptDir("u", 1)); !os.IsNotExist(err) {
		t.Errorf("a refused job got an attempt directory: %v", err)
	}
	cfg.AllowUnisolated = true
	r = NewMonitorRunner(cfg, slog.New(slog.DiscardHandler))
	if iso := r.Isolation(); iso.Isolated || iso.JobsRefused {
		t.Errorf("allowing runner's isolation %+v", iso)
	}
	p, err := r.Start(t.Context(), req)
	if err != nil {
		t.Fatalf("allowed unisolated start: %v", err)
	}
	if e := waitExit(t, p, 10*time.Second); e.Code != 0 {
		t.Errorf("allowed unisolated job: exit %+v", e)
	}
}
