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
// a book there is neither.
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
	if none.estimator() != nil {
		t.Fatal("an estimator without a book")
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
