package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
)

// Hybrid cores: CPUs with performance and efficiency cores (Intel P/E
// cores since Alder Lake, Arm big.LITTLE and DynamIQ, NVIDIA GB10) get a
// kind and a relative capacity per core. Sources, first found wins for
// the kind (see docs/topology.md, "Hybrid cores"):
//
//  1. /sys/devices/cpu_core/cpus and /sys/devices/cpu_atom/cpus, the
//     Intel hybrid PMUs: cpu_core CPUs are performance cores, cpu_atom
//     (and cpu_lowpower) CPUs efficiency cores.
//  2. cpuN/cpu_capacity, the scheduler's capacity (arm64, RISC-V, recent
//     x86 kernels): 1024 for the biggest core.
//  3. cpuN/cpufreq/base_frequency (intel_pstate).
//
// Capacity comes from cpu_capacity where the kernel gives it, else from
// base_frequency, scaled so that the host's biggest core is 1024. A core
// whose capacity is within CoreKindTolerance of the biggest is a
// performance core, the others efficiency cores (hwloc likewise merges
// max frequencies within 10%, and its MIDR kinds on GB10 group capacities
// 997-1024 together). cpuinfo_max_freq is never used: it differs between
// identical cores (Turbo Boost Max 3.0 favoured cores, AMD preferred
// cores) and would invent kinds. A host whose cores all look alike says
// nothing: every core keeps CoreKindUnknown and capacity 0.

// CoreKind is what kind of core a hybrid CPU's core is.
type CoreKind string

// Core kinds. CoreKindUnknown (the empty string) is every core of a host
// without hybrid information.
const (
	CoreKindUnknown     CoreKind = ""
	CoreKindPerformance CoreKind = "performance"
	CoreKindEfficiency  CoreKind = "efficiency"
)

// MaxCoreCapacity is the capacity of a host's biggest core.
const MaxCoreCapacity = 1024

// CoreKindTolerance is how far below the biggest core's capacity, as a
// fraction of it, a core is still a performance core.
const CoreKindTolerance = 0.10

// Where discovery found core kinds (Host.CoreKindSource).
const (
	CoreKindSourcePMU      = "pmu"            // /sys/devices/cpu_core, cpu_atom
	CoreKindSourceCapacity = "cpu_capacity"   // cpuN/cpu_capacity
	CoreKindSourceBaseFreq = "base_frequency" // cpuN/cpufreq/base_frequency
)

// IsHybrid reports whether the host has cores of more than one kind.
func (h *Host) IsHybrid() bool {
	var perf, eff bool
	for _, c := range h.Cores {
		perf = perf || c.Kind == CoreKindPerformance
		eff = eff || c.Kind == CoreKindEfficiency
	}
	return perf && eff
}

// CoreKindCPUs returns the online CPUs of the host's cores of kind k.
func (h *Host) CoreKindCPUs(k CoreKind) CPUSet {
	var out CPUSet
	for _, c := range h.Cores {
		if c.Kind == k {
			out = out.Union(c.CPUs)
		}
	}
	return out
}

// coreKinds sets Core.Kind and Core.Capacity and Host.CoreKindSource from
// the sources above; it changes nothing on a host that is not hybrid.
func (d *discovery) coreKinds() {
	h := d.host
	if len(h.Cores) == 0 {
		return
	}
	online := h.OnlineCPUs
	caps, capSrc := d.perCPUValues("cpu_capacity", online)
	if capSrc == "" {
		caps, capSrc = d.perCPUValues("cpufreq/base_frequency", online)
	}
	pmuKind := d.pmuKinds(online)

	kinds := make([]CoreKind, len(h.Cores))
	capacity := make([]int, len(h.Cores))
	var mixed []int // cores whose threads disagree
	if capSrc != "" {
		top := slices.Max(slices.Collect(maps.Values(caps)))
		for i, c := range h.Cores {
			// A core's value is its smallest thread's: siblings agree on
			// real hardware.
			v := -1
			for _, cpu := range c.CPUs.List() {
				x, ok := caps[cpu]
				switch {
				case !ok:
				case v < 0:
					v = x
				case x != v:
					mixed = append(mixed, cpu)
					v = min(v, x)
				}
			}
			if v < 0 {
				continue
			}
			capacity[i] = int((int64(v)*MaxCoreCapacity + int64(top)/2) / int64(top))
			kinds[i] = CoreKindEfficiency
			if float64(v) >= float64(top)*(1-CoreKindTolerance) {
				kinds[i] = CoreKindPerformance
			}
		}
	}
	src := capSrc
	if pmuKind != nil {
		src = CoreKindSourcePMU
		for i, c := range h.Cores {
			kinds[i] = pmuKind[c.CPUs.List()[0]]
		}
	}
	var perf, eff bool
	for _, k := range kinds {
		perf = perf || k == CoreKindPerformance
		eff = eff || k == CoreKindEfficiency
	}
	if !perf || !eff {
		return // one kind of core: nothing to say
	}
	if len(mixed) > 0 {
		d.warn("%s differs between SMT siblings; each core has its smallest thread's: CPUs %s", capSrc, NewCPUSet(mixed...))
	}
	var unknown CPUSet
	for i := range h.Cores {
		h.Cores[i].Kind, h.Cores[i].Capacity = kinds[i], capacity[i]
		if kinds[i] == CoreKindUnknown {
			unknown = unknown.Union(h.Cores[i].CPUs)
		}
	}
	if !unknown.IsEmpty() {
		d.warn("%s names no kind for some cores of this hybrid host; their kind is unknown: CPUs %s", src, unknown)
	}
	h.CoreKindSource = src
}

// perCPUValues reads cpuN/name for every online CPU. It returns the
// values and the source name, or no source unless every online CPU has a
// positive value (a partial or malformed file is warned about once).
func (d *discovery) perCPUValues(name string, online CPUSet) (map[int]int, string) {
	vals := map[int]int{}
	var missing, bad []int
	for _, cpu := range online.List() {
		v, err := d.fs.readInt(fmt.Sprintf("%s/cpu%d/%s", sysCPU, cpu, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			missing = append(missing, cpu)
		case err != nil || v <= 0:
			bad = append(bad, cpu)
		default:
			vals[cpu] = v
		}
	}
	if len(vals) == 0 {
		return nil, ""
	}
	if len(missing)+len(bad) > 0 {
		d.warn("%s/cpuN/%s missing or not a positive integer on some CPUs; not used for core kinds: CPUs %s", sysCPU, name, NewCPUSet(append(missing, bad...)...))
		return nil, ""
	}
	src := CoreKindSourceCapacity
	if name != "cpu_capacity" {
		src = CoreKindSourceBaseFreq
	}
	return vals, src
}

// pmuKinds reads the Intel hybrid PMUs' CPU lists: nil when there are
// none or they cover no online CPU.
func (d *discovery) pmuKinds(online CPUSet) map[int]CoreKind {
	out := map[int]CoreKind{}
	for _, p := range []struct {
		file string
		kind CoreKind
	}{
		{"/sys/devices/cpu_core/cpus", CoreKindPerformance},
		{"/sys/devices/cpu_atom/cpus", CoreKindEfficiency},
		{"/sys/devices/cpu_lowpower/cpus", CoreKindEfficiency},
	} {
		set, err := d.fs.readCPUList(p.file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			d.warn("%v; not used for core kinds", err)
			return nil
		}
		for _, cpu := range set.Intersection(online).List() {
			out[cpu] = p.kind
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// CoreKindLines describes a hybrid host's core kinds, one line per kind
// ("performance: 6 cores, CPUs 0-11, capacity 1024"), performance first;
// nil when the host is not hybrid.
func (h *Host) CoreKindLines() []string {
	if !h.IsHybrid() {
		return nil
	}
	var out []string
	for _, k := range []CoreKind{CoreKindPerformance, CoreKindEfficiency, CoreKindUnknown} {
		n, lo, hi := 0, 0, 0
		for _, c := range h.Cores {
			if c.Kind != k {
				continue
			}
			if n == 0 || c.Capacity < lo {
				lo = c.Capacity
			}
			hi = max(hi, c.Capacity)
			n++
		}
		if n == 0 {
			continue
		}
		name := string(k)
		if k == CoreKindUnknown {
			name = "unknown"
		}
		line := fmt.Sprintf("%s: %d cores, CPUs %s", name, n, h.CoreKindCPUs(k))
		switch {
		case hi == 0:
		case lo == hi:
			line += fmt.Sprintf(", capacity %d", hi)
		default:
			line += fmt.Sprintf(", capacity %d-%d", lo, hi)
		}
		out = append(out, line)
	}
	return out
}
