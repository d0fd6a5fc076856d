package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	osexec "os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
)

// Dispatch runs the hidden modes of the fusiond binary: the job monitor
// (MonitorArg) and the job's first process. It returns false when args
// (os.Args) ask for neither; otherwise the caller exits with the code.
// It must run before anything else in main: the job's first process must
// not parse flags, open files or start goroutines of its own.
func Dispatch(args []string) (int, bool) { return DispatchWith(args, nil) }

// DispatchWith is Dispatch for a binary that can run container jobs with rt.
func DispatchWith(args []string, rt ContainerRuntime) (int, bool) {
	if len(args) < 2 {
		return 0, false
	}
	switch args[1] {
	case MonitorArg:
		if len(args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: fusiond __monitor ATTEMPT-DIR")
			return 2, true
		}
		return runMonitor(args[2], rt), true
	case execArg:
		return runExec(), true
	case usernsArg:
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0, true
	}
	return 0, false
}

// readyMsg is the one line a monitor writes to the daemon on fd 3: the
// job's pid, or why it could not start.
type readyMsg struct {
	JobPID int    `json:"job_pid,omitempty"`
	Error  string `json:"error,omitempty"`
}

// monitor holds one job attempt.
type monitor struct {
	dir  string
	spec Spec
	log  *slog.Logger
	rt   ContainerRuntime
	cg   *cgroups.Cgroup
	proc JobProcess
	// logDone is closed once the job's output is drained.
	logDone chan struct{}
}

// runMonitor is the monitor's main: fusiond __monitor DIR, started by the
// daemon with setsid, stdin and stdout on /dev/null, stderr on
// DIR/monitor.log, fd 3 the pipe for its readyMsg and fd 4 the locked
// DIR/monitor.lock.
func runMonitor(dir string, rt ContainerRuntime) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("monitor", os.Getpid())
	ready := os.NewFile(3, "ready")
	report := func(m readyMsg) {
		if ready == nil {
			return
		}
		_ = json.NewEncoder(ready).Encode(m)
		ready.Close()
		ready = nil
	}
	mon := &monitor{dir: dir, log: log, rt: rt}
	if err := readJSON(filepath.Join(dir, specFile), &mon.spec); err != nil {
		report(readyMsg{Error: "monitor: " + err.Error()})
		return 1
	}
	mon.log = log.With("job", mon.spec.JobID, "attempt", mon.spec.Attempt)
	if mon.spec.Rootfs != "" && mon.spec.SetIdentity {
		// The daemon started this monitor in a mount namespace of its own.
		if err := enterOwnMountNS(); err != nil {
			report(readyMsg{Error: "monitor: " + err.Error()})
			return 1
		}
	}
	// fd 4 is the attempt's lock file, locked by the daemon before it
	// started this process: the lock now lives exactly as long as this
	// process, with no moment unlocked in between, and a daemon that can
	// take it knows the monitor is gone.
	lock := os.NewFile(4, lockFile)
	if lock == nil {
		report(readyMsg{Error: "monitor: no lock file on fd 4"})
		return 1
	}
	// Neither the lock nor the ready pipe may leak into the job.
	unix.CloseOnExec(3)
	unix.CloseOnExec(4)
	defer runtime.KeepAlive(lock)

	// Signals are caught before the job starts so that a cancel arriving
	// early is not lost.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGINT, syscall.SIGHUP)

	// The monitor names itself first (a daemon restarting now can find
	// and, if need be, kill it), then its job once that runs.
	state := State{MonitorPID: os.Getpid()}
	state.MonitorStart, _ = processStart("/proc", os.Getpid())
	if err := writeJSONDurably(filepath.Join(dir, stateFile), state); err != nil {
		mon.log.Error("recording monitor state", "err", err)
	}
	// Room for the result is set aside while there is some: a job that
	// ends while the state filesystem is full still gets its end recorded.
	if err := reserveSpace(filepath.Join(dir, reserveFile), resultReserve); err != nil {
		mon.log.Warn("reserving room for the job's result", "err", err)
	}
	oomBefore, err := mon.start()
	if err != nil {
		mon.log.Error("job did not start", "err", err)
		mon.cleanup()
		report(readyMsg{Error: err.Error()})
		return 1
	}
	state.JobPID, state.StartedAt = mon.proc.Pid(), time.Now().UTC()
	if mon.cg != nil {
		state.Cgroup = mon.cg.Path()
	}
	if err := writeJSONDurably(filepath.Join(dir, stateFile), state); err != nil {
		mon.log.Error("recording monitor state", "err", err)
	}
	report(readyMsg{JobPID: state.JobPID})
	mon.log.Info("job running", "pid", state.JobPID, "cgroup", state.Cgroup)

	ws := mon.supervise(sigs)
	res := mon.finish(ws, oomBefore)
	err = writeJSONDurably(filepath.Join(dir, resultFile), res)
	if err != nil {
		// The filesystem may be full: give back the room set aside and
		// try again.
		if rerr := os.Remove(filepath.Join(dir, reserveFile)); rerr == nil {
			mon.log.Warn("recording result failed; retrying in the space reserved for it", "err", err)
			err = writeJSONDurably(filepath.Join(dir, resultFile), res)
		}
	}
	_ = os.Remove(filepath.Join(dir, reserveFile))
	if err != nil {
		// Without a durable result the daemon will report the job lost,
		// which is the truth as far as anyone can prove.
		mon.log.Error("recording result", "err", err)
		return 1
	}
	mon.log.Info("job ended", "reason", res.Reason, "code", res.Exit.Code, "signal", res.Exit.Signal)
	return 0
}

// start creates the job's cgroup and starts its first process, held until
// it is inside the cgroup. It returns the cgroup's OOM-kill count before
// the job ran.
func (m *monitor) start() (uint64, error) {
	var oomBefore uint64
	quotaDeferred := false
	if c := m.spec.Cgroup; c != nil {
		mgr, err := cgroups.NewManager(cgroups.WithRoot(c.Root), cgroups.WithParent(c.Parent), cgroups.WithLogger(m.log))
		if err != nil {
			return 0, fmt.Errorf("cgroups: %w", err)
		}
		// The CPU quota is set once the job runs: the start-up of the job's
		// first process (Go runtime, container init) would otherwise crawl
		// at a tenth of a core for a cpu: 100m best-effort job.
		lim := c.Limits
		if lim.CPUQuota > 0 {
			lim.CPUQuota, quotaDeferred = 0, true
		}
		m.cg, err = createCgroup(mgr, m.spec.JobID, c.Tier, lim)
		if err != nil {
			return 0, err
		}
		if st, err := m.cg.Stats(); err == nil {
			oomBefore = st.OOMKills
		}
	}
	out, err := openRotatingLog(m.spec.LogPath, m.spec.LogMaxBytes)
	if err != nil {
		return 0, err
	}
	if m.spec.Rootfs != "" {
		err = m.startContainer(out)
	} else {
		err = m.startProcess(out)
	}
	if err != nil {
		return 0, err
	}
	if quotaDeferred {
		l := m.spec.Cgroup.Limits
		if err := m.cg.SetCPUQuota(l.CPUQuota * 1000 / int64(max(l.CPUPeriod, 1))); err != nil {
			m.killAll()
			_, _ = m.proc.Wait()
			_ = m.proc.Close()
			return 0, fmt.Errorf("set the job's CPU quota: %w", err)
		}
	}
	return oomBefore, nil
}

// startProcess starts a plain job's first process, held until it is in
// the job's cgroup.
func (m *monitor) startProcess(out io.WriteCloser) error {
	specR, specW, err := os.Pipe()
	if err != nil {
		out.Close()
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		out.Close()
		specR.Close()
		specW.Close()
		return err
	}
	defer errR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		out.Close()
		specR.Close()
		specW.Close()
		errW.Close()
		return err
	}
	cmd := osexec.Command("/proc/self/exe", execArg)
	cmd.Args[0] = "fusiond-job"
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = outW, outW
	cmd.ExtraFiles = []*os.File{specR, errW}
	// The job leads its own process group; no Pdeathsig: the job must
	// outlive anything but its own end or a cancel.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	specR.Close()
	errW.Close()
	outW.Close()
	if err != nil {
		out.Close()
		outR.Close()
		specW.Close()
		return fmt.Errorf("start job process: %w", err)
	}
	m.proc = &cmdProcess{cmd}
	m.copyOutput(outR, out)
	fail := func(err error) error {
		specW.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	// The job's process says once its runtime is up, and is moved into the
	// cgroup only then: fusiond's own start-up is not charged to the job's
	// memory nor slowed by its CPU settings.
	ready := make([]byte, 1)
	if _, err := io.ReadFull(errR, ready); err != nil || ready[0] != stubReady {
		return fail(fmt.Errorf("job process did not come up: %v", err))
	}
	if m.cg != nil {
		if err := m.cg.AddProc(cmd.Process.Pid); err != nil {
			return fail(err)
		}
	}
	// Release the job: hand it its spec. It execs the command, which
	// closes its end of errW; an exec failure is written there instead.
	if err := json.NewEncoder(specW).Encode(m.spec); err != nil {
		return fail(fmt.Errorf("hand the job its spec: %w", err))
	}
	specW.Close()
	msg, _ := io.ReadAll(errR)
	if len(msg) > 0 {
		_ = cmd.Wait()
		return errors.New(string(msg))
	}
	return nil
}

// copyOutput copies the job's output from r to the log until every writer
// has closed the pipe. A failing log (a full disk, a failed rotation) does
// not end the job: the error is logged once and the rest of the output is
// drained and dropped, so the job never gets EPIPE for it.
func (m *monitor) copyOutput(r *os.File, out io.WriteCloser) {
	m.logDone = make(chan struct{})
	go func() {
		defer close(m.logDone)
		if _, err := io.Copy(out, r); err != nil {
			m.log.Warn("writing job output failed; dropping the rest of it", "err", err)
			if _, err := io.Copy(io.Discard, r); err != nil {
				m.log.Warn("draining job output", "err", err)
			}
		}
		r.Close()
		out.Close()
	}()
}

// startContainer starts a container job through the runtime, in the job's
// cgroup.
func (m *monitor) startContainer(out io.WriteCloser) error {
	if m.rt == nil {
		out.Close()
		return errors.New("this fusiond binary cannot run container jobs (rootfs)")
	}
	if m.cg == nil {
		out.Close()
		return errors.New("container jobs need cgroups, and fusiond runs without them")
	}
	// The root filesystem is opened and checked as the job's user; the
	// runtime starts the container over exactly that directory.
	root, rootPath, err := openRootfs(m.spec)
	if err != nil {
		out.Close()
		return err
	}
	defer root.Close()
	if m.spec.SetIdentity {
		// A root runtime re-resolves the path it is given: it gets one
		// that no user can swap, onto which the opened directory itself
		// is mounted, where root can create nothing.
		var idmapErr error
		if rootPath, idmapErr, err = stageRoot(root, filepath.Join(m.dir, stagedRootDir), m.spec.UID); err != nil {
			out.Close()
			return fmt.Errorf("rootfs %s: %w", m.spec.Rootfs, err)
		}
		if idmapErr != nil && m.spec.UID != 0 {
			m.log.Warn("container root staged without an idmap: a mount point the job's user removes while the container starts would be made again by the runtime, as root, in the user's root filesystem", "err", idmapErr)
		}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		out.Close()
		return err
	}
	m.copyOutput(outR, out)
	p, err := m.rt.Start(ContainerRequest{
		Spec: m.spec, StateDir: filepath.Join(m.dir, "container"),
		CgroupPath: m.cg.Path(), Limits: m.spec.Cgroup.Limits, Output: outW,
		Root: root, RootPath: rootPath,
	})
	outW.Close()
	if err != nil {
		return fmt.Errorf("start container: %w", err)
	}
	m.proc = p
	return nil
}

// cmdProcess is a plain job process.
type cmdProcess struct{ cmd *osexec.Cmd }

func (p *cmdProcess) Pid() int { return p.cmd.Process.Pid }

func (p *cmdProcess) Wait() (syscall.WaitStatus, error) {
	err := p.cmd.Wait()
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		return ws, nil
	}
	return 0, err
}

func (p *cmdProcess) Close() error { return nil }

// createCgroup creates the job's cgroup. A shared-pool job's cpus were
// computed by the daemon a moment ago; a guaranteed job placed since may
// have taken cores out of the pool, and a v1 cpuset must stay within its
// tier's: so the job gets the part of its planned set that the tier still
// has, re-read when a concurrent change of the pool gets in the way.
func createCgroup(mgr *cgroups.Manager, jobID string, tier cgroups.Tier, lim cgroups.Limits) (*cgroups.Cgroup, error) {
	if tier == cgroups.Guaranteed || lim.Cpus == "" {
		return mgr.Create(jobID, tier, lim)
	}
	planned, err := cgroups.ParseCPUList(lim.Cpus)
	if err != nil {
		return nil, err
	}
	var cg *cgroups.Cgroup
	for range 3 {
		if pool, err := mgr.TierCPUs(tier); err == nil {
			if in := intersect(planned, pool); len(in) > 0 {
				lim.Cpus = cgroups.FormatCPUList(in)
			} else if len(pool) > 0 {
				lim.Cpus = cgroups.FormatCPUList(pool)
			}
		}
		if cg, err = mgr.Create(jobID, tier, lim); err == nil {
			return cg, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, err
}

func intersect(a, b []int) []int {
	var out []int
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// supervise waits for the job's first process while obeying signals:
// SIGTERM (and SIGINT) is passed to every process of the job and, after the
// grace period, the whole job is killed; SIGUSR1 kills it at once.
func (m *monitor) supervise(sigs <-chan os.Signal) syscall.WaitStatus {
	waited := make(chan syscall.WaitStatus, 1)
	go func() {
		ws, err := m.proc.Wait()
		if err != nil {
			m.log.Error("waiting for the job", "err", err)
		}
		waited <- ws
	}()
	var grace <-chan time.Time
	for {
		select {
		case ws := <-waited:
			return ws
		case sig := <-sigs:
			switch sig {
			case syscall.SIGTERM, syscall.SIGINT:
				m.log.Info("terminating job", "grace", m.spec.Grace)
				m.signalAll(syscall.SIGTERM)
				if grace == nil {
					grace = time.After(m.spec.Grace)
				}
			case syscall.SIGUSR1:
				m.log.Info("killing job")
				m.killAll()
			}
		case <-grace:
			m.log.Warn("job ignored SIGTERM; killing it", "grace", m.spec.Grace)
			m.killAll()
		}
	}
}

// signalAll sends sig to every process of the job.
func (m *monitor) signalAll(sig syscall.Signal) {
	if m.cg != nil {
		if pids, err := m.cg.Procs(); err == nil {
			for _, p := range pids {
				_ = syscall.Kill(p, sig)
			}
			return
		}
	}
	_ = syscall.Kill(-m.proc.Pid(), sig)
}

// killAll kills every process of the job: the whole cgroup, or without
// one the job's process group.
func (m *monitor) killAll() {
	if m.cg != nil {
		if err := m.cg.Kill(); err != nil {
			m.log.Error("killing the job's cgroup", "err", err)
		}
		return
	}
	_ = syscall.Kill(-m.proc.Pid(), syscall.SIGKILL)
}

// finish kills what is left of the job, drains its output, measures it and
// removes its cgroup.
func (m *monitor) finish(ws syscall.WaitStatus, oomBefore uint64) Result {
	m.killAll()
	select {
	case <-m.logDone:
	case <-time.After(5 * time.Second):
		// Without a cgroup, a process that escaped the process group may
		// hold the output pipe; do not wait for it forever.
		m.log.Warn("job output still open after the job ended")
	}
	res := Result{FinishedAt: time.Now().UTC(), Reason: cgroups.ExitExited}
	var st cgroups.Stats
	if m.cg != nil {
		var err error
		if st, err = m.cg.Stats(); err != nil {
			m.log.Warn("reading job accounting", "err", err)
		} else {
			u := usageFrom(st)
			u.MemoryCurrent = 0
			res.Usage = &u
		}
		res.Reason = cgroups.ExitReason(ws, oomBefore, st)
	} else if ws.Signaled() {
		res.Reason = cgroups.ExitSignaled
	}
	switch {
	case ws.Signaled():
		res.Exit = api.ExitStatus{Code: 128 + int(ws.Signal()), Signal: signalName(ws.Signal())}
	default:
		res.Exit = api.ExitStatus{Code: ws.ExitStatus()}
	}
	res.Exit.OOMKilled = res.Reason == cgroups.ExitOOMKilled
	if err := m.proc.Close(); err != nil {
		m.log.Warn("releasing the job's container", "err", err)
	}
	m.cleanup()
	return res
}

// cleanup removes the job's cgroup.
func (m *monitor) cleanup() {
	if m.cg == nil {
		return
	}
	if err := m.cg.Delete(); err != nil {
		m.log.Error("removing the job's cgroup", "err", err)
	}
}

// stubReady is the byte the job's first process writes on fd 4 once it is
// up and waiting for its spec.
const stubReady = 'R'

// runExec is the job's first process: it reads its Spec from fd 3 (which
// the monitor writes only once the process is in the job's cgroup), applies
// rlimits and identity and execs the command. It first writes stubReady to
// fd 4; then a failure is written there, and exec closes it on success.
func runExec() int {
	runtime.LockOSThread()
	specF := os.NewFile(3, "spec")
	errF := os.NewFile(4, "exec-error")
	if specF == nil || errF == nil {
		fmt.Fprintln(os.Stderr, "fusiond __exec is started by the job monitor only")
		return 2
	}
	unix.CloseOnExec(4)
	fail := func(format string, args ...any) int {
		fmt.Fprintf(errF, format, args...)
		return 127
	}
	if _, err := errF.Write([]byte{stubReady}); err != nil {
		return 127
	}
	var spec Spec
	if err := json.NewDecoder(specF).Decode(&spec); err != nil {
		return fail("reading the job spec: %v", err)
	}
	specF.Close()
	for _, rl := range spec.Rlimits {
		if err := unix.Setrlimit(rl.Resource, &unix.Rlimit{Cur: rl.Soft, Max: rl.Hard}); err != nil {
			return fail("setrlimit %d: %v", rl.Resource, err)
		}
	}
	if spec.SetIdentity {
		// Raw per-thread calls on this locked thread: exec follows at once
		// and only this thread survives it.
		if err := setIdentity(spec.UID, spec.GID, spec.Groups); err != nil {
			return fail("switch to uid %d: %v", spec.UID, err)
		}
	}
	if err := unix.Chdir(spec.Dir); err != nil {
		return fail("working directory %s: %v", spec.Dir, err)
	}
	// Looked up now, as the job's user: a file in a directory the user
	// cannot search is "not found", as a missing one is.
	path, err := lookPath(spec.Path, spec.Env)
	if err != nil {
		return fail("%v", err)
	}
	err = unix.Exec(path, spec.Args, spec.Env)
	return fail("exec %s: %v", path, err)
}

func setIdentity(uid, gid uint32, groups []uint32) error {
	var ptr unsafe.Pointer
	if len(groups) > 0 {
		ptr = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(ptr), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	return nil
}

// resultReserve is the room a monitor sets aside for its result; a result
// is a few hundred bytes, the rest is for the filesystem's own metadata.
const resultReserve = 64 << 10

// reserveSpace writes (not merely allocates: no filesystem may count it
// as free) n bytes to path, durably.
func reserveSpace(path string, n int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(make([]byte, n)); err != nil {
		f.Close()
		_ = os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
