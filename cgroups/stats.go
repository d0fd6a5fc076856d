package cgroups

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Stats is a job's accounting, read from its cgroup.
type Stats struct {
	// CPU time used, and time spent throttled by the CPU quota.
	CPUUsage      time.Duration `json:"cpuUsage"`
	CPUUser       time.Duration `json:"cpuUser,omitempty"`
	CPUSystem     time.Duration `json:"cpuSystem,omitempty"`
	ThrottledTime time.Duration `json:"throttledTime"`
	NrThrottled   uint64        `json:"nrThrottled"`
	// MemoryCurrent and MemoryPeak in bytes.
	MemoryCurrent uint64 `json:"memoryCurrent"`
	MemoryPeak    uint64 `json:"memoryPeak"`
	// OOMKills counts processes the OOM killer killed in this cgroup.
	OOMKills uint64 `json:"oomKills"`
	// PSI is the pressure stall information; nil where the kernel has none
	// for the cgroup (cgroup v1).
	PSI *PSI `json:"psi,omitempty"`
}

// PSI holds the cgroup's cpu, memory and io pressure.
type PSI struct {
	CPU    Pressure `json:"cpu"`
	Memory Pressure `json:"memory"`
	IO     Pressure `json:"io"`
}

// Pressure is one resource's "some" and "full" stall lines.
type Pressure struct {
	Some PressureLine `json:"some"`
	Full PressureLine `json:"full"`
}

// PressureLine is one line of a *.pressure file: the share of wall time
// stalled, averaged over 10 s, 60 s and 300 s (percent), and the total.
type PressureLine struct {
	Avg10  float64       `json:"avg10"`
	Avg60  float64       `json:"avg60"`
	Avg300 float64       `json:"avg300"`
	Total  time.Duration `json:"total"`
}

// ParsePressure parses the contents of a cgroup or /proc/pressure file.
func ParsePressure(s string) (Pressure, error) {
	var p Pressure
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var dst *PressureLine
		switch f[0] {
		case "some":
			dst = &p.Some
		case "full":
			dst = &p.Full
		default:
			return Pressure{}, fmt.Errorf("pressure: unknown line %q", line)
		}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return Pressure{}, fmt.Errorf("pressure: field %q", kv)
			}
			var err error
			switch k {
			case "avg10":
				dst.Avg10, err = strconv.ParseFloat(v, 64)
			case "avg60":
				dst.Avg60, err = strconv.ParseFloat(v, 64)
			case "avg300":
				dst.Avg300, err = strconv.ParseFloat(v, 64)
			case "total":
				var us uint64
				us, err = strconv.ParseUint(v, 10, 64)
				dst.Total = time.Duration(min(us, uint64(1<<63-1)/1000)) * time.Microsecond
			}
			if err != nil {
				return Pressure{}, fmt.Errorf("pressure: field %q: %w", kv, err)
			}
		}
	}
	return p, nil
}

func readPressure(file string) (Pressure, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return Pressure{}, err
	}
	return ParsePressure(string(b))
}
