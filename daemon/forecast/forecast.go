// Package forecast predicts a time series h steps ahead: short-term
// models (EWMA, Holt's linear trend, damped), seasonal ones (additive
// Holt-Winters, and a periodicity model over a period found by FFT, as
// Crane's DSP predictor does), the naive and seasonal-naive baselines, and
// the back-test that picks a model per series by its error on the
// series' own past. It is pure (no I/O, no clock): the daemon runs it on
// the telemetry bus's history and the elastic controller's series, the
// CLI on a trace.
package forecast

import (
	"fmt"
	"math"
)

// Kind is a forecasting model.
type Kind string

// Kinds.
const (
	Naive         Kind = "naive"
	SeasonalNaive Kind = "seasonal-naive"
	EWMA          Kind = "ewma"
	Holt          Kind = "holt"
	HoltWinters   Kind = "holt-winters"
	Periodic      Kind = "periodic"
)

// Method is a model with its parameters.
type Method struct {
	Kind Kind
	// Alpha (level), Beta (trend) and Gamma (season) are the smoothing
	// weights in (0, 1]; Phi damps Holt's trend (1: not damped).
	Alpha, Beta, Gamma, Phi float64
	// Period is the season length in steps (seasonal-naive, Holt-Winters,
	// periodic); Cycles how many past cycles the periodic model averages.
	Period, Cycles int
}

func (m Method) String() string {
	switch m.Kind {
	case Naive:
		return "naive"
	case SeasonalNaive:
		return fmt.Sprintf("seasonal-naive(m=%d)", m.Period)
	case EWMA:
		return fmt.Sprintf("ewma(α=%g)", m.Alpha)
	case Holt:
		return fmt.Sprintf("holt(α=%g β=%g φ=%g)", m.Alpha, m.Beta, m.Phi)
	case HoltWinters:
		return fmt.Sprintf("holt-winters(α=%g β=%g γ=%g m=%d)", m.Alpha, m.Beta, m.Gamma, m.Period)
	case Periodic:
		return fmt.Sprintf("periodic(m=%d k=%d)", m.Period, m.Cycles)
	}
	return string(m.Kind)
}

// Warmup is how many points the method needs before its first forecast.
func (m Method) Warmup() int {
	switch m.Kind {
	case SeasonalNaive:
		return m.Period
	case HoltWinters:
		return 2 * m.Period
	case Periodic:
		return m.Period * max(m.Cycles, 1)
	case Holt:
		return 2
	}
	return 1
}

// Run returns p with p[t] the forecast of y[t+h] made from y[0..t]; NaN
// where the method is still warming up. It is one pass over y.
func (m Method) Run(y []float64, h int) []float64 {
	p := make([]float64, len(y))
	for i := range p {
		p[i] = math.NaN()
	}
	if h < 1 || len(y) == 0 {
		return p
	}
	switch m.Kind {
	case Naive:
		copy(p, y)
	case SeasonalNaive, Periodic:
		k0 := (h + m.Period - 1) / m.Period // the first cycle back that is known at t
		cycles := max(m.Cycles, 1)
		if m.Kind == SeasonalNaive {
			cycles = 1
		}
		for t := range y {
			sum, n := 0.0, 0
			for k := k0; k < k0+cycles; k++ {
				if i := t + h - k*m.Period; i >= 0 {
					sum += y[i]
					n++
				}
			}
			if n == cycles {
				p[t] = sum / float64(n)
			}
		}
	case EWMA:
		l := y[0]
		for t, v := range y {
			l += m.Alpha * (v - l)
			p[t] = l
		}
	case Holt:
		l, b := y[0], 0.0
		damp := dampSum(m.Phi, h)
		for t := 1; t < len(y); t++ {
			if t == 1 {
				l, b = y[1], y[1]-y[0]
			} else {
				prev := l
				l = m.Alpha*y[t] + (1-m.Alpha)*(l+m.Phi*b)
				b = m.Beta*(l-prev) + (1-m.Beta)*m.Phi*b
			}
			p[t] = l + damp*b
		}
	case HoltWinters:
		hw(y, h, m, p)
	}
	return p
}

// dampSum is φ + φ² + … + φ^h (h when φ = 1).
func dampSum(phi float64, h int) float64 {
	if phi == 1 {
		return float64(h)
	}
	s, f := 0.0, 1.0
	for range h {
		f *= phi
		s += f
	}
	return s
}

// hw is additive Holt-Winters, initialised from the first two seasons.
func hw(y []float64, h int, m Method, p []float64) {
	P := m.Period
	if P < 2 || len(y) < 2*P {
		return
	}
	var m1, m2 float64
	for i := range P {
		m1 += y[i]
		m2 += y[P+i]
	}
	m1, m2 = m1/float64(P), m2/float64(P)
	l, b := m2, (m2-m1)/float64(P)
	s := make([]float64, P)
	for i := range P {
		s[i] = (y[i] - m1 + y[P+i] - m2) / 2
	}
	for t := 2 * P; t < len(y); t++ {
		si := t % P
		prev := l
		l = m.Alpha*(y[t]-s[si]) + (1-m.Alpha)*(l+b)
		b = m.Beta*(l-prev) + (1-m.Beta)*b
		s[si] = m.Gamma*(y[t]-l) + (1-m.Gamma)*s[si]
		p[t] = l + float64(h)*b + s[(t+h)%P]
	}
}

// Forecast is the forecast h steps after the end of y (NaN when y is too
// short for the method).
func (m Method) Forecast(y []float64, h int) float64 {
	if len(y) == 0 {
		return math.NaN()
	}
	return m.Run(y, h)[len(y)-1]
}
