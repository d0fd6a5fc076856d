// Package exec is fusiond's executor: it implements jobs.Runner.
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
// ProcessRunner is the older plain-child runner (jobs die with the daemon);
// tests of the job manager use it.
package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// ProcessRunner starts jobs as child processes of the daemon.
type ProcessRunner struct {
	log *slog.Logger
	// procRoot is where Reap looks for leftover processes (/proc).
	procRoot string
	// asRoot is true when the daemon may switch to the job's identity.
	asRoot bool
}

var _ jobs.Runner = (*ProcessRunner)(nil)

// NewProcessRunner returns a runner. procRoot is normally "/proc".
func NewProcessRunner(log *slog.Logger, procRoot string) *ProcessRunner {
	return &ProcessRunner{log: log, procRoot: procRoot, asRoot: os.Geteuid() == 0}
}

type process struct {
	cmd *osexec.Cmd
	log *os.File
}

func (p *process) PID() int { return p.cmd.Process.Pid }

func (p *process) Signal(sig syscall.Signal) error {
	// The job leads its own process group: signal the whole group.
	err := syscall.Kill(-p.cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

func (p *process) Wait() (api.ExitStatus, error) {
	err := p.cmd.Wait()
	p.log.Close()
	st, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return api.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	var exit api.ExitStatus
	switch {
	case st.Signaled():
		exit.Code = 128 + int(st.Signal())
		exit.Signal = signalName(st.Signal())
	default:
		exit.Code = st.ExitStatus()
	}
	// Reap the rest of the group: nothing of a finished job outlives it.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	return exit, nil
}

// signalName is the short name of a signal ("KILL"), or its number.
func signalName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return strconv.Itoa(int(s))
}

// Start starts req's command. The job's log file is opened by the daemon
// (as root) and handed to the job, so the job needs no access to the state
// directory.
func (r *ProcessRunner) Start(_ context.Context, req jobs.RunRequest) (jobs.Process, error) {
	path, err := lookPath(req.Command[0], req.Env)
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(req.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	cmd := osexec.Command(path, req.Command[1:]...)
	cmd.Args[0] = req.Command[0]
	cmd.Env = req.Env
	cmd.Dir = req.Workdir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// A job must not outlive a daemon that can no longer account for
		// it.
		Pdeathsig: syscall.SIGKILL,
	}
	if r.asRoot {
		cmd.SysProcAttr.Credential = &syscall.Credential{
			Uid: req.UID, Gid: req.GID, Groups: req.Groups,
		}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", req.Command[0], err)
	}
	r.log.Debug("job process started", "job", req.JobID, "pid", cmd.Process.Pid, "uid", req.UID)
	return &process{cmd: cmd, log: logf}, nil
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

// Attach always fails: a plain child process dies with the daemon that
// started it.
func (r *ProcessRunner) Attach(jobID string, attempt int) (jobs.Process, error) {
	return nil, fmt.Errorf("job %s attempt %d: %w", jobID, attempt, jobs.ErrGone)
}

// Reap kills the processes left from a job attempt whose daemon died.
func (r *ProcessRunner) Reap(jobID string, pid int) (int, error) {
	return reapByEnv(r.procRoot, jobID, pid)
}

// reapByEnv kills the processes that carry the job's FUSIOND_JOB_ID in
// their environment and, when the leader's pid was recorded, belong to its
// process group (pgid = pid), so a recycled pid never gets an unrelated
// process killed.
func reapByEnv(procRoot, jobID string, pid int) (int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, fmt.Errorf("scan processes: %w", err)
	}
	marker := []byte("\x00FUSIOND_JOB_ID=" + jobID + "\x00")
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
		if err != nil || !bytes.Contains(append(append([]byte{0}, environ...), 0), marker) {
			continue
		}
		if err := syscall.Kill(p, syscall.SIGKILL); err == nil {
			killed++
		}
	}
	return killed, nil
}
