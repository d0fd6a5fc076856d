package sim

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
)

// TestEnergyHandTrace replays a trace whose placement is forced (CPU and
// the GPU model leave each pod one node) and checks the energy
// accounting against figures worked out by hand.
//
// Node a: 2 × T4 (table: 10 W idle, 70 W TDP), 8 cores; node b: 1 × "X"
// (--gpu-power X=20:120), 1 core. Pods: p0 1 GPU on a from 0 to 10 000 s;
// p1 half a GPU on a from 1 000 to 4 600 s; p2 1 GPU of model X on b at
// 8 200 s. Window: the median to the last creation, [1 000, 8 200] s, 2 h.
//
//	1st hour: a0 70 W + a1 (10 + 60·0.5) 40 W + b 20 W = 130 W; idle: b
//	2nd hour: a0 70 W + a1 10 W + b 20 W          = 100 W; idle: a1, b
//
// Energy 230 Wh; GPU-hours served 1.5 + 1 = 2.5, so 92 Wh per GPU-hour;
// idle GPU-hours 1 + 2 = 3, of which 2 on a node with nothing allocated
// (b); the idle GPUs drew 20 + 30 = 50 Wh, 40 of them on b, so with idle
// nodes powered off (230 − 40) / 2.5 = 76 Wh per GPU-hour; mean draw 115 W.
//
// The idle floor is every GPU's idle draw over the window, (10 + 10 + 20)
// W × 2 h = 80 Wh, so the work added 150 Wh (32 + 60 Wh per GPU-hour).
// Delivered compute (X given 100 TFLOPS, but p2 arrives at the window's
// end): a0 65 TFLOPS × 2 h + a1 0.5 × 65 × 1 h = 162.5 TFLOP-hours,
// 162.5 / 312 A100-eq GPU-hours, so 230 × 312 / 162.5 = 441.6 Wh per
// A100-eq GPU-hour (80 × 312 / 162.5 = 153.6 of it the floor) and
// 230 / 0.1625 Wh per FP16 PFLOP-hour.
func TestEnergyHandTrace(t *testing.T) {
	// b first, so a's GPUs are found by the assignment's node index.
	specs := []NodeSpec{
		{Name: "b", CPUMilli: 1000, MemMiB: 8192, GPUs: 1, Model: "X"},
		{Name: "a", CPUMilli: 8000, MemMiB: 8192, GPUs: 2, Model: "T4"},
	}
	pods := []Pod{
		{Name: "p0", CPUMilli: 4000, MemMiB: 1024, GPUs: 1, GPUMilli: 1000, Creation: 0, Deletion: 10000},
		{Name: "p1", CPUMilli: 4000, MemMiB: 1024, GPUs: 1, GPUMilli: 500, Creation: 1000, Deletion: 4600},
		{Name: "p2", CPUMilli: 500, MemMiB: 1024, GPUs: 1, GPUMilli: 1000, GPUSpec: "X", Creation: 8200, Deletion: 20000},
	}
	power := map[string][2]float64{"X": {20, 120}}
	tflops := map[string]float64{"X": 100}
	for _, pol := range []string{"fusiond", "spread", "fgd"} {
		r, err := RunTimed(context.Background(), specs, pods, pol, 1, 0.95, TimedOptions{Power: power, TFLOPS: tflops})
		if err != nil {
			t.Fatal(err)
		}
		if r.Placed != 3 || r.WindowS != 7200 {
			t.Fatalf("%s: placed %d, window %d s", pol, r.Placed, r.WindowS)
		}
		e := r.Energy
		for _, c := range []struct {
			name      string
			got, want float64
		}{
			{"GPU-hours", r.GPUHours, 2.5},
			{"kWh", e.KWh, 0.230},
			{"Wh/GPU-hour", e.WhPerGPUHour, 92},
			{"idle GPU-hours", e.IdleGPUHours, 3},
			{"idle-node GPU-hours", e.IdleNodeGPUHours, 2},
			{"idle kWh", e.IdleKWh, 0.050},
			{"idle-node kWh", e.IdleNodeKWh, 0.040},
			{"Wh/GPU-hour, idle nodes off", e.WhPerGPUHourOff, 76},
			{"mean kW", e.MeanKW, 0.115},
			{"idle floor kWh", e.IdleFloorKWh, 0.080},
			{"dynamic kWh", e.DynamicKWh, 0.150},
			{"floor Wh/GPU-hour", e.FloorWhPerGPUHour, 32},
			{"dynamic Wh/GPU-hour", e.DynamicWhPerGPUHour, 60},
			{"FP16 PFLOP-hours", e.PFLOPHours, 0.1625},
			{"A100-eq GPU-hours", e.A100EqHours, 162.5 / 312},
			{"Wh/A100-eq-hour", e.WhPerA100EqHour, 441.6},
			{"floor Wh/A100-eq-hour", e.FloorWhPerA100EqHour, 153.6},
			{"Wh/PFLOP-hour", e.WhPerPFLOPHour, 230 / 0.1625},
			{"T4 GPU-hours", e.Models[0].GPUHours, 2.5},
			{"T4 dynamic kWh", e.Models[0].DynamicKWh, 0.150},
			{"X GPU-hours", e.Models[1].GPUHours, 0},
		} {
			if math.Abs(c.got-c.want) > 1e-9 {
				t.Errorf("%s: %s = %v, want %v", pol, c.name, c.got, c.want)
			}
		}
		if len(e.Power) != 2 || e.Power[0].Model != "T4" || e.Power[0].IdleW != 10 || e.Power[0].TDPW != 70 || e.Power[1].Source != "--gpu-power" ||
			e.Power[0].TFLOPS != 65 || e.Power[1].TFLOPS != 100 || e.Power[1].TFLOPSSource != "--gpu-tflops" {
			t.Errorf("%s: power model %+v", pol, e.Power)
		}
	}
}

func TestPowerModelInputs(t *testing.T) {
	for _, s := range []string{"G2", "G2=", "G2=35", "G2=x:300", "G2=300:35", "=1:2", "G2=-1:5"} {
		if _, err := ParsePowerOverrides(s); !errors.Is(err, ErrBadOption) {
			t.Errorf("ParsePowerOverrides(%q) = %v, want ErrBadOption", s, err)
		}
	}
	m, err := ParsePowerOverrides("G2=35:300, G3=50:400")
	if err != nil || m["G2"] != [2]float64{35, 300} || m["G3"] != [2]float64{50, 400} {
		t.Fatalf("ParsePowerOverrides = %v, %v", m, err)
	}
	mystery := []NodeSpec{{Name: "n", GPUs: 1, Model: "Mystery9"}}
	if _, err := PowerModel(mystery, nil, nil); !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), "--gpu-power Mystery9=") {
		t.Fatalf("unknown model: %v", err)
	}
	// Watts alone do not say what work the model does.
	if _, err := PowerModel(mystery, map[string][2]float64{"Mystery9": {5, 50}}, nil); !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), "--gpu-tflops Mystery9=") {
		t.Fatalf("unknown model's throughput: %v", err)
	}
	for _, s := range []string{"G2", "G2=", "G2=x", "G2=0", "G2=-5", "=312", "G2=1e9"} {
		if _, err := ParseTFLOPS(s); !errors.Is(err, ErrBadOption) {
			t.Errorf("ParseTFLOPS(%q) = %v, want ErrBadOption", s, err)
		}
	}
	f, err := ParseTFLOPS("G2=312, G3=125.5")
	if err != nil || f["G2"] != 312 || f["G3"] != 125.5 {
		t.Fatalf("ParseTFLOPS = %v, %v", f, err)
	}
}

// TestPowerModelCoversOpenB checks that every GPU model of the openb node
// list has figures, and which: the documented mapping (docs/load.md
// "Energy").
func TestPowerModelCoversOpenB(t *testing.T) {
	specs, _ := loadTrace(t, "openb_pod_list_default")
	power, err := PowerModel(specs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A10": "A10", "G2": "A100 PCIe", "G3": "A100 PCIe", "P100": "P100 PCIe", "T4": "T4", "V100M16": "V100 SXM2", "V100M32": "V100 SXM2"}
	gpus := 0
	for _, p := range power {
		gpus += p.GPUs
		if w, ok := want[p.Model]; !ok || !strings.HasPrefix(p.Source, "table: "+w) || p.IdleW <= 0 || p.TDPW <= p.IdleW || p.TFLOPSSource != p.Source || p.TFLOPS <= 0 {
			t.Errorf("%s: %+v, want table %q", p.Model, p, w)
		}
	}
	if tf := map[string]float64{}; true {
		for _, p := range power {
			tf[p.Model] = p.TFLOPS
		}
		// The datasheets' dense FP16 figures; G2/G3 as the A100 they are
		// counted as.
		if tf["T4"] != 65 || tf["G2"] != 312 || tf["V100M32"] != 125 || tf["P100"] != 18.7 || tf["A10"] != 125 {
			t.Errorf("throughput %v", tf)
		}
	}
	if len(power) != len(want) || gpus != 6212 {
		t.Fatalf("%d models, %d GPUs: %+v", len(power), gpus, power)
	}
}

// TestTimedReportsEnergy checks that the energy columns reach the
// command's table and CSV outputs.
func TestTimedReportsEnergy(t *testing.T) {
	o := tinyOptions()
	o.Policies = []string{"fusiond", "spread"}
	o.Timed, o.LoadPct = true, 80
	for format, want := range map[string]string{"table": "Wh/A100-eq-hour", "csv": "gpu_power_kw,idle_gpus,a100_eq"} {
		o.Format = format
		var b bytes.Buffer
		if err := Run(context.Background(), o, &b); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), want) || (format == "table" && !strings.Contains(b.String(), "power model:")) {
			t.Errorf("%s output lacks %q:\n%s", format, want, b.String())
		}
	}
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Timed {
		e := r.Energy
		// Every GPU draws at least its idle watts and at most its TDP.
		var lo, hi float64
		for _, p := range e.Power {
			lo += p.IdleW * float64(p.GPUs)
			hi += p.TDPW * float64(p.GPUs)
		}
		if e.MeanKW*1000 < lo-1e-6 || e.MeanKW*1000 > hi+1e-6 || e.IdleGPUHours < e.IdleNodeGPUHours || e.WhPerGPUHour <= 0 {
			t.Errorf("%s: implausible energy %+v (idle %v W, TDP %v W)", r.Policy, e, lo, hi)
		}
		for _, u := range r.Util {
			if u.IdleGPUs < 0 || u.PowerKW*1000 < lo-1e-6 || u.PowerKW*1000 > hi+1e-6 {
				t.Fatalf("%s: sample %+v", r.Policy, u)
			}
		}
	}
}

// TestEnergyGapSplit checks on a replay that the per-model accounting
// adds up to the whole, and that the gap to spread in Wh per GPU-hour is
// the floor part plus a model-mix part equal to Σ over models of the
// difference in each model's share of the GPU-hours × (TDP − idle).
func TestEnergyGapSplit(t *testing.T) {
	o := tinyOptions()
	o.Policies = []string{"fusiond", "spread"}
	o.Timed, o.LoadPct = true, 80
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(1, math.Abs(a), math.Abs(b)) }
	for _, r := range rep.Timed {
		e := r.Energy
		var h, a100 float64
		for _, m := range e.Models {
			h += m.GPUHours
			a100 += m.A100EqHours
		}
		if !near(h, r.GPUHours) || !near(a100, e.A100EqHours) || !near(e.A100EqHours*312, e.PFLOPHours*1000) {
			t.Errorf("%s: models' GPU-hours %v of %v, A100-eq %v of %v, PFLOP-hours %v", r.Policy, h, r.GPUHours, a100, e.A100EqHours, e.PFLOPHours)
		}
		if e.A100EqHours <= 0 || !near(e.WhPerA100EqHour, e.KWh*1000/e.A100EqHours) || !near(e.FloorWhPerGPUHour+e.DynamicWhPerGPUHour, e.WhPerGPUHour) {
			t.Errorf("%s: inconsistent %+v", r.Policy, e)
		}
	}
	a, b := rep.Timed[0], rep.Timed[1]
	g := SplitGap(a, b)
	if a.Energy.VsSpread == nil || *a.Energy.VsSpread != g || b.Energy.VsSpread != nil {
		t.Errorf("vs spread in the report: %+v, %+v; want %+v on fusiond only", a.Energy.VsSpread, b.Energy.VsSpread, g)
	}
	var mix float64
	for i, p := range a.Energy.Power {
		mix += (a.Energy.Models[i].GPUHours/a.GPUHours - b.Energy.Models[i].GPUHours/b.GPUHours) * (p.TDPW - p.IdleW)
	}
	if !near(g.Total, g.Floor+g.Mix) || !near(g.Mix, mix) || !near(g.BAtAMix, b.Energy.WhPerGPUHour+g.Mix) {
		t.Errorf("split %+v, model mix by hand %v", g, mix)
	}
	if a.GPUHours != b.GPUHours && g.Floor == 0 {
		t.Errorf("different GPU-hours (%v, %v) but no floor part: %+v", a.GPUHours, b.GPUHours, g)
	}
}
