package daemon

import (
	"fmt"
	"time"

	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// SchedulingConfig tunes the queue, preemption and defragmentation
// (docs/scheduling.md, "Queue", "Preemption" and "Defragmentation").
type SchedulingConfig struct {
	// AgingPerMinute is the priority (0..1000) a pending job gains per
	// minute it waits, so nothing starves: a job is behind no job that
	// arrives more than (1000 − its priority)/aging minutes after it.
	// 0 turns aging off.
	AgingPerMinute float64 `json:"aging_per_minute"`
	// GangTimeout is how long the members of a gang wait for the rest of
	// it to be submitted before they fail; 0 waits forever.
	GangTimeout Duration         `json:"gang_timeout"`
	Preemption  PreemptionConfig `json:"preemption"`
	Defrag      DefragConfig     `json:"defrag"`
}

// DefragConfig lets the job first in the queue, when it does not fit,
// have movable jobs (spec.movable, or best-effort) stopped and started
// again elsewhere on this host to make room for it.
type DefragConfig struct {
	// Enabled turns defragmentation on.
	Enabled bool `json:"enabled"`
	// MaxMoves bounds the jobs moved per Window.
	MaxMoves int      `json:"max_moves"`
	Window   Duration `json:"window"`
	// MinIntervalPerJob is how long a moved job is not moved again.
	MinIntervalPerJob Duration `json:"min_interval_per_job"`
}

// PreemptionConfig lets a waiting job evict lower-tier jobs.
type PreemptionConfig struct {
	// Enabled turns preemption on.
	Enabled bool `json:"enabled"`
	// MaxEvictions bounds the jobs preempted per Window.
	MaxEvictions int      `json:"max_evictions"`
	Window       Duration `json:"window"`
}

// DefaultSchedulingConfig is the scheduling section's defaults.
func DefaultSchedulingConfig() SchedulingConfig {
	return SchedulingConfig{
		AgingPerMinute: 10,
		GangTimeout:    Duration(10 * time.Minute),
		Preemption:     PreemptionConfig{Enabled: true, MaxEvictions: 8, Window: Duration(10 * time.Minute)},
		Defrag:         DefragConfig{Enabled: true, MaxMoves: 4, Window: Duration(10 * time.Minute), MinIntervalPerJob: Duration(30 * time.Minute)},
	}
}

// validate returns the key of the first bad setting and why.
func (s SchedulingConfig) validate() (string, error) {
	switch {
	case s.AgingPerMinute < 0 || s.AgingPerMinute > 1000:
		return "scheduling.aging_per_minute", fmt.Errorf("between 0 and 1000 priority points per minute, got %g", s.AgingPerMinute)
	case s.GangTimeout < 0:
		return "scheduling.gang_timeout", fmt.Errorf("must not be negative (0: wait forever), got %s", time.Duration(s.GangTimeout))
	case s.Preemption.MaxEvictions < 1 || s.Preemption.MaxEvictions > 10000:
		return "scheduling.preemption.max_evictions", fmt.Errorf("between 1 and 10000 per window, got %d (turn preemption off with enabled: false)", s.Preemption.MaxEvictions)
	case s.Preemption.Window < Duration(time.Second):
		return "scheduling.preemption.window", fmt.Errorf("at least 1s, got %s", time.Duration(s.Preemption.Window))
	case s.Defrag.MaxMoves < 1 || s.Defrag.MaxMoves > 1000:
		return "scheduling.defrag.max_moves", fmt.Errorf("between 1 and 1000 per window, got %d (turn defragmentation off with enabled: false)", s.Defrag.MaxMoves)
	case s.Defrag.Window < Duration(time.Second):
		return "scheduling.defrag.window", fmt.Errorf("at least 1s, got %s", time.Duration(s.Defrag.Window))
	case s.Defrag.MinIntervalPerJob < Duration(time.Second):
		return "scheduling.defrag.min_interval_per_job", fmt.Errorf("at least 1s, got %s", time.Duration(s.Defrag.MinIntervalPerJob))
	}
	return "", nil
}

// queue is the job manager's view of the section.
func (s SchedulingConfig) queue() jobs.QueueConfig {
	return jobs.QueueConfig{
		AgingPerMinute:   s.AgingPerMinute,
		GangTimeout:      time.Duration(s.GangTimeout),
		NoPreemption:     !s.Preemption.Enabled,
		MaxEvictions:     s.Preemption.MaxEvictions,
		PreemptionWindow: time.Duration(s.Preemption.Window),
		Defrag: jobs.DefragConfig{
			Enabled:     s.Defrag.Enabled,
			MaxMoves:    s.Defrag.MaxMoves,
			Window:      time.Duration(s.Defrag.Window),
			MinInterval: time.Duration(s.Defrag.MinIntervalPerJob),
		},
	}
}
