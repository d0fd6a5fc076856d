// Package executor is fusiond's executor: it implements jobs.Runner.
//
// MonitorRunner, the daemon's runner, starts every job attempt under a
// small monitor process (the fusiond binary re-executed with MonitorArg; see
// Dispatch), like containerd's shims or conmon. The monitor lives in its own
// session, creates the job's cgroup (package cgroups), starts the job's
// first process held on a pipe until it is inside that cgroup, switches it
// to the submitting user's uid, gid and groups, rlimits and working
// directory, copies its output to a size-capped, rotated log, obeys cancel
// (SIGTERM, grace, then the whole cgroup killed) and writes the exit status
// (code, signal, OOM kill) and accounting durably into the attempt's
// directory. Jobs thereby survive a daemon crash; a restarted daemon
// re-attaches with Attach.
//
// It owns job processes and their monitors and may import cgroups, devices,
// daemon/api (exit status, usage), daemon/internal/jobs (the Runner
// interface it implements) and the standard library; libcontainer only in
// its subpackage container.
package executor

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// signalName is the short name of a signal ("KILL"), or its number.
func signalName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return strconv.Itoa(int(s))
}

// lookPath resolves name against the job's own PATH, not the daemon's.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathVar := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in the job's PATH (%s)", name, pathVar)
}

// reapByEnv kills the processes that carry the job's FUSIOND_JOB_ID and
// the runner's marker (its jobs directory) in their environment and, when
// the leader's pid was recorded, belong to its process group (pgid = pid),
// so neither a recycled pid nor another daemon's job of the same ID gets
// an unrelated process killed.
func reapByEnv(procRoot, jobID, marker string, pid int) (int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, fmt.Errorf("scan processes: %w", err)
	}
	idEntry := []byte("\x00FUSIOND_JOB_ID=" + jobID + "\x00")
	markerEntry := []byte("\x00" + marker + "\x00")
	killed := 0
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid > 0 {
			if pgid, err := syscall.Getpgid(p); err != nil || pgid != pid {
				continue
			}
		}
		environ, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ"))
		environ = append(append([]byte{0}, environ...), 0)
		if err != nil || !bytes.Contains(environ, idEntry) || !bytes.Contains(environ, markerEntry) {
			continue
		}
		if err := syscall.Kill(p, syscall.SIGKILL); err == nil {
			killed++
		}
	}
	return killed, nil
}
