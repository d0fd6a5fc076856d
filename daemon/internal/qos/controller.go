// Package qos is the daemon's QoS loop: every window it reads each
// protected job's run-queue latency histogram (from the eBPF probe), who
// held the CPU while it waited, and its memory pressure, and moves the
// best-effort tier's CPU quota and memory high with an AIMD controller — a
// multiplicative shrink, in proportion to best-effort's share of the
// wait, when a protected job's p99 breaks its SLO; an additive restore
// after a healthy period.
package qos

import (
	"fmt"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/ebpf"
)

// Params tune the controller. The pool the best-effort quota is cut from
// is not among them: it is the shared CPU pool best-effort runs on now
// (the cores no guaranteed job holds), which changes as exclusive cores
// are taken and given back, so each Step is told it.
type Params struct {
	// MinMilli is the floor of the best-effort quota (at most the pool).
	MinMilli int64
	// Shrink multiplies the quota on a breach (0 < Shrink < 1).
	Shrink float64
	// RestoreStep is added to the quota once per RestoreAfter of health;
	// a quota reaching the pool is removed.
	RestoreStep int64
	// RestoreAfter is how long every protected job must be within its SLO
	// before (and between) restore steps.
	RestoreAfter time.Duration
	// MinEvents is how many run-queue events a window needs before its p99
	// counts as a measurement.
	MinEvents uint64
	// MinMemory is the floor of the best-effort memory high, in bytes.
	MinMemory int64
	// MinBlame is the least share of a breaching job's wait best-effort
	// work must have held the CPU for before its quota is cut (0 ≤
	// MinBlame < 1); below it the breach is someone else's and only
	// noted.
	MinBlame float64
	// BreachWindows is how many windows in a row a job's p99 must break
	// its SLO, best-effort to blame, before the quota is cut (0 and 1:
	// the first): one window's p99 over a few hundred waits is noisy.
	BreachWindows int
}

// Validate checks the parameters.
func (p Params) Validate() error {
	switch {
	case p.MinMilli <= 0:
		return fmt.Errorf("qos: min best-effort quota must be positive, got %dm", p.MinMilli)
	case p.Shrink <= 0 || p.Shrink >= 1:
		return fmt.Errorf("qos: shrink factor must be in (0, 1), got %g", p.Shrink)
	case p.RestoreStep <= 0:
		return fmt.Errorf("qos: restore step must be positive")
	case p.RestoreAfter <= 0:
		return fmt.Errorf("qos: restore period must be positive")
	case p.BreachWindows < 0:
		return fmt.Errorf("qos: breach windows must not be negative")
	case p.MinBlame < 0 || p.MinBlame >= 1:
		return fmt.Errorf("qos: min blame must be in [0, 1), got %g", p.MinBlame)
	}
	return nil
}

// Sample is one protected job's measurement over the last window.
type Sample struct {
	JobID string
	// SLO: the most the p99 may be (0: no latency SLO), and the most
	// memory pressure (PSI some avg10, percent; 0: none).
	RunqueueP99  time.Duration
	PSISomeAvg10 float64
	// P99 and Events of the window; MemoryPSI nil where not measured.
	P99       time.Duration
	Events    uint64
	MemoryPSI *float64
	// Blame is the window's wait by who held the CPU (ebpf.Runner); all
	// zero where the probe does not attribute.
	Blame [ebpf.Runners]uint64
}

// bestEffortShare is the share of s's wait best-effort work held the CPU
// for; known is false when the probe charged the wait to nobody, and the
// share is then 1 (the loop acts as it would without attribution).
func (s Sample) bestEffortShare() (share float64, known bool) {
	var sum uint64
	for _, n := range s.Blame {
		sum += n
	}
	if sum == 0 {
		return 1, false
	}
	return float64(s.Blame[ebpf.RunnerBestEffort]) / float64(sum), true
}

// DescribeBlame is a wait by runner as shares, largest first, leaving out
// those under 1%: "outside 85%, besteffort 10%, idle 5%".
func DescribeBlame(b [ebpf.Runners]uint64) string {
	d := delayedBy(b)
	if d == nil {
		return api.DelayedBy{}.Describe()
	}
	return d.Describe()
}

// Breach reports what in s breaks its SLO ("" when nothing does).
func (s Sample) breach(minEvents uint64) string {
	if s.RunqueueP99 > 0 && s.Events >= minEvents && s.P99 > s.RunqueueP99 {
		return fmt.Sprintf("run-queue p99 %v > SLO %v (%d events)", s.P99.Round(time.Microsecond), s.RunqueueP99, s.Events)
	}
	if s.PSISomeAvg10 > 0 && s.MemoryPSI != nil && *s.MemoryPSI > s.PSISomeAvg10 {
		return fmt.Sprintf("memory pressure %.2f%% > SLO %.2f%%", *s.MemoryPSI, s.PSISomeAvg10)
	}
	return ""
}

// Action is one change the controller asks for.
type Action struct {
	// Kind is "cpu" or "memory".
	Kind string
	// Op is "shrink" (a tighter limit on the best-effort tier),
	// "restore" (a looser one, or none) or "spare" (a breach best-effort
	// did not cause: nothing to write, an event to publish).
	Op string
	// CPUMilli is the new best-effort quota (0: no quota); MemoryHigh the
	// new best-effort memory high (0: none).
	CPUMilli   int64
	MemoryHigh int64
	// JobID and Reason name the protected job and the measurement behind
	// the action (empty JobID for a restore).
	JobID  string
	Reason string
}

// Controller is the pure AIMD controller: Step plans, Commit records what
// was applied. Its limits move only through Commit, so an action the host
// failed to write leaves the controller where the cgroup still is, and the
// next window plans it again. It is not safe for concurrent use; the loop
// serialises it.
type Controller struct {
	p          Params
	quota      int64 // 0: none
	memHigh    int64 // 0: none
	lastBreach time.Time
	lastChange time.Time
	lastSpare  time.Time
	// streak counts, per job, the windows in a row it breached with
	// best-effort to blame.
	streak map[string]int
}

// NewController starts unrestricted.
func NewController(p Params) (*Controller, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Controller{p: p, streak: map[string]int{}}, nil
}

// Quota is the best-effort quota now (0: none).
func (c *Controller) Quota() int64 { return c.quota }

// MemoryHigh is the best-effort memory high now (0: none).
func (c *Controller) MemoryHigh() int64 { return c.memHigh }

// Breaching lists the samples over their SLO, with why.
func (c *Controller) Breaching(samples []Sample) map[string]string {
	out := map[string]string{}
	for _, s := range samples {
		if r := s.breach(c.p.MinEvents); r != "" {
			out[s.JobID] = r
		}
	}
	return out
}

// Step takes one window's samples at time now, the best-effort tier's
// memory use (bytes) and the shared pool's CPU now (millicores), and
// returns the actions to apply (none most windows). It records when a
// protected job last breached because of best-effort work, never a limit:
// Commit does that for each action the host applied.
//
// A run-queue breach cuts the quota in proportion to best-effort's share
// of the breaching job's wait and to the p99's overshoot (the share 1 at
// twice the SLO or more cuts it by Shrink, the share 1 at 1.5 times the
// SLO by half as much); the job asking for the largest cut decides. A breach where best-effort held the CPU
// for less than MinBlame of the wait changes nothing: one spare action per
// RestoreAfter says whose it was, and it does not hold back a restore.
func (c *Controller) Step(now time.Time, samples []Sample, bestEffortMemory, poolMilli int64) []Action {
	var acts []Action
	cpuBreach, memBreach := -1, -1
	var cpuWhy, memWhy string
	var cpuShare float64
	var cpuKnown bool
	spare := -1
	streak := map[string]int{}
	pending := false // a breach not yet confirmed
	for i, s := range samples {
		r := s.breach(c.p.MinEvents)
		if r == "" {
			continue
		}
		if s.RunqueueP99 > 0 && s.Events >= c.p.MinEvents && s.P99 > s.RunqueueP99 {
			share, known := s.bestEffortShare()
			if known && share < c.p.MinBlame {
				if spare < 0 {
					spare = i
				}
				continue
			}
			// A p99 just over its SLO asks for a small cut: the share
			// scales by the overshoot, in full from twice the SLO.
			share *= min(1, float64(s.P99-s.RunqueueP99)/float64(s.RunqueueP99))
			streak[s.JobID] = c.streak[s.JobID] + 1
			if streak[s.JobID] < c.p.BreachWindows {
				pending = true
				continue
			}
			if cpuBreach < 0 || share > cpuShare {
				cpuBreach, cpuWhy, cpuShare, cpuKnown = i, r, share, known
			}
		} else if memBreach < 0 {
			memBreach, memWhy = i, r
		}
	}
	c.streak = streak
	if cpuBreach >= 0 || memBreach >= 0 || pending {
		c.lastBreach = now
	}
	// A quota at or above the pool limits nothing: shrink from the pool.
	base := poolMilli
	if c.quota > 0 && c.quota < poolMilli {
		base = c.quota
	}
	floor := min(c.p.MinMilli, poolMilli)
	if cpuBreach >= 0 && base > floor {
		factor := 1 - (1-c.p.Shrink)*cpuShare
		q := max(floor, int64(float64(base)*factor))
		why := cpuWhy
		if cpuKnown {
			why = fmt.Sprintf("%s; the wait: %s", cpuWhy, DescribeBlame(samples[cpuBreach].Blame))
		}
		if q < base {
			acts = append(acts, Action{Kind: "cpu", Op: "shrink", CPUMilli: q, MemoryHigh: c.memHigh, JobID: samples[cpuBreach].JobID,
				Reason: fmt.Sprintf("shrink best-effort CPU to %dm of a %dm shared pool: %s", q, poolMilli, why)})
		}
	}
	if spare >= 0 && cpuBreach < 0 && !pending && now.Sub(c.lastSpare) >= c.p.RestoreAfter {
		s := samples[spare]
		share, _ := s.bestEffortShare()
		acts = append(acts, Action{Kind: "cpu", Op: "spare", CPUMilli: c.quota, MemoryHigh: c.memHigh, JobID: s.JobID,
			Reason: fmt.Sprintf("best-effort not throttled: %s, but best-effort held the CPU for %.0f%% of the wait (below %.0f%%): %s",
				s.breach(c.p.MinEvents), 100*share, 100*c.p.MinBlame, DescribeBlame(s.Blame))})
	}
	if cpuBreach >= 0 || memBreach >= 0 || pending {
		if memBreach >= 0 && bestEffortMemory > c.p.MinMemory {
			target := max(c.p.MinMemory, int64(float64(bestEffortMemory)*c.p.Shrink)) &^ 4095
			if c.memHigh == 0 || target < c.memHigh {
				acts = append(acts, Action{Kind: "memory", Op: "shrink", CPUMilli: c.quota, MemoryHigh: target, JobID: samples[memBreach].JobID,
					Reason: fmt.Sprintf("lower best-effort memory high to %d MiB: %s", target>>20, memWhy)})
			}
		}
		return acts
	}
	// Healthy, or breached by others only: restore one step per
	// RestoreAfter since the last breach best-effort caused and the last
	// change.
	if now.Sub(c.lastBreach) < c.p.RestoreAfter || now.Sub(c.lastChange) < c.p.RestoreAfter {
		return acts
	}
	if c.quota > 0 {
		q := c.quota + c.p.RestoreStep
		reason := fmt.Sprintf("restore best-effort CPU to %dm of a %dm shared pool after %v without a breach best-effort caused", q, poolMilli, c.p.RestoreAfter)
		if q >= poolMilli {
			q, reason = 0, fmt.Sprintf("remove the best-effort CPU quota after %v without a breach best-effort caused", c.p.RestoreAfter)
		}
		acts = append(acts, Action{Kind: "cpu", Op: "restore", CPUMilli: q, MemoryHigh: c.memHigh, Reason: reason})
	}
	if c.memHigh != 0 {
		acts = append(acts, Action{Kind: "memory", Op: "restore", CPUMilli: c.quota, Reason: fmt.Sprintf("remove the best-effort memory high after %v without a breach", c.p.RestoreAfter)})
	}
	return acts
}

// Commit records that the host applied a, one of Step's actions, at now.
func (c *Controller) Commit(now time.Time, a Action) {
	if a.Op == "spare" {
		c.lastSpare = now
		return
	}
	switch a.Kind {
	case "cpu":
		c.quota = a.CPUMilli
	case "memory":
		c.memHigh = a.MemoryHigh
	}
	c.lastChange = now
}
