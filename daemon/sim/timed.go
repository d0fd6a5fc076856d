package sim

import "context"

// UtilPoint is the GPU allocation at one time.
type UtilPoint struct {
	Time    int64   `json:"t"`
	UtilPct float64 `json:"util_pct"`
	Queued  int     `json:"queued"`
}

// TimedResult is one run of the time-ordered mode.
type TimedResult struct {
	Policy      string      `json:"policy"`
	Pods        int         `json:"pods"`
	Placed      int         `json:"placed"`
	NeverPlaced int         `json:"never_placed"`
	MeanUtilPct float64     `json:"mean_util_pct"`
	PeakUtilPct float64     `json:"peak_util_pct"`
	WaitP50     float64     `json:"wait_p50_s"`
	WaitP95     float64     `json:"wait_p95_s"`
	WaitMean    float64     `json:"wait_mean_s"`
	Util        []UtilPoint `json:"util,omitempty"`
}

// RunTimed is implemented in timed mode.
func RunTimed(ctx context.Context, specs []NodeSpec, pods []Pod, policy string, seed uint64, coverage float64) (TimedResult, error) {
	return TimedResult{Policy: policy}, ctx.Err()
}
