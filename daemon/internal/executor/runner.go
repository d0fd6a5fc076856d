package executor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// MonitorConfig configures a MonitorRunner.
type MonitorConfig struct {
	// JobsDir holds one directory per job (<JobsDir>/<job>/output.log);
	// attempts live in <JobsDir>/<job>/attempt-<n>.
	JobsDir string
	// Executable is the fusiond binary the monitors run (os.Executable()
	// of the daemon; in tests the test binary, whose TestMain calls
	// Dispatch).
	Executable string
	// Cgroups, when set, gives every job a cgroup; CgroupRoot and
	// CgroupParent must be what it was built with (the monitors build
	// their own).
	Cgroups      *cgroups.Manager
	CgroupRoot   string
	CgroupParent string
	// SharedCPUs returns the shared CPU pool burstable and best-effort
	// jobs run on (all CPUs when nil).
	SharedCPUs func() []int
	// MemNodes maps the NUMA node a job is aligned to onto the nodes its
	// cpuset.mems names: the node itself when it has memory, its nearest
	// memory nodes when it has none (topology.Host.MemoryNodesFor); nil
	// or an empty answer leaves cpuset.mems unset. When MemNodes is nil
	// the job's node is used as it is.
	MemNodes func(node int) []int
	// Grace is what a monitor waits after SIGTERM before killing the job.
	Grace time.Duration
	// LogMaxBytes caps output.log before rotation (DefaultLogMaxBytes).
	LogMaxBytes int64
	// ProcRoot is /proc.
	ProcRoot string
	// StartTimeout bounds how long Start waits for the monitor's report.
	StartTimeout time.Duration
	// NoCgroups, when Cgroups is nil, says why (not root, a controller
	// missing). Jobs without a cgroup run with no limits, no device
	// isolation and no accounting: Start refuses them unless
	// AllowUnisolated is set.
	NoCgroups       string
	AllowUnisolated bool
}

// MonitorRunner starts every job attempt under its own monitor process
// (the fusiond binary re-executed with MonitorArg), in the manner of
// containerd's shims: the monitor is in a session of its own, owns the job's
// process and cgroup, and records the job's end durably in the attempt
// directory, so jobs survive a daemon crash or restart and Attach finds them
// again.
type MonitorRunner struct {
	cfg    MonitorConfig
	log    *slog.Logger
	asRoot bool
}

var (
	_ jobs.Runner        = (*MonitorRunner)(nil)
	_ jobs.QuotaSetter   = (*MonitorRunner)(nil)
	_ jobs.Process       = (*monitorProcess)(nil)
	_ jobs.UsageReporter = (*monitorProcess)(nil)
)

// NewMonitorRunner returns a runner.
func NewMonitorRunner(cfg MonitorConfig, log *slog.Logger) *MonitorRunner {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if cfg.LogMaxBytes <= 0 {
		cfg.LogMaxBytes = DefaultLogMaxBytes
	}
	return &MonitorRunner{cfg: cfg, log: log, asRoot: os.Geteuid() == 0}
}

// AttemptDir is where one attempt's monitor keeps its files.
func (r *MonitorRunner) AttemptDir(jobID string, attempt int) string {
	return filepath.Join(r.cfg.JobsDir, jobID, "attempt-"+strconv.Itoa(attempt))
}

// ErrNoExclusiveCPUs is returned for a guaranteed job placed without an
// exclusive CPU set while cgroups are in use.
var ErrNoExclusiveCPUs = errors.New("guaranteed job has no exclusive CPU set")

// ErrUnisolated is returned by Start for every job when jobs would run
// without a cgroup and that was not allowed.
var ErrUnisolated = errors.New("jobs cannot be isolated on this node")

// Isolation says how this runner confines jobs (for the node status).
func (r *MonitorRunner) Isolation() api.Isolation {
	if r.cfg.Cgroups != nil {
		return api.Isolation{Isolated: true, Mode: r.cfg.Cgroups.Mode().String()}
	}
	return api.Isolation{Reason: r.cfg.NoCgroups, JobsRefused: !r.cfg.AllowUnisolated}
}

// ErrAttemptRunning: Start was asked for an attempt whose monitor is still
// alive; its directory is left alone.
var ErrAttemptRunning = errors.New("a monitor of this attempt is still running")

// cgroupPlacement turns a run request — its tier and recorded allocation
// (api.Allocation) — into cgroups.Placement, the one hardware-facing form of
// a placement; the executor keeps no placement type of its own. Guaranteed
// jobs on their exclusive cores with memory limit = request;
// burstable jobs on the shared pool weighted by their CPU request with
// their memory as limit; best-effort jobs on the shared pool with a CPU
// quota at their request (changeable with SetCPUQuota) and their memory as
// limit.
//
// A job aligned to a NUMA node allocates from that node, or, through
// memNodes (MonitorConfig.MemNodes) when the node has no memory, from its
// nearest memory nodes: a memory-less node in cpuset.mems is refused by
// the kernel (cgroup v1) or silently widened to every node (v2).
func cgroupPlacement(req jobs.RunRequest, shared []int, memNodes func(int) []int) (cgroups.Placement, error) {
	a := req.Allocation
	cpu := int64(a.CPU)
	mem := int64(a.Memory)
	p := cgroups.Placement{
		Tier:            req.Tier,
		CPURequestMilli: cpu,
		MemoryRequest:   mem,
		MemoryLimit:     mem,
		Devices:         req.Devices,
		SharedCPUs:      shared,
	}
	if a.NUMANode >= 0 && a.CPUSet != "" {
		p.MemNodes = []int{a.NUMANode}
		if memNodes != nil {
			p.MemNodes = memNodes(a.NUMANode)
		}
	}
	switch p.Tier {
	case cgroups.Guaranteed:
		cpus, err := cgroups.ParseCPUList(a.CPUSet)
		if err != nil {
			return p, fmt.Errorf("job %s exclusive cpus: %w", req.JobID, err)
		}
		if len(cpus) == 0 {
			return p, ErrNoExclusiveCPUs
		}
		p.ExclusiveCPUs = cpus
		p.SharedCPUs = nil
	case cgroups.BestEffort:
		p.CPULimitMilli = cpu
	}
	return p, nil
}

// withDeviceEnv is the job's environment with the device grant's
// variables in place of any the job's spec set itself (a spec's
// CUDA_VISIBLE_DEVICES or CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): each key
// appears once, so no libc's getenv can pick the job's own value over
// fusiond's.
func withDeviceEnv(env []string, dev map[string]string) []string {
	out := make([]string, 0, len(env)+len(dev))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := dev[k]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(dev)) {
		out = append(out, k+"="+dev[k])
	}
	return out
}

// Start writes the attempt's spec and starts its monitor, which reports
// once the job's process runs in its cgroup.
func (r *MonitorRunner) Start(ctx context.Context, req jobs.RunRequest) (jobs.Process, error) {
	if r.cfg.Cgroups == nil && !r.cfg.AllowUnisolated {
		return nil, fmt.Errorf("%w (%s): refusing to run job %s without limits or device isolation; a node may run jobs so only with allow_unisolated_jobs: true in its config", ErrUnisolated, r.cfg.NoCgroups, req.JobID)
	}
	// The command is looked up in the job's PATH by the job's own first
	// process once it runs as the job's user (a container's, by the
	// container's init, inside it, also as the user): root's look-up
	// would tell a user which files exist in directories they cannot
	// search.
	path := req.Command[0]
	env := append(withDeviceEnv(req.Env, req.DeviceEnv), r.jobsDirMarker())
	spec := Spec{
		JobID: req.JobID, Attempt: req.Attempt,
		Path: path, Args: slices.Clone(req.Command), Env: env, Dir: req.Workdir,
		SetIdentity: r.asRoot, UID: req.UID, GID: req.GID, Groups: req.Groups,
		LogPath: req.LogPath, LogMaxBytes: r.cfg.LogMaxBytes, Grace: r.cfg.Grace,
		Rootfs: req.Rootfs, Devices: req.Devices,
	}
	if r.cfg.Cgroups != nil {
		var shared []int
		if r.cfg.SharedCPUs != nil {
			shared = r.cfg.SharedCPUs()
		}
		if len(shared) == 0 {
			shared = onlineCPUs()
		}
		p, err := cgroupPlacement(req, shared, r.cfg.MemNodes)
		if err != nil {
			return nil, err
		}
		lim, err := cgroups.Plan(p)
		if err != nil {
			return nil, err
		}
		spec.Cgroup = &CgroupSpec{Root: r.cfg.CgroupRoot, Parent: r.cfg.CgroupParent, Tier: p.Tier, Limits: lim}
	}
	dir := r.AttemptDir(req.JobID, req.Attempt)
	// A directory left by a start that never got going is stale; one whose
	// monitor still runs is not, and is never removed from under it.
	alive, err := monitorAlive(dir)
	if err != nil {
		return nil, fmt.Errorf("attempt directory: %w", err)
	}
	if alive {
		return nil, fmt.Errorf("job %s attempt %d: %w", req.JobID, req.Attempt, ErrAttemptRunning)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("attempt directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("attempt directory: %w", err)
	}
	if err := writeJSONDurably(filepath.Join(dir, specFile), spec); err != nil {
		return nil, fmt.Errorf("write job spec: %w", err)
	}
	// A root monitor of a container job lives in a mount namespace of its
	// own, where it stages the job's root (see stageRoot): nothing it
	// mounts is seen by, or left to, the host.
	return r.startMonitor(ctx, req.JobID, req.Attempt, dir, spec.Rootfs != "" && spec.SetIdentity)
}

func (r *MonitorRunner) startMonitor(ctx context.Context, jobID string, attempt int, dir string, ownMountNS bool) (*monitorProcess, error) {
	mlog, err := os.OpenFile(filepath.Join(dir, monitorLogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("monitor log: %w", err)
	}
	defer mlog.Close()
	// The lock is taken here and handed to the monitor, so that it is held
	// from before the monitor exists until the monitor is gone.
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("monitor lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil, fmt.Errorf("monitor lock: %w", err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer readyR.Close()
	cmd := osexec.Command(r.cfg.Executable, MonitorArg, dir)
	cmd.Args[0] = "fusiond-monitor"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.Stderr = mlog
	cmd.ExtraFiles = []*os.File{readyW, lock}
	// A session of its own: the monitor outlives the daemon and gets none
	// of its terminal's signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if ownMountNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
	}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return nil, fmt.Errorf("start monitor: %w", err)
	}
	// The daemon reaps the monitor it started; a later daemon does not
	// need to (init does).
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()

	type answer struct {
		msg readyMsg
		err error
	}
	got := make(chan answer, 1)
	go func() {
		var m readyMsg
		line, err := bufio.NewReader(readyR).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &m)
		}
		got <- answer{m, err}
	}()
	timer := time.NewTimer(r.cfg.StartTimeout)
	defer timer.Stop()
	var a answer
	select {
	case a = <-got:
	case <-timer.C:
		r.abandonStart(jobID, attempt, cmd.Process, exited)
		return nil, fmt.Errorf("monitor did not report within %s", r.cfg.StartTimeout)
	case <-ctx.Done():
		r.abandonStart(jobID, attempt, cmd.Process, exited)
		return nil, ctx.Err()
	}
	switch {
	case a.err != nil:
		return nil, fmt.Errorf("monitor failed before the job started (see %s): %w", filepath.Join(dir, monitorLogFile), a.err)
	case a.msg.Error != "":
		return nil, errors.New(a.msg.Error)
	}
	start, _ := processStart(r.cfg.ProcRoot, cmd.Process.Pid)
	r.log.Debug("job monitor started", "job", jobID, "attempt", attempt, "monitor", cmd.Process.Pid, "pid", a.msg.JobPID)
	return &monitorProcess{r: r, jobID: jobID, dir: dir, monPID: cmd.Process.Pid, monStart: start, jobPID: a.msg.JobPID}, nil
}

// abandonStart kills a monitor that did not report in time and then reaps
// the job: a late monitor may already have started it (in its cgroup, or
// carrying its FUSIOND_JOB_ID marker), and the caller releases the job's
// resources once Start fails, so nothing of it may be left running.
func (r *MonitorRunner) abandonStart(jobID string, attempt int, mon *os.Process, exited <-chan struct{}) {
	_ = mon.Kill()
	// The monitor must be gone before the reap, or it could still be
	// starting the job behind it.
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		r.log.Warn("killed job monitor has not exited", "job", jobID, "attempt", attempt, "monitor", mon.Pid)
	}
	n, err := r.Reap(jobID, 0)
	if err != nil {
		r.log.Warn("reap job after a failed start", "job", jobID, "attempt", attempt, "err", err)
		return
	}
	if n > 0 {
		r.log.Info("reaped job after a failed start", "job", jobID, "attempt", attempt, "killed", n)
	}
}

// Attach finds the monitor of an attempt an earlier daemon started, or the
// result it left.
func (r *MonitorRunner) Attach(jobID string, attempt int) (jobs.Process, error) {
	dir := r.AttemptDir(jobID, attempt)
	p := &monitorProcess{r: r, jobID: jobID, dir: dir}
	var res Result
	if err := readJSON(filepath.Join(dir, resultFile), &res); err == nil {
		p.result = &res
		var st State
		if readJSON(filepath.Join(dir, stateFile), &st) == nil {
			p.jobPID = st.JobPID
		}
		return p, nil
	}
	// A monitor still starting its job has not named the job yet: wait
	// (bounded) until it has, or is gone.
	deadline := time.Now().Add(r.cfg.StartTimeout)
	for {
		alive, err := monitorAlive(dir)
		if err != nil {
			return nil, err
		}
		if !alive {
			// The monitor may have written its result and exited just now.
			if readJSON(filepath.Join(dir, resultFile), &res) == nil {
				p.result = &res
				return p, nil
			}
			// A monitor records itself (state.json) before it starts the
			// job: without that record no monitor of this attempt ever
			// got going.
			if _, err := os.Lstat(filepath.Join(dir, stateFile)); errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("job %s attempt %d: %w", jobID, attempt, jobs.ErrNeverStarted)
			}
			return nil, fmt.Errorf("job %s attempt %d: %w", jobID, attempt, jobs.ErrGone)
		}
		var st State
		if err := readJSON(filepath.Join(dir, stateFile), &st); err == nil && st.JobPID > 0 {
			p.monPID, p.monStart, p.jobPID = st.MonitorPID, st.MonitorStart, st.JobPID
			return p, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("job %s attempt %d: monitor alive but has not started the job within %s", jobID, attempt, r.cfg.StartTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// monitorAlive reports whether a process holds the attempt's monitor lock.
func monitorAlive(dir string) (bool, error) {
	f, err := os.Open(filepath.Join(dir, lockFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("monitor lock: %w", err)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false, nil
}

// Reap kills whatever is left of a job whose monitor could not be
// re-attached: live monitors of its attempts, its cgroup's processes (and
// the cgroup), or without cgroups the members of its process group that
// carry its job ID.
func (r *MonitorRunner) Reap(jobID string, pid int) (int, error) {
	killed := r.killMonitors(jobID)
	if r.cfg.Cgroups == nil {
		n, err := reapByEnv(r.cfg.ProcRoot, jobID, r.jobsDirMarker(), pid)
		return killed + n, err
	}
	cg, err := r.cfg.Cgroups.Load(jobID)
	if errors.Is(err, cgroups.ErrNotFound) {
		n, err := reapByEnv(r.cfg.ProcRoot, jobID, r.jobsDirMarker(), pid)
		return killed + n, err
	}
	if err != nil {
		return killed, err
	}
	pids, _ := cg.Procs()
	if err := cg.Kill(); err != nil {
		return killed, err
	}
	return killed + len(pids), cg.Delete()
}

// jobsDirMarker is the environment entry every job this runner starts
// carries besides FUSIOND_JOB_ID: job IDs repeat across daemons (on one
// host in tests, or after a state directory is replaced), and a reap by
// environment must never kill another daemon's job of the same ID.
func (r *MonitorRunner) jobsDirMarker() string {
	return "FUSIOND_JOBS_DIR=" + r.cfg.JobsDir
}

// killMonitors SIGKILLs the live monitors of a job's attempts and says how
// many it killed.
func (r *MonitorRunner) killMonitors(jobID string) int {
	dirs, _ := filepath.Glob(filepath.Join(r.cfg.JobsDir, jobID, "attempt-*"))
	killed := 0
	for _, dir := range dirs {
		if alive, err := monitorAlive(dir); err != nil || !alive {
			continue
		}
		var st State
		if readJSON(filepath.Join(dir, stateFile), &st) != nil || st.MonitorPID <= 0 {
			continue
		}
		p := &monitorProcess{r: r, monPID: st.MonitorPID, monStart: st.MonitorStart}
		if err := p.signalMonitor(syscall.SIGKILL); err == nil {
			killed++
		}
	}
	return killed
}

// SetCPUQuota changes a running job's CPU quota (millicores; 0 removes it).
func (r *MonitorRunner) SetCPUQuota(jobID string, milli int64) error {
	if r.cfg.Cgroups == nil {
		return errors.New("jobs run without cgroups: no CPU quota to change")
	}
	cg, err := r.cfg.Cgroups.Load(jobID)
	if err != nil {
		return err
	}
	return cg.SetCPUQuota(milli)
}

// monitorProcess is the daemon's handle on one monitored attempt.
type monitorProcess struct {
	r        *MonitorRunner
	jobID    string
	dir      string
	monPID   int
	monStart uint64
	jobPID   int

	mu     sync.Mutex
	result *Result
}

func (p *monitorProcess) PID() int { return p.jobPID }

// Wait blocks until the monitor has gone (its lock is free), then returns
// the result it recorded.
func (p *monitorProcess) Wait() (api.ExitStatus, error) {
	p.mu.Lock()
	res := p.result
	p.mu.Unlock()
	if res != nil {
		return res.Exit, nil
	}
	f, err := os.Open(filepath.Join(p.dir, lockFile))
	if err != nil {
		return api.ExitStatus{}, fmt.Errorf("monitor lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_SH)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	f.Close()
	if err != nil {
		return api.ExitStatus{}, fmt.Errorf("monitor lock: %w", err)
	}
	var r Result
	if err := readJSON(filepath.Join(p.dir, resultFile), &r); err != nil {
		return api.ExitStatus{}, fmt.Errorf("the job's monitor ended without recording a result (see %s): %w",
			filepath.Join(p.dir, monitorLogFile), err)
	}
	p.mu.Lock()
	p.result = &r
	p.mu.Unlock()
	return r.Exit, nil
}

// Usage is the job's accounting: measured now while it runs, as recorded
// once it has ended.
func (p *monitorProcess) Usage() (api.Usage, error) {
	p.mu.Lock()
	res := p.result
	p.mu.Unlock()
	if res != nil {
		if res.Usage == nil {
			return api.Usage{}, errors.New("no accounting recorded")
		}
		return *res.Usage, nil
	}
	if p.r.cfg.Cgroups == nil {
		return api.Usage{}, errors.New("jobs run without cgroups")
	}
	cg, err := p.r.cfg.Cgroups.Load(p.jobID)
	if err != nil {
		return api.Usage{}, err
	}
	st, err := cg.Stats()
	if err != nil {
		return api.Usage{}, err
	}
	return usageFrom(st), nil
}

// Signal asks the monitor to act: SIGKILL kills the whole job at once
// (the monitor gets SIGUSR1); other signals are passed to the monitor,
// which terminates the job on SIGTERM. The monitor is named by pid and
// start time, through a pidfd, so a recycled pid is never signalled.
func (p *monitorProcess) Signal(sig syscall.Signal) error {
	if p.monPID <= 0 {
		return nil // already finished
	}
	if sig == syscall.SIGKILL {
		sig = syscall.SIGUSR1
	}
	return p.signalMonitor(sig)
}

// signalMonitor sends sig to the monitor process itself.
func (p *monitorProcess) signalMonitor(sig syscall.Signal) error {
	fd, err := unix.PidfdOpen(p.monPID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd of monitor %d: %w", p.monPID, err)
	}
	defer unix.Close(fd)
	if start, err := processStart(p.r.cfg.ProcRoot, p.monPID); err != nil || start != p.monStart {
		return nil // the monitor is gone; its pid names another process
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal monitor %d: %w", p.monPID, err)
	}
	return nil
}

// onlineCPUs is every CPU the daemon may run on.
func onlineCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}
