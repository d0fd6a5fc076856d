package sim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/fusiond/fusiond/daemon/profile"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Run-time estimates of the time-ordered replay's backfill (--estimates):
// what sched.Queue.ScheduleRunning is told of each pod's run time, for the
// running pods' expected ends (the head's shadow time) and for the queued
// pods it may backfill on the head's reserved node.
const (
	// EstimatesNone gives the queue no run times: the head's reserved
	// node is left to it alone (sched.Queue.Schedule, the default).
	EstimatesNone = "none"
	// EstimatesProfile learns a profile.Book online from the pods that
	// ended and estimates with Book.EstimateRuntime; a pod whose key has
	// no profile yet gets the longest rule's estimate.
	EstimatesProfile = "profile"
	// EstimatesLongest estimates every pod's run time as the longest
	// (scaled) lifetime of any pod ended so far: the "T, the longest run
	// time" of the queue's wait bound (docs/scheduling.md); none before
	// the first pod ends.
	EstimatesLongest = "longest"
	// EstimatesExact is the oracle: each pod's real (scaled) lifetime.
	EstimatesExact = "exact"
)

// ParseEstimates checks a comma-separated list of estimate modes.
func ParseEstimates(s string) ([]string, error) {
	var out []string
	for _, m := range splitList(s) {
		switch m {
		case EstimatesNone, EstimatesProfile, EstimatesLongest, EstimatesExact:
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		default:
			return nil, fmt.Errorf("%w: --estimates %q: want none, profile, longest or exact", ErrBadOption, m)
		}
	}
	if len(out) == 0 {
		return []string{EstimatesNone}, nil
	}
	return out, nil
}

// EstimateStats is how good a replay's run-time estimates were: each
// placed pod's estimate at the moment it started against its real
// (scaled) lifetime.
type EstimateStats struct {
	Mode string `json:"mode"`
	// Started is the pods placed whose lifetime is known and positive
	// (the ones an error can be taken of).
	Started int `json:"started"`
	// Estimated is how many of them had an estimate from the mode itself
	// (profile: from a profile, not the longest-rule fallback), and
	// EstimatedShare that over Started.
	Estimated      int     `json:"estimated"`
	EstimatedShare float64 `json:"estimated_share"`
	// MdAPEPct is the median absolute percentage error of those
	// estimates, |estimate − lifetime| / lifetime × 100; UnderPct the
	// share of them below the lifetime (the pod outran its estimate).
	MdAPEPct float64 `json:"mdape_pct"`
	UnderPct float64 `json:"under_pct"`
}

// estimator supplies a replay's run-time estimates and keeps their error.
// Times are the replay's seconds.
type estimator struct {
	mode    string
	book    *profile.Book
	clock   int64
	longest int64
	life    map[string]int64
	keys    map[string]profile.Key
	stats   EstimateStats
	apes    []float64
	under   int
}

// endless is the lifetime of a pod with no deletion time.
const endless = math.MaxInt64 / 4

func newEstimator(mode string, pods []Pod, life map[string]int64) (*estimator, error) {
	e := &estimator{mode: mode, life: life, stats: EstimateStats{Mode: mode}}
	if mode != EstimatesProfile {
		return e, nil
	}
	// One owner holds every key (podKey): the per-owner bound is the book's.
	e.book = profile.New(profile.Options{Now: func() time.Time { return time.Unix(e.clock, 0) },
		MaxPerOwner: profile.DefaultMaxProfiles})
	e.keys = make(map[string]profile.Key, len(pods))
	for i := range pods {
		e.keys[pods[i].Name] = podKey(&pods[i])
	}
	return e, nil
}

// podKey is the profile key of an openb pod. The trace's pods have unique
// names, so a pod is keyed by what a user would name a job: its request
// shape (CPU, memory, GPUs and share, GPU models) as the name and its QoS
// as the class, one owner for all.
func podKey(p *Pod) profile.Key {
	gpu := "none"
	if p.GPUs > 0 {
		gpu = fmt.Sprintf("%dx%dm", p.GPUs, p.GPUMilli)
	}
	name := fmt.Sprintf("cpu=%dm,mem=%dMi,gpu=%s", p.CPUMilli, p.MemMiB, gpu)
	if p.GPUSpec != "" {
		name += ",models=" + p.GPUSpec
	}
	return profile.Key{Owner: "openb", Name: name, Class: p.QoS}
}

// estimate is req's expected run time at the replay's current time, and
// whether it came from the mode itself (not a fallback).
func (e *estimator) estimate(req *sched.Request) (est int64, ok, own bool) {
	switch e.mode {
	case EstimatesExact:
		l := e.life[req.ID]
		return l, l < endless, true
	case EstimatesProfile:
		if d, ok := e.book.EstimateRuntime(e.keys[req.ID], 0); ok {
			return int64(math.Ceil(d.Seconds())), true, true
		}
		return e.longest, e.longest > 0, false
	case EstimatesLongest:
		return e.longest, e.longest > 0, true
	}
	return 0, false, false
}

// queueEstimate is the estimate sched.Queue.Estimate asks for.
func (e *estimator) queueEstimate(req *sched.Request) (int64, bool) {
	est, ok, _ := e.estimate(req)
	return est, ok
}

// started is a pod placed at t: its expected end, and the estimate's
// error noted.
func (e *estimator) started(req *sched.Request, t int64) sched.Running {
	est, ok, own := e.estimate(req)
	if l := e.life[req.ID]; l > 0 && l < endless {
		e.stats.Started++
		if ok && own {
			e.stats.Estimated++
			e.apes = append(e.apes, 100*math.Abs(float64(est-l))/float64(l))
			if est < l {
				e.under++
			}
		}
	}
	return sched.Running{End: t + est, EndKnown: ok}
}

// ended is a pod that ended now after running its whole lifetime: the
// longest rule and the profiles learn from it (run time only: the trace
// has no usage samples).
func (e *estimator) ended(req *sched.Request) error {
	life := e.life[req.ID]
	e.longest = max(e.longest, life)
	if e.book == nil {
		return nil
	}
	u := profile.Usage{CPUMilli: float64(req.CPUMilli), MemMiB: float64(req.MemMiB), GPUMilli: float64(req.GPUMilliTotal())}
	if err := e.book.Observe(profile.Observation{Key: e.keys[req.ID], At: time.Unix(e.clock, 0), RunSeconds: float64(life), Requested: u, NoUsage: true}); err != nil {
		return fmt.Errorf("profile of pod %s: %w", req.ID, err)
	}
	return nil
}

func (e *estimator) result() EstimateStats {
	s := e.stats
	if s.Started > 0 {
		s.EstimatedShare = float64(s.Estimated) / float64(s.Started)
	}
	if len(e.apes) > 0 {
		s.MdAPEPct = percentile(e.apes, 0.5)
		s.UnderPct = 100 * float64(e.under) / float64(len(e.apes))
	}
	return s
}

// writeEstimates writes the backfill estimates table of the timed runs
// that had --estimates: per policy and mode the waits, how many pods
// started with an estimate of the mode's own and its error.
func writeEstimates(w io.Writer, runs []TimedResult) error {
	if !slices.ContainsFunc(runs, func(t TimedResult) bool { return t.Estimates != nil }) {
		return nil
	}
	fmt.Fprintln(w, "backfill run-time estimates (error: each pod's estimate when it started against its scaled lifetime; profile: pods whose key had a profile)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\testimates\tplaced\twait p50 s\twait p95 s\twait p99 s\tmean wait s\tmean GPU util %%\tstarted with estimate %%\test. error MdAPE %%\tunder-estimated %%\t\n")
	for _, t := range runs {
		if t.Estimates == nil {
			continue
		}
		e := t.Estimates
		share, mdape, under := "-", "-", "-"
		if e.Mode != EstimatesNone && e.Started > 0 {
			share = fmt.Sprintf("%.1f", 100*e.EstimatedShare)
		}
		if e.Estimated > 0 {
			mdape, under = fmt.Sprintf("%.1f", e.MdAPEPct), fmt.Sprintf("%.1f", e.UnderPct)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.0f\t%.1f\t%.2f\t%s\t%s\t%s\t\n", t.Policy, e.Mode, t.Placed, t.WaitP50, t.WaitP95, t.WaitP99, t.WaitMean, t.MeanUtilPct, share, mdape, under)
	}
	return tw.Flush()
}
