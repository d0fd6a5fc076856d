package sim

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// TestEstimatesBackfillHandTrace: node a has 2 GPUs. p0 takes one from 0
// to 1000 s; h (2 GPUs, 100 s) arrives at 10 s and must wait for p0; s
// (1 GPU, 50 s) arrives at 20 s. With exact estimates s ends (70 s) before
// h's shadow time (1000 s), so it is backfilled at once; without
// estimates, or with the longest rule (nothing had ended when p0 started,
// so p0's end is unknown and h has no shadow time), s waits behind h until
// 1100 s. h starts at 1000 s either way (waits 990 s).
func TestEstimatesBackfillHandTrace(t *testing.T) {
	specs := []NodeSpec{{Name: "a", CPUMilli: 8000, MemMiB: 8192, GPUs: 2, Model: "T4"}}
	pods := []Pod{
		{Name: "p0", CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 1000, Creation: 0, Deletion: 1000},
		{Name: "h", CPUMilli: 2000, MemMiB: 1024, GPUs: 2, GPUMilli: 1000, Creation: 10, Deletion: 110},
		{Name: "s", CPUMilli: 500, MemMiB: 512, GPUs: 1, GPUMilli: 1000, Creation: 20, Deletion: 70},
		// z only keeps the replay going (it runs until the last arrival).
		{Name: "z", CPUMilli: 100, MemMiB: 64, Creation: 2000, Deletion: 2001},
	}
	for _, c := range []struct {
		mode string
		mean float64 // (0 + 990 + wait of s + 0) / 4
	}{
		{EstimatesNone, (990 + 1080) / 4.0},
		{EstimatesLongest, (990 + 1080) / 4.0},
		{EstimatesExact, 990 / 4.0},
	} {
		r, err := RunTimed(context.Background(), specs, pods, "fusiond", 1, 0.95, TimedOptions{Estimates: c.mode})
		if err != nil {
			t.Fatal(err)
		}
		if r.Placed != 4 || r.WaitMean != c.mean {
			t.Fatalf("%s: placed %d, mean wait %.1f s, want 4 and %.1f", c.mode, r.Placed, r.WaitMean, c.mean)
		}
		if r.Estimates == nil || r.Estimates.Mode != c.mode {
			t.Fatalf("%s: estimates %+v", c.mode, r.Estimates)
		}
	}
}

// TestEstimatesProfileError: two pods of one shape, the first living
// 100 s and ending before the second (200 s) starts, and two of other
// shapes. The second starts with the profile's estimate, 100 s: one of
// the four pods estimated from a profile, error 50 %, under-estimated.
// The exact oracle has no error.
func TestEstimatesProfileError(t *testing.T) {
	specs := []NodeSpec{{Name: "a", CPUMilli: 8000, MemMiB: 8192, GPUs: 2, Model: "T4"}}
	pods := []Pod{
		{Name: "q0", CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 500, QoS: "LS", Creation: 0, Deletion: 100},
		{Name: "q1", CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 500, QoS: "LS", Creation: 150, Deletion: 350},
		{Name: "other", CPUMilli: 2000, MemMiB: 1024, Creation: 160, Deletion: 260},
		{Name: "z", CPUMilli: 100, MemMiB: 64, Creation: 1000, Deletion: 1001},
	}
	r, err := RunTimed(context.Background(), specs, pods, "fusiond", 1, 0.95, TimedOptions{Estimates: EstimatesProfile})
	if err != nil {
		t.Fatal(err)
	}
	e := r.Estimates
	if e.Started != 4 || e.Estimated != 1 || e.MdAPEPct != 50 || e.UnderPct != 100 {
		t.Fatalf("profile estimates %+v, want 4 started, 1 from a profile, 50 %% error, under", e)
	}
	r, err = RunTimed(context.Background(), specs, pods, "fusiond", 1, 0.95, TimedOptions{Estimates: EstimatesExact})
	if err != nil {
		t.Fatal(err)
	}
	if e := r.Estimates; e.Estimated != 4 || e.EstimatedShare != 1 || e.MdAPEPct != 0 {
		t.Fatalf("exact estimates %+v", e)
	}
	var out bytes.Buffer
	if err := writeTable(&out, &Report{Trace: "hand", Timed: []TimedResult{r}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "backfill run-time estimates") || !strings.Contains(out.String(), "exact") {
		t.Fatalf("no estimates table:\n%s", out.String())
	}
}

func TestParseEstimates(t *testing.T) {
	if m, err := ParseEstimates("profile, longest,profile"); err != nil || len(m) != 2 || m[0] != EstimatesProfile || m[1] != EstimatesLongest {
		t.Fatalf("%v %v", m, err)
	}
	if m, err := ParseEstimates(""); err != nil || len(m) != 1 || m[0] != EstimatesNone {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := ParseEstimates("oracle"); !errors.Is(err, ErrBadOption) {
		t.Fatalf("bad mode: %v", err)
	}
	if _, err := RunTimed(context.Background(), []NodeSpec{{Name: "a", CPUMilli: 1000, MemMiB: 1024, GPUs: 1, Model: "T4"}}, nil, "fusiond", 1, 0.95, TimedOptions{Estimates: "oracle"}); !errors.Is(err, ErrBadOption) {
		t.Fatalf("RunTimed with a bad mode: %v", err)
	}
}

// podKey keys a pod by its request shape and QoS, not its unique name.
func TestPodKey(t *testing.T) {
	a := Pod{Name: "x", CPUMilli: 1000, MemMiB: 2048, GPUs: 1, GPUMilli: 500, GPUSpec: "V100M16|V100M32", QoS: "LS"}
	b := a
	b.Name = "y"
	if podKey(&a) != podKey(&b) {
		t.Fatal("two pods of one shape keyed apart")
	}
	b.GPUMilli = 1000
	if podKey(&a) == podKey(&b) {
		t.Fatal("two shapes keyed alike")
	}
	if k := podKey(&a); k.Name != "cpu=1000m,mem=2048Mi,gpu=1x500m,models=V100M16|V100M32" || k.Class != "LS" {
		t.Fatalf("key %+v", k)
	}
}

// The flag is checked before anything runs.
func TestEstimatesFlag(t *testing.T) {
	for args, want := range map[string]string{
		"--estimates profile":               "--estimates needs --timed",
		"--timed --estimates profile,guess": `--estimates "guess"`,
	} {
		cmd := NewCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(strings.Fields(args))
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("simulate %s: %v, want an error naming %q", args, err, want)
		}
	}
}
