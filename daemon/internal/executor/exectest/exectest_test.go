package exectest

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// startNamed starts a shell with the given argv[0] and last argument that
// waits, without children, on a pipe the test holds open.
func startNamed(t *testing.T, argv0, last string) *osexec.Cmd {
	t.Helper()
	cmd := &osexec.Cmd{Path: "/bin/sh", Args: []string{argv0, "-c", "read -r _", "x", last}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); stdin.Close(); _ = cmd.Wait() })
	return cmd
}

// exited waits (bounded) for cmd to end and says whether it did.
func exited(cmd *osexec.Cmd) bool {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

func TestKillMonitors(t *testing.T) {
	state := t.TempDir()
	mine := startNamed(t, monitorName, filepath.Join(state, "jobs", "j1", "attempt-1"))
	other := startNamed(t, monitorName, filepath.Join(t.TempDir(), "jobs", "j1", "attempt-1"))
	notMonitor := startNamed(t, "fusiond-job", filepath.Join(state, "jobs", "j1", "attempt-1"))
	// /proc/PID/cmdline shows the new argv only once the process has run.
	time.Sleep(100 * time.Millisecond)
	if n := KillMonitors("/proc", state); n != 1 {
		t.Errorf("killed %d monitors, want 1", n)
	}
	if !exited(mine) {
		t.Error("the state directory's monitor survived")
	}
	for _, c := range []*osexec.Cmd{other, notMonitor} {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("process %v was killed: %v", c.Args, err)
		}
	}
}

func TestCleanupKillsCgroupProcesses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root to create cgroups")
	}
	root := "/sys/fs/cgroup"
	hier := filepath.Join(root, "cpu")
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		hier = root
	}
	parent := fmt.Sprintf("fusiond-exectest-cleanup-%d", os.Getpid())
	leaf := filepath.Join(hier, parent, "fusiond", "burstable", "job")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	cmd := startNamed(t, "sleeper", "x")
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatalf("move into cgroup: %v", err)
	}
	if err := Cleanup(root, parent, "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if !exited(cmd) {
		t.Error("process of the cgroup survived")
	}
	if _, err := os.Stat(filepath.Join(hier, parent)); !os.IsNotExist(err) {
		t.Errorf("cgroup subtree left: %v", err)
	}
}
