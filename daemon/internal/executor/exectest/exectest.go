// Package exectest cleans up after tests that run jobs through fusiond's
// executor: it kills what a failing test left behind (job monitors, the
// processes of job cgroups) and removes the test's cgroup subtree, so that
// no process outlives the test on the CI host. It only touches the cgroup
// subtree and the state directory it is given.
//
// Tests only; it imports the standard library.
package exectest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// monitorName is the argv[0] the executor gives its job monitors.
const monitorName = "fusiond-monitor"

// KillMonitors SIGKILLs the job monitors whose attempt directory lies
// under stateDir, reading processes from procRoot ("/proc"), and says how
// many it killed.
func KillMonitors(procRoot, stateDir string) int {
	entries, _ := os.ReadDir(procRoot)
	prefix := filepath.Clean(stateDir) + string(filepath.Separator)
	killed := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
		if len(args) < 2 || args[0] != monitorName || !strings.HasPrefix(args[len(args)-1], prefix) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	return killed
}

// CgroupTops lists the directories of the top-level cgroup parent under
// root in every hierarchy that has it (one on v2, one per controller on v1).
func CgroupTops(root, parent string) []string {
	tops, _ := filepath.Glob(filepath.Join(root, "*", parent))
	if _, err := os.Stat(filepath.Join(root, parent)); err == nil {
		tops = append(tops, filepath.Join(root, parent))
	}
	return tops
}

// Cleanup kills the monitors under stateDir, then every process in the
// cgroup subtree parent (cgroup.kill where the kernel has it, SIGKILL of
// each listed process otherwise), waits up to wait for it to empty and
// removes its directories, deepest first.
func Cleanup(root, parent, stateDir string, wait time.Duration) error {
	if stateDir != "" {
		KillMonitors("/proc", stateDir)
	}
	var errs []error
	for _, top := range CgroupTops(root, parent) {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := killCgroup(dirs[i], wait); err != nil {
				errs = append(errs, err)
			}
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// killCgroup kills the processes of one cgroup directory until it is
// empty or wait has passed.
func killCgroup(dir string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		fields := bytes.Fields(procs)
		if len(fields) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has processes %s", dir, bytes.Join(fields, []byte(" ")))
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
			for _, f := range fields {
				if pid, err := strconv.Atoi(string(f)); err == nil && pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}
