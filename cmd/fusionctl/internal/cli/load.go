package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// telemetryLines writes the telemetry bus's summary as status rows.
func telemetryLines(w io.Writer, t api.TelemetryStatus) {
	load := fmt.Sprintf("CPU %.0f%% busy", 100*t.CPUBusy)
	if len(t.NodeBusy) > 1 {
		var per []string
		for n, b := range t.NodeBusy {
			per = append(per, fmt.Sprintf("node%d %.0f%%", n, 100*b))
		}
		load += " (" + strings.Join(per, ", ") + ")"
	}
	load += ", memory " + t.MemoryUsed.Human() + " used"
	if p := t.PSI; p != nil {
		load += fmt.Sprintf(", pressure cpu %.1f%% memory %.1f%% io %.1f%%", p.CPU, p.Memory, p.IO)
	} else {
		load += ", no pressure stall information (kernel without /proc/pressure)"
	}
	fmt.Fprintf(w, "Load:\t%s\n", load)
	power := t.Power
	if t.PackagePowerW != nil {
		power = fmt.Sprintf("CPU packages %.1f W (%s)", *t.PackagePowerW, t.Power)
	}
	if t.GPUs > 0 {
		power += fmt.Sprintf("; GPUs %.1f W", t.GPUPowerW)
		if t.IdleGPUs > 0 {
			// What placement does with them: the energy dimension scores
			// an option on an idle GPU lower (docs/load.md "Energy").
			power += fmt.Sprintf(" (%d idle, drawing %.1f W; placement scores waking an idle GPU lower)", t.IdleGPUs, t.IdleGPUPowerW)
		}
	}
	fmt.Fprintf(w, "Power:\t%s\n", power)
	if e := t.GPUEnergy; e != nil {
		fmt.Fprintf(w, "GPU energy:\t%s\n", gpuEnergyLine(*e, t.GPUEnergyRecent))
	}
	jobs := fmt.Sprintf("%d jobs read", t.Jobs)
	if t.MaxJobs > 0 {
		jobs = fmt.Sprintf("%d jobs read (at most %d)", t.Jobs, t.MaxJobs)
	}
	if t.UnfollowedJobs > 0 {
		jobs += fmt.Sprintf(", %d NOT FOLLOWED (telemetry.max_jobs reached)", t.UnfollowedJobs)
	}
	tel := fmt.Sprintf("every %v (jobs every %v), %d of %d samples, %d GPUs, %s, %v per sample, rings bounded at %s; job PSI: %s",
		time.Duration(t.Interval), time.Duration(t.JobInterval), t.Samples, t.Ring, t.GPUs, jobs, time.Duration(t.SampleCost).Round(time.Microsecond), t.MemoryBound.Human(), t.JobPSI)
	if t.LastError != "" {
		tel += "; last error: " + t.LastError
	}
	fmt.Fprintf(w, "Telemetry:\t%s\n", tel)
	for _, f := range t.Forecasts {
		fmt.Fprintf(w, "Forecast:\t%s in %v: %.3g (now %.3g; %s, back-test sMAPE %.1f%% over %d min)\n",
			f.Series, time.Duration(f.Horizon), f.Value, f.Now, f.Model, f.SMAPE, f.Points)
	}
}

// reclaimLine is the reclaimed-capacity loop's state on one line.
func reclaimLine(r api.ReclaimStatus) string {
	if !r.Enabled {
		return "not running (" + r.Reason + ")"
	}
	budget := "no best-effort limit"
	if r.BudgetCPU > 0 || r.BudgetMemory > 0 {
		var parts []string
		if r.BudgetCPU > 0 {
			parts = append(parts, r.BudgetCPU.String()+" CPU")
		}
		if r.BudgetMemory > 0 {
			parts = append(parts, r.BudgetMemory.Human()+" memory")
		}
		budget = "best-effort held to " + strings.Join(parts, " and ")
	}
	if r.LentCPU > 0 {
		budget += fmt.Sprintf(", %s CPU lent to each best-effort job beyond its request", r.LentCPU)
	}
	s := fmt.Sprintf("reclaimable %s CPU and %s memory, reclaimed %s CPU and %s memory (best-effort uses %s and %s), held by best-effort jobs placed on it %s CPU and %s memory; %s; %d evicted",
		r.ReclaimableCPU, r.ReclaimableMemory.Human(), r.ReclaimedCPU, r.ReclaimedMemory.Human(),
		r.BestEffortCPU, r.BestEffortMemory.Human(), r.PlacedCPU, r.PlacedMemory.Human(), budget, r.Evictions)
	if r.LastAction != "" && r.LastActionAt != nil {
		s += fmt.Sprintf("; last: %s (%s)", r.LastAction, r.LastActionAt.Local().Format("15:04:05"))
	}
	return s
}

// gpuEnergyLine is the GPUs' energy per unit of delivered work since the
// telemetry bus started, and over its last minute (recent, when there is
// one): energy, the idle floor apart, and Wh per A100-equivalent
// GPU-hour of compute delivered (SM utilisation × the model's dense FP16
// TFLOPS, over an A100's 312).
func gpuEnergyLine(e api.GPUEnergy, recent *api.GPUEnergy) string {
	s := fmt.Sprintf("%.1f Wh over %v (%.1f Wh measured, the rest from the model table), idle floor %.1f Wh", e.EnergyWh,
		time.Duration(e.Window).Round(time.Second), e.MeasuredWh, e.IdleFloorWh)
	if e.A100EqHours > 0 {
		s += fmt.Sprintf("; delivered %.3f A100-eq GPU-hours (SM utilisation × FP16 TFLOPS): %.1f Wh per A100-eq GPU-hour (idle floor %.1f of it), %.1f Wh per busy GPU-hour",
			e.A100EqHours, e.WhPerA100EqHour, e.FloorWhPerA100EqHour, e.WhPerBusyGPUHour)
	} else {
		s += "; no compute delivered (SM utilisation 0)"
	}
	if recent != nil {
		if recent.A100EqHours > 0 {
			s += fmt.Sprintf("; last %v: %.1f Wh per A100-eq GPU-hour", time.Duration(recent.Window).Round(time.Second), recent.WhPerA100EqHour)
		} else {
			s += fmt.Sprintf("; last %v: no compute delivered", time.Duration(recent.Window).Round(time.Second))
		}
	}
	if e.UnknownGPUs > 0 {
		s += fmt.Sprintf("; %d GPUs of a model the table lacks (their measured power only)", e.UnknownGPUs)
	}
	return s
}
