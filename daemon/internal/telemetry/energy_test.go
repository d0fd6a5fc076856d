package telemetry

import (
	"math"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/sched"
)

// TestGPUEnergy samples three GPUs for six minutes, one sample a second:
// an H100 at 50 % SM drawing a measured 400 W, a T4 at 100 % whose power
// the driver does not report (the model's 70 W TDP at full use), and a
// GPU of a model the table does not know at 20 % drawing 100 W. The
// first sample only primes the bus and the second opens the window, so
// 360 s are counted.
func TestGPUEnergy(t *testing.T) {
	h100, _ := sched.LookupGPU("NVIDIA H100 80GB HBM3")
	t4, _ := sched.LookupGPU("Tesla T4")
	models := map[string]sched.GPUSpec{"GPU-h100": h100, "GPU-t4": t4}
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(1000, 0)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Ring: 600,
		GPUs: func() []GPU {
			return []GPU{{ID: "GPU-h100", SMUtil: 50, PowerW: 400}, {ID: "GPU-t4", SMUtil: 100}, {ID: "GPU-x", SMUtil: 20, PowerW: 100}}
		},
		GPUModel: func(id string) (sched.GPUSpec, bool) { s, ok := models[id]; return s, ok },
	})
	if st := b.Status(); st.GPUEnergy != nil || st.GPUEnergyRecent != nil {
		t.Fatalf("GPU energy before any sample: %+v", st.GPUEnergy)
	}
	for range 362 {
		clk.add(time.Second)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	st := b.Status()
	e := st.GPUEnergy
	if e == nil {
		t.Fatal("no GPU energy in the status")
	}
	hours := 360.0 / 3600
	watts := 400 + t4.TDPW + 100
	a100 := (0.5*h100.FP16 + t4.FP16) * hours / 312
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"window s", time.Duration(e.Window).Seconds(), 360},
		{"energy Wh", e.EnergyWh, watts * hours},
		{"measured Wh", e.MeasuredWh, 500 * hours},
		{"idle floor Wh", e.IdleFloorWh, (h100.IdleW + t4.IdleW) * hours},
		{"GPU-hours", e.GPUHours, 3 * hours},
		{"busy GPU-hours", e.BusyGPUHours, 1.7 * hours},
		{"A100-eq hours", e.A100EqHours, a100},
		{"Wh/A100-eq-hour", e.WhPerA100EqHour, watts * hours / a100},
		{"floor Wh/A100-eq-hour", e.FloorWhPerA100EqHour, (h100.IdleW + t4.IdleW) * hours / a100},
		{"Wh/busy GPU-hour", e.WhPerBusyGPUHour, watts / 1.7},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if e.UnknownGPUs != 1 || !e.Since.Equal(time.Unix(1002, 0)) {
		t.Errorf("unknown GPUs %d, since %v", e.UnknownGPUs, e.Since)
	}
	// The last minute: the ring's samples after newest − 60 s, the first
	// of them opening the window.
	r := st.GPUEnergyRecent
	if r == nil || time.Duration(r.Window) != 59*time.Second || !near(r.EnergyWh, watts*59/3600) || !near(r.WhPerA100EqHour, e.WhPerA100EqHour) {
		t.Errorf("recent %+v", r)
	}
}

// A bus whose GPUs do no work delivers nothing: no energy per unit of
// work, not a division by zero.
func TestGPUEnergyIdle(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(0, 0)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, GPUs: func() []GPU { return []GPU{{ID: "GPU-a", PowerW: 60}} }})
	for range 5 {
		clk.add(100 * time.Millisecond)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	e := b.Status().GPUEnergy
	if e == nil || e.A100EqHours != 0 || e.WhPerA100EqHour != 0 || e.WhPerBusyGPUHour != 0 || e.UnknownGPUs != 1 || !(e.EnergyWh > 0) || e.IdleFloorWh != 0 {
		t.Errorf("idle GPU energy %+v", e)
	}
}
