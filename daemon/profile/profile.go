// Package profile owns task profiles: what finished jobs of one kind
// used and how long they ran, learned with decay, bounded, serialisable.
//
// A profile is keyed by (owner, name, class) — the name being the job's
// name or, without one, its label set. Each finished run is folded in as
// an Observation: its run time, whether it failed, what it asked for and
// what its telemetry showed (typical and peak CPU, memory, GPU
// utilisation and GPU memory). Every distribution is a log-bucketed
// histogram (about 4.4% per bucket, at most 64 buckets) whose
// weights decay by half every HalfLife, so recent runs count more and a
// profile's memory is bounded; the Book holds at most MaxProfiles
// profiles, at most MaxPerOwner of them one owner's, and evicts the least
// recently seen (the owner's own first when that owner is at its bound,
// so one owner's new kinds of job never push out another's profiles
// while the Book has room). It is pure: no I/O but
// the io.Writer and io.Reader given to Save and Load, and the clock only
// through Options.Now.
package profile

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Key names a kind of job.
type Key struct {
	Owner string `json:"owner"`
	// Name is the job's name, or its labels as a sorted "k=v,k=v" set
	// when it has no name (KeyOf).
	Name  string `json:"name"`
	Class string `json:"class"`
}

// MaxKeyLen is the longest Owner, Name or Class a Key may have, in bytes.
const MaxKeyLen = 512

// KeyOf is the key of a job of owner and class named name with labels:
// the name when it has one, else LabelSet(labels).
func KeyOf(owner, name string, labels map[string]string, class string) Key {
	if name == "" {
		name = LabelSet(labels)
	}
	return Key{Owner: owner, Name: name, Class: class}
}

// LabelSet is labels as "k=v,k=v" sorted by key; "" for none.
func LabelSet(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for i, k := range keys {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(k)
		sb.WriteByte('=')
		sb.WriteString(labels[k])
	}
	return sb.String()
}

// Validate says whether k can name a profile: Name not empty (an empty
// one would pool unrelated jobs), every part valid UTF-8 of at most
// MaxKeyLen bytes.
func (k Key) Validate() error {
	if k.Name == "" {
		return errors.New("profile key: empty name")
	}
	for _, s := range []string{k.Owner, k.Name, k.Class} {
		if len(s) > MaxKeyLen {
			return fmt.Errorf("profile key: part of %d bytes, more than %d", len(s), MaxKeyLen)
		}
		if !utf8.ValidString(s) {
			return errors.New("profile key: not valid UTF-8")
		}
	}
	return nil
}

func (k Key) less(o Key) int {
	if c := strings.Compare(k.Owner, o.Owner); c != 0 {
		return c
	}
	if c := strings.Compare(k.Name, o.Name); c != 0 {
		return c
	}
	return strings.Compare(k.Class, o.Class)
}

// Usage is an amount of each resource a profile follows.
type Usage struct {
	CPUMilli float64 `json:"cpu_milli"`
	MemMiB   float64 `json:"mem_mib"`
	// GPUMilli is GPU utilisation in milli-GPUs (1000 = one GPU busy).
	GPUMilli  float64 `json:"gpu_milli"`
	GPUMemMiB float64 `json:"gpu_mem_mib"`
}

func (u Usage) values() [4]float64 { return [4]float64{u.CPUMilli, u.MemMiB, u.GPUMilli, u.GPUMemMiB} }

func usageOf(v [4]float64) Usage {
	return Usage{CPUMilli: v[0], MemMiB: v[1], GPUMilli: v[2], GPUMemMiB: v[3]}
}

var metricNames = [4]string{"CPU", "memory", "GPU", "GPU memory"}

func (u Usage) validate(what string) error {
	for i, v := range u.values() {
		if !finite(v) || v < 0 {
			return fmt.Errorf("%s %s: %v is not a finite amount ≥ 0", what, metricNames[i], v)
		}
	}
	return nil
}

// Observation is one finished run of a job.
type Observation struct {
	Key        Key
	At         time.Time // when the job ended; zero: Options.Now()
	RunSeconds float64
	Failed     bool
	Requested  Usage // what its spec asked for
	Typical    Usage // p50 of its telemetry samples
	Peak       Usage // p95 (or max) of its samples
	// NoUsage says no telemetry was sampled while it ran (too short,
	// telemetry off): Typical and Peak are not folded in; the run counts
	// for run time and failure rate only.
	NoUsage bool
}

// Validate says whether o can be folded in.
func (o Observation) Validate() error {
	if err := o.Key.Validate(); err != nil {
		return err
	}
	if !finite(o.RunSeconds) || o.RunSeconds < 0 {
		return fmt.Errorf("profile observation: run time %v is not a finite number of seconds ≥ 0", o.RunSeconds)
	}
	if err := o.Requested.validate("profile observation: requested"); err != nil {
		return err
	}
	if o.NoUsage {
		return nil
	}
	if err := o.Typical.validate("profile observation: typical"); err != nil {
		return err
	}
	return o.Peak.validate("profile observation: peak")
}

// Dist is a distribution's summary.
type Dist struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	Max float64 `json:"max"`
}

// Profile is what a Book learned of one key.
type Profile struct {
	Key Key `json:"key"`
	// Runs is the observations folded in; SampledRuns those of them that
	// carried usage (not NoUsage).
	Runs        int `json:"runs"`
	SampledRuns int `json:"sampled_runs"`
	// Weight is the runs' decayed weight now (each run weighs 1 when it
	// ends, half that HalfLife later).
	Weight   float64   `json:"weight"`
	LastSeen time.Time `json:"last_seen"`
	// Runtime is the run time in seconds of the runs that succeeded (a
	// failed run's time says when it broke, not how long its work takes);
	// zero when none did.
	Runtime Dist `json:"runtime"`
	// CPU, Mem, GPU and GPUMem: P50 is the weighted median of the runs'
	// typical use, P95 the weighted p95 of their peaks, Max the largest
	// peak still weighed.
	CPU    Dist `json:"cpu"`
	Mem    Dist `json:"mem"`
	GPU    Dist `json:"gpu"`
	GPUMem Dist `json:"gpu_mem"`
	// FailureRate is the decayed weight of failed runs over all runs.
	FailureRate float64 `json:"failure_rate"`
	// Requested is the latest request seen.
	Requested Usage `json:"requested"`
}

// Options tunes a Book. Zero (nil) fields take the defaults.
type Options struct {
	// MaxProfiles bounds the profiles held (default 4096); the least
	// recently seen is evicted first.
	MaxProfiles int
	// MaxPerOwner bounds the profiles held of one owner (default 256, or
	// MaxProfiles when that is less; one above MaxProfiles is
	// MaxProfiles): a new key of an owner at the bound evicts that
	// owner's least recently seen profile rather than anyone else's.
	MaxPerOwner int
	// HalfLife is how long until a run weighs half (default 7 days).
	HalfLife time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// MinRuns is how many sampled runs a recommendation needs (default 5).
	MinRuns int
	// EstimateMinRuns is how many succeeded runs a run-time estimate needs
	// (default 1).
	EstimateMinRuns int
	// Headroom is the share added to the observed p95 peak for a
	// suggested request (nil: the default 0.2, 20%; a 0 is no headroom).
	Headroom *float64
}

// Defaults.
const (
	DefaultMaxProfiles     = 4096
	DefaultMaxPerOwner     = 256
	DefaultHalfLife        = 7 * 24 * time.Hour
	DefaultMinRuns         = 5
	DefaultEstimateMinRuns = 1
	DefaultHeadroom        = 0.2
)

// Validate says whether o's set fields are sane (zero and nil fields are
// fine: they take the defaults).
func (o Options) Validate() error {
	switch {
	case o.MaxProfiles < 0:
		return fmt.Errorf("profile options: max profiles %d < 0", o.MaxProfiles)
	case o.MaxPerOwner < 0:
		return fmt.Errorf("profile options: max profiles per owner %d < 0", o.MaxPerOwner)
	case o.HalfLife < 0:
		return fmt.Errorf("profile options: half-life %v < 0", o.HalfLife)
	case o.HalfLife > 0 && o.HalfLife < time.Second:
		return fmt.Errorf("profile options: half-life %v < 1s", o.HalfLife)
	case o.MinRuns < 0 || o.EstimateMinRuns < 0:
		return errors.New("profile options: negative run threshold")
	case o.Headroom != nil && !(*o.Headroom >= 0 && *o.Headroom <= 10):
		return fmt.Errorf("profile options: headroom %v not in [0, 10]", *o.Headroom)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.MaxProfiles <= 0 {
		o.MaxProfiles = DefaultMaxProfiles
	}
	if o.MaxPerOwner <= 0 {
		o.MaxPerOwner = DefaultMaxPerOwner
	}
	o.MaxPerOwner = min(o.MaxPerOwner, o.MaxProfiles)
	if o.HalfLife < time.Second {
		o.HalfLife = DefaultHalfLife
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MinRuns <= 0 {
		o.MinRuns = DefaultMinRuns
	}
	if o.EstimateMinRuns <= 0 {
		o.EstimateMinRuns = DefaultEstimateMinRuns
	}
	if o.Headroom == nil || !(*o.Headroom >= 0 && *o.Headroom <= 10) {
		h := DefaultHeadroom
		o.Headroom = &h
	} else {
		h := *o.Headroom // the Book's own copy
		o.Headroom = &h
	}
	return o
}

// entry is one profile's learned state; every weight in it is as of Ref.
type entry struct {
	Key         Key       `json:"key"`
	Ref         time.Time `json:"ref"`
	Runs        int       `json:"runs"`
	SampledRuns int       `json:"sampled_runs"`
	OKRuns      int       `json:"ok_runs"`
	W           float64   `json:"w"`
	FailW       float64   `json:"fail_w"`
	LastSeen    time.Time `json:"last_seen"`
	Requested   Usage     `json:"requested"`
	Runtime     hist      `json:"runtime"`
	Typical     [4]hist   `json:"typical"`
	Peak        [4]hist   `json:"peak"`
}

// decayTo moves e's weights forward to t (no-op for t not after Ref).
func (e *entry) decayTo(t time.Time, halfLife time.Duration) {
	if !t.After(e.Ref) {
		return
	}
	f := decay(t.Sub(e.Ref), halfLife)
	e.W *= f
	e.FailW *= f
	e.Runtime.scale(f)
	for i := range e.Typical {
		e.Typical[i].scale(f)
		e.Peak[i].scale(f)
	}
	e.Ref = t
}

// decay is 2^(−age/halfLife).
func decay(age, halfLife time.Duration) float64 {
	if age <= 0 {
		return 1
	}
	return math.Exp2(-age.Seconds() / halfLife.Seconds())
}

func (e *entry) profile(now time.Time, halfLife time.Duration) Profile {
	p := Profile{
		Key: e.Key, Runs: e.Runs, SampledRuns: e.SampledRuns,
		Weight: e.W * decay(now.Sub(e.Ref), halfLife), LastSeen: e.LastSeen,
		Requested: e.Requested,
		Runtime:   distOf(&e.Runtime, &e.Runtime),
	}
	if e.W > 0 {
		p.FailureRate = e.FailW / e.W
	}
	d := [4]*Dist{&p.CPU, &p.Mem, &p.GPU, &p.GPUMem}
	for i := range d {
		*d[i] = distOf(&e.Typical[i], &e.Peak[i])
	}
	return p
}

func distOf(typical, peak *hist) Dist {
	return Dist{P50: typical.quantile(0.5), P95: peak.quantile(0.95), Max: peak.max()}
}

// Book holds the profiles; safe for concurrent use.
type Book struct {
	o  Options
	mu sync.Mutex
	m  map[Key]*entry
	// owners counts m's profiles by owner.
	owners map[string]int
}

// New is an empty Book.
func New(o Options) *Book {
	return &Book{o: o.withDefaults(), m: make(map[Key]*entry), owners: make(map[string]int)}
}

// putLocked adds e, whose key b does not hold.
func (b *Book) putLocked(e *entry) {
	b.m[e.Key] = e
	b.owners[e.Key.Owner]++
}

// dropLocked forgets k's profile, which b holds.
func (b *Book) dropLocked(k Key) {
	delete(b.m, k)
	if b.owners[k.Owner]--; b.owners[k.Owner] <= 0 {
		delete(b.owners, k.Owner)
	}
}

// Len is the number of profiles held.
func (b *Book) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// Observe folds one finished run in. An invalid observation (see
// Observation.Validate) changes nothing and is the error.
func (b *Book) Observe(o Observation) error {
	if err := o.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	at := o.At
	if at.IsZero() {
		at = b.o.Now()
	}
	e := b.m[o.Key]
	if e == nil {
		if n := b.owners[o.Key.Owner]; n >= b.o.MaxPerOwner {
			b.evictLocked(n-b.o.MaxPerOwner+1, o.Key.Owner, true)
		}
		if len(b.m) >= b.o.MaxProfiles {
			b.evictLocked(len(b.m)-b.o.MaxProfiles+1, "", false)
		}
		e = &entry{Key: o.Key, Ref: at}
		b.putLocked(e)
	}
	e.decayTo(at, b.o.HalfLife)
	w := decay(e.Ref.Sub(at), b.o.HalfLife) // < 1 for a run older than the profile's latest
	e.Runs++
	e.W += w
	if o.Failed {
		e.FailW += w
	} else {
		e.OKRuns++
		e.Runtime.add(o.RunSeconds, w)
	}
	if !o.NoUsage {
		e.SampledRuns++
		typ, peak := o.Typical.values(), o.Peak.values()
		for i := range typ {
			e.Typical[i].add(typ[i], w)
			e.Peak[i].add(math.Max(peak[i], typ[i]), w)
		}
	}
	if !at.Before(e.LastSeen) {
		e.LastSeen = at
		e.Requested = o.Requested
	}
	return nil
}

// evictLocked drops the n least recently seen profiles: of owner when
// ofOwner, else of anyone.
func (b *Book) evictLocked(n int, owner string, ofOwner bool) {
	if n <= 0 {
		return
	}
	mine := func(e *entry) bool { return !ofOwner || e.Key.Owner == owner }
	older := func(x, y *entry) int {
		if c := x.LastSeen.Compare(y.LastSeen); c != 0 {
			return c
		}
		return x.Key.less(y.Key)
	}
	if n == 1 { // the common case, a new key in a full book: one scan
		var oldest *entry
		for _, e := range b.m {
			if mine(e) && (oldest == nil || older(e, oldest) < 0) {
				oldest = e
			}
		}
		if oldest != nil {
			b.dropLocked(oldest.Key)
		}
		return
	}
	var all []*entry
	for _, e := range b.m {
		if mine(e) {
			all = append(all, e)
		}
	}
	slices.SortFunc(all, older)
	for _, e := range all[:min(n, len(all))] {
		b.dropLocked(e.Key)
	}
}

// Get is k's profile, decayed to now.
func (b *Book) Get(k Key) (Profile, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[k]
	if e == nil {
		return Profile{}, false
	}
	return e.profile(b.o.Now(), b.o.HalfLife), true
}

// All is every profile, sorted by owner, name, class.
func (b *Book) All() []Profile {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.o.Now()
	out := make([]Profile, 0, len(b.m))
	for _, e := range b.m {
		out = append(out, e.profile(now, b.o.HalfLife))
	}
	slices.SortFunc(out, func(x, y Profile) int { return x.Key.less(y.Key) })
	return out
}

// EstimateRuntime is how long a job of key k is expected to run. The
// spec's own limit wins when given (> 0): the job cannot run longer.
// Else it is the p95 of k's succeeded runs' times, once there are
// Options.EstimateMinRuns of them: EASY backfill trusts the estimate to
// keep the queue head's reservation, and a job that outruns it delays
// the head, so the estimate is a high quantile (about one run in twenty
// outruns it) rather than the median. False when there is no limit and
// no such profile.
func (b *Book) EstimateRuntime(k Key, limit time.Duration) (time.Duration, bool) {
	if limit > 0 {
		return limit, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[k]
	if e == nil || e.OKRuns < b.o.EstimateMinRuns || len(e.Runtime.B) == 0 {
		return 0, false
	}
	s := e.Runtime.quantile(0.95)
	const maxSeconds = float64(math.MaxInt64/int64(time.Second)) - 1
	return time.Duration(math.Min(s, maxSeconds) * float64(time.Second)), true
}

// Recommendation is a suggested request for a job of Key.
type Recommendation struct {
	Key       Key   `json:"key"`
	Requested Usage `json:"requested"`
	Suggested Usage `json:"suggested"`
	// Runs is the sampled runs the suggestion rests on.
	Runs int `json:"runs"`
	// Reasons says, for each resource whose suggestion differs from the
	// request, what was asked and what was used.
	Reasons []string `json:"reasons"`
	// OverAsked says some resource is asked for well beyond its use.
	OverAsked bool `json:"over_asked"`
}

// Granularity of suggested requests, and how far off a request must be
// before a different one is suggested.
const (
	cpuStepMilli  = 50
	memStepMiB    = 64
	gpuStepMilli  = 50
	gpuMemStepMiB = 256
	// overAskShare: a request is over-asked when the suggestion is below
	// this share of it.
	overAskShare = 0.8
)

var steps = [4]float64{cpuStepMilli, memStepMiB, gpuStepMilli, gpuMemStepMiB}
var units = [4]string{"m", " MiB", "m", " MiB"}

// Recommend suggests requests for a job of key k that asks for requested,
// from k's profile once it has Options.MinRuns sampled runs. For each
// resource asked for (> 0): the p95 of the runs' peaks plus Headroom,
// rounded up to a step (50m CPU, 64 MiB memory, 50m GPU, 256 MiB GPU
// memory), at least one step for CPU and memory. It is suggested when it
// is below 80% of the request (over-asked) or above the request (the runs
// used more than asked; CPU and GPU use can exceed a request); else the
// request stands. A resource not asked for is left at zero. False when
// there is no profile or too few sampled runs, or requested is invalid.
func (b *Book) Recommend(k Key, requested Usage) (Recommendation, bool) {
	if requested.validate("requested") != nil {
		return Recommendation{}, false
	}
	p, ok := b.Get(k)
	if !ok || p.SampledRuns < b.o.MinRuns {
		return Recommendation{}, false
	}
	r := Recommendation{Key: k, Requested: requested, Runs: p.SampledRuns}
	req := requested.values()
	peaks := [4]float64{p.CPU.P95, p.Mem.P95, p.GPU.P95, p.GPUMem.P95}
	var sug [4]float64
	for i := range req {
		sug[i] = req[i]
		if req[i] == 0 {
			continue
		}
		s := math.Ceil(peaks[i]*(1+*b.o.Headroom)/steps[i]) * steps[i]
		if i <= 1 && s < steps[i] {
			s = steps[i]
		}
		switch {
		case s < overAskShare*req[i]:
			sug[i] = s
			r.OverAsked = true
			r.Reasons = append(r.Reasons, fmt.Sprintf("asks %s %s, p95 used %s over %d runs: suggest %s",
				amount(req[i], units[i]), metricNames[i], amount(peaks[i], units[i]), p.SampledRuns, amount(s, units[i])))
		case peaks[i] > req[i]:
			sug[i] = s
			r.Reasons = append(r.Reasons, fmt.Sprintf("asks %s %s, p95 used %s over %d runs, more than asked: suggest %s",
				amount(req[i], units[i]), metricNames[i], amount(peaks[i], units[i]), p.SampledRuns, amount(s, units[i])))
		}
	}
	r.Suggested = usageOf(sug)
	return r, true
}

func amount(v float64, unit string) string {
	return fmt.Sprintf("%.0f%s", math.Round(v), unit)
}
