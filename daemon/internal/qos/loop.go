package qos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/ebpf"
)

// Probe is what the loop needs of the eBPF probe (*ebpf.Probe).
type Probe interface {
	Register(cgroupID uint64, tier uint32) error
	Unregister(cgroupID uint64) error
	Histogram(cgroupID uint64) (ebpf.Histogram, error)
}

// Job is one running job as the loop sees it.
type Job struct {
	ID    string
	Tier  api.Tier
	Class api.Class
	// SLO is the effective SLO; nil for an unprotected job.
	SLO *api.QoS
}

// Host is what the loop reads and moves: the running jobs, their cgroups
// and the best-effort tier's knobs (the daemon implements it over
// jobs.Manager and cgroups.Manager).
type Host interface {
	Running() []Job
	// CgroupID is the id the probe keys the job's cgroup by.
	CgroupID(jobID string) (uint64, error)
	// MemoryPSI is the job's memory pressure (some avg10), nil where the
	// kernel has none per cgroup (cgroup v1).
	MemoryPSI(jobID string) (*float64, error)
	BestEffortMemory() (int64, error)
	// SharedPoolMilli is the CPU of the shared pool best-effort runs on
	// now: the host's cores that no guaranteed job holds exclusively.
	SharedPoolMilli() int64
	// TierCgroupID is the id the probe keys a tier's cgroup by.
	TierCgroupID(t api.Tier) (uint64, error)
	// CgroupPath names the cgroup the probe keys by id (a cgroup outside
	// fusiond's, in the cpu hierarchy).
	CgroupPath(id uint64) (string, error)
	SetBestEffortCPU(milli int64) error
	SetBestEffortMemoryHigh(bytes int64) error
}

// Cache is the loop's second actuator over best-effort work where the
// hardware has one: a share of each cache's ways and of memory bandwidth
// (resctrl: Intel RDT, AMD PQoS).
type Cache interface {
	// SetBestEffortShare gives best-effort work share (0 < share ≤ 1) of
	// each cache and of memory bandwidth; 1 lifts the limit.
	SetBestEffortShare(share float64) error
	// Sync moves the best-effort threads not yet under the limit there.
	Sync() error
	// Describe says what is allocated: "L3 (2 domains), MB (2 domains)".
	Describe() string
}

// Config is the loop's configuration.
type Config struct {
	Window time.Duration
	Params Params
	// Cache is the second actuator; nil where the host has none, and
	// CacheOff then says why for the status.
	Cache    Cache
	CacheOff string
	// Publish sends an event to `fusionctl events`.
	Publish func(api.Event)
	Now     func() time.Time
}

// Loop runs the controller over the probe's histograms.
type Loop struct {
	cfg   Config
	probe Probe
	host  Host
	log   *slog.Logger

	mu      sync.Mutex
	ctrl    *Controller
	jobs    map[string]*tracked
	status  api.QoSStatus
	applied bool
	// actions counts the actions the loop took (or tried), by key;
	// latency sums the protected jobs' run-queue latency by class over
	// the loop's life (each window's new events added once), so it only
	// grows, whatever jobs come and go.
	actions map[ActionKey]uint64
	latency map[api.Class]*ebpf.Histogram
	// untimed is the running jobs the probe has no slot for (ErrFull),
	// each counted once in untimedTotal; atBound is true from the warning
	// that opens an episode of them to the line that ends it.
	untimed      map[string]bool
	untimedTotal uint64
	atBound      bool
	// tiers is true once every tier's cgroup is registered for its
	// class; delay sums the protected jobs' waits by runner over the
	// loop's life; offenders is the probe's last reading of the outside
	// cgroups' charges, paths the names found for their ids.
	tiers       bool
	tiersWarned bool // a registration failure logged
	cacheErr    bool // a Sync failure logged, until one succeeds
	delay       [ebpf.Runners]uint64
	offenders   map[uint64]uint64
	paths       map[uint64]string
}

// ActionKey names a kind of action for counting: Op is shrink or
// restore, Resource cpu or memory, Result applied or failed.
type ActionKey struct {
	Op, Resource, Result string
}

// Counters are the loop's running totals for metrics.
type Counters struct {
	// Actions counts the loop's actions by key since it started.
	Actions map[ActionKey]uint64
	// Latency is the run-queue latency of the protected jobs, by job
	// class, since the loop started.
	Latency map[api.Class]ebpf.Histogram
	// ProbeStats is false when the kernel does not count the probe's
	// programs (kernel.bpf_stats_enabled=0); ProbeRuns and ProbeRunNs
	// are then 0.
	ProbeStats            bool
	ProbeRuns, ProbeRunNs uint64
	// Slots is the probe's slots (Max 0 when the probe does not say);
	// Untimed the running jobs it has no slot for now, UntimedTotal every
	// job it had none for, each once.
	Slots        ebpf.SlotStats
	Untimed      int
	UntimedTotal uint64
	// Delay is the protected jobs' run-queue wait by who held the CPU
	// (ebpf.Runner), since the loop started.
	Delay [ebpf.Runners]uint64
	// LostWaits is the waits the probe dropped (two timed threads in one
	// slot of its pending-wait array at once), when it says.
	LostWaits uint64
}

type tracked struct {
	cgroup uint64
	class  api.Class
	slo    *api.QoS
	prev   ebpf.Histogram
	last   ebpf.Histogram // the last window
	total  ebpf.Histogram
	psi    *float64
	state  string
}

// TierNumber is the probe's number for a tier (0 is "not a job").
func TierNumber(t api.Tier) uint32 {
	switch t {
	case api.TierGuaranteed:
		return 1
	case api.TierBurstable:
		return 2
	case api.TierBestEffort:
		return 3
	}
	return 4
}

// New builds the loop; Run drives it.
func New(cfg Config, probe Probe, host Host, log *slog.Logger) (*Loop, error) {
	if cfg.Window <= 0 {
		return nil, fmt.Errorf("qos: window must be positive")
	}
	ctrl, err := NewController(cfg.Params)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Publish == nil {
		cfg.Publish = func(api.Event) {}
	}
	return &Loop{cfg: cfg, probe: probe, host: host, log: log, ctrl: ctrl, jobs: map[string]*tracked{},
		actions: map[ActionKey]uint64{}, latency: map[api.Class]*ebpf.Histogram{}, untimed: map[string]bool{},
		offenders: map[uint64]uint64{}, paths: map[uint64]string{},
		status: api.QoSStatus{Probes: "attached", Enabled: true, Window: api.Duration(cfg.Window), Resctrl: resctrlStatus(cfg, 1)}}, nil
}

// Run steps the loop every window until ctx ends, then lifts the
// best-effort limits it set.
func (l *Loop) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.Window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.applied {
				if err := l.host.SetBestEffortCPU(0); err != nil {
					l.log.Warn("qos: lifting the best-effort quota", "err", err)
				}
				if err := l.host.SetBestEffortMemoryHigh(0); err != nil {
					l.log.Warn("qos: lifting the best-effort memory high", "err", err)
				}
				if l.cfg.Cache != nil {
					if err := l.cfg.Cache.SetBestEffortShare(1); err != nil {
						l.log.Warn("qos: lifting the best-effort cache and bandwidth limit", "err", err)
					}
				}
			}
			for _, j := range l.jobs {
				_ = l.probe.Unregister(j.cgroup)
			}
			return
		case <-t.C:
			l.Step()
		}
	}
}

// Step runs one window: follow the running jobs, read their histograms,
// let the controller decide, apply and publish what it decided.
func (l *Loop) Step() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	if !l.tiers {
		l.tiers = l.registerTiers()
	}
	if c := l.cfg.Cache; c != nil {
		switch err := c.Sync(); {
		case err != nil && !l.cacheErr:
			l.cacheErr = true
			l.log.Warn("qos: moving best-effort threads under the cache and bandwidth limit (logged once until it works)", "err", err)
		case err == nil:
			l.cacheErr = false
		}
	}
	running := l.host.Running()
	seen := map[string]bool{}
	var samples []Sample
	protected, untimed := 0, 0
	var newlyUntimed []string
	for _, rj := range running {
		seen[rj.ID] = true
		j, ok := l.jobs[rj.ID]
		if !ok {
			id, err := l.host.CgroupID(rj.ID)
			if err != nil {
				l.log.Debug("qos: job has no cgroup yet", "job", rj.ID, "err", err)
				continue
			}
			err = l.probe.Register(id, TierNumber(rj.Tier))
			if errors.Is(err, ebpf.ErrFull) && rj.SLO != nil {
				if victim := l.freeSlot(rj.ID); victim != "" {
					// Untimed from now: counted in this window when the
					// loop went past it, else when it gets to it.
					if seen[victim] {
						untimed++
					}
					if !l.untimed[victim] {
						l.untimed[victim] = true
						l.untimedTotal++
						newlyUntimed = append(newlyUntimed, victim)
					}
					err = l.probe.Register(id, TierNumber(rj.Tier))
				}
			}
			if errors.Is(err, ebpf.ErrFull) {
				// Counted and logged once per episode below, not per
				// job and window.
				untimed++
				if !l.untimed[rj.ID] {
					l.untimed[rj.ID] = true
					l.untimedTotal++
					newlyUntimed = append(newlyUntimed, rj.ID)
				}
				continue
			}
			if err != nil {
				l.log.Warn("qos: registering the job's cgroup with the probe", "job", rj.ID, "err", err)
				continue
			}
			delete(l.untimed, rj.ID)
			j = &tracked{cgroup: id, state: "no-data"}
			l.jobs[rj.ID] = j
			l.log.Info("qos: timing run-queue latency", "job", rj.ID, "cgroup_id", id, "protected", rj.SLO != nil)
		}
		j.slo, j.class = rj.SLO, rj.Class
		h, err := l.probe.Histogram(j.cgroup)
		if err != nil {
			l.log.Warn("qos: reading the histogram", "job", rj.ID, "err", err)
			continue
		}
		j.last, j.prev, j.total = h.Sub(j.prev), h, h
		if j.slo == nil {
			j.state = "unprotected"
			continue
		}
		protected++
		l.addLatency(j.class, j.last)
		s := Sample{JobID: rj.ID, RunqueueP99: time.Duration(j.slo.RunqueueP99), PSISomeAvg10: j.slo.PSISomeAvg10,
			P99: j.last.Quantile(0.99), Events: j.last.Count, Blame: j.last.BlameNs}
		if j.slo.PSISomeAvg10 > 0 {
			if psi, err := l.host.MemoryPSI(rj.ID); err == nil {
				s.MemoryPSI, j.psi = psi, psi
			}
		}
		samples = append(samples, s)
	}
	for id, j := range l.jobs {
		if !seen[id] {
			if err := l.probe.Unregister(j.cgroup); err != nil {
				l.log.Warn("qos: unregistering", "job", id, "err", err)
			}
			delete(l.jobs, id)
		}
	}
	for id := range l.untimed {
		if !seen[id] {
			delete(l.untimed, id)
		}
	}
	switch {
	case untimed > 0 && !l.atBound:
		l.atBound = true
		l.log.Warn("qos: every latency probe slot is taken: running jobs started from now on are not timed until timed ones end (a protected job takes the slot of an unprotected one); raise qos.max_jobs (logged once per episode; fusionctl status and fusiond_qos_untimed_jobs show it)",
			"slots", l.slots().Max, "untimed", untimed, "first", newlyUntimed)
	case untimed == 0 && l.atBound:
		l.atBound = false
		l.log.Info("qos: every running job is timed again", "untimed_total", l.untimedTotal)
	}
	l.status.UntimedJobs, l.status.UntimedJobsTotal = untimed, l.untimedTotal
	breaching := l.ctrl.Breaching(samples)
	for _, s := range samples {
		j := l.jobs[s.JobID]
		switch {
		case breaching[s.JobID] != "":
			j.state = "breach"
		case s.Events < l.cfg.Params.MinEvents && s.MemoryPSI == nil:
			j.state = "no-data"
		default:
			j.state = "ok"
		}
	}
	var beMem int64
	if len(breaching) > 0 {
		if m, err := l.host.BestEffortMemory(); err == nil {
			beMem = m
		}
	}
	var window [ebpf.Runners]uint64
	for _, smp := range samples {
		for i, n := range smp.Blame {
			window[i] += n
			l.delay[i] += n
		}
	}
	l.status.DelayedBy = delayedBy(window)
	l.status.TopOutside = l.topOutside()
	pool := l.host.SharedPoolMilli()
	for _, a := range l.ctrl.Step(now, samples, beMem, pool) {
		if a.Op == "spare" {
			// Nothing to write: say whose breach it was.
			reason := a.Reason
			if len(l.status.TopOutside) > 0 {
				reason += "; top outside cgroups: " + describeOutside(l.status.TopOutside)
			}
			l.ctrl.Commit(now, a)
			l.actions[ActionKey{Op: a.Op, Resource: a.Kind, Result: "noted"}]++
			l.log.Info("qos: "+reason, "job", a.JobID)
			t := now.UTC()
			l.status.LastAction, l.status.LastActionAt = reason, &t
			l.cfg.Publish(api.Event{Time: t, Kind: api.EventQoS, JobID: a.JobID, Reason: reason})
			continue
		}
		var err error
		if a.Kind == "cpu" {
			err = l.host.SetBestEffortCPU(a.CPUMilli)
		} else {
			err = l.host.SetBestEffortMemoryHigh(a.MemoryHigh)
		}
		reason := a.Reason
		key := ActionKey{Op: a.Op, Resource: a.Kind, Result: "applied"}
		if err != nil {
			key.Result = "failed"
			reason = fmt.Sprintf("%s: failed: %v", a.Reason, err)
			l.log.Error("qos: applying", "action", a.Reason, "err", err)
		} else {
			// Only a written limit moves the controller: a failed
			// write leaves it where the cgroup is, to plan again.
			l.ctrl.Commit(now, a)
			l.applied = true
			if a.Kind == "cpu" {
				reason += l.setCacheShare(a.CPUMilli, pool)
			}
			l.log.Info("qos: "+reason, "job", a.JobID)
		}
		l.actions[key]++
		t := now.UTC()
		l.status.LastAction, l.status.LastActionAt = reason, &t
		l.cfg.Publish(api.Event{Time: t, Kind: api.EventQoS, JobID: a.JobID, Reason: reason})
	}
	l.status.SharedPool = api.MilliCPU(pool)
	l.status.BestEffortQuota = api.MilliCPU(l.ctrl.Quota())
	l.status.BestEffortMemoryHigh = api.Bytes(l.ctrl.MemoryHigh())
	l.status.Protected, l.status.Breaching = protected, len(breaching)
}

// setCacheShare moves the second actuator with the CPU quota: best-effort
// gets the quota's share of the pool of each cache and of memory
// bandwidth (all of them with no quota). It returns what to add to the
// action's reason.
func (l *Loop) setCacheShare(quota, pool int64) string {
	c := l.cfg.Cache
	if c == nil {
		return ""
	}
	share := 1.0
	if quota > 0 && pool > 0 {
		share = min(1, float64(quota)/float64(pool))
	}
	if err := c.SetBestEffortShare(share); err != nil {
		l.log.Error("qos: setting the best-effort cache and bandwidth share", "share", share, "err", err)
		return fmt.Sprintf("; cache and bandwidth share %.0f%%: failed: %v", 100*share, err)
	}
	l.status.Resctrl = resctrlStatus(l.cfg, share)
	if share == 1 {
		return "; best-effort cache and bandwidth limit lifted"
	}
	return fmt.Sprintf("; best-effort cache and bandwidth at %.0f%%", 100*share)
}

// resctrlStatus is the status's line for the second actuator.
func resctrlStatus(cfg Config, share float64) string {
	if cfg.Cache == nil {
		return cmp.Or(cfg.CacheOff, "off")
	}
	if share >= 1 {
		return cfg.Cache.Describe() + "; best-effort unrestricted"
	}
	return fmt.Sprintf("%s; best-effort at %.0f%%", cfg.Cache.Describe(), 100*share)
}

// registerTiers registers each tier's cgroup with the probe for its
// class, so a job the probe has no slot for is still known as its tier's
// when it holds a CPU. It reports whether every tier is registered (or
// the probe does not classify); the loop tries again each window until
// then.
func (l *Loop) registerTiers() bool {
	p, ok := l.probe.(interface {
		RegisterClass(cgroupID uint64, tier uint32) error
	})
	if !ok {
		return true
	}
	done := true
	for _, t := range api.Tiers {
		id, err := l.host.TierCgroupID(t)
		if err == nil {
			err = p.RegisterClass(id, TierNumber(t))
		}
		if err != nil {
			if !l.tiersWarned {
				l.log.Warn("qos: registering a tier's cgroup with the probe (tried again each window, logged once)", "tier", t, "err", err)
			}
			done = false
		}
	}
	l.tiersWarned = !done
	return done
}

// maxTopOutside is how many outside cgroups the status names.
const maxTopOutside = 5

// topOutside reads the probe's charges to outside cgroups and returns
// those charged the most since the last window, with their paths.
func (l *Loop) topOutside() []api.OutsideDelay {
	p, ok := l.probe.(interface {
		Offenders() (map[uint64]uint64, error)
	})
	if !ok {
		return nil
	}
	now, err := p.Offenders()
	if err != nil {
		l.log.Warn("qos: reading the outside cgroups' charges", "err", err)
		return nil
	}
	var out []api.OutsideDelay
	for id, ns := range now {
		// A cgroup the kernel's LRU dropped and charged again starts
		// from zero: its delta is what it holds.
		d := ns
		if prev, ok := l.offenders[id]; ok && prev <= ns {
			d = ns - prev
		}
		if d > 0 {
			out = append(out, api.OutsideDelay{ID: id, Wait: api.Duration(d)})
		}
	}
	l.offenders = now
	slices.SortFunc(out, func(a, b api.OutsideDelay) int {
		return cmp.Or(cmp.Compare(b.Wait, a.Wait), cmp.Compare(a.ID, b.ID))
	})
	if len(out) > maxTopOutside {
		out = out[:maxTopOutside]
	}
	for i := range out {
		out[i].Cgroup = l.cgroupPath(out[i].ID)
	}
	return out
}

// maxPaths bounds the cache of outside cgroups' names.
const maxPaths = 1024

// cgroupPath names an outside cgroup once and remembers it, or that the
// host cannot find it ("": it may be gone).
func (l *Loop) cgroupPath(id uint64) string {
	if p, ok := l.paths[id]; ok {
		return p
	}
	p, err := l.host.CgroupPath(id)
	if err != nil {
		// Remembered too: a cgroup gone stays gone, and the walk is not
		// cheap on a host of many cgroups.
		l.log.Debug("qos: naming an outside cgroup", "id", id, "err", err)
		p = ""
	}
	if len(l.paths) >= maxPaths {
		clear(l.paths)
	}
	l.paths[id] = p
	return p
}

// describeOutside names outside cgroups and their charges on one line.
func describeOutside(top []api.OutsideDelay) string {
	parts := make([]string, 0, len(top))
	for _, o := range top {
		name := o.Cgroup
		if name == "" {
			name = fmt.Sprintf("cgroup id %d", o.ID)
		}
		parts = append(parts, fmt.Sprintf("%s %v", name, time.Duration(o.Wait).Round(time.Microsecond)))
	}
	return strings.Join(parts, ", ")
}

// delayedBy is a wait by runner in the API's shape; nil when nothing was
// charged.
func delayedBy(b [ebpf.Runners]uint64) *api.DelayedBy {
	var sum uint64
	for _, n := range b {
		sum += n
	}
	if sum == 0 {
		return nil
	}
	d := func(r ebpf.Runner) api.Duration { return api.Duration(b[r]) }
	return &api.DelayedBy{Idle: d(ebpf.RunnerIdle), Guaranteed: d(ebpf.RunnerGuaranteed), Burstable: d(ebpf.RunnerBurstable),
		BestEffort: d(ebpf.RunnerBestEffort), Job: d(ebpf.RunnerOtherJob), Outside: d(ebpf.RunnerOutside), Kernel: d(ebpf.RunnerKernel)}
}

// freeSlot unregisters an unprotected job to give its slot to protected
// job id, and returns it; "" when every timed job is protected. The
// unprotected job with the largest ID (the newest, for the job manager's
// IDs) goes; it is untimed from then on, like any job without a slot.
func (l *Loop) freeSlot(id string) string {
	victim := ""
	for jid, j := range l.jobs {
		if j.slo == nil && (victim == "" || len(jid) > len(victim) || len(jid) == len(victim) && jid > victim) {
			victim = jid
		}
	}
	if victim == "" {
		return ""
	}
	if err := l.probe.Unregister(l.jobs[victim].cgroup); err != nil {
		l.log.Warn("qos: unregistering an unprotected job for a protected one", "job", victim, "err", err)
		return ""
	}
	delete(l.jobs, victim)
	l.log.Info("qos: a protected job takes an unprotected job's probe slot", "job", id, "untimed", victim)
	return victim
}

// slots is the probe's slot use, when it reports one (*ebpf.Probe).
func (l *Loop) slots() ebpf.SlotStats {
	if p, ok := l.probe.(interface{ Slots() ebpf.SlotStats }); ok {
		return p.Slots()
	}
	return ebpf.SlotStats{}
}

func (l *Loop) addLatency(c api.Class, d ebpf.Histogram) {
	h := l.latency[c]
	if h == nil {
		h = &ebpf.Histogram{}
		l.latency[c] = h
	}
	for i := range h.Buckets {
		h.Buckets[i] += d.Buckets[i]
	}
	h.Count += d.Count
	h.SumNs += d.SumNs
	h.Preemptions += d.Preemptions
}

// Counters returns copies of the loop's running totals.
func (l *Loop) Counters() Counters {
	l.mu.Lock()
	out := Counters{Actions: make(map[ActionKey]uint64, len(l.actions)), Latency: make(map[api.Class]ebpf.Histogram, len(l.latency))}
	for k, v := range l.actions {
		out.Actions[k] = v
	}
	for c, h := range l.latency {
		out.Latency[c] = *h
	}
	out.Untimed, out.UntimedTotal = l.status.UntimedJobs, l.status.UntimedJobsTotal
	out.Delay = l.delay
	l.mu.Unlock()
	out.Slots = l.slots()
	out.ProbeRuns, out.ProbeRunNs, out.ProbeStats = l.probeStats()
	out.LostWaits = l.lostWaits()
	return out
}

// lostWaits is the waits the probe dropped (0 when it does not say).
func (l *Loop) lostWaits() uint64 {
	p, ok := l.probe.(interface{ LostWaits() (uint64, error) })
	if !ok {
		return 0
	}
	n, err := p.LostWaits()
	if err != nil {
		return 0
	}
	return n
}

// probeStats sums the kernel's accounting of the probe's programs; ok is
// false when the probe has none or the kernel does not count.
func (l *Loop) probeStats() (runs, ns uint64, ok bool) {
	ps, isStats := l.probe.(interface {
		Stats() ([]ebpf.ProgramStats, error)
	})
	if !isStats {
		return 0, 0, false
	}
	st, err := ps.Stats()
	if err != nil {
		return 0, 0, false
	}
	for _, p := range st {
		runs, ns = runs+p.RunCount, ns+p.RunTimeNs
	}
	return runs, ns, runs > 0
}

// Status is the loop's state for node status.
func (l *Loop) Status() api.QoSStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.status
	st := l.slots()
	s.ProbeSlots, s.ProbeSlotsUsed = st.Max, st.Used
	if runs, ns, ok := l.probeStats(); ok {
		s.ProbeEvents, s.ProbeNsPerEvent = runs, float64(ns)/float64(runs)
	}
	s.ProbeLostWaits = l.lostWaits()
	return s
}

// JobLatency is a job's latency for `fusionctl show`; nil when the loop
// does not follow the job (not running, or no cgroup).
func (l *Loop) JobLatency(id string) *api.Latency {
	l.mu.Lock()
	defer l.mu.Unlock()
	j, ok := l.jobs[id]
	if !ok {
		return nil
	}
	out := &api.Latency{State: j.state, P50: api.Duration(j.last.Quantile(0.5)), P99: api.Duration(j.last.Quantile(0.99)),
		Count: j.last.Count, Histogram: j.total.Buckets[:], Preemptions: j.total.Preemptions, MemoryPressure: j.psi,
		DelayedBy: delayedBy(j.total.BlameNs), WindowDelayedBy: delayedBy(j.last.BlameNs)}
	out.Histogram = append([]uint64(nil), out.Histogram...)
	if j.slo != nil {
		s := *j.slo
		out.SLO = &s
	}
	return out
}
