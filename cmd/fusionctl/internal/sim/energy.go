package sim

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/fusiond/fusiond/daemon/sched"
)

// GPUPower is the power model of one GPU model in the time-ordered
// replay: a GPU with nothing allocated draws IdleW; one with a share s
// (0..1) of it allocated draws IdleW + (TDPW − IdleW)·s.
type GPUPower struct {
	// Model is the node list's name of the model ("V100M32").
	Model string `json:"model"`
	// GPUs is how many GPUs of the model the node list holds.
	GPUs   int     `json:"gpus"`
	IdleW  float64 `json:"idle_w"`
	TDPW   float64 `json:"tdp_w"`
	Source string  `json:"source"`
	// TFLOPS is the model's dense FP16 tensor throughput (FP16 without
	// tensor cores on a P100): the GPU model table's FP16 column, through
	// the same openb mapping as the watts, or --gpu-tflops; TFLOPSSource
	// says which.
	TFLOPS       float64 `json:"fp16_tflops"`
	TFLOPSSource string  `json:"tflops_source"`
}

// openbPower maps the openb node list's model names to the GPU model
// table (daemon/sched/perf.go) or, for the models Alibaba did not
// disclose, to a stated assumption (docs/load.md "Energy").
func openbPower(model string) (table, note string, ok bool) {
	switch strings.ToUpper(model) {
	case "V100M16", "V100M32":
		return "V100 SXM2", "form assumed: SXM2", true
	case "P100":
		return "P100 PCIe", "form assumed: 1–2-GPU nodes", true
	case "G1", "G2", "G3":
		return "A100 PCIe", "undisclosed model, assumed a 300 W class", true
	}
	return "", "", false
}

// PowerModel returns the power figures and FP16 throughput of every GPU
// model in specs: overrides ("MODEL=IDLE:TDP", comma-separated; see
// ParsePowerOverrides) and tflops ("MODEL=TFLOPS"; see ParseTFLOPS)
// first, then the openb mapping, then the model table by the model's
// name. A model none of them knows is an error: the report would
// otherwise rest on a made-up figure.
func PowerModel(specs []NodeSpec, overrides map[string][2]float64, tflops map[string]float64) ([]GPUPower, error) {
	count := map[string]int{}
	for _, s := range specs {
		for _, g := range s.Groups() {
			if g.GPUs > 0 {
				count[g.Model] += g.GPUs
			}
		}
	}
	out := make([]GPUPower, 0, len(count))
	for m, n := range count {
		p := GPUPower{Model: m, GPUs: n}
		name, note := m, ""
		if t, n, ok := openbPower(m); ok {
			name, note = t, n
		}
		spec, known := sched.LookupGPU(name)
		from := "table: " + spec.Name
		if note != "" {
			from += " (" + note + ")"
		}
		switch w, ok := overrides[m]; {
		case ok:
			p.IdleW, p.TDPW, p.Source = w[0], w[1], "--gpu-power"
		case known:
			p.IdleW, p.TDPW, p.Source = spec.IdleW, spec.TDPW, from
		default:
			return nil, fmt.Errorf("%w: no power figures for GPU model %q: give --gpu-power %s=IDLE:TDP", ErrBadOption, m, m)
		}
		switch f, ok := tflops[m]; {
		case ok:
			p.TFLOPS, p.TFLOPSSource = f, "--gpu-tflops"
		case known && spec.FP16 > 0:
			p.TFLOPS, p.TFLOPSSource = spec.FP16, from
		default:
			return nil, fmt.Errorf("%w: no FP16 throughput for GPU model %q: give --gpu-tflops %s=TFLOPS", ErrBadOption, m, m)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b GPUPower) int { return strings.Compare(a.Model, b.Model) })
	return out, nil
}

// ParsePowerOverrides parses "G2=35:300,G3=50:400" (idle and TDP watts
// per model).
func ParsePowerOverrides(s string) (map[string][2]float64, error) {
	out := map[string][2]float64{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		m, w, ok := strings.Cut(part, "=")
		idle, tdp, ok2 := strings.Cut(w, ":")
		i, err1 := strconv.ParseFloat(idle, 64)
		t, err2 := strconv.ParseFloat(tdp, 64)
		if !ok || !ok2 || m == "" || err1 != nil || err2 != nil || i < 0 || t < i || t > 10000 {
			return nil, fmt.Errorf("%w: --gpu-power %q: want MODEL=IDLE:TDP watts with 0 ≤ IDLE ≤ TDP", ErrBadOption, part)
		}
		out[strings.TrimSpace(m)] = [2]float64{i, t}
	}
	return out, nil
}

// ParseTFLOPS parses "G2=312,G3=125" (dense FP16 TFLOPS per model).
func ParseTFLOPS(s string) (map[string]float64, error) {
	out := map[string]float64{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		m, v, ok := strings.Cut(part, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || strings.TrimSpace(m) == "" || err != nil || !(f > 0 && f <= 1e5) {
			return nil, fmt.Errorf("%w: --gpu-tflops %q: want MODEL=TFLOPS with 0 < TFLOPS ≤ 100000", ErrBadOption, part)
		}
		out[strings.TrimSpace(m)] = f
	}
	return out, nil
}

// energyMeter integrates the GPUs' power and idleness over the window
// [lo, hi] as the replay applies and releases assignments. Power is
// piecewise constant between events, so the meter keeps the running sums
// (watts, idle GPUs, idle nodes) and adds sum × dt at every event.
type energyMeter struct {
	lo, hi, at  int64
	idleW, dynW [][]float64 // per node, per GPU: idle watts, TDP − idle
	milli       [][]int64   // allocated milli-GPU per node, per GPU
	busy        []int       // GPUs with something allocated, per node
	watts       float64     // current draw of all GPUs
	idleWatts   float64     // the part of it drawn by idle GPUs
	offWatts    float64     // the part drawn by GPUs on idle nodes
	idle        int         // GPUs with nothing allocated
	idleNodeGPU int         // GPUs on those nodes
	wattSec     float64     // ∫ watts dt over the window so far
	idleWattSec float64     // ∫ idleWatts dt
	offWattSec  float64     // ∫ offWatts dt
	idleSec     float64     // ∫ idle dt
	idleNodeSec float64     // ∫ idleNodeGPU dt
	// Delivered compute: tflops per node, per GPU; rate the TFLOPS the
	// allocated shares hold now (Σ share × TFLOPS); tflopSec ∫ rate dt.
	tflops   [][]float64
	rate     float64
	tflopSec float64
	// floorW is every GPU's idle draw together (constant).
	floorW float64
	// Per GPU model (index into power): the model of each node's GPUs,
	// the milli-GPU allocated on the model now and ∫ of it dt.
	model      [][]int
	modelMilli []int64
	modelSec   []float64
}

func newEnergyMeter(nodes []*sched.Node, power []GPUPower, lo, hi int64) (*energyMeter, error) {
	by := map[string]int{}
	for i, p := range power {
		by[p.Model] = i
	}
	e := &energyMeter{lo: lo, hi: hi, at: lo,
		idleW: make([][]float64, len(nodes)), dynW: make([][]float64, len(nodes)),
		milli: make([][]int64, len(nodes)), busy: make([]int, len(nodes)),
		tflops: make([][]float64, len(nodes)), model: make([][]int, len(nodes)),
		modelMilli: make([]int64, len(power)), modelSec: make([]float64, len(power))}
	for i, n := range nodes {
		if len(n.GPUs) == 0 {
			continue
		}
		e.idleW[i], e.dynW[i], e.milli[i] = make([]float64, len(n.GPUs)), make([]float64, len(n.GPUs)), make([]int64, len(n.GPUs))
		e.tflops[i], e.model[i] = make([]float64, len(n.GPUs)), make([]int, len(n.GPUs))
		for g := range n.GPUs {
			m, ok := by[n.ModelOf(g)]
			if !ok {
				return nil, fmt.Errorf("%w: no power figures for GPU model %q", ErrBadOption, n.ModelOf(g))
			}
			p := power[m]
			e.idleW[i][g], e.dynW[i][g] = p.IdleW, p.TDPW-p.IdleW
			e.tflops[i][g], e.model[i][g] = p.TFLOPS, m
			e.watts += p.IdleW
			e.idleWatts += p.IdleW
			e.offWatts += p.IdleW
			e.floorW += p.IdleW
		}
		e.idle += len(n.GPUs)
		e.idleNodeGPU += len(n.GPUs)
	}
	return e, nil
}

// advance integrates the current sums from the last event to t (clipped
// to the window).
func (e *energyMeter) advance(t int64) {
	t = min(t, e.hi)
	if t <= e.at {
		return
	}
	dt := float64(t - e.at)
	e.wattSec += e.watts * dt
	e.idleWattSec += e.idleWatts * dt
	e.offWattSec += e.offWatts * dt
	e.idleSec += float64(e.idle) * dt
	e.idleNodeSec += float64(e.idleNodeGPU) * dt
	e.tflopSec += e.rate * dt
	for m, v := range e.modelMilli {
		e.modelSec[m] += float64(v) * dt
	}
	e.at = t
}

// apply (sign +1) or release (−1) assignment a.
func (e *energyMeter) change(a *sched.Assignment, sign int64) {
	i := a.NodeIdx
	if i < 0 || i >= len(e.milli) {
		return
	}
	for _, g := range a.GPUs {
		if g < 0 || g >= len(e.milli[i]) {
			continue
		}
		before := e.milli[i][g]
		after := min(sched.MilliPerGPU, max(0, before+sign*a.GPUMilli))
		e.milli[i][g] = after
		share := float64(after-before) / sched.MilliPerGPU
		e.watts += e.dynW[i][g] * share
		e.rate += e.tflops[i][g] * share
		e.modelMilli[e.model[i][g]] += after - before
		switch {
		case before == 0 && after > 0:
			e.idle--
			e.idleWatts -= e.idleW[i][g]
			if e.busy[i]++; e.busy[i] == 1 {
				e.idleNodeGPU -= len(e.milli[i])
				e.offWatts -= sum(e.idleW[i])
			}
		case before > 0 && after == 0:
			e.idle++
			e.idleWatts += e.idleW[i][g]
			if e.busy[i]--; e.busy[i] == 0 {
				e.idleNodeGPU += len(e.milli[i])
				e.offWatts += sum(e.idleW[i])
			}
		}
	}
}

// Energy is the replay's GPU energy inside the window under the power
// model of GPUPower.
type Energy struct {
	// KWh is the energy all GPUs drew, busy and idle.
	KWh float64 `json:"energy_kwh"`
	// WhPerGPUHour is KWh over the GPU-hours served (in Wh).
	WhPerGPUHour float64 `json:"wh_per_gpu_hour"`
	// MeanKW is the mean draw.
	MeanKW float64 `json:"mean_kw"`
	// IdleGPUHours is the time GPUs spent with nothing allocated;
	// IdleNodeGPUHours the part of it on nodes none of whose GPUs had
	// anything allocated (a whole server that could be powered down).
	IdleGPUHours     float64 `json:"idle_gpu_hours"`
	IdleNodeGPUHours float64 `json:"idle_node_gpu_hours"`
	// IdleKWh is the energy the idle GPUs drew; IdleNodeKWh the part of
	// it drawn on idle nodes, which powering those servers off would
	// save (an upper bound: no wake-up cost, GPUs only).
	IdleKWh     float64 `json:"idle_kwh"`
	IdleNodeKWh float64 `json:"idle_node_kwh"`
	// WhPerGPUHourOff is WhPerGPUHour less IdleNodeKWh.
	WhPerGPUHourOff float64 `json:"wh_per_gpu_hour_idle_nodes_off"`
	// IdleFloorKWh is what every GPU's idle draw alone comes to over the
	// window (Σ idle W × window, busy GPUs included): the same for every
	// policy. DynamicKWh = KWh − IdleFloorKWh is what the allocated work
	// adds to it. (IdleNodeKWh is the part of the floor drawn on wholly
	// idle nodes.)
	IdleFloorKWh float64 `json:"idle_floor_kwh"`
	DynamicKWh   float64 `json:"dynamic_kwh"`
	// FloorWhPerGPUHour + DynamicWhPerGPUHour = WhPerGPUHour. Under the
	// linear power model the dynamic part is Σ over models of the
	// model's share of the GPU-hours × (TDP − idle): it depends on the
	// model mix alone, and the floor part on the GPU-hours served alone.
	FloorWhPerGPUHour   float64 `json:"floor_wh_per_gpu_hour"`
	DynamicWhPerGPUHour float64 `json:"dynamic_wh_per_gpu_hour"`
	// PFLOPHours is the compute delivered in the window: Σ over GPUs of
	// the allocated share × the model's dense FP16 TFLOPS × time, in FP16
	// PFLOP-hours. A100EqHours is the same in hours of an A100
	// (sched.ReferenceFP16, 312 TFLOPS): a T4 GPU-hour is 65/312 of one.
	PFLOPHours  float64 `json:"fp16_pflop_hours"`
	A100EqHours float64 `json:"a100_eq_hours"`
	// WhPerA100EqHour and WhPerPFLOPHour are KWh over the delivered
	// compute; FloorWhPerA100EqHour the idle floor's part of the former.
	WhPerA100EqHour      float64 `json:"wh_per_a100_eq_hour"`
	WhPerPFLOPHour       float64 `json:"wh_per_fp16_pflop_hour"`
	FloorWhPerA100EqHour float64 `json:"floor_wh_per_a100_eq_hour"`
	// Models is what each GPU model served, in the order of Power.
	Models []ModelUse `json:"models"`
	Power  []GPUPower `json:"power_model"`
	// VsSpread is the gap to spread's run on the same replay, when
	// spread ran too (Simulate; see SplitGap).
	VsSpread *GapSplit `json:"vs_spread,omitempty"`
}

// ModelUse is what the GPUs of one model served in the window.
type ModelUse struct {
	Model string `json:"model"`
	// GPUHours is the GPU time allocated on the model's GPUs,
	// A100EqHours the compute it held (GPUHours × TFLOPS / 312).
	GPUHours    float64 `json:"gpu_hours"`
	A100EqHours float64 `json:"a100_eq_hours"`
	// DynamicKWh is the energy above idle the model's allocated shares
	// drew: GPUHours × (TDP − idle).
	DynamicKWh float64 `json:"dynamic_kwh"`
}

// result closes the window and summarises it; gpuHours is the GPU time
// served in it.
func (e *energyMeter) result(gpuHours float64, power []GPUPower) Energy {
	e.advance(e.hi)
	r := Energy{KWh: e.wattSec / 3600 / 1000, IdleKWh: e.idleWattSec / 3600 / 1000, IdleNodeKWh: e.offWattSec / 3600 / 1000,
		IdleGPUHours: e.idleSec / 3600, IdleNodeGPUHours: e.idleNodeSec / 3600, Power: power}
	if w := float64(e.hi - e.lo); w > 0 {
		r.MeanKW = e.wattSec / w / 1000
	}
	r.IdleFloorKWh = e.floorW * float64(e.hi-e.lo) / 3600 / 1000
	r.DynamicKWh = r.KWh - r.IdleFloorKWh
	ref := sched.ReferenceFP16()
	r.PFLOPHours = e.tflopSec / 3600 / 1000
	r.A100EqHours = e.tflopSec / 3600 / ref
	for m, p := range power {
		h := e.modelSec[m] / sched.MilliPerGPU / 3600
		r.Models = append(r.Models, ModelUse{Model: p.Model, GPUHours: h, A100EqHours: h * p.TFLOPS / ref, DynamicKWh: h * (p.TDPW - p.IdleW) / 1000})
	}
	if gpuHours > 0 {
		r.WhPerGPUHour = r.KWh * 1000 / gpuHours
		r.WhPerGPUHourOff = (r.KWh - r.IdleNodeKWh) * 1000 / gpuHours
		r.FloorWhPerGPUHour = r.IdleFloorKWh * 1000 / gpuHours
		r.DynamicWhPerGPUHour = r.DynamicKWh * 1000 / gpuHours
	}
	if r.A100EqHours > 0 {
		r.WhPerA100EqHour = r.KWh * 1000 / r.A100EqHours
		r.WhPerPFLOPHour = r.KWh * 1000 / r.PFLOPHours
		r.FloorWhPerA100EqHour = r.IdleFloorKWh * 1000 / r.A100EqHours
	}
	return r
}

// GapSplit divides the difference in Wh per GPU-hour between two runs
// on the same cluster and window (A − B) into its two parts under the
// linear power model: Floor, the idle floor spread over a different
// number of GPU-hours (how much work is served: utilisation), and Mix,
// the energy above idle per GPU-hour, which is set by the GPU models the
// GPU-hours fall on (how power-hungry the busy GPUs are, not how busy).
// BAtAMix is B's Wh per GPU-hour had its GPU-hours had A's model mix.
type GapSplit struct {
	A       string  `json:"policy"`
	B       string  `json:"against"`
	Total   float64 `json:"total_wh_per_gpu_hour"`
	Floor   float64 `json:"floor_wh_per_gpu_hour"`
	Mix     float64 `json:"mix_wh_per_gpu_hour"`
	BAtAMix float64 `json:"b_at_a_mix_wh_per_gpu_hour"`
	// A100Eq is the difference in Wh per A100-equivalent GPU-hour.
	A100Eq float64 `json:"total_wh_per_a100_eq_hour"`
}

// SplitGap is the GapSplit of a against b.
func SplitGap(a, b TimedResult) GapSplit {
	ea, eb := a.Energy, b.Energy
	return GapSplit{A: a.Policy, B: b.Policy,
		Total:   ea.WhPerGPUHour - eb.WhPerGPUHour,
		Floor:   ea.FloorWhPerGPUHour - eb.FloorWhPerGPUHour,
		Mix:     ea.DynamicWhPerGPUHour - eb.DynamicWhPerGPUHour,
		BAtAMix: eb.FloorWhPerGPUHour + ea.DynamicWhPerGPUHour,
		A100Eq:  ea.WhPerA100EqHour - eb.WhPerA100EqHour,
	}
}

// splitAgainstSpread sets every other run's Energy.VsSpread when spread
// is among runs.
func splitAgainstSpread(runs []TimedResult) {
	i := slices.IndexFunc(runs, func(t TimedResult) bool { return t.Policy == "spread" })
	if i < 0 {
		return
	}
	for j := range runs {
		if j != i {
			g := SplitGap(runs[j], runs[i])
			runs[j].Energy.VsSpread = &g
		}
	}
}

// writeComputeEnergy prints energy per delivered compute, the idle floor
// apart, GPU-hours per model, and (when spread ran) each other policy's
// gap to spread split into utilisation and model mix.
func writeComputeEnergy(w io.Writer, runs []TimedResult) error {
	if len(runs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nenergy per delivered compute (dense FP16 TFLOPS per model; 1 A100-eq GPU-hour = %g TFLOPS × 1 h, the %s):\n", sched.ReferenceFP16(), sched.ReferenceModel)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tGPU-hours\tA100-eq GPU-hours\tFP16 PFLOP-hours\tWh/GPU-hour\tWh/A100-eq-hour\tWh/PFLOP-hour\tidle floor MWh\tof it on idle nodes\tdynamic MWh\tfloor Wh/GPU-hour\tdynamic Wh/GPU-hour\tfloor Wh/A100-eq-hour\t\n")
	for _, t := range runs {
		e := t.Energy
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", t.Policy, t.GPUHours, e.A100EqHours, e.PFLOPHours,
			e.WhPerGPUHour, e.WhPerA100EqHour, e.WhPerPFLOPHour, e.IdleFloorKWh/1000, e.IdleNodeKWh/1000, e.DynamicKWh/1000, e.FloorWhPerGPUHour, e.DynamicWhPerGPUHour, e.FloorWhPerA100EqHour)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nGPU-hours served per model (share of the policy's GPU-hours):\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hdr := "policy"
	for _, m := range runs[0].Energy.Power {
		hdr += fmt.Sprintf("\t%s (%g TFLOPS, %g W above idle)", m.Model, m.TFLOPS, m.TDPW-m.IdleW)
	}
	fmt.Fprintln(tw, hdr+"\t")
	for _, t := range runs {
		line := t.Policy
		for _, m := range t.Energy.Models {
			share := 0.0
			if t.GPUHours > 0 {
				share = 100 * m.GPUHours / t.GPUHours
			}
			line += fmt.Sprintf("\t%.0f (%.1f%%)", m.GPUHours, share)
		}
		fmt.Fprintln(tw, line+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !slices.ContainsFunc(runs, func(t TimedResult) bool { return t.Energy.VsSpread != nil }) {
		return nil
	}
	fmt.Fprintf(w, "\nWh/GPU-hour against spread = floor part (GPU-hours served) + dynamic part (model mix):\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tgap Wh/GPU-hour\tfrom the floor\tfrom the model mix\tspread at the policy's mix\tgap Wh/A100-eq-hour\t\n")
	for _, t := range runs {
		g := t.Energy.VsSpread
		if g == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%+.1f\t%+.1f\t%+.1f\t%.1f\t%+.1f\t\n", t.Policy, g.Total, g.Floor, g.Mix, g.BAtAMix, g.A100Eq)
	}
	return tw.Flush()
}

// writePowerModel prints the power model a timed report rests on.
func writePowerModel(w io.Writer, power []GPUPower) {
	fmt.Fprintf(w, "power model: a GPU draws idle + (TDP − idle) × its allocated share; an idle GPU idle watts; delivered compute is the allocated share × the dense FP16 TFLOPS\n")
	for _, p := range power {
		from := p.TFLOPSSource
		if from == p.Source {
			from = "the same"
		}
		fmt.Fprintf(w, "  %-8s %5d GPUs  idle %4.0f W  TDP %4.0f W  FP16 %6.1f TFLOPS  %s; TFLOPS: %s\n", p.Model, p.GPUs, p.IdleW, p.TDPW, p.TFLOPS, p.Source, from)
	}
}

// a100Eq is the compute the allocated shares hold now, in A100s.
func (e *energyMeter) a100Eq() float64 { return e.rate / sched.ReferenceFP16() }

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}
