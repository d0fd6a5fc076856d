// Package elastic is the controller of elastic jobs: service and
// inference jobs with replicas {min, max, target}. Every step it reads
// each group's load (the target metric summed over its running
// replicas), forecasts it a lead time ahead (daemon/forecast, the model
// chosen per group by back-test) and sizes the group so that the
// forecast load fits under the target per replica: it scales up as soon
// as the forecast says so — before the load arrives — and down only when
// even the recent peak and the forecast fit in fewer replicas with a
// margin (hysteresis) and the last change is a cool-down old. Applying a
// change (submitting or cancelling replica jobs) is the Host's; the
// decision is the pure Decide.
package elastic

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/forecast"
)

// Group is one elastic job and its replicas.
type Group struct {
	// ID is the elastic job's (the first replica's).
	ID       string
	Replicas api.Replicas
	// Members are the live replica jobs, the elastic job first.
	Members []string
}

// Host is the controller's view of the job manager and the telemetry.
type Host interface {
	// Groups are the live elastic jobs.
	Groups() []Group
	// Load is the group's current load in the target's units, summed
	// over its running members (a member that is not running yet adds
	// nothing); ok is false when nothing was measured.
	Load(g Group) (float64, bool)
	// Scale brings the group to n members: it submits or cancels replica
	// jobs.
	Scale(g Group, n int, reason string) error
}

// Config tunes the controller.
type Config struct {
	// Step is how often it decides (default 10s).
	Step time.Duration
	// Lead is how far ahead it forecasts: the time a new replica needs to
	// start serving (default 1m).
	Lead time.Duration
	// Cooldown is the least time between a change and a scale-down
	// (default 5m).
	Cooldown time.Duration
	// Tolerance is the hysteresis band: a scale-down happens only when the
	// load would fill fewer replicas to at most (1 − Tolerance) of the
	// target (default 0.1).
	Tolerance float64
	// History is how many steps of load each group keeps (default 360:
	// an hour at 10 s).
	History int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.Step == 0 {
		c.Step = 10 * time.Second
	}
	if c.Lead == 0 {
		c.Lead = time.Minute
	}
	if c.Cooldown == 0 {
		c.Cooldown = 5 * time.Minute
	}
	if c.Tolerance == 0 {
		c.Tolerance = 0.1
	}
	if c.History == 0 {
		c.History = 360
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks a configuration after its defaults.
func (c Config) validate() error {
	switch {
	case c.Step < 100*time.Millisecond:
		return fmt.Errorf("elastic step %v: at least 100ms", c.Step)
	case c.Lead < 0:
		return fmt.Errorf("elastic lead %v: must not be negative", c.Lead)
	case c.Cooldown < 0:
		return fmt.Errorf("elastic cooldown %v: must not be negative", c.Cooldown)
	case c.Tolerance <= 0 || c.Tolerance >= 0.5:
		return fmt.Errorf("elastic tolerance %g: between 0 and 0.5 (exclusive)", c.Tolerance)
	case c.History < 16:
		return fmt.Errorf("elastic history %d: at least 16 steps", c.History)
	}
	return nil
}

// Controller sizes the elastic groups.
type Controller struct {
	cfg    Config
	host   Host
	log    *slog.Logger
	groups map[string]*state
}

// state is one group's load history and last change.
type state struct {
	load       []float64
	lastChange time.Time
}

// New builds a controller.
func New(cfg Config, host Host, log *slog.Logger) (*Controller, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg, host: host, log: log, groups: map[string]*state{}}, nil
}

// Run steps every Step until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Step)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Step()
		}
	}
}

// Step reads every group's load, decides and applies its size.
func (c *Controller) Step() {
	now := c.cfg.Now()
	seen := map[string]bool{}
	for _, g := range c.host.Groups() {
		seen[g.ID] = true
		st := c.groups[g.ID]
		if st == nil {
			// A new group's first change is not held back by the cool-down.
			st = &state{lastChange: now.Add(-c.cfg.Cooldown)}
			c.groups[g.ID] = st
		}
		if l, ok := c.host.Load(g); ok {
			st.load = append(st.load, l)
			if len(st.load) > c.cfg.History {
				st.load = st.load[len(st.load)-c.cfg.History:]
			}
		}
		d := Decide(Input{Replicas: g.Replicas, Current: len(g.Members), Load: st.load,
			SinceChange: now.Sub(st.lastChange)}, c.params())
		if d.Want == len(g.Members) {
			continue
		}
		if err := c.host.Scale(g, d.Want, d.Reason); err != nil {
			c.log.Warn("scaling an elastic job", "job", g.ID, "from", len(g.Members), "to", d.Want, "err", err)
			continue
		}
		st.lastChange = now
		c.log.Info("elastic job scaled", "job", g.ID, "from", len(g.Members), "to", d.Want, "reason", d.Reason)
	}
	for id := range c.groups {
		if !seen[id] {
			delete(c.groups, id)
		}
	}
}

func (c *Controller) params() Params {
	return Params{Lead: int(math.Ceil(float64(c.cfg.Lead) / float64(c.cfg.Step))),
		CooldownSteps: int(c.cfg.Cooldown / c.cfg.Step), Cooldown: c.cfg.Cooldown, Tolerance: c.cfg.Tolerance}
}

// Params are Decide's tuning.
type Params struct {
	// Lead is the forecast horizon in steps.
	Lead int
	// CooldownSteps is the recent window (in steps) whose peak a
	// scale-down must fit; Cooldown the least time since the last change.
	CooldownSteps int
	Cooldown      time.Duration
	Tolerance     float64
}

// Input is one group's state at a step.
type Input struct {
	Replicas api.Replicas
	// Current is the group's live members now.
	Current int
	// Load is the group's load per step, oldest first (the last is now).
	Load        []float64
	SinceChange time.Duration
}

// Decision is the size a group should have and why.
type Decision struct {
	Want   int
	Reason string
	// Forecast is the load forecast Lead steps ahead (the current load
	// when the history is too short to forecast), Model what forecast it.
	Forecast float64
	Model    string
}

// Decide sizes one group. Below min or above max it clamps at once.
// Otherwise it scales up to fit max(now, forecast) at the target per
// replica, and down, after the cool-down, to fit max(recent peak,
// forecast) at (1 − tolerance) of the target.
func Decide(in Input, p Params) Decision {
	r := in.Replicas
	d := Decision{Want: in.Current}
	clamp := func(n int) int { return min(max(n, r.Min), r.Max) }
	if in.Current < r.Min || in.Current > r.Max {
		d.Want = clamp(in.Current)
		d.Reason = fmt.Sprintf("%d replicas, outside [%d, %d]", in.Current, r.Min, r.Max)
		return d
	}
	if len(in.Load) == 0 {
		return d
	}
	now := in.Load[len(in.Load)-1]
	d.Forecast, d.Model = now, "current load"
	if m, ok := forecast.Fit(in.Load, max(p.Lead, 1), 4); ok && !math.IsNaN(m.Value) {
		d.Forecast, d.Model = max(m.Value, 0), m.Method.String()
	}
	target := r.Target.Value
	need := max(now, d.Forecast)
	if up := clamp(int(math.Ceil(need/target - 1e-9))); up > in.Current {
		d.Want = up
		d.Reason = fmt.Sprintf("%s load %.3g now, %.3g forecast (%s) over %d replicas at %.3g each", r.Target.Metric, now, d.Forecast, d.Model, in.Current, target)
		return d
	}
	if in.SinceChange < p.Cooldown {
		return d
	}
	peak := d.Forecast
	for _, v := range in.Load[max(0, len(in.Load)-p.CooldownSteps-1):] {
		peak = max(peak, v)
	}
	down := clamp(int(math.Ceil(peak / (target * (1 - p.Tolerance)))))
	if down < in.Current {
		d.Want = down
		d.Reason = fmt.Sprintf("%s load peaked at %.3g over the cool-down, %.3g forecast (%s): fits %d replicas at %.0f%% of %.3g", r.Target.Metric, peak, d.Forecast, d.Model, down, 100*(1-p.Tolerance), target)
	}
	return d
}
