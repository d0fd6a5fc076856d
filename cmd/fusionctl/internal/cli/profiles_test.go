package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/profile"
)

func TestProfileAndRecommendationTables(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	b := profile.New(profile.Options{Now: func() time.Time { return now }, MinRuns: 3})
	key := profile.Key{Owner: "alice", Name: "over\x1b[31m", Class: "batch"}
	req := profile.Usage{CPUMilli: 4000, MemMiB: 4096}
	for i := range 4 {
		err := b.Observe(profile.Observation{Key: key, At: now.Add(-time.Minute), RunSeconds: 12 + float64(i), Requested: req,
			Typical: profile.Usage{CPUMilli: 150, MemMiB: 40}, Peak: profile.Usage{CPUMilli: 210, MemMiB: 50}})
		if err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	l := api.ProfileList{Enabled: true, Profiles: b.All(), HalfLife: api.Duration(168 * time.Hour)}
	if err := profileTable(&out, l, now); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{`over\x1b[31m`, "alice", "batch", "150m/210m (4000m)", "40 MiB/50 MiB (4096 MiB)", "13s/15s", "1m0s ago", "0%", "168h0m0s"} {
		if !strings.Contains(s, want) {
			t.Errorf("profile table lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "\x1b") {
		t.Errorf("an escape reached the table:\n%q", s)
	}

	r, ok := b.Recommend(key, req)
	if !ok {
		t.Fatal("no recommendation")
	}
	p, _ := b.Get(key)
	out.Reset()
	if err := recommendationTable(&out, api.Recommendation{JobID: "42", Ready: true, Recommendation: r, Profile: &p}); err != nil {
		t.Fatal(err)
	}
	s = out.String()
	for _, want := range []string{"Job 42", "over-asked", "asks 4000m CPU, p95 used 210m over 4 runs: suggest 300m", "300m ←", "64 MiB ←"} {
		if !strings.Contains(s, want) {
			t.Errorf("recommendation lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "GPU") {
		t.Errorf("a job that neither asks for nor uses a GPU shows GPU rows:\n%s", s)
	}
	out.Reset()
	recommendationTable(&out, api.Recommendation{Recommendation: profile.Recommendation{Key: key, Requested: req, Suggested: req}, Note: "1 of the 5 sampled runs", Profile: &p})
	if s := out.String(); !strings.Contains(s, "No recommendation yet: 1 of the 5 sampled runs.") || strings.Contains(s, "←") {
		t.Errorf("not ready:\n%s", s)
	}
	out.Reset()
	profileTable(&out, api.ProfileList{}, now)
	if !strings.Contains(out.String(), "task profiles are off") {
		t.Errorf("disabled: %q", out.String())
	}
}

func TestRecommendArgs(t *testing.T) {
	for _, args := range [][]string{{"recommend"}, {"recommend", "7", "--name", "x"}, {"recommend", "7", "--owner", "bob"}} {
		var stdout, stderr bytes.Buffer
		root, _ := NewRootCommand(strings.NewReader(""), &stdout, &stderr)
		root.SetArgs(append(args, "--socket", "/nonexistent/sock"))
		if err := root.Execute(); err == nil || strings.Contains(err.Error(), "nonexistent") {
			t.Errorf("%v: %v, want a usage error before any request", args, err)
		}
	}
}
