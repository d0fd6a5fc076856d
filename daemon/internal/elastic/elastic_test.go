package elastic

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// fakeHost is one elastic group whose total load is a function of time.
type fakeHost struct {
	now    *time.Time
	g      Group
	load   func(t time.Time) float64
	events []scaleEvent
}

type scaleEvent struct {
	at       time.Time
	from, to int
	load     float64
}

func (h *fakeHost) Groups() []Group            { return []Group{h.g} }
func (h *fakeHost) Load(Group) (float64, bool) { return h.load(*h.now), true }
func (h *fakeHost) Scale(g Group, n int, _ string) error {
	h.events = append(h.events, scaleEvent{at: *h.now, from: len(g.Members), to: n, load: h.load(*h.now)})
	h.g.Members = make([]string, n)
	return nil
}

const step = 10 * time.Second

func run(t *testing.T, h *fakeHost, d time.Duration, cfg Config, each func(n int, load float64)) {
	t.Helper()
	start := *h.now
	cfg.Now = func() time.Time { return *h.now }
	cfg.Step = step
	c, err := New(cfg, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	for *h.now = start; h.now.Sub(start) < d; *h.now = h.now.Add(step) {
		c.Step()
		if each != nil {
			each(len(h.g.Members), h.load(*h.now))
		}
	}
}

func group(n int) Group {
	return Group{ID: "1", Members: make([]string, n),
		Replicas: api.Replicas{Min: 1, Max: 10, Target: api.ScaleTarget{Metric: api.MetricCPU, Value: 100}}}
}

// A steady load, then a ramp of 10 a minute: the controller adds each
// replica before the load reaches what the replicas it has can carry,
// so the group is never short of capacity during the ramp.
func TestScaleUpBeforePredictedRamp(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	rampAt := t0.Add(20 * time.Minute)
	h := &fakeHost{now: &now, g: group(1), load: func(t time.Time) float64 {
		if t.Before(rampAt) {
			return 80
		}
		return min(80+10*t.Sub(rampAt).Minutes(), 650)
	}}
	short := 0
	run(t, h, 2*time.Hour, Config{Lead: time.Minute}, func(n int, load float64) {
		if float64(n)*100 < load {
			short++
		}
	})
	if short > 0 {
		t.Errorf("%d steps with the load above the replicas' capacity; events %+v", short, h.events)
	}
	ahead := 0
	for _, e := range h.events {
		if e.to > e.from && e.load <= float64(e.from)*100 {
			ahead++ // scaled while the replicas it had still carried the load
		}
	}
	if len(h.events) < 6 || ahead < len(h.events)-1 {
		t.Errorf("%d of %d scale-ups came before the load needed them, want all (but the first); events %+v", ahead, len(h.events), h.events)
	}
	if got := len(h.g.Members); got != 7 {
		t.Errorf("%d replicas at a load of 650 per 100, want 7", got)
	}
}

// A level load with ±12% noise settles at the size that carries its
// peaks and stays there: no replica is added and removed again.
func TestNoFlappingUnderNoise(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	r := rand.New(rand.NewPCG(3, 4))
	h := &fakeHost{now: &now, g: group(1), load: func(time.Time) float64 { return 250 + (r.Float64()*2-1)*30 }}
	run(t, h, 3*time.Hour, Config{Lead: time.Minute}, nil)
	if len(h.events) == 0 || len(h.events) > 2 {
		t.Fatalf("%d scale events under noise, want 1 or 2: %+v", len(h.events), h.events)
	}
	for _, e := range h.events {
		if e.to < e.from {
			t.Errorf("scaled down under a level load: %+v", h.events)
		}
	}
	if n := len(h.g.Members); n < 3 || n > 4 {
		t.Errorf("%d replicas for 250 ± 30 per 100", n)
	}
}

// When the load falls, replicas go only after the cool-down, and only as
// far as the hysteresis allows: 100 per 100 at 90% is 2 replicas.
func TestScaleDownAfterCooldown(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	drop := t0.Add(30 * time.Minute)
	h := &fakeHost{now: &now, g: group(5), load: func(t time.Time) float64 {
		if t.Before(drop) {
			return 450
		}
		return 100
	}}
	run(t, h, 2*time.Hour, Config{Lead: time.Minute, Cooldown: 5 * time.Minute}, nil)
	if len(h.events) != 1 {
		t.Fatalf("events %+v, want one scale-down", h.events)
	}
	e := h.events[0]
	if e.to != 2 || e.at.Sub(drop) < 5*time.Minute {
		t.Errorf("scaled %d→%d %v after the drop, want 5→2 no sooner than the 5 m cool-down", e.from, e.to, e.at.Sub(drop))
	}
}

func TestDecideClampsAndWaits(t *testing.T) {
	r := api.Replicas{Min: 2, Max: 3, Target: api.ScaleTarget{Metric: api.MetricGPUUtil, Value: 50}}
	p := Params{Lead: 6, CooldownSteps: 30, Cooldown: 5 * time.Minute, Tolerance: 0.1}
	if d := Decide(Input{Replicas: r, Current: 0}, p); d.Want != 2 {
		t.Errorf("no members: want %d, want min 2", d.Want)
	}
	if d := Decide(Input{Replicas: r, Current: 2, Load: []float64{1000}}, p); d.Want != 3 {
		t.Errorf("load far over: want %d, want max 3", d.Want)
	}
	if d := Decide(Input{Replicas: r, Current: 3, Load: []float64{10}, SinceChange: time.Minute}, p); d.Want != 3 {
		t.Errorf("inside the cool-down: want %d, want 3 kept", d.Want)
	}
	if d := Decide(Input{Replicas: r, Current: 3, Load: []float64{10}, SinceChange: time.Hour}, p); d.Want != 2 || d.Reason == "" {
		t.Errorf("after the cool-down: %+v, want min 2 with a reason", d)
	}
	if d := Decide(Input{Replicas: r, Current: 2}, p); d.Want != 2 {
		t.Errorf("nothing measured: want %d, want 2 kept", d.Want)
	}
}

func TestConfigValidated(t *testing.T) {
	for _, c := range []Config{{Step: time.Millisecond}, {Tolerance: 0.7}, {Lead: -time.Second}, {History: 3}} {
		if _, err := New(c, &fakeHost{}, nil); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}
