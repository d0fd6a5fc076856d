package daemon

import (
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
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

// estimator is the queue's run-time estimator (jobs.Config.Estimator);
// nil without a book.
func (u profileUse) estimator() jobs.RuntimeEstimator {
	if u.book == nil {
		return nil
	}
	return u
}

// EstimateJob is how long j is expected to run: its task profile's
// estimate (profile.Book.EstimateRuntime, the p95 of its succeeded runs).
// A job spec has no run-time limit of its own yet, so none is passed; when
// one is added it goes in as the limit, which wins. False without a
// profile.
func (u profileUse) EstimateJob(j *api.Job) (time.Duration, bool) {
	if u.book == nil || j == nil {
		return 0, false
	}
	return u.book.EstimateRuntime(jobKey(*j), 0)
}
