// Package telemetry is fusiond's telemetry bus: one sampler that reads
// the host's load at a fixed rate (10 Hz by default) — per-CPU use from
// /proc/stat, pressure stall information from /proc/pressure, memory from
// /proc/meminfo, CPU package power from RAPL (devices/rapl), GPU
// utilisation and power from the NVIDIA driver's telemetry — and running
// jobs' usage from their cgroups at a slower rate, into ring buffers of a
// fixed size. It owns the one reader API the rest of the daemon uses for
// live load (Reader): the latest sample, a window, busy fractions per
// NUMA node, per-GPU utilisation, per-job usage, and the per-minute
// history the forecasters run on. It also keeps, for each followed job, a
// bounded summary of its current attempt's use (runs.go), which the
// daemon takes when the attempt ends for the job's task profile.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/sched"
	"github.com/fusiond/fusiond/devices/rapl"
)

// GPU is one GPU's reading in a sample.
type GPU struct {
	// ID is the device ID the placer uses (the GPU's UUID).
	ID string `json:"id"`
	// SMUtil and MemUtil are percentages (0..100).
	SMUtil  float64 `json:"sm_util"`
	MemUtil float64 `json:"mem_util"`
	PowerW  float64 `json:"power_w"`
	// LimitW is the power limit the GPU enforces (its cap), 0 when not
	// read.
	LimitW float64 `json:"limit_w,omitempty"`
	// MemUsedMiB is the GPU's memory in use, 0 when not read.
	MemUsedMiB float64 `json:"mem_used_mib,omitempty"`
}

// Sample is one reading of the host.
type Sample struct {
	At time.Time
	// CPUBusy is the host's busy fraction (0..1) since the previous
	// sample; CPUs the same per CPU number; Nodes per NUMA node (index =
	// node ID), the mean of the node's CPUs.
	CPUBusy float64
	CPUs    []float32
	Nodes   []float64
	// PSI is the host's pressure (percent, some avg10); PSIValid is false
	// where the kernel has no /proc/pressure.
	PSI      PSI
	PSIValid bool
	// MemTotal and MemAvailable are /proc/meminfo's, in bytes.
	MemTotal, MemAvailable uint64
	// PackageW is each CPU package's power (RAPL) since the previous
	// sample; empty without RAPL.
	PackageW []float64
	GPUs     []GPU
}

// PSI is the "some" avg10 of each resource, in percent.
type PSI struct {
	CPU    float64 `json:"cpu"`
	Memory float64 `json:"memory"`
	IO     float64 `json:"io"`
}

// JobRef is a running job the bus reads the cgroup of.
type JobRef struct {
	ID string
	// Started is when the job's current attempt started: it tells one
	// attempt's run summary from another's (TakeRun).
	Started time.Time
	// GPUs are the GPUs the job holds, for its run summary (TakeRun).
	GPUs []GPUHold
}

// JobUsage is one reading of a job's cgroup.
type JobUsage struct {
	At time.Time
	// CPUMilli is the job's CPU use since its previous reading, in
	// millicores.
	CPUMilli float64
	// Memory is memory.current (v2) or memory.usage_in_bytes (v1).
	Memory uint64
	// PSI is the job's pressure where the kernel has per-cgroup PSI
	// (cgroup v2); nil on cgroup v1.
	PSI *PSI
}

// Jobs is where the bus finds running jobs and their cgroups.
type Jobs interface {
	Running() []JobRef
	Stats(jobID string) (cgroups.Stats, error)
}

// PowerMeter reads CPU package power (*rapl.Meter).
type PowerMeter interface {
	Read(now time.Time) ([]rapl.Reading, error)
}

var _ PowerMeter = (*rapl.Meter)(nil)

// Config configures a Bus. Zero values take the defaults.
type Config struct {
	// Interval between host samples (default 100 ms: 10 Hz).
	Interval time.Duration
	// JobInterval between readings of the jobs' cgroups (default 1 s).
	JobInterval time.Duration
	// Ring is how many host samples are kept (default 3000: 5 min at
	// 10 Hz).
	Ring int
	// History is how many per-minute points are kept (default 1440: a day).
	History int
	// JobRing is how many readings are kept per job (default 300); MaxJobs
	// bounds the jobs followed at once (default 512, at most
	// MaxJobsLimit). A job followed stays followed while it runs; a job
	// that starts while MaxJobs are followed is not read until a followed
	// one ends, and is counted (Status, FollowStats) and logged: the bus
	// never drops jobs silently.
	JobRing, MaxJobs int
	// Proc is the proc file system (default /proc).
	Proc string
	// CPUNode maps a CPU number to its NUMA node (topology); CPUs not in
	// it count to node 0.
	CPUNode map[int]int
	// GPUs returns the driver's latest GPU telemetry; nil without GPUs.
	GPUs func() []GPU
	// GPUModel gives a GPU's figures from the GPU model table
	// (sched.LookupGPU of its model) by its ID, for the status's GPU
	// energy: its idle floor, its power where none is measured, and its
	// throughput. Nil: no GPU's model is known.
	GPUModel func(id string) (sched.GPUSpec, bool)
	// Jobs, when set, is read every JobInterval.
	Jobs Jobs
	// Power, when set, is read every sample; PowerNote says why it is
	// nil (no RAPL zones) for the status.
	Power     PowerMeter
	PowerNote string
	// JobPSINote says why jobs have no PSI (cgroup v1), for the status.
	JobPSINote string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.Interval == 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.JobInterval == 0 {
		c.JobInterval = time.Second
	}
	if c.Ring == 0 {
		c.Ring = 3000
	}
	if c.History == 0 {
		c.History = 1440
	}
	if c.JobRing == 0 {
		c.JobRing = 300
	}
	if c.MaxJobs == 0 {
		c.MaxJobs = DefaultMaxJobs
	}
	if c.Proc == "" {
		c.Proc = "/proc"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks a configuration (after defaults).
func (c Config) validate() error {
	switch {
	case c.Interval < 10*time.Millisecond:
		return fmt.Errorf("telemetry interval %v: at least 10ms", c.Interval)
	case c.JobInterval < c.Interval:
		return fmt.Errorf("telemetry job interval %v: at least the interval %v", c.JobInterval, c.Interval)
	case c.Ring < 10 || c.Ring > 1_000_000:
		return fmt.Errorf("telemetry ring %d: between 10 and 1000000 samples", c.Ring)
	case c.History < 60 || c.History > 100_000:
		return fmt.Errorf("telemetry history %d: between 60 and 100000 minutes", c.History)
	case c.JobRing < 2:
		return fmt.Errorf("telemetry job ring %d: at least 2", c.JobRing)
	case c.MaxJobs < 1 || c.MaxJobs > MaxJobsLimit:
		return fmt.Errorf("telemetry max jobs %d: between 1 and %d", c.MaxJobs, MaxJobsLimit)
	}
	return nil
}

// DefaultMaxJobs is how many jobs the bus follows at once by default.
const DefaultMaxJobs = 512

// MaxJobsLimit is the most jobs the bus can be configured to follow: each
// followed job holds a ring of JobRing readings (21.6 KB with the default
// 300), so 8192 jobs hold at most 177 MB, and the sampler reads every
// followed job's cgroup each JobInterval on its own goroutine, so far more
// would crowd out the host samples.
const MaxJobsLimit = 8192

// Bus samples the host and jobs and keeps the rings. Reads never block
// the sampler for longer than a copy.
type Bus struct {
	cfg Config
	log *slog.Logger

	// Sampler state, touched only by Sample (one goroutine).
	proc     procReader
	prevHost cpuTimes
	prevCPUs []cpuTimes
	curCPUs  []cpuTimes
	nodeOf   []int // CPU number → node
	nNodes   int
	primed   bool
	lastJobs time.Time
	prevJob  map[string]jobPrev
	minute   minuteAcc
	// follow is the running jobs the bus reads (at most MaxJobs);
	// refused the running jobs it does not, each counted once in
	// unfollowedTotal; atBound is true from the warning that opens an
	// episode of refusals to the note that ends it.
	follow  map[string]bool
	refused map[string]bool
	atBound bool

	mu      sync.RWMutex
	ring    []Sample
	next    int // slot the next sample goes to
	count   int // samples in the ring
	total   uint64
	cost    time.Duration // time spent sampling, all samples
	jobs    map[string]*jobRing
	history []Point
	hNext   int
	hCount  int
	lastErr string
	fc      forecasts
	// follows is the bus's following of jobs, for the status and metrics.
	follows FollowStats
	// energy integrates the GPUs' energy since the first sample.
	energy gpuEnergy
	// runs are the followed jobs' summaries of their current attempt;
	// ended those of jobs seen ending, until taken (TakeRun) or old.
	runs  map[string]*RunSummary
	ended map[string]endedRun
}

// FollowStats is how the bus follows the running jobs against its bound.
type FollowStats struct {
	// Followed is how many running jobs the bus reads, of at most Max.
	Followed, Max int
	// Unfollowed is how many running jobs it does not read now, because
	// Max were followed when they started.
	Unfollowed int
	// UnfollowedTotal counts the jobs it ever refused to follow (each job
	// once, however long it ran unfollowed).
	UnfollowedTotal uint64
}

type jobPrev struct {
	at  time.Time
	cpu time.Duration
}

// New builds a bus; Run starts it. A bad configuration is an error.
func New(cfg Config, log *slog.Logger) (*Bus, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bus{cfg: cfg, log: log, proc: procReader{root: cfg.Proc},
		ring: make([]Sample, cfg.Ring), history: make([]Point, cfg.History),
		jobs: map[string]*jobRing{}, prevJob: map[string]jobPrev{}, runs: map[string]*RunSummary{}, ended: map[string]endedRun{},
		follow: map[string]bool{}, refused: map[string]bool{}, follows: FollowStats{Max: cfg.MaxJobs}}
	for cpu, n := range cfg.CPUNode {
		for len(b.nodeOf) <= cpu {
			b.nodeOf = append(b.nodeOf, 0)
		}
		b.nodeOf[cpu] = n
		b.nNodes = max(b.nNodes, n+1)
	}
	b.nNodes = max(b.nNodes, 1)
	return b, nil
}

// Run samples every Interval until ctx ends.
func (b *Bus) Run(ctx context.Context) {
	t := time.NewTicker(b.cfg.Interval)
	defer t.Stop()
	for {
		if err := b.Sample(); err != nil {
			b.noteErr(err)
		} else {
			b.mu.Lock()
			b.lastErr = "" // the status shows only a current error
			b.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (b *Bus) noteErr(err error) {
	b.mu.Lock()
	first := b.lastErr == ""
	b.lastErr = err.Error()
	b.mu.Unlock()
	if first {
		b.log.Warn("telemetry sample failed (logged once; fusionctl status shows the latest)", "err", err)
	}
}

// Sample takes one sample now: the host always, the jobs when
// JobInterval has passed. It is what Run calls each tick; the benchmark
// calls it directly.
func (b *Bus) Sample() error {
	start := time.Now()
	now := b.cfg.Now()
	var errs []error
	// The slot written next holds the oldest sample: readers skip it
	// while it is rewritten (it leaves the count until the write ends),
	// and its slices are reused.
	b.mu.Lock()
	slot := &b.ring[b.next]
	if b.count == len(b.ring) {
		b.count--
	}
	b.mu.Unlock()
	s := Sample{At: now, CPUs: slot.CPUs[:0], Nodes: slot.Nodes[:0], PackageW: slot.PackageW[:0], GPUs: slot.GPUs[:0]}
	if err := b.readCPU(&s); err != nil {
		errs = append(errs, err)
	}
	if st, err := b.proc.read("meminfo"); err == nil {
		s.MemTotal, s.MemAvailable, err = parseMeminfo(st)
		if err != nil {
			errs = append(errs, err)
		}
	} else {
		errs = append(errs, fmt.Errorf("meminfo: %w", err))
	}
	s.PSI, s.PSIValid = b.readPSI()
	if b.cfg.Power != nil {
		if rs, err := b.cfg.Power.Read(now); err != nil {
			errs = append(errs, err)
		} else {
			for _, r := range rs {
				if r.Valid {
					s.PackageW = append(s.PackageW, r.PowerW)
				}
			}
		}
	}
	if b.cfg.GPUs != nil {
		s.GPUs = append(s.GPUs, b.cfg.GPUs()...)
	}
	if b.cfg.Jobs != nil && now.Sub(b.lastJobs) >= b.cfg.JobInterval {
		b.lastJobs = now
		if err := b.readJobs(now, s.GPUs); err != nil {
			errs = append(errs, err)
		}
	}
	var done *Point
	if b.primed {
		done = b.minute.add(&s)
	}
	b.mu.Lock()
	if b.primed {
		*slot = s
		b.next = (b.next + 1) % len(b.ring)
		b.count++
		if len(s.GPUs) > 0 {
			b.energy.add(&s, b.cfg.GPUModel)
		}
	}
	b.total++
	b.cost += time.Since(start)
	if done != nil {
		b.history[b.hNext] = *done
		b.hNext = (b.hNext + 1) % len(b.history)
		b.hCount = min(b.hCount+1, len(b.history))
	}
	b.mu.Unlock()
	if done != nil {
		b.refit()
	}
	b.primed = true
	return errors.Join(errs...)
}

func (b *Bus) readCPU(s *Sample) error {
	st, err := b.proc.read("stat")
	if err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	var host cpuTimes
	b.curCPUs, err = parseStat(st, &host, b.curCPUs[:0])
	if err != nil {
		return err
	}
	if b.primed {
		s.CPUBusy = busyFrac(b.prevHost, host)
		for len(s.Nodes) < b.nNodes {
			s.Nodes = append(s.Nodes, 0)
		}
		var perNode [64]int
		counts := perNode[:]
		if b.nNodes > len(perNode) {
			counts = make([]int, b.nNodes)
		}
		for cpu, cur := range b.curCPUs {
			var f float64
			if cpu < len(b.prevCPUs) {
				f = busyFrac(b.prevCPUs[cpu], cur)
			}
			s.CPUs = append(s.CPUs, float32(f))
			if cur.total == 0 {
				continue // a CPU number /proc/stat skips (offline)
			}
			n := 0
			if cpu < len(b.nodeOf) {
				n = b.nodeOf[cpu]
			}
			s.Nodes[n] += f
			counts[n]++
		}
		for n := range s.Nodes {
			if counts[n] > 0 {
				s.Nodes[n] /= float64(counts[n])
			}
		}
	}
	b.prevHost = host
	b.prevCPUs = append(b.prevCPUs[:0], b.curCPUs...)
	return nil
}

func (b *Bus) readPSI() (PSI, bool) {
	var p PSI
	for _, r := range []struct {
		file string
		dst  *float64
	}{{"pressure/cpu", &p.CPU}, {"pressure/memory", &p.Memory}, {"pressure/io", &p.IO}} {
		st, err := b.proc.read(r.file)
		if err != nil {
			return PSI{}, false
		}
		if *r.dst, err = parseSomeAvg10(st); err != nil {
			return PSI{}, false
		}
	}
	return p, true
}

func (b *Bus) readJobs(now time.Time, gpus []GPU) error {
	var errs []error
	running := b.cfg.Jobs.Running()
	seen := b.followJobs(running)
	for _, j := range running {
		if !seen[j.ID] {
			continue
		}
		st, err := b.cfg.Jobs.Stats(j.ID)
		if errors.Is(err, fs.ErrNotExist) {
			continue // the job ended, or has no cgroup yet, since Running
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("job %s: %w", j.ID, err))
			continue
		}
		prev, ok := b.prevJob[j.ID]
		b.prevJob[j.ID] = jobPrev{at: now, cpu: st.CPUUsage}
		if !ok || now.Sub(prev.at) <= 0 || st.CPUUsage < prev.cpu {
			continue
		}
		u := JobUsage{At: now, Memory: st.MemoryCurrent,
			CPUMilli: float64(st.CPUUsage-prev.cpu) / float64(now.Sub(prev.at)) * 1000}
		if st.PSI != nil {
			u.PSI = &PSI{CPU: st.PSI.CPU.Some.Avg10, Memory: st.PSI.Memory.Some.Avg10, IO: st.PSI.IO.Some.Avg10}
		}
		b.mu.Lock()
		r := b.jobs[j.ID]
		if r == nil {
			r = &jobRing{buf: make([]JobUsage, b.cfg.JobRing)}
			b.jobs[j.ID] = r
		}
		r.push(u)
		b.addRun(j, u, gpus)
		b.mu.Unlock()
	}
	b.mu.Lock()
	for id := range b.jobs {
		if !seen[id] {
			delete(b.jobs, id)
		}
	}
	b.endRuns(seen, now)
	b.mu.Unlock()
	for id := range b.prevJob {
		if !seen[id] {
			delete(b.prevJob, id)
		}
	}
	return errors.Join(errs...)
}

// followJobs updates which running jobs the bus follows and returns them:
// those followed already, while they run, then the others in running's
// order while fewer than MaxJobs are followed. The jobs left out are
// counted (each once), and an episode of them is logged at its start and
// its end, not per job or per reading.
func (b *Bus) followJobs(running []JobRef) map[string]bool {
	isRunning := make(map[string]bool, len(running))
	for _, j := range running {
		isRunning[j.ID] = true
	}
	for id := range b.follow {
		if !isRunning[id] {
			delete(b.follow, id)
		}
	}
	for id := range b.refused {
		if !isRunning[id] {
			delete(b.refused, id)
		}
	}
	var newlyRefused []string
	unfollowed := 0
	for _, j := range running {
		switch {
		case b.follow[j.ID]:
		case len(b.follow) < b.cfg.MaxJobs:
			b.follow[j.ID] = true
			delete(b.refused, j.ID)
		default:
			unfollowed++
			if !b.refused[j.ID] {
				b.refused[j.ID] = true
				newlyRefused = append(newlyRefused, j.ID)
			}
		}
	}
	b.mu.Lock()
	b.follows.Followed, b.follows.Unfollowed = len(b.follow), unfollowed
	b.follows.UnfollowedTotal += uint64(len(newlyRefused))
	total := b.follows.UnfollowedTotal
	b.mu.Unlock()
	switch {
	case unfollowed > 0 && !b.atBound:
		b.atBound = true
		b.log.Warn("telemetry: the job bound is reached: running jobs started from now on are not followed (no usage readings) until followed ones end; raise telemetry.max_jobs (logged once per episode; fusionctl status and fusiond_telemetry_jobs_unfollowed show it)",
			"max_jobs", b.cfg.MaxJobs, "unfollowed", unfollowed, "first", newlyRefused)
	case unfollowed == 0 && b.atBound:
		b.atBound = false
		b.log.Info("telemetry: every running job is followed again", "max_jobs", b.cfg.MaxJobs, "unfollowed_total", total)
	}
	return b.follow
}

// FollowStats reports how the bus follows the running jobs against its
// bound (as of the last job reading).
func (b *Bus) FollowStats() FollowStats {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.follows
}

// jobRing is one job's readings, oldest first from start.
type jobRing struct {
	buf         []JobUsage
	next, count int
}

func (r *jobRing) push(u JobUsage) {
	r.buf[r.next] = u
	r.next = (r.next + 1) % len(r.buf)
	r.count = min(r.count+1, len(r.buf))
}

// each calls fn for the readings newer than since, oldest first.
func (r *jobRing) each(since time.Time, fn func(JobUsage)) {
	for i := range r.count {
		u := r.buf[(r.next-r.count+i+len(r.buf))%len(r.buf)]
		if u.At.After(since) {
			fn(u)
		}
	}
}

// cloneSample deep-copies a ring slot (its slices are reused).
func cloneSample(s Sample) Sample {
	s.CPUs = slices.Clone(s.CPUs)
	s.Nodes = slices.Clone(s.Nodes)
	s.PackageW = slices.Clone(s.PackageW)
	s.GPUs = slices.Clone(s.GPUs)
	return s
}
