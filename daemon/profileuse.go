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
// (profiles.enabled false) it gives none of them but the estimates of
// jobs that give their own max_runtime.
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

// estimator is the queue's run-time estimator (jobs.Config.Estimator). It
// is there without a book too: a job's own max_runtime is an estimate.
func (u profileUse) estimator() jobs.RuntimeEstimator { return u }

// EstimateJob is how long j is expected to run: its spec's max_runtime
// when it gives one (it wins: the job is stopped there), else its task
// profile's estimate (profile.Book.EstimateRuntime, the p95 of its
// succeeded runs). False with neither.
func (u profileUse) EstimateJob(j *api.Job) (time.Duration, bool) {
	if j == nil {
		return 0, false
	}
	limit := time.Duration(j.Spec.MaxRuntime)
	if u.book == nil {
		return limit, limit > 0
	}
	return u.book.EstimateRuntime(jobKey(*j), limit)
}
