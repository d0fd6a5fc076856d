package daemon

import (
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/reclaim"
	"github.com/fusiond/fusiond/daemon/profile"
)

// profileUse is where placement puts the task profiles (profiles.go) to
// use: the reclaim loop's prior on a job's peak, the shape learner's
// prior and the queue's run-time estimates. Without a book
// (profiles.enabled false) it gives none of them.
type profileUse struct {
	book *profile.Book
	// minRuns is how many sampled runs a profile needs before its peaks
	// are trusted (profiles.min_runs, as for a recommendation).
	minRuns int
}

// profileUse is the daemon's; call it once the profiles part started.
func (d *Daemon) profileUse() profileUse {
	if d.profiles == nil {
		return profileUse{}
	}
	return profileUse{book: d.profiles.Book(), minRuns: max(1, d.profiles.cfg.MinRuns)}
}

// reclaimPrior is the p95 peak CPU and memory of the profile of a job of
// owner with spec, once it holds minRuns sampled runs; zero otherwise.
func (u profileUse) reclaimPrior(owner api.Owner, spec api.JobSpec) reclaim.Usage {
	if u.book == nil {
		return reclaim.Usage{}
	}
	p, ok := u.book.Get(jobKey(api.Job{Owner: owner, Spec: spec}))
	if !ok || p.SampledRuns < u.minRuns {
		return reclaim.Usage{}
	}
	return reclaim.Usage{CPU: p.CPU.P95, Memory: p.Mem.P95 * (1 << 20)}
}

// shapes are the profiles whose request shapes prime the placer's shape
// learner (hostplacer.Placer.SeedProfiles).
func (u profileUse) shapes() []profile.Profile {
	if u.book == nil {
		return nil
	}
	return u.book.All()
}

// EstimateRuntime is how long a job of key k is expected to run
// (profile.Book.EstimateRuntime: the spec's own limit when given, else
// the profile's); false without a book or a profile.
func (u profileUse) EstimateRuntime(k profile.Key, limit time.Duration) (time.Duration, bool) {
	if u.book == nil {
		if limit > 0 {
			return limit, true
		}
		return 0, false
	}
	return u.book.EstimateRuntime(k, limit)
}
