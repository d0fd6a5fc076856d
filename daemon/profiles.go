package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
	"github.com/fusiond/fusiond/daemon/internal/atomicfile"
	"github.com/fusiond/fusiond/daemon/internal/telemetry"
	"github.com/fusiond/fusiond/daemon/profile"
)

// ProfilesConfig is the task profiles the daemon learns from finished
// jobs (package profile; docs/scheduling.md).
type ProfilesConfig struct {
	// Enabled learns, keeps and serves profiles (default true).
	Enabled bool `json:"enabled"`
	// MaxProfiles bounds the profiles kept (1..1000000; default 4096);
	// the least recently seen is dropped first.
	MaxProfiles int `json:"max_profiles"`
	// MaxPerOwner bounds the profiles kept of one owner (1..1000000;
	// default 256; one above MaxProfiles is MaxProfiles): an owner at the
	// bound loses its own least recently seen profile to a new one, never
	// another owner's.
	MaxPerOwner int `json:"max_per_owner"`
	// HalfLife is how long until a run weighs half (≥ 1m; default 168h).
	HalfLife Duration `json:"half_life"`
	// SaveInterval is how often the profiles are written to
	// <state_dir>/profiles.json when they changed (≥ 1s; default 5m);
	// they are written at shutdown too.
	SaveInterval Duration `json:"save_interval"`
	// MinRuns is how many sampled runs a recommendation needs (1..1000;
	// default 5).
	MinRuns int `json:"min_runs"`
	// Headroom is added to the observed p95 peak for a suggested request,
	// as a share (0..10; default 0.2).
	Headroom float64 `json:"headroom"`
}

// DefaultProfilesConfig learns profiles with a week's half-life.
func DefaultProfilesConfig() ProfilesConfig {
	return ProfilesConfig{Enabled: true, MaxProfiles: profile.DefaultMaxProfiles, MaxPerOwner: profile.DefaultMaxPerOwner, HalfLife: Duration(profile.DefaultHalfLife),
		SaveInterval: Duration(5 * time.Minute), MinRuns: profile.DefaultMinRuns, Headroom: profile.DefaultHeadroom}
}

func (c ProfilesConfig) validate() (string, error) {
	switch {
	case c.MaxProfiles < 1 || c.MaxProfiles > 1_000_000:
		return "profiles.max_profiles", fmt.Errorf("between 1 and 1000000, got %d", c.MaxProfiles)
	case c.MaxPerOwner < 1 || c.MaxPerOwner > 1_000_000:
		return "profiles.max_per_owner", fmt.Errorf("between 1 and 1000000, got %d", c.MaxPerOwner)
	case c.HalfLife < Duration(time.Minute):
		return "profiles.half_life", fmt.Errorf("at least 1m, got %v", time.Duration(c.HalfLife))
	case c.SaveInterval < Duration(time.Second):
		return "profiles.save_interval", fmt.Errorf("at least 1s, got %v", time.Duration(c.SaveInterval))
	case c.MinRuns < 1 || c.MinRuns > 1000:
		return "profiles.min_runs", fmt.Errorf("between 1 and 1000, got %d", c.MinRuns)
	case !(c.Headroom >= 0 && c.Headroom <= 10):
		return "profiles.headroom", fmt.Errorf("between 0 and 10, got %g", c.Headroom)
	}
	return "", c.options().Validate()
}

func (c ProfilesConfig) options() profile.Options {
	headroom := c.Headroom // 0 is no headroom, not the package's default
	return profile.Options{MaxProfiles: c.MaxProfiles, MaxPerOwner: c.MaxPerOwner, HalfLife: time.Duration(c.HalfLife), MinRuns: c.MinRuns, Headroom: &headroom}
}

// profilesFile is where the profiles are kept, under the state directory.
const profilesFile = "profiles.json"

// jobKey is the profile key of a job.
func jobKey(j api.Job) profile.Key {
	return profile.KeyOf(api.UserName(j.Owner.UID, j.Owner.User), j.Spec.Name, j.Spec.Labels, string(j.Spec.Class))
}

// requestedUsage is what a spec asks for, in a profile's units: CPU and
// memory; whole GPUs as 1000m each and a share as its milli-GPUs with
// its memory cap. A MIG instance is left out (its use is not attributed,
// see gpuHolds), so no GPU suggestion is made for it.
func requestedUsage(s api.JobSpec) profile.Usage {
	u := profile.Usage{CPUMilli: float64(s.Resources.CPU), MemMiB: float64(s.Resources.Memory) / (1 << 20)}
	if g := s.Resources.GPU; g != nil && g.MIG == "" {
		switch {
		case g.Share > 0:
			u.GPUMilli = float64(g.Share)
			u.GPUMemMiB = float64(g.Memory) / (1 << 20)
		default:
			u.GPUMilli = 1000 * float64(max(g.Count, 1))
		}
	}
	return u
}

// observation is one ended attempt of j as a profile observation: its
// run time from started to ended, its spec's request, and its use from
// the telemetry bus's summary of the attempt (run, when sampled). Without
// readings a job that holds no GPU takes its use from the executor's
// accounting (its mean CPU and peak memory); one that holds GPUs is
// recorded without use (NoUsage), since nothing says what it used of them.
func observation(j api.Job, started, ended time.Time, failed bool, run telemetry.RunSummary, sampled bool) profile.Observation {
	o := profile.Observation{Key: jobKey(j), At: ended, RunSeconds: max(ended.Sub(started).Seconds(), 0), Failed: failed,
		Requested: requestedUsage(j.Spec)}
	switch {
	case sampled && run.Readings > 0:
		o.Typical, o.Peak = run.Typical(), run.Peak()
	case j.Usage != nil && o.RunSeconds > 0 && j.Spec.Resources.GPU == nil:
		cpu := j.Usage.CPUSeconds / o.RunSeconds * 1000
		mem := float64(j.Usage.MemoryPeak) / (1 << 20)
		o.Typical = profile.Usage{CPUMilli: cpu, MemMiB: mem}
		o.Peak = o.Typical
	default:
		o.NoUsage = true
	}
	return o
}

// runTaker hands over a job attempt's usage summary (*telemetry.Bus).
type runTaker interface {
	TakeRun(id string, started time.Time) (telemetry.RunSummary, bool)
}

// profileLearner feeds the profile book from ended job attempts, keeps it
// in <state_dir>/profiles.json and serves it over the API.
type profileLearner struct {
	cfg  ProfilesConfig
	book *profile.Book
	path string
	runs runTaker
	log  *slog.Logger
	// get reads a job as a caller may see it (the job manager's Get);
	// set once the manager is built.
	get func(ctx context.Context, c api.Caller, id string) (api.Job, error)

	saveMu sync.Mutex // one save at a time
	mu     sync.Mutex
	dirty  bool // changed since the last save
	stop   chan struct{}
	done   chan struct{}
}

var _ apiserver.ProfileBackend = (*profileLearner)(nil)

// openProfiles loads the profiles kept under stateDir. A file that cannot
// be read as profiles is logged and moved aside (profiles.json.corrupt-
// <unix time>), and the daemon starts with none: a damaged file costs
// what was learned, never the start.
func openProfiles(cfg ProfilesConfig, stateDir string, runs runTaker, log *slog.Logger) (*profileLearner, error) {
	l := &profileLearner{cfg: cfg, path: filepath.Join(stateDir, profilesFile), runs: runs, log: log}
	f, err := os.Open(l.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		l.book = profile.New(cfg.options())
		return l, nil
	case err != nil:
		return nil, fmt.Errorf("profiles: %w", err)
	}
	defer f.Close()
	book, err := profile.Load(f, cfg.options())
	if err != nil {
		aside := fmt.Sprintf("%s.corrupt-%d", l.path, time.Now().Unix())
		if rerr := os.Rename(l.path, aside); rerr != nil {
			return nil, fmt.Errorf("profiles: %w; moving it aside: %w", err, rerr)
		}
		log.Warn("task profiles unreadable: moved aside, starting with none", "err", err, "moved_to", aside)
		book = profile.New(cfg.options())
	} else {
		log.Info("task profiles loaded", "profiles", book.Len(), "path", l.path)
	}
	l.book = book
	return l, nil
}

// runEndedFunc is runEnded for jobs.Config, nil for a nil learner.
func (l *profileLearner) runEndedFunc() func(api.Job, time.Time, time.Time, bool) {
	if l == nil {
		return nil
	}
	return l.runEnded
}

// backend is l for apiserver.Config, nil (no profile routes' backend) for
// a nil learner.
func (l *profileLearner) backend() apiserver.ProfileBackend {
	if l == nil {
		return nil
	}
	return l
}

// Book is the profiles learned.
func (l *profileLearner) Book() *profile.Book { return l.book }

// runEnded is jobs.Config.RunEnded: it folds an ended attempt in. A job
// with neither name nor labels has no key and is not learned from.
func (l *profileLearner) runEnded(j api.Job, started, ended time.Time, failed bool) {
	run, sampled := l.runs.TakeRun(j.ID, started)
	o := observation(j, started, ended, failed, run, sampled)
	if err := l.book.Observe(o); err != nil {
		l.log.Debug("job not profiled", "job", j.ID, "err", err)
		return
	}
	l.mu.Lock()
	l.dirty = true
	l.mu.Unlock()
}

// start saves every SaveInterval until stopSaving.
func (l *profileLearner) start() {
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(l.done)
		t := time.NewTicker(time.Duration(l.cfg.SaveInterval))
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
				if err := l.save(); err != nil {
					l.log.Warn("task profiles not saved", "err", err)
				}
			}
		}
	}()
}

// close stops the saves and saves a last time.
func (l *profileLearner) close() error {
	if l.stop != nil {
		close(l.stop)
		<-l.done
		l.stop = nil
	}
	return l.save()
}

// save writes the profiles when they changed: to a temporary file in the
// same directory, synced, then renamed over profiles.json and the
// directory synced, so a crash leaves the old file or the new one.
func (l *profileLearner) save() error {
	l.saveMu.Lock()
	defer l.saveMu.Unlock()
	l.mu.Lock()
	dirty := l.dirty
	l.dirty = false
	l.mu.Unlock()
	if !dirty {
		return nil
	}
	err := atomicfile.Write(l.path, 0o600, func(f *os.File) error { return l.book.Save(f) })
	if err != nil {
		l.mu.Lock()
		l.dirty = true // try again next time
		l.mu.Unlock()
		return fmt.Errorf("profiles: %w", err)
	}
	return nil
}

// visibleOwner is the owner a caller may see profiles of: any for an
// admin (""), else their own.
func visibleOwner(c api.Caller) (string, bool) {
	if c.Admin {
		return "", true
	}
	return api.UserName(c.UID, c.User), false
}

// Profiles implements apiserver.ProfileBackend.
func (l *profileLearner) Profiles(c api.Caller, q api.ProfileQuery) (api.ProfileList, error) {
	own, all := visibleOwner(c)
	out := api.ProfileList{Enabled: true, HalfLife: api.Duration(l.cfg.HalfLife), Profiles: []profile.Profile{}}
	for _, p := range l.book.All() {
		if (!all && p.Key.Owner != own) || !matchesQuery(p.Key, q) {
			continue
		}
		out.Profiles = append(out.Profiles, p)
	}
	return out, nil
}

func matchesQuery(k profile.Key, q api.ProfileQuery) bool {
	return (q.Owner == "" || k.Owner == q.Owner) && (q.Name == "" || k.Name == q.Name) && (q.Class == "" || k.Class == q.Class)
}

// Recommend implements apiserver.ProfileBackend: the profile q names (the
// caller's own unless an admin names another owner; without a class the
// most recently seen of that name) against its latest request.
func (l *profileLearner) Recommend(c api.Caller, q api.ProfileQuery) (api.Recommendation, error) {
	own, all := visibleOwner(c)
	if q.Owner == "" {
		q.Owner = api.UserName(c.UID, c.User)
	}
	if !all && q.Owner != own {
		return api.Recommendation{}, api.Errorf(api.CodeNotFound, "no profile %q of owner %q", q.Name, q.Owner)
	}
	var found *profile.Profile
	for _, p := range l.book.All() {
		if matchesQuery(p.Key, q) && (found == nil || p.LastSeen.After(found.LastSeen)) {
			found = &p
		}
	}
	if found == nil {
		return api.Recommendation{}, api.Errorf(api.CodeNotFound, "no profile %q of owner %q", q.Name, q.Owner)
	}
	return l.recommend(found.Key, found.Requested, ""), nil
}

// JobRecommendation implements apiserver.ProfileBackend: job id's spec
// against its key's profile (as the caller may see the job).
func (l *profileLearner) JobRecommendation(ctx context.Context, c api.Caller, id string) (api.Recommendation, error) {
	j, err := l.get(ctx, c, id)
	if err != nil {
		return api.Recommendation{}, err
	}
	k := jobKey(j)
	if k.Validate() != nil {
		return api.Recommendation{JobID: j.ID, Recommendation: profile.Recommendation{Key: k, Requested: requestedUsage(j.Spec), Suggested: requestedUsage(j.Spec)},
			Note: "the job has neither a name nor labels: it has no profile"}, nil
	}
	return l.recommend(k, requestedUsage(j.Spec), j.ID), nil
}

// recommend is the answer for key k asking for req.
func (l *profileLearner) recommend(k profile.Key, req profile.Usage, jobID string) api.Recommendation {
	out := api.Recommendation{JobID: jobID}
	if p, ok := l.book.Get(k); ok {
		out.Profile = &p
	}
	if r, ok := l.book.Recommend(k, req); ok {
		out.Ready, out.Recommendation = true, r
		return out
	}
	out.Recommendation = profile.Recommendation{Key: k, Requested: req, Suggested: req}
	switch {
	case out.Profile == nil:
		out.Note = "no runs of this job have ended yet"
	default:
		out.Recommendation.Runs = out.Profile.SampledRuns
		out.Note = fmt.Sprintf("%d of the %d sampled runs a recommendation needs (profiles.min_runs)", out.Profile.SampledRuns, l.cfg.MinRuns)
	}
	return out
}
