package elastic

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"
)

// Vertical sizing: a burstable job's CPU limit follows its usage
// (VPA-like) — a high percentile of its recent use times a headroom, never
// below its request — so a job that needs more than it asked for gets it
// and a runaway one is held near what it normally uses.

// ResizeParams tune Recommend.
type ResizeParams struct {
	// Percentile of the recent usage (0..100; default 95) and the headroom
	// it is multiplied by (default 1.3).
	Percentile, Headroom float64
	// MinSamples is how many readings a recommendation needs (default 30).
	MinSamples int
	// Change is the least relative change worth applying (default 0.1).
	Change float64
}

func (p *ResizeParams) defaults() {
	if p.Percentile == 0 {
		p.Percentile = 95
	}
	if p.Headroom == 0 {
		p.Headroom = 1.3
	}
	if p.MinSamples == 0 {
		p.MinSamples = 30
	}
	if p.Change == 0 {
		p.Change = 0.1
	}
}

// Recommend is a CPU limit (millicores) for a job of request millicores
// from its recent usage readings: max(request, percentile × headroom).
// ok is false with too few readings, or when the limit in force (current;
// 0: none) is within Change of it.
func Recommend(usage []float64, request, current int64, p ResizeParams) (limit int64, ok bool) {
	p.defaults()
	if len(usage) < p.MinSamples {
		return 0, false
	}
	s := slices.Clone(usage)
	slices.Sort(s)
	i := int(math.Ceil(p.Percentile/100*float64(len(s)))) - 1
	pct := s[min(max(i, 0), len(s)-1)]
	limit = max(request, int64(math.Ceil(pct*p.Headroom)))
	if current > 0 && math.Abs(float64(limit-current)) < p.Change*float64(current) {
		return 0, false
	}
	return limit, true
}

// Resizable is a running burstable job.
type Resizable struct {
	ID string
	// Request is its CPU request (millicores); Usage its recent readings.
	Request int64
	Usage   []float64
}

// ResizeHost is the resizer's view of the daemon.
type ResizeHost interface {
	Burstable() []Resizable
	// SetCPULimit sets a job's CPU limit (millicores) and says why.
	SetCPULimit(jobID string, milli int64, reason string) error
}

// Resizer applies Recommend to every burstable job every Period.
type Resizer struct {
	host    ResizeHost
	period  time.Duration
	p       ResizeParams
	log     *slog.Logger
	current map[string]int64
}

// NewResizer builds a resizer.
func NewResizer(host ResizeHost, period time.Duration, p ResizeParams, log *slog.Logger) (*Resizer, error) {
	p.defaults()
	switch {
	case period < 100*time.Millisecond:
		return nil, fmt.Errorf("resize period %v: at least 100ms", period)
	case p.Percentile <= 0 || p.Percentile > 100:
		return nil, fmt.Errorf("resize percentile %g: in (0, 100]", p.Percentile)
	case p.Headroom < 1:
		return nil, fmt.Errorf("resize headroom %g: at least 1", p.Headroom)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Resizer{host: host, period: period, p: p, log: log, current: map[string]int64{}}, nil
}

// Run resizes every period until ctx ends.
func (r *Resizer) Run(ctx context.Context) {
	t := time.NewTicker(r.period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Step()
		}
	}
}

// Step resizes every burstable job once.
func (r *Resizer) Step() {
	seen := map[string]bool{}
	for _, j := range r.host.Burstable() {
		seen[j.ID] = true
		limit, ok := Recommend(j.Usage, j.Request, r.current[j.ID], r.p)
		if !ok {
			continue
		}
		reason := fmt.Sprintf("CPU limit %dm → %dm: p%g of %d readings × %g, never below the %dm request",
			r.current[j.ID], limit, r.p.Percentile, len(j.Usage), r.p.Headroom, j.Request)
		if err := r.host.SetCPULimit(j.ID, limit, reason); err != nil {
			r.log.Warn("resizing a burstable job", "job", j.ID, "err", err)
			continue
		}
		r.current[j.ID] = limit
	}
	for id := range r.current {
		if !seen[id] {
			delete(r.current, id)
		}
	}
}
