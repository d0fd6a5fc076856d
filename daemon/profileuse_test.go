package daemon

import (
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/reclaim"
	"github.com/fusiond/fusiond/daemon/profile"
)

// The reclaim prior is the profile's p95 peak CPU and memory (bytes),
// only once the profile holds min_runs sampled runs, and only for the
// job's own key; the queue's estimate is the profile's run time; without
// a book there is no prior and no shape.
func TestProfileUseReclaimPrior(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	book := profile.New(profile.Options{Now: func() time.Time { return t0 }})
	owner := api.Owner{UID: 1000, User: "alice"}
	spec := api.JobSpec{Name: "train", Class: api.ClassBatch, Resources: api.Resources{CPU: 4000, Memory: 8 << 30}}
	u := profileUse{book: book, minRuns: 3}
	observe := func() {
		t.Helper()
		o := profile.Observation{Key: jobKey(api.Job{Owner: owner, Spec: spec}), At: t0, RunSeconds: 60,
			Requested: profile.Usage{CPUMilli: 4000, MemMiB: 8192}, Typical: profile.Usage{CPUMilli: 500, MemMiB: 1024},
			Peak: profile.Usage{CPUMilli: 1500, MemMiB: 3072}}
		if err := book.Observe(o); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		observe()
	}
	if p := u.reclaimPrior(owner, spec); p != (reclaim.Usage{}) {
		t.Fatalf("prior from 2 runs: %+v", p)
	}
	observe()
	p := u.reclaimPrior(owner, spec)
	if p.CPU != 1500 || p.Memory != 3072<<20 {
		t.Fatalf("prior %+v, want 1500m and 3 GiB", p)
	}
	other := spec
	other.Name = "eval"
	if p := u.reclaimPrior(owner, other); p != (reclaim.Usage{}) {
		t.Fatalf("prior of another job's profile: %+v", p)
	}
	if len(u.shapes()) != 1 {
		t.Fatalf("shapes %+v", u.shapes())
	}
	var none profileUse
	if p := none.reclaimPrior(owner, spec); p != (reclaim.Usage{}) || none.shapes() != nil {
		t.Fatal("a prior without a book")
	}
	job := api.Job{Owner: owner, Spec: spec}
	if d, ok := u.estimator().EstimateJob(&job); !ok || d != time.Minute {
		t.Fatalf("estimate %v %v, want the runs' 60 s", d, ok)
	}
	job.Spec.Name = "eval"
	if _, ok := u.EstimateJob(&job); ok {
		t.Fatal("estimate for a job without a profile")
	}
}

// The queue's estimate is the spec's max_runtime when it gives one: it
// wins over the profile's, and a job with a limit but no profile (or no
// book) has one; without either there is none.
func TestProfileUseEstimateLimitWins(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	book := profile.New(profile.Options{Now: func() time.Time { return t0 }})
	owner := api.Owner{UID: 1000, User: "alice"}
	spec := api.JobSpec{Name: "train", Class: api.ClassBatch, Resources: api.Resources{CPU: 4000, Memory: 8 << 30}}
	for range 3 {
		o := profile.Observation{Key: jobKey(api.Job{Owner: owner, Spec: spec}), At: t0, RunSeconds: 60,
			Requested: profile.Usage{CPUMilli: 4000, MemMiB: 8192}}
		if err := book.Observe(o); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name  string
		u     profileUse
		spec  func(api.JobSpec) api.JobSpec
		want  time.Duration
		found bool
	}{
		{"profile only", profileUse{book: book}, func(s api.JobSpec) api.JobSpec { return s }, time.Minute, true},
		{"limit over profile", profileUse{book: book}, func(s api.JobSpec) api.JobSpec { s.MaxRuntime = api.Duration(2 * time.Hour); return s }, 2 * time.Hour, true},
		{"limit, no profile", profileUse{book: book}, func(s api.JobSpec) api.JobSpec { s.Name, s.MaxRuntime = "eval", api.Duration(90*time.Second); return s }, 90 * time.Second, true},
		{"limit, no book", profileUse{}, func(s api.JobSpec) api.JobSpec { s.MaxRuntime = api.Duration(90 * time.Second); return s }, 90 * time.Second, true},
		{"neither, no book", profileUse{}, func(s api.JobSpec) api.JobSpec { return s }, 0, false},
		{"neither, no profile", profileUse{book: book}, func(s api.JobSpec) api.JobSpec { s.Name = "eval"; return s }, 0, false},
	} {
		job := api.Job{Owner: owner, Spec: c.spec(spec)}
		got, ok := c.u.estimator().EstimateJob(&job)
		if got != c.want || ok != c.found {
			t.Errorf("%s: estimate %v %v, want %v %v", c.name, got, ok, c.want, c.found)
		}
	}
	if _, ok := (profileUse{}).EstimateJob(nil); ok {
		t.Error("an estimate for no job")
	}
}
