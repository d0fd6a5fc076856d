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
	for _, pol := range []string{"fusiond", "spread", "fgd"} {
		r, err := RunTimed(context.Background(), specs, pods, pol, 1, 0.95, TimedOptions{Power: power})
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
		} {
			if math.Abs(c.got-c.want) > 1e-9 {
				t.Errorf("%s: %s = %v, want %v", pol, c.name, c.got, c.want)
			}
		}
		if len(e.Power) != 2 || e.Power[0].Model != "T4" || e.Power[0].IdleW != 10 || e.Power[0].TDPW != 70 || e.Power[1].Source != "--gpu-power" {
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
	if _, err := PowerModel([]NodeSpec{{Name: "n", GPUs: 1, Model: "Mystery9"}}, nil); !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), "--gpu-power Mystery9=") {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestPowerModelCoversOpenB checks that every GPU model of the openb node
// list has figures, and which: the documented mapping (docs/load.md
// "Energy").
func TestPowerModelCoversOpenB(t *testing.T) {
	specs, _ := loadTrace(t, "openb_pod_list_default")
	power, err := PowerModel(specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A10": "A10", "G2": "A100 PCIe", "G3": "A100 PCIe", "P100": "P100 PCIe", "T4": "T4", "V100M16": "V100 SXM2", "V100M32": "V100 SXM2"}
	gpus := 0
	for _, p := range power {
		gpus += p.GPUs
		if w, ok := want[p.Model]; !ok || !strings.HasPrefix(p.Source, "table: "+w) || p.IdleW <= 0 || p.TDPW <= p.IdleW {
			t.Errorf("%s: %+v, want table %q", p.Model, p, w)
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
	for format, want := range map[string]string{"table": "Wh/GPU-hour", "csv": "gpu_power_kw,idle_gpus"} {
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
