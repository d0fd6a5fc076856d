package daemon

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/fusiond/fusiond/cgroups/resctrl"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/qos"
	"github.com/fusiond/fusiond/ebpf"
)

// QoSConfig is the latency SLO defaults and the QoS loop's tuning.
type QoSConfig struct {
	// Enabled runs the QoS loop (when the kernel can run the probes and
	// jobs have cgroups).
	Enabled bool `json:"enabled"`
	// Window is how often the loop reads the histograms.
	Window Duration `json:"window"`
	// Classes is the SLO a job of each class gets when its spec sets
	// none; a class not listed is not protected.
	Classes map[api.Class]api.QoS `json:"classes"`
	// MinBestEffortCPU is the floor of the best-effort tier's quota.
	MinBestEffortCPU api.MilliCPU `json:"min_besteffort_cpu"`
	// Shrink multiplies the best-effort quota on a breach, in (0, 1).
	Shrink float64 `json:"shrink"`
	// RestoreStep is added back per RestoreAfter within SLO.
	RestoreStep  api.MilliCPU `json:"restore_step"`
	RestoreAfter Duration     `json:"restore_after"`
	// MinEvents is how many run-queue events a window needs to count.
	MinEvents uint64 `json:"min_events"`
	// MinBlame is the least share of a breaching job's run-queue wait
	// that best-effort work must have held the CPU for before the loop
	// cuts its quota (0 to 1, exclusive of 1; default 0.1): a breach
	// others caused is noted, not acted on.
	MinBlame float64 `json:"min_blame"`
	// BreachWindows is how many windows in a row a protected job's p99
	// must break its SLO (best-effort to blame) before the loop cuts the
	// quota (1-100; default 2): one window's p99 is noisy.
	BreachWindows int `json:"breach_windows"`
	// MinBestEffortMemory is the floor of the best-effort memory high.
	MinBestEffortMemory api.Bytes `json:"min_besteffort_memory"`
	// MaxJobs is how many job cgroups the latency probe times at once
	// (1..8192; default 1024), the size of its kernel maps. A job beyond
	// it is not timed (a protected job takes an unprotected job's slot);
	// fusionctl status notes it, fusiond_qos_untimed_jobs counts it and
	// one warning is logged per episode.
	MaxJobs int `json:"max_jobs"`
	// Resctrl drives best-effort work's share of the caches and of memory
	// bandwidth with the CPU quota, where the host has resctrl (Intel
	// RDT, AMD PQoS) mounted at ResctrlRoot.
	Resctrl     bool   `json:"resctrl"`
	ResctrlRoot string `json:"resctrl_root"`
}

// DefaultQoSConfig protects service and inference jobs at a 2 ms
// run-queue p99.
func DefaultQoSConfig() QoSConfig {
	return QoSConfig{
		Enabled: true,
		Window:  Duration(time.Second),
		Classes: map[api.Class]api.QoS{
			api.ClassService:   {RunqueueP99: api.Duration(2 * time.Millisecond)},
			api.ClassInference: {RunqueueP99: api.Duration(2 * time.Millisecond)},
		},
		MinBestEffortCPU:    100,
		Shrink:              0.5,
		RestoreStep:         500,
		RestoreAfter:        Duration(10 * time.Second),
		MinEvents:           20,
		MinBlame:            0.1,
		BreachWindows:       2,
		MinBestEffortMemory: 256 << 20,
		MaxJobs:             ebpf.MaxCgroups,
		Resctrl:             true,
		ResctrlRoot:         resctrl.DefaultRoot,
	}
}

func (c QoSConfig) validate() (string, error) {
	if c.Window < Duration(10*time.Millisecond) {
		return "qos.window", fmt.Errorf("at least 10ms, got %v", time.Duration(c.Window))
	}
	for class, q := range c.Classes {
		if !slices.Contains(api.Classes, class) {
			return "qos.classes." + string(class), fmt.Errorf("unknown class (want training, inference, batch or service)")
		}
		if err := q.Validate("qos.classes." + string(class)); err != nil {
			return "qos.classes." + string(class), err
		}
	}
	switch {
	case c.MinBestEffortCPU <= 0:
		return "qos.min_besteffort_cpu", fmt.Errorf("must be positive")
	case c.Shrink <= 0 || c.Shrink >= 1:
		return "qos.shrink", fmt.Errorf("must be between 0 and 1 (exclusive), got %g", c.Shrink)
	case c.RestoreStep <= 0:
		return "qos.restore_step", fmt.Errorf("must be positive")
	case c.RestoreAfter <= 0:
		return "qos.restore_after", fmt.Errorf("must be positive")
	case c.BreachWindows < 1 || c.BreachWindows > 100:
		return "qos.breach_windows", fmt.Errorf("between 1 and 100 windows, got %d", c.BreachWindows)
	case c.MinBlame < 0 || c.MinBlame >= 1:
		return "qos.min_blame", fmt.Errorf("must be at least 0 and below 1, got %g", c.MinBlame)
	case c.Resctrl && !filepath.IsAbs(c.ResctrlRoot):
		return "qos.resctrl_root", fmt.Errorf("must be an absolute path, got %q", c.ResctrlRoot)
	case c.MinBestEffortMemory < 0:
		return "qos.min_besteffort_memory", fmt.Errorf("must not be negative")
	case c.MaxJobs < 1 || c.MaxJobs > ebpf.MaxCgroupsLimit:
		// The histogram map is a per-CPU array the kernel allocates in
		// full at load: HistogramBytes a slot per possible CPU.
		return "qos.max_jobs", fmt.Errorf("between 1 and %d job cgroups, got %d (the probe's histograms take %d bytes per slot per CPU, allocated at load)", ebpf.MaxCgroupsLimit, c.MaxJobs, ebpf.HistogramBytes)
	}
	return "", nil
}

// params are the controller's parameters.
func (c QoSConfig) params() qos.Params {
	return qos.Params{
		MinMilli: int64(c.MinBestEffortCPU), Shrink: c.Shrink,
		RestoreStep: int64(c.RestoreStep), RestoreAfter: time.Duration(c.RestoreAfter),
		MinEvents: c.MinEvents, MinMemory: int64(c.MinBestEffortMemory), MinBlame: c.MinBlame, BreachWindows: c.BreachWindows,
	}
}

// SLO is the effective SLO of a job: its spec's, else its class default.
func (c QoSConfig) SLO(spec api.JobSpec) *api.QoS {
	if spec.QoS != nil {
		q := *spec.QoS
		return &q
	}
	if q, ok := c.Classes[spec.Class]; ok {
		return &q
	}
	return nil
}
