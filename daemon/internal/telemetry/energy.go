package telemetry

import (
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

// recentEnergy is the window of the status's recent GPU energy.
const recentEnergy = time.Minute

// gpuEnergy integrates the GPUs' power, idle floor and delivered compute
// over samples: each sample's readings count from the previous sample
// added to it (the first only opens the window).
type gpuEnergy struct {
	since, last time.Time
	seconds     float64
	wattSec     float64 // ∫ power dt, all GPUs
	measuredSec float64 // the part of it from measured power
	floorSec    float64 // ∫ Σ idle W dt (known models)
	gpuSec      float64 // ∫ GPUs dt
	busySec     float64 // ∫ Σ SM utilisation dt
	tflopSec    float64 // ∫ Σ SM utilisation × FP16 TFLOPS dt
	unknown     int     // GPUs of an unknown model in the last sample
}

// add counts s's GPU readings from the previous sample added to s.
// model gives a GPU's table figures by its ID (nil: none known).
func (e *gpuEnergy) add(s *Sample, model func(id string) (sched.GPUSpec, bool)) {
	if e.last.IsZero() {
		e.since, e.last = s.At, s.At
		return
	}
	dt := s.At.Sub(e.last).Seconds()
	if dt <= 0 {
		return
	}
	e.last = s.At
	e.seconds += dt
	e.unknown = 0
	for _, g := range s.GPUs {
		util := min(max(g.SMUtil, 0), 100) / 100
		var spec sched.GPUSpec
		ok := false
		if model != nil {
			spec, ok = model(g.ID)
		}
		w := g.PowerW
		switch {
		case w > 0:
			e.measuredSec += w * dt
		case ok:
			w = spec.IdleW + (spec.TDPW-spec.IdleW)*util
		}
		e.wattSec += w * dt
		e.gpuSec += dt
		e.busySec += util * dt
		if ok {
			e.floorSec += spec.IdleW * dt
			e.tflopSec += util * spec.FP16 * dt
		} else {
			e.unknown++
		}
	}
}

// status is the window's summary; nil before any GPU time is counted.
func (e *gpuEnergy) status() *api.GPUEnergy {
	if e.gpuSec <= 0 {
		return nil
	}
	const h = 3600
	out := &api.GPUEnergy{
		Since: e.since, Window: api.Duration(time.Duration(e.seconds * float64(time.Second))),
		EnergyWh: e.wattSec / h, MeasuredWh: e.measuredSec / h, IdleFloorWh: e.floorSec / h,
		GPUHours: e.gpuSec / h, BusyGPUHours: e.busySec / h, A100EqHours: e.tflopSec / h / sched.ReferenceFP16(),
		UnknownGPUs: e.unknown,
	}
	if out.BusyGPUHours > 0 {
		out.WhPerBusyGPUHour = out.EnergyWh / out.BusyGPUHours
	}
	if out.A100EqHours > 0 {
		out.WhPerA100EqHour = out.EnergyWh / out.A100EqHours
		out.FloorWhPerA100EqHour = out.IdleFloorWh / out.A100EqHours
	}
	return out
}

// recentEnergyLocked integrates the ring's samples over its last d;
// b.mu must be held.
func (b *Bus) recentEnergyLocked(d time.Duration) *api.GPUEnergy {
	var e gpuEnergy
	b.window(d, func(s *Sample) { e.add(s, b.cfg.GPUModel) })
	return e.status()
}
