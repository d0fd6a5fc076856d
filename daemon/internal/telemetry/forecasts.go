package telemetry

import (
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/forecast"
)

// Horizon is how far ahead the host series are forecast: 15 minutes,
// the horizon the forecasters are evaluated at (docs/load.md).
const Horizon = 15 * time.Minute

// minPeriod is the shortest season (in minutes) the host forecasts look
// for.
const minPeriod = 10

// forecasts are the host series' latest forecasts, refitted on the
// per-minute history each time a minute ends.
type forecasts struct {
	mu     sync.Mutex
	latest []api.SeriesForecast
}

func (f *forecasts) status() []api.SeriesForecast {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.SeriesForecast(nil), f.latest...)
}

// hostSeries are the forecast series of the per-minute history.
var hostSeries = []struct {
	name string
	of   func(Point) float64
	// present says whether the host has the series at all.
	present func(Point) bool
}{
	{"cpu_busy", func(p Point) float64 { return p.CPUBusy }, func(Point) bool { return true }},
	{"memory_used_bytes", func(p Point) float64 { return p.MemUsed }, func(Point) bool { return true }},
	{"gpu_sm_util_pct", func(p Point) float64 { return p.GPUUtil }, func(p Point) bool { return p.GPUs > 0 }},
	{"cpu_package_w", func(p Point) float64 { return p.PackageW }, func(p Point) bool { return p.Packages > 0 }},
}

// refit forecasts every host series Horizon ahead from the history (one
// point a minute), the model chosen per series by back-test.
func (b *Bus) refit() {
	h := b.History()
	if len(h) == 0 {
		return
	}
	steps := int(Horizon / time.Minute)
	var out []api.SeriesForecast
	for _, s := range hostSeries {
		if !s.present(h[len(h)-1]) {
			continue
		}
		y := make([]float64, len(h))
		for i, p := range h {
			y[i] = s.of(p)
		}
		m, ok := forecast.Fit(y, steps, minPeriod)
		if !ok {
			continue
		}
		out = append(out, api.SeriesForecast{Series: s.name, Model: m.Method.String(), Horizon: api.Duration(Horizon),
			Now: y[len(y)-1], Value: m.Value, SMAPE: m.Errors.SMAPE, Points: len(y)})
	}
	b.fc.mu.Lock()
	b.fc.latest = out
	b.fc.mu.Unlock()
}

// Forecast is series' latest forecast (see the names fusionctl status
// lists: cpu_busy, memory_used_bytes, gpu_sm_util_pct, cpu_package_w).
func (b *Bus) Forecast(series string) (api.SeriesForecast, bool) {
	for _, f := range b.fc.status() {
		if f.Series == series {
			return f, true
		}
	}
	return api.SeriesForecast{}, false
}
