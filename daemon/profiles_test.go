package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
	"github.com/fusiond/fusiond/daemon/profile"
)

func TestProfilesConfig(t *testing.T) {
	if key, err := DefaultProfilesConfig().validate(); err != nil {
		t.Fatalf("defaults: %s %v", key, err)
	}
	cfg := DefaultConfig()
	if err := ParseConfig([]byte("profiles: {half_life: 24h, max_profiles: 10, min_runs: 3}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Profiles.MaxProfiles != 10 || time.Duration(cfg.Profiles.HalfLife) != 24*time.Hour || cfg.Profiles.MinRuns != 3 ||
		!cfg.Profiles.Enabled || time.Duration(cfg.Profiles.SaveInterval) != 5*time.Minute {
		t.Fatalf("not merged over the defaults: %+v", cfg.Profiles)
	}
	// max_per_owner reaches the book; max_profiles below it bounds it.
	cfg = DefaultConfig()
	if err := ParseConfig([]byte("profiles: {max_profiles: 100, max_per_owner: 3}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if o := cfg.Profiles.options(); o.MaxPerOwner != 3 || o.MaxProfiles != 100 {
		t.Fatalf("options %+v, want 3 per owner of 100", o)
	}
	b := profile.New(cfg.Profiles.options())
	for i := range 5 {
		_ = b.Observe(profile.Observation{Key: profile.Key{Owner: "alice", Name: strconv.Itoa(i)}, RunSeconds: 1})
	}
	if b.Len() != 3 {
		t.Fatalf("%d of one owner's profiles kept, max_per_owner 3", b.Len())
	}
	// headroom: 0 reaches the book as no headroom, not its default.
	cfg = DefaultConfig()
	if err := ParseConfig([]byte("profiles: {headroom: 0}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if h := cfg.Profiles.options().Headroom; h == nil || *h != 0 {
		t.Fatalf("headroom 0 passed to the profile book as %v", h)
	}
	for body, key := range map[string]string{
		"profiles: {max_profiles: 0}\n":       "profiles.max_profiles",
		"profiles: {half_life: 1s}\n":         "profiles.half_life",
		"profiles: {save_interval: 10ms}\n":   "profiles.save_interval",
		"profiles: {min_runs: 0}\n":           "profiles.min_runs",
		"profiles: {headroom: -0.5}\n":        "profiles.headroom",
		"profiles: {max_profiles: 2000000}\n": "profiles.max_profiles",
		"profiles: {max_per_owner: 0}\n":      "profiles.max_per_owner",
		"profiles: {max_per_owner: -3}\n":     "profiles.max_per_owner",
	} {
		cfg := DefaultConfig()
		if err := ParseConfig([]byte(body), &cfg); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%q: %v, want an error naming %s", body, err, key)
		}
	}
}

type fakeRuns map[string]telemetry.RunSummary

func (f fakeRuns) TakeRun(id string, _ time.Time) (telemetry.RunSummary, bool) {
	s, ok := f[id]
	delete(f, id)
	return s, ok
}

func TestObservation(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j := api.Job{ID: "7", Owner: api.Owner{UID: 1000, User: "alice"},
		Spec: api.JobSpec{Labels: map[string]string{"b": "2", "a": "1"}, Class: api.ClassBatch,
			Resources: api.Resources{CPU: 4000, Memory: 4 << 30, GPU: &api.GPURequest{Share: 250, Memory: 2 << 30}}},
		Usage: &api.Usage{CPUSeconds: 3, MemoryPeak: 100 << 20}}
	o := observation(j, t0, t0.Add(30*time.Second), true, telemetry.RunSummary{}, false)
	want := profile.Key{Owner: "alice", Name: "a=1,b=2", Class: "batch"}
	if o.Key != want || o.RunSeconds != 30 || !o.Failed || o.At != t0.Add(30*time.Second) {
		t.Fatalf("observation %+v", o)
	}
	if o.Requested != (profile.Usage{CPUMilli: 4000, MemMiB: 4096, GPUMilli: 250, GPUMemMiB: 2048}) {
		t.Fatalf("requested %+v", o.Requested)
	}
	if !o.NoUsage {
		t.Fatal("a GPU job with no readings recorded use")
	}
	// Without GPUs the executor's accounting stands in: 3 CPU-seconds
	// over 30 s is 100m; the memory peak 100 MiB.
	j.Spec.Resources.GPU = nil
	j.Owner.User = ""
	o = observation(j, t0, t0.Add(30*time.Second), false, telemetry.RunSummary{}, false)
	if o.NoUsage || o.Peak != (profile.Usage{CPUMilli: 100, MemMiB: 100}) || o.Key.Owner != "uid 1000" {
		t.Fatalf("accounting observation %+v", o)
	}
	// No name and no labels: no key, Observe refuses it.
	j.Spec.Labels = nil
	o = observation(j, t0, t0.Add(time.Second), false, telemetry.RunSummary{}, false)
	if err := profile.New(profile.Options{}).Observe(o); err == nil {
		t.Fatal("a job with no name or labels was profiled")
	}
	// MIG asks nothing a profile follows on the GPU.
	if u := requestedUsage(api.JobSpec{Resources: api.Resources{CPU: 1, GPU: &api.GPURequest{MIG: "1g.18gb", Count: 2}}}); u.GPUMilli != 0 {
		t.Fatalf("MIG request %+v", u)
	}
	if u := requestedUsage(api.JobSpec{Resources: api.Resources{GPU: &api.GPURequest{Count: 2}}}); u.GPUMilli != 2000 {
		t.Fatalf("two whole GPUs %+v", u)
	}
}

func learnerFor(t *testing.T, dir string, cfg ProfilesConfig) *profileLearner {
	t.Helper()
	l, err := openProfiles(cfg, dir, fakeRuns{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestProfilesPersistAndServe(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultProfilesConfig()
	cfg.MinRuns = 3
	l := learnerFor(t, dir, cfg)
	t0 := time.Now().Add(-time.Hour)
	alice := api.Owner{UID: 1000, User: "alice"}
	over := api.JobSpec{Name: "over", Class: api.ClassBatch, Resources: api.Resources{CPU: 4000, Memory: 4 << 30}}
	for i := range 4 {
		j := api.Job{ID: string(rune('1' + i)), Owner: alice, Spec: over, Usage: &api.Usage{CPUSeconds: 0.5, MemoryPeak: 50 << 20}}
		l.runEnded(j, t0, t0.Add(10*time.Second), false)
	}
	l.runEnded(api.Job{ID: "9", Owner: api.Owner{UID: 1001, User: "bob"}, Spec: over, Usage: &api.Usage{}}, t0, t0.Add(time.Second), false)
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	// A new learner reads what the first saved.
	l = learnerFor(t, dir, cfg)
	jobs := map[string]api.Job{"5": {ID: "5", Owner: alice, Spec: over}}
	l.get = func(_ context.Context, c api.Caller, id string) (api.Job, error) {
		j, ok := jobs[id]
		if !ok || (!c.Admin && c.UID != j.Owner.UID) {
			return api.Job{}, api.ErrNotFound
		}
		return j, nil
	}
	aliceC, bobC, rootC := api.Caller{UID: 1000, User: "alice"}, api.Caller{UID: 1001, User: "bob"}, api.Caller{Admin: true}
	list, _ := l.Profiles(rootC, api.ProfileQuery{})
	if len(list.Profiles) != 2 || list.Profiles[0].Key.Owner != "alice" || list.Profiles[0].Runs != 4 {
		t.Fatalf("root's list after a restart %+v", list.Profiles)
	}
	list, _ = l.Profiles(bobC, api.ProfileQuery{Owner: "alice"})
	if len(list.Profiles) != 0 {
		t.Fatalf("bob sees alice's profiles: %+v", list.Profiles)
	}
	list, _ = l.Profiles(bobC, api.ProfileQuery{})
	if len(list.Profiles) != 1 || list.Profiles[0].Key.Owner != "bob" {
		t.Fatalf("bob's list %+v", list.Profiles)
	}
	r, err := l.JobRecommendation(context.Background(), aliceC, "5")
	if err != nil || !r.Ready || !r.OverAsked || r.Suggested.CPUMilli != 100 || r.Suggested.MemMiB != 64 || r.Runs != 4 {
		// 0.5 CPU-seconds over 10 s is 50m: ×1.2 rounds up to 100m;
		// 50 MiB ×1.2 = 60 → 64 MiB.
		t.Fatalf("alice's recommendation %+v %v", r, err)
	}
	if _, err := l.JobRecommendation(context.Background(), bobC, "5"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("bob's recommendation of alice's job: %v", err)
	}
	if _, err := l.Recommend(bobC, api.ProfileQuery{Owner: "alice", Name: "over"}); err == nil {
		t.Fatal("bob got alice's profile's recommendation")
	}
	r, err = l.Recommend(aliceC, api.ProfileQuery{Name: "over"})
	if err != nil || !r.Ready || r.Requested.CPUMilli != 4000 {
		t.Fatalf("alice by name %+v %v", r, err)
	}
	r, err = l.Recommend(bobC, api.ProfileQuery{Name: "over"})
	if err != nil || r.Ready || !strings.Contains(r.Note, "1 of the 3 sampled runs") {
		t.Fatalf("bob's one run %+v %v", r, err)
	}
}

func TestCorruptProfilesMovedAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, profilesFile)
	if err := os.WriteFile(path, []byte(`{"format":"fusiond-profiles","version":1,"profiles":[{"key":{"name":""}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	l := learnerFor(t, dir, DefaultProfilesConfig())
	if l.Book().Len() != 0 {
		t.Fatal("profiles from a corrupt file")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("corrupt file left in place: %v", err)
	}
	aside, _ := filepath.Glob(path + ".corrupt-*")
	if len(aside) != 1 {
		t.Fatalf("moved aside: %v", aside)
	}
	// Nothing learned, nothing written.
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an unchanged book was saved: %v", err)
	}
}
