package profile

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func key(name string) Key { return Key{Owner: "alice", Name: name, Class: "batch"} }

// nearestRank is the textbook nearest-rank quantile.
func nearestRank(v []float64, q float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func TestQuantilesOnKnownData(t *testing.T) {
	c := &clock{t0}
	b := New(Options{Now: c.now})
	// Values spaced more than a bucket apart: the histogram's quantiles
	// are exactly the nearest-rank ones.
	r := rand.New(rand.NewPCG(1, 2))
	var run, cpuTyp, cpuPeak []float64
	for i := range 40 {
		v := 100 * math.Pow(1.1, float64(r.IntN(60)))
		run = append(run, v)
		cpuTyp = append(cpuTyp, 10*math.Pow(1.05, float64(i)))
		cpuPeak = append(cpuPeak, 2000/math.Pow(1.05, float64(i)))
		err := b.Observe(Observation{Key: key("a"), At: t0, RunSeconds: v,
			Typical: Usage{CPUMilli: cpuTyp[i]}, Peak: Usage{CPUMilli: cpuPeak[i]}})
		if err != nil {
			t.Fatal(err)
		}
	}
	p, ok := b.Get(key("a"))
	if !ok {
		t.Fatal("no profile")
	}
	if p.Runs != 40 || p.SampledRuns != 40 || math.Abs(p.Weight-40) > 1e-9 {
		t.Fatalf("runs %d/%d weight %v", p.Runs, p.SampledRuns, p.Weight)
	}
	check := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	// Every set is geometric with ratio ≥ 1.05 (or random powers of
	// 1.1): more than a bucket's 2^(1/16) ≈ 1.044 apart.
	check("runtime p95", p.Runtime.P95, nearestRank(run, 0.95))
	check("runtime max", p.Runtime.Max, slices.Max(run))
	check("cpu p95", p.CPU.P95, nearestRank(cpuPeak, 0.95))
	check("cpu max", p.CPU.Max, 2000)
	check("cpu p50", p.CPU.P50, nearestRank(cpuTyp, 0.5))
}

func TestQuantilesWithinABucket(t *testing.T) {
	b := New(Options{Now: func() time.Time { return t0 }})
	r := rand.New(rand.NewPCG(3, 4))
	var v []float64
	for range 1000 {
		x := math.Exp(r.NormFloat64()*2 + 5)
		v = append(v, x)
		if err := b.Observe(Observation{Key: key("b"), At: t0, RunSeconds: x, NoUsage: true}); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := b.Get(key("b"))
	for _, c := range []struct {
		q   float64
		got float64
	}{{0.5, p.Runtime.P50}, {0.95, p.Runtime.P95}} {
		want := nearestRank(v, c.q)
		if math.Abs(c.got-want)/want > 0.05 {
			t.Errorf("q%v = %v, want %v ± 5%%", c.q, c.got, want)
		}
	}
	if p.SampledRuns != 0 || p.CPU != (Dist{}) {
		t.Errorf("NoUsage runs sampled: %+v", p)
	}
}

func TestDecayHalvesWeight(t *testing.T) {
	c := &clock{t0}
	hl := time.Hour
	b := New(Options{Now: c.now, HalfLife: hl})
	if err := b.Observe(Observation{Key: key("d"), At: t0, RunSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	c.t = t0.Add(hl)
	p, _ := b.Get(key("d"))
	if math.Abs(p.Weight-0.5) > 1e-12 {
		t.Fatalf("weight after one half-life %v, want 0.5", p.Weight)
	}
	c.t = t0.Add(3 * hl)
	p, _ = b.Get(key("d"))
	if math.Abs(p.Weight-0.125) > 1e-12 {
		t.Fatalf("weight after three half-lives %v, want 0.125", p.Weight)
	}
}

func TestDecayFavoursRecentRuns(t *testing.T) {
	c := &clock{t0}
	hl := time.Hour
	b := New(Options{Now: c.now, HalfLife: hl})
	// 10 old runs at 1000 s, 4 runs three half-lives later at 100 s:
	// the old ones weigh 10/8 = 1.25 against 4, so the median is 100.
	for range 10 {
		_ = b.Observe(Observation{Key: key("r"), At: t0, RunSeconds: 1000, Failed: false})
	}
	for range 4 {
		_ = b.Observe(Observation{Key: key("r"), At: t0.Add(3 * hl), RunSeconds: 100, Failed: true})
	}
	c.t = t0.Add(3 * hl)
	p, _ := b.Get(key("r"))
	if p.Runtime.P50 != 1000 {
		// failed runs are not in the run time: only the 1000 s ones are
		t.Fatalf("runtime p50 %v, want 1000 (failed runs excluded)", p.Runtime.P50)
	}
	if want := 4 / (4 + 1.25); math.Abs(p.FailureRate-want) > 1e-9 {
		t.Fatalf("failure rate %v, want %v", p.FailureRate, want)
	}
	for range 4 {
		_ = b.Observe(Observation{Key: key("s"), At: t0, Typical: Usage{CPUMilli: 1000}, Peak: Usage{CPUMilli: 1000}})
	}
	for range 2 {
		_ = b.Observe(Observation{Key: key("s"), At: t0.Add(3 * hl), Typical: Usage{CPUMilli: 100}, Peak: Usage{CPUMilli: 100}})
	}
	p, _ = b.Get(key("s"))
	if p.CPU.P50 != 100 {
		t.Fatalf("cpu p50 %v, want 100 (4 old runs weigh 0.5 against 2)", p.CPU.P50)
	}
	// An observation older than the profile's latest weighs less too.
	_ = b.Observe(Observation{Key: key("s"), At: t0.Add(2 * hl), Typical: Usage{CPUMilli: 100}, Peak: Usage{CPUMilli: 100}})
	p, _ = b.Get(key("s"))
	if want := 4.0/8 + 2 + 0.5; math.Abs(p.Weight-want) > 1e-9 {
		t.Fatalf("weight %v, want %v", p.Weight, want)
	}
}

func TestEvictionBound(t *testing.T) {
	c := &clock{t0}
	b := New(Options{Now: c.now, MaxProfiles: 3})
	for i := range 10 {
		// key 0 is seen again late, so it survives
		at := t0.Add(time.Duration(i) * time.Minute)
		if err := b.Observe(Observation{Key: key(fmt.Sprint(i)), At: at, RunSeconds: 1}); err != nil {
			t.Fatal(err)
		}
		if i == 8 {
			_ = b.Observe(Observation{Key: key("0"), At: at, RunSeconds: 1})
		}
		if b.Len() > 3 {
			t.Fatalf("%d profiles, bound 3", b.Len())
		}
	}
	var names []string
	for _, p := range b.All() {
		names = append(names, p.Key.Name)
	}
	if want := []string{"0", "8", "9"}; !slices.Equal(names, want) {
		t.Fatalf("kept %v, want %v", names, want)
	}
}

func TestHistogramBounded(t *testing.T) {
	var h hist
	r := rand.New(rand.NewPCG(5, 6))
	for range 100000 {
		h.add(math.Exp(r.Float64()*200-100), 1)
	}
	h.add(math.MaxFloat64, 1)
	h.add(0, 1)
	if len(h.B) > maxStored {
		t.Fatalf("%d buckets, bound %d", len(h.B), maxStored)
	}
	if err := h.check(); err != nil {
		t.Fatal(err)
	}
}

func TestBadInputRejected(t *testing.T) {
	b := New(Options{})
	bad := []Observation{
		{Key: Key{Owner: "a"}, RunSeconds: 1},
		{Key: key("x"), RunSeconds: math.NaN()},
		{Key: key("x"), RunSeconds: -1},
		{Key: key("x"), RunSeconds: math.Inf(1)},
		{Key: key("x"), Requested: Usage{CPUMilli: -5}},
		{Key: key("x"), Typical: Usage{MemMiB: math.NaN()}},
		{Key: key("x"), Peak: Usage{GPUMilli: math.Inf(-1)}},
		{Key: Key{Name: strings.Repeat("n", MaxKeyLen+1)}},
		{Key: Key{Name: "\xff"}},
	}
	for i, o := range bad {
		if err := b.Observe(o); err == nil {
			t.Errorf("%d: %+v accepted", i, o)
		}
	}
	if b.Len() != 0 {
		t.Fatalf("bad observations made %d profiles", b.Len())
	}
	if _, ok := b.Recommend(key("x"), Usage{CPUMilli: math.NaN()}); ok {
		t.Fatal("NaN request recommended on")
	}
}

func TestEstimateRuntime(t *testing.T) {
	b := New(Options{Now: func() time.Time { return t0 }})
	if d, ok := b.EstimateRuntime(key("e"), 0); ok {
		t.Fatalf("estimate %v with no profile", d)
	}
	if d, ok := b.EstimateRuntime(key("e"), time.Minute); !ok || d != time.Minute {
		t.Fatalf("limit not used: %v %v", d, ok)
	}
	_ = b.Observe(Observation{Key: key("e"), At: t0, RunSeconds: 5, Failed: true})
	if d, ok := b.EstimateRuntime(key("e"), 0); ok {
		t.Fatalf("estimate %v from failed runs only", d)
	}
	for i := 1; i <= 20; i++ {
		_ = b.Observe(Observation{Key: key("e"), At: t0, RunSeconds: float64(10 * i)})
	}
	d, ok := b.EstimateRuntime(key("e"), 0)
	if !ok || d != 190*time.Second {
		t.Fatalf("estimate %v %v, want p95 = 190s", d, ok)
	}
	if d, _ := b.EstimateRuntime(key("e"), time.Second); d != time.Second {
		t.Fatalf("limit %v did not win over the profile", d)
	}
	_ = b.Observe(Observation{Key: key("huge"), At: t0, RunSeconds: 1e300})
	if d, ok := b.EstimateRuntime(key("huge"), 0); !ok || d <= 0 {
		t.Fatalf("huge run time estimate %v %v", d, ok)
	}
}

func TestRecommendThresholds(t *testing.T) {
	b := New(Options{Now: func() time.Time { return t0 }, MinRuns: 5})
	req := Usage{CPUMilli: 4000, MemMiB: 4096, GPUMilli: 0, GPUMemMiB: 0}
	obs := func(cpu, mem float64) {
		t.Helper()
		err := b.Observe(Observation{Key: key("w"), At: t0, RunSeconds: 3, Requested: req,
			Typical: Usage{CPUMilli: cpu / 2, MemMiB: mem / 2}, Peak: Usage{CPUMilli: cpu, MemMiB: mem}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		obs(200+float64(i), 100)
	}
	if r, ok := b.Recommend(key("w"), req); ok {
		t.Fatalf("recommendation from 4 runs: %+v", r)
	}
	obs(210, 100)
	r, ok := b.Recommend(key("w"), req)
	if !ok {
		t.Fatal("no recommendation from 5 runs")
	}
	// p95 of peaks 200..203, 210 = 210; ×1.2 = 252 → 300m. Memory
	// 100 × 1.2 = 120 → 128 MiB.
	want := Usage{CPUMilli: 300, MemMiB: 128}
	if r.Suggested != want || !r.OverAsked || r.Runs != 5 || len(r.Reasons) != 2 {
		t.Fatalf("recommendation %+v, want suggested %+v over-asked with two reasons", r, want)
	}
	if !strings.Contains(r.Reasons[0], "asks 4000m CPU, p95 used 210m over 5 runs") {
		t.Fatalf("reason %q", r.Reasons[0])
	}
	// A request close to use stands; one below use is raised.
	r, _ = b.Recommend(key("w"), Usage{CPUMilli: 300, MemMiB: 90})
	if r.OverAsked || r.Suggested.CPUMilli != 300 || r.Suggested.MemMiB != 128 || len(r.Reasons) != 1 {
		t.Fatalf("close request: %+v", r)
	}
	if _, ok := b.Recommend(key("nobody"), req); ok {
		t.Fatal("recommendation with no profile")
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	c := &clock{t0}
	b := New(Options{Now: c.now, HalfLife: time.Hour})
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 200 {
		_ = b.Observe(Observation{
			Key: KeyOf(fmt.Sprint("u", i%3), "", map[string]string{"app": fmt.Sprint(i % 7), "tier": "x"}, "batch"),
			At:  t0.Add(time.Duration(i) * time.Minute), RunSeconds: r.Float64() * 1000, Failed: i%5 == 0,
			Requested: Usage{CPUMilli: 1000, MemMiB: 512},
			Typical:   Usage{CPUMilli: r.Float64() * 500, MemMiB: r.Float64() * 300, GPUMilli: 0},
			Peak:      Usage{CPUMilli: r.Float64() * 900, MemMiB: r.Float64() * 500, GPUMemMiB: r.Float64() * 1e5},
		})
	}
	c.t = t0.Add(5 * time.Hour)
	var buf bytes.Buffer
	if err := b.Save(&buf); err != nil {
		t.Fatal(err)
	}
	b2, err := Load(bytes.NewReader(buf.Bytes()), Options{Now: c.now, HalfLife: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a1, a2 := b.All(), b2.All()
	if len(a1) != 21 || !slices.Equal(a1, a2) {
		t.Fatalf("round trip: %d profiles\n%+v\n%+v", len(a1), a1, a2)
	}
	if a1[0].Key.Name != "app=0,tier=x" {
		t.Fatalf("label-set key %q", a1[0].Key.Name)
	}
	// A smaller bound keeps the most recently seen.
	b3, err := Load(bytes.NewReader(buf.Bytes()), Options{Now: c.now, MaxProfiles: 2})
	if err != nil || b3.Len() != 2 {
		t.Fatalf("bounded load: %v, %v", b3, err)
	}
}

func TestLoadRejectsCorrupt(t *testing.T) {
	b := New(Options{Now: func() time.Time { return t0 }})
	_ = b.Observe(Observation{Key: key("c"), At: t0, RunSeconds: 3, Typical: Usage{CPUMilli: 5}, Peak: Usage{CPUMilli: 7}})
	var buf bytes.Buffer
	_ = b.Save(&buf)
	good := buf.String()
	cases := map[string]string{
		"empty":         "",
		"truncated":     good[:len(good)/2],
		"not json":      "hello",
		"format":        strings.Replace(good, fileFormat, "other", 1),
		"version":       strings.Replace(good, `"version":1`, `"version":9`, 1),
		"unknown":       strings.Replace(good, `"version":1`, `"version":1,"x":2`, 1),
		"runs":          strings.Replace(good, `"runs":1`, `"runs":-1`, 1),
		"weight":        strings.Replace(good, `"w":1,`, `"w":-1,`, 1),
		"bucket":        strings.Replace(good, `[44,1,7,7]`, `[44,1,8,7]`, 1),
		"bucket index":  strings.Replace(good, `[44,1,7,7]`, `[44.5,1,7,7]`, 1),
		"bucket size":   strings.Replace(good, `[44,1,7,7]`, `[44,1,7,7,7]`, 1),
		"bucket weight": strings.Replace(good, `[44,1,7,7]`, `[44,0,7,7]`, 1),
		"empty name":    strings.Replace(good, `"name":"c"`, `"name":""`, 1),
		"trailing":      good + "{}",
		"duplicate":     strings.Replace(good, `"profiles":[`, `"profiles":[`+profileJSON(t, good)+",", 1),
		"null entry":    strings.Replace(good, `"profiles":[`, `"profiles":[null,`, 1),
		"bucket zero":   strings.Replace(good, `[44,1,7,7]`, `[44,1,0,7]`, 1),
	}
	for name, s := range cases {
		if s == good {
			t.Fatalf("%s: corruption did not apply", name)
		}
		if _, err := Load(strings.NewReader(s), Options{}); err == nil {
			t.Errorf("%s: loaded", name)
		} else if !strings.HasPrefix(err.Error(), "profile: load: ") {
			t.Errorf("%s: error %q", name, err)
		}
	}
	if _, err := Load(strings.NewReader(good), Options{}); err != nil {
		t.Fatal(err)
	}
}

// profileJSON is the first profile's object in a saved file.
func profileJSON(t *testing.T, s string) string {
	i := strings.Index(s, `"profiles":[`) + len(`"profiles":[`)
	j := strings.LastIndex(s, "]}")
	if i < 0 || j < i {
		t.Fatal("no profiles in file")
	}
	return s[i:j]
}

func TestLabelSet(t *testing.T) {
	if got := LabelSet(map[string]string{"b": "2", "a": "1"}); got != "a=1,b=2" {
		t.Fatal(got)
	}
	if k := KeyOf("o", "n", map[string]string{"a": "1"}, "c"); k.Name != "n" {
		t.Fatal(k)
	}
	if LabelSet(nil) != "" {
		t.Fatal("labels of none")
	}
}

func TestSketch(t *testing.T) {
	var s Sketch
	var v []float64
	for i := range 200 {
		x := 5 * math.Pow(1.05, float64(i%30)) // 30 buckets: none merged (64 are kept)
		v = append(v, x)
		if !s.Add(x) {
			t.Fatal("reading refused")
		}
	}
	for _, bad := range []float64{math.NaN(), -1, math.Inf(1)} {
		if s.Add(bad) {
			t.Fatalf("%v accepted", bad)
		}
	}
	if s.Count() != 200 {
		t.Fatalf("count %d", s.Count())
	}
	for _, q := range []float64{0.5, 0.95} {
		if got, want := s.Quantile(q), nearestRank(v, q); got != want {
			t.Errorf("q%v = %v, want %v", q, got, want)
		}
	}
	if s.Max() != slices.Max(v) {
		t.Errorf("max %v", s.Max())
	}
	// 200 distinct values, 200 buckets: merged into 64, the quantiles
	// interpolated over merged buckets stay close.
	var wide Sketch
	v = v[:0]
	for i := range 200 {
		x := 5 * math.Pow(1.05, float64(i))
		v = append(v, x)
		wide.Add(x)
	}
	for _, q := range []float64{0.5, 0.95} {
		if got, want := wide.Quantile(q), nearestRank(v, q); math.Abs(got-want)/want > 0.1 {
			t.Errorf("merged q%v = %v, want %v ± 10%%", q, got, want)
		}
	}
	if wide.Max() != slices.Max(v) || len(wide.h.B) > maxStored {
		t.Errorf("merged: max %v, %d buckets", wide.Max(), len(wide.h.B))
	}
	var empty Sketch
	if empty.Quantile(0.5) != 0 || empty.Max() != 0 {
		t.Fatal("empty sketch not zero")
	}
}

// A Headroom of 0 is no headroom, not the default; nil is the default.
func TestRecommendHeadroom(t *testing.T) {
	req := Usage{CPUMilli: 4000, MemMiB: 4096}
	suggest := func(o Options) Usage {
		t.Helper()
		o.Now = func() time.Time { return t0 }
		b := New(o)
		for range 5 {
			err := b.Observe(Observation{Key: key("h"), At: t0, RunSeconds: 3, Requested: req,
				Typical: Usage{CPUMilli: 100, MemMiB: 50}, Peak: Usage{CPUMilli: 210, MemMiB: 100}})
			if err != nil {
				t.Fatal(err)
			}
		}
		r, ok := b.Recommend(key("h"), req)
		if !ok {
			t.Fatal("no recommendation")
		}
		return r.Suggested
	}
	zero, half := 0.0, 0.5
	for _, c := range []struct {
		what string
		h    *float64
		want Usage
	}{
		{"nil (the default 20%)", nil, Usage{CPUMilli: 300, MemMiB: 128}}, // 252 → 300m, 120 → 128 MiB
		{"0", &zero, Usage{CPUMilli: 250, MemMiB: 128}},                   // 210 → 250m, 100 → 128 MiB
		{"0.5", &half, Usage{CPUMilli: 350, MemMiB: 192}},                 // 315 → 350m, 150 → 192 MiB
	} {
		if got := suggest(Options{Headroom: c.h}); got != c.want {
			t.Errorf("headroom %s: suggested %+v, want %+v", c.what, got, c.want)
		}
	}
	bad := -0.1
	if err := (Options{Headroom: &bad}).Validate(); err == nil {
		t.Error("a negative headroom validated")
	}
}

func ownerKey(owner, name string) Key { return Key{Owner: owner, Name: name, Class: "batch"} }

func names(ps []Profile, owner string) []string {
	var out []string
	for _, p := range ps {
		if p.Key.Owner == owner {
			out = append(out, p.Key.Name)
		}
	}
	slices.Sort(out)
	return out
}

// One owner flooding the Book with new kinds of job evicts only its own
// profiles while the Book has room for the others'.
func TestPerOwnerBound(t *testing.T) {
	c := &clock{t0}
	b := New(Options{Now: c.now, MaxProfiles: 100, MaxPerOwner: 10})
	obs := func(k Key, at time.Time) {
		t.Helper()
		if err := b.Observe(Observation{Key: k, At: at, RunSeconds: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 { // bob's, seen long before alice's
		obs(ownerKey("bob", fmt.Sprint(i)), t0)
	}
	for i := range 1000 {
		obs(ownerKey("alice", fmt.Sprintf("%04d", i)), t0.Add(time.Hour+time.Duration(i)*time.Second))
		if n := len(names(b.All(), "alice")); n > 10 {
			t.Fatalf("alice holds %d profiles, bound 10", n)
		}
	}
	all := b.All()
	if got := names(all, "bob"); !slices.Equal(got, []string{"0", "1", "2", "3", "4"}) {
		t.Fatalf("bob's profiles %v after alice's flood, want all 5 kept", got)
	}
	var want []string
	for i := 990; i < 1000; i++ {
		want = append(want, fmt.Sprintf("%04d", i))
	}
	if got := names(all, "alice"); !slices.Equal(got, want) {
		t.Fatalf("alice's profiles %v, want her 10 newest %v", got, want)
	}
	// Seeing a profile already held evicts nothing.
	obs(ownerKey("alice", "0995"), t0.Add(2*time.Hour))
	if b.Len() != 15 {
		t.Fatalf("%d profiles, want 15", b.Len())
	}
}

// The global bound holds over many owners each under their own bound: the
// least recently seen of anyone goes.
func TestGlobalBoundOverOwners(t *testing.T) {
	c := &clock{t0}
	b := New(Options{Now: c.now, MaxProfiles: 20, MaxPerOwner: 5})
	for i := range 50 {
		k := ownerKey(fmt.Sprint("u", i%10), fmt.Sprint(i))
		if err := b.Observe(Observation{Key: k, At: t0.Add(time.Duration(i) * time.Minute), RunSeconds: 1}); err != nil {
			t.Fatal(err)
		}
		if b.Len() > 20 {
			t.Fatalf("%d profiles, bound 20", b.Len())
		}
	}
	var got []string
	for _, p := range b.All() {
		got = append(got, p.Key.Name)
	}
	slices.Sort(got)
	var want []string
	for i := 30; i < 50; i++ {
		want = append(want, fmt.Sprint(i))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("kept %v, want the 20 most recently seen %v", got, want)
	}
}

func TestPerOwnerOptions(t *testing.T) {
	if err := (Options{MaxPerOwner: -1}).Validate(); err == nil {
		t.Error("a negative per-owner bound validated")
	}
	for _, c := range []struct{ max, per, want int }{
		{0, 0, DefaultMaxPerOwner},
		{10, 0, 10},  // the default, bounded by MaxProfiles
		{10, 50, 10}, // above MaxProfiles
		{100, 7, 7},
	} {
		if got := (Options{MaxProfiles: c.max, MaxPerOwner: c.per}).withDefaults().MaxPerOwner; got != c.want {
			t.Errorf("MaxProfiles %d MaxPerOwner %d: per-owner bound %d, want %d", c.max, c.per, got, c.want)
		}
	}
}

// Load of a file holding more of an owner's profiles than the bound keeps
// that owner's most recently seen, and everyone else's.
func TestLoadPerOwnerBound(t *testing.T) {
	c := &clock{t0}
	b := New(Options{Now: c.now, MaxPerOwner: 100})
	for i := range 30 {
		_ = b.Observe(Observation{Key: ownerKey("alice", fmt.Sprintf("%02d", i)), At: t0.Add(time.Duration(i) * time.Minute), RunSeconds: 1})
	}
	for i := range 3 {
		_ = b.Observe(Observation{Key: ownerKey("bob", fmt.Sprint(i)), At: t0, RunSeconds: 1})
	}
	var buf bytes.Buffer
	if err := b.Save(&buf); err != nil {
		t.Fatal(err)
	}
	b2, err := Load(bytes.NewReader(buf.Bytes()), Options{Now: c.now, MaxPerOwner: 10})
	if err != nil {
		t.Fatal(err)
	}
	all := b2.All()
	var want []string
	for i := 20; i < 30; i++ {
		want = append(want, fmt.Sprintf("%02d", i))
	}
	if got := names(all, "alice"); !slices.Equal(got, want) {
		t.Fatalf("alice's profiles after load %v, want her 10 newest %v", got, want)
	}
	if got := names(all, "bob"); len(got) != 3 {
		t.Fatalf("bob's profiles after load %v, want all 3", got)
	}
	// The Book goes on counting what it loaded: a new one of alice's
	// evicts her oldest.
	_ = b2.Observe(Observation{Key: ownerKey("alice", "new"), At: t0.Add(time.Hour), RunSeconds: 1})
	if got := names(b2.All(), "alice"); len(got) != 10 || slices.Contains(got, "20") {
		t.Fatalf("alice's profiles %v, want 10 without her oldest", got)
	}
}
