package executor

import (
	osexec "os/exec"
	"syscall"
	"testing"
	"time"
)

// TestReapByEnvSparesOtherDaemonsJobs: two processes carry the same job ID
// (two daemons on one host, as in the tests); a reap by environment kills
// only the one that also carries this runner's jobs directory.
func TestReapByEnvSparesOtherDaemonsJobs(t *testing.T) {
	start := func(marker string) *osexec.Cmd {
		t.Helper()
		cmd := osexec.Command("sleep", "30")
		cmd.Env = []string{"FUSIOND_JOB_ID=7", marker}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	ours := (&MonitorRunner{cfg: MonitorConfig{JobsDir: "/state/a/jobs"}}).jobsDirMarker()
	theirs := (&MonitorRunner{cfg: MonitorConfig{JobsDir: "/state/b/jobs"}}).jobsDirMarker()
	mine, other := start(ours), start(theirs)
	n, err := reapByEnv("/proc", "7", ours, 0)
	if err != nil || n != 1 {
		t.Fatalf("reap killed %d processes (%v), want 1", n, err)
	}
	done := make(chan error, 1)
	go func() { done <- mine.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("this runner's job was not killed")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the other daemon's job 7 was killed: %v", err)
	}
}
