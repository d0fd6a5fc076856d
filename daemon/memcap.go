package daemon

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/metrics"
	"github.com/fusiond/fusiond/devices/nvidia"
)

// memCapJobs is what the memory-cap watch asks of the job manager.
type memCapJobs interface {
	// NoteGPUMemory records an over-cap (or back-under) episode on a
	// running job; StopOverGPUCap stops the job for one.
	NoteGPUMemory(id, reason string) error
	StopOverGPUCap(id, reason string) error
}

// pidOwners attributes GPU processes to jobs: for the running jobs ids,
// a function naming the job a PID belongs to ("" for none).
type pidOwners interface {
	owners(ids []string) func(pid uint32) string
}

type memCapKey struct{ job, gpu string }

// memCapWatch enforces the memory caps of shares on time-sliced GPUs.
// NVML's running compute processes (sampled by the GPU driver's telemetry
// sampler, the sweep the telemetry bus reads, on MPS and time-sliced GPUs
// alike) are attributed to jobs through their cgroups and summed per job
// per GPU; a share whose job holds more than its cap starts an episode:
// one event on the job, counted once, and, under over_cap: kill, the job
// is stopped. MPS GPUs are left to MPS, which sets their caps. The episode
// ends when the job is back under its cap (an event, under warn) or its
// share is gone.
type memCapWatch struct {
	policy  OverCapPolicy
	samples func() []nvidia.Sample
	shares  func() []nvidia.ShareStatus
	owners  pidOwners
	jobs    memCapJobs
	log     *slog.Logger

	mu              sync.Mutex
	over            map[memCapKey]nvidia.ShareMemory
	episodes, kills uint64
}

func newMemCapWatch(policy OverCapPolicy, samples func() []nvidia.Sample, shares func() []nvidia.ShareStatus, owners pidOwners, j memCapJobs, log *slog.Logger) *memCapWatch {
	return &memCapWatch{policy: policy, samples: samples, shares: shares, owners: owners, jobs: j, log: log, over: map[memCapKey]nvidia.ShareMemory{}}
}

// gib writes MiB as GiB with at most one decimal ("2 GiB", "9.1 GiB").
func gib(mb uint64) string {
	return strconv.FormatFloat(float64(int64(float64(mb)/1024*10+0.5))/10, 'f', -1, 64) + " GiB"
}

// overCapReason says how far over its cap a share's job is.
func overCapReason(u nvidia.ShareMemory) string {
	pids := make([]string, len(u.PIDs))
	for i, p := range u.PIDs {
		pids[i] = strconv.FormatUint(uint64(p), 10)
	}
	return fmt.Sprintf("GPU memory %s over its cap of %s on %s (time-sliced share; processes %s)",
		gib(u.UsedMB), gib(u.CapMB), u.GPU, strings.Join(pids, ", "))
}

// check takes one look at the shares' memory and acts on what changed.
func (w *memCapWatch) check() {
	shares := w.shares()
	present := map[memCapKey]bool{}
	var ids []string
	for _, st := range shares {
		if st.Mode != nvidia.ModeTimeSlicing {
			continue
		}
		for _, sh := range st.Shares {
			if sh.MemoryMB > 0 {
				present[memCapKey{sh.ID, st.GPU}] = true
				ids = append(ids, sh.ID)
			}
		}
	}
	var use []nvidia.ShareMemory
	if len(ids) > 0 {
		use = nvidia.TimeSlicedShareMemory(w.samples(), shares, w.owners.owners(ids))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.over {
		if !present[k] {
			delete(w.over, k) // the share is gone: the job ended or moved
		}
	}
	for _, u := range use {
		k := memCapKey{u.Job, u.GPU}
		_, in := w.over[k]
		switch {
		case u.Over() && !in:
			w.startEpisode(k, u)
		case !u.Over() && in:
			delete(w.over, k)
			if w.policy == OverCapWarn {
				why := fmt.Sprintf("GPU memory back under its cap: %s of %s on %s", gib(u.UsedMB), gib(u.CapMB), u.GPU)
				if err := w.jobs.NoteGPUMemory(u.Job, why); err != nil {
					w.log.Debug("GPU memory cap: could not record the end of an episode", "job", u.Job, "err", err)
				}
			}
		}
	}
}

// startEpisode records (under kill: and acts on) a share newly over its
// cap; called with w.mu held. An episode the job manager could not take
// (the job is not running yet, the store is full) is tried again at the
// next check.
func (w *memCapWatch) startEpisode(k memCapKey, u nvidia.ShareMemory) {
	why := overCapReason(u)
	var err error
	if w.policy == OverCapKill {
		err = w.jobs.StopOverGPUCap(u.Job, why)
	} else {
		err = w.jobs.NoteGPUMemory(u.Job, why+"; over_cap: warn, left running")
	}
	if err != nil {
		w.log.Warn("GPU memory cap: a job over its cap could not be acted on; trying again", "job", u.Job, "gpu", u.GPU, "policy", w.policy, "err", err)
		return
	}
	w.over[k] = u
	w.episodes++
	if w.policy == OverCapKill {
		w.kills++
	}
	w.log.Warn("GPU memory cap: job over its share's cap", "job", u.Job, "gpu", u.GPU, "usedMB", u.UsedMB, "capMB", u.CapMB, "policy", w.policy)
}

// stats are the watch's counters for the metrics.
func (w *memCapWatch) stats() metrics.GPUMemCap {
	if w == nil {
		return metrics.GPUMemCap{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return metrics.GPUMemCap{Over: len(w.over), Episodes: w.episodes, Kills: w.kills}
}

// run checks every interval until ctx ends.
func (w *memCapWatch) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		w.check()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// procOwners attributes processes to jobs by their cgroups (a process
// belongs to a job when /proc/PID/cgroup puts it in the job's cgroup or
// under it) or, when jobs run without cgroups, by ancestry: a process
// whose parent chain reaches a job's PID is that job's.
type procOwners struct {
	procRoot string // "/proc"
	cg       *cgroups.Manager
	// pid is a running job's PID, for attribution without cgroups.
	pid func(id string) int
}

func (o procOwners) owners(ids []string) func(pid uint32) string {
	if o.cg != nil {
		paths := map[string]string{} // "/" + cgroup path → job
		for _, id := range ids {
			if c, err := o.cg.Load(id); err == nil {
				paths["/"+c.Path()] = id
			}
		}
		return func(pid uint32) string { return o.byCgroup(pid, paths) }
	}
	pids := map[int]string{}
	for _, id := range ids {
		if p := o.pid(id); p > 0 {
			pids[p] = id
		}
	}
	return func(pid uint32) string { return o.byAncestry(int(pid), pids) }
}

// byCgroup reads /proc/PID/cgroup (every hierarchy's line, so v1 and v2
// alike) and finds a job cgroup holding the process.
func (o procOwners) byCgroup(pid uint32, paths map[string]string) string {
	b, err := readBounded(filepath.Join(o.procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"), 64<<10)
	if err != nil {
		return "" // gone, or not in this PID namespace
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		_, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		_, p, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for p != "/" && p != "." && p != "" {
			if id, ok := paths[p]; ok {
				return id
			}
			p = filepath.Dir(p)
		}
	}
	return ""
}

// byAncestry walks the parent chain of pid (at most 64 steps) to a job's
// PID.
func (o procOwners) byAncestry(pid int, pids map[int]string) string {
	for step := 0; step < 64 && pid > 1; step++ {
		if id, ok := pids[pid]; ok {
			return id
		}
		b, err := readBounded(filepath.Join(o.procRoot, strconv.Itoa(pid), "stat"), 4<<10)
		if err != nil {
			return ""
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			return ""
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			return ""
		}
		if pid, err = strconv.Atoi(f[1]); err != nil {
			return ""
		}
	}
	return ""
}

// readBounded reads at most limit bytes of a small /proc file.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(io.LimitReader(f, limit))
	return buf.Bytes(), err
}

// jobPID is a running job's PID from the manager (0 when unknown).
func jobPID(m *jobs.Manager) func(id string) int {
	return func(id string) int {
		j, err := m.Get(context.Background(), api.Caller{Admin: true}, id)
		if err != nil {
			return 0
		}
		return j.PID
	}
}

// startMemCap starts the memory-cap watch of time-sliced GPU shares,
// checking every telemetry.job_interval; a host without GPUs runs none
// (nil). stop ends it.
func startMemCap(ctx context.Context, cfg Config, h *hardware.Host, cg *cgroups.Manager, m *jobs.Manager, log *slog.Logger) (*memCapWatch, func(), error) {
	policy, err := cfg.GPU.OverCap()
	if err != nil {
		return nil, func() {}, fmt.Errorf("gpu.sharing.over_cap: %w", err)
	}
	g := h.GPUs()
	if g == nil {
		return nil, func() {}, nil
	}
	if cg == nil {
		log.Warn("GPU memory caps: jobs run without cgroups; GPU processes are attributed to jobs by ancestry (a process that leaves its job's process tree is not counted)")
	}
	w := newMemCapWatch(policy, h.Telemetry, g.ShareStatuses, procOwners{procRoot: "/proc", cg: cg, pid: jobPID(m)}, m, log)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(runCtx, time.Duration(cfg.Telemetry.JobInterval))
	}()
	log.Info("GPU memory caps of time-sliced shares watched", "over_cap", policy, "interval", time.Duration(cfg.Telemetry.JobInterval))
	return w, func() { cancel(); <-done }, nil
}
