package sim

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

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

// PowerModel returns the power figures of every GPU model in specs:
// overrides ("MODEL=IDLE:TDP", comma-separated; see ParsePowerOverrides)
// first, then the openb mapping, then the model table by the model's
// name. A model none of them knows is an error: the report would
// otherwise rest on a made-up figure.
func PowerModel(specs []NodeSpec, overrides map[string][2]float64) ([]GPUPower, error) {
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
		if w, ok := overrides[m]; ok {
			p.IdleW, p.TDPW, p.Source = w[0], w[1], "--gpu-power"
			out = append(out, p)
			continue
		}
		name, note := m, ""
		if t, n, ok := openbPower(m); ok {
			name, note = t, n
		}
		spec, ok := sched.LookupGPU(name)
		if !ok {
			return nil, fmt.Errorf("%w: no power figures for GPU model %q: give --gpu-power %s=IDLE:TDP", ErrBadOption, m, m)
		}
		p.IdleW, p.TDPW, p.Source = spec.IdleW, spec.TDPW, "table: "+spec.Name
		if note != "" {
			p.Source += " (" + note + ")"
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
}

func newEnergyMeter(nodes []*sched.Node, power []GPUPower, lo, hi int64) (*energyMeter, error) {
	by := map[string]GPUPower{}
	for _, p := range power {
		by[p.Model] = p
	}
	e := &energyMeter{lo: lo, hi: hi, at: lo,
		idleW: make([][]float64, len(nodes)), dynW: make([][]float64, len(nodes)),
		milli: make([][]int64, len(nodes)), busy: make([]int, len(nodes))}
	for i, n := range nodes {
		if len(n.GPUs) == 0 {
			continue
		}
		e.idleW[i], e.dynW[i], e.milli[i] = make([]float64, len(n.GPUs)), make([]float64, len(n.GPUs)), make([]int64, len(n.GPUs))
		for g := range n.GPUs {
			p, ok := by[n.ModelOf(g)]
			if !ok {
				return nil, fmt.Errorf("%w: no power figures for GPU model %q", ErrBadOption, n.ModelOf(g))
			}
			e.idleW[i][g], e.dynW[i][g] = p.IdleW, p.TDPW-p.IdleW
			e.watts += p.IdleW
			e.idleWatts += p.IdleW
			e.offWatts += p.IdleW
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
		e.watts += e.dynW[i][g] * float64(after-before) / sched.MilliPerGPU
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
	WhPerGPUHourOff float64    `json:"wh_per_gpu_hour_idle_nodes_off"`
	Power           []GPUPower `json:"power_model"`
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
	if gpuHours > 0 {
		r.WhPerGPUHour = r.KWh * 1000 / gpuHours
		r.WhPerGPUHourOff = (r.KWh - r.IdleNodeKWh) * 1000 / gpuHours
	}
	return r
}

// writePowerModel prints the power model a timed report rests on.
func writePowerModel(w io.Writer, power []GPUPower) {
	fmt.Fprintf(w, "power model: a GPU draws idle + (TDP − idle) × its allocated share; an idle GPU idle watts\n")
	for _, p := range power {
		fmt.Fprintf(w, "  %-8s %5d GPUs  idle %4.0f W  TDP %4.0f W  %s\n", p.Model, p.GPUs, p.IdleW, p.TDPW, p.Source)
	}
}

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}
