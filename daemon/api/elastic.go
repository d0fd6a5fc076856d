package api

import "strings"

// Replicas makes a service or inference job elastic: the daemon runs
// between Min and Max copies of it (the submitted job is the first; the
// others are jobs of their own, labelled LabelReplicaOf), adding copies
// before the Target metric is forecast to pass its value per copy and
// removing them, with hysteresis and a cool-down, when it stays below.
type Replicas struct {
	Min    int         `json:"min"`
	Max    int         `json:"max"`
	Target ScaleTarget `json:"target"`
}

// ScaleTarget is the metric the replicas are sized by and its value per
// replica.
type ScaleTarget struct {
	Metric ScaleMetric `json:"metric"`
	// Value per replica: for cpu, percent of each replica's CPU request
	// (1..1000); for gpu_util, percent SM utilisation of its GPUs
	// (1..100); for custom, the number the job reports (> 0).
	Value float64 `json:"value"`
}

// ScaleMetric names a scaling metric.
type ScaleMetric string

// Scaling metrics. A custom metric is reported by the job itself: the
// last line of its output that reads "FUSIOND_METRIC=<number>" is each
// replica's current value.
const (
	MetricCPU     ScaleMetric = "cpu"
	MetricGPUUtil ScaleMetric = "gpu_util"
	MetricCustom  ScaleMetric = "custom"
)

// ScaleMetrics are the valid metrics.
var ScaleMetrics = []ScaleMetric{MetricCPU, MetricGPUUtil, MetricCustom}

// MaxReplicas bounds Replicas.Max.
const MaxReplicas = 64

// LabelReplicaOf marks a replica job with the ID of the elastic job it
// copies; LabelReplica is its number (2, 3, ...; the elastic job itself
// is 1).
const (
	LabelReplicaOf = "fusiond.io/replica-of"
	LabelReplica   = "fusiond.io/replica"
)

// EventScale is the kind of an elastic job's replica change event,
// EventResize of a burstable job's CPU limit change.
const (
	EventScale  = "scale"
	EventResize = "resize"
)

// CustomMetricPrefix starts the output line a job reports its custom
// metric with.
const CustomMetricPrefix = "FUSIOND_METRIC="

func (s *JobSpec) validateReplicas() error {
	r := s.Replicas
	if r == nil {
		return nil
	}
	switch {
	case s.Class != ClassService && s.Class != ClassInference:
		return FieldError("replicas", "only service and inference jobs scale, not %s", s.Class)
	case s.Gang != nil:
		return FieldError("replicas", "a gang member cannot scale on its own")
	case r.Min < 1 || r.Min > MaxReplicas:
		return FieldError("replicas.min", "must be between 1 and %d, got %d", MaxReplicas, r.Min)
	case r.Max < r.Min || r.Max > MaxReplicas:
		return FieldError("replicas.max", "must be between replicas.min (%d) and %d, got %d", r.Min, MaxReplicas, r.Max)
	case !oneOf(r.Target.Metric, ScaleMetrics):
		return FieldError("replicas.target.metric", "unknown metric %q (want one of: %s)", r.Target.Metric, list(ScaleMetrics))
	case r.Target.Value <= 0:
		return FieldError("replicas.target.value", "must be positive, got %g", r.Target.Value)
	case r.Target.Metric == MetricCPU && r.Target.Value > 1000:
		return FieldError("replicas.target.value", "cpu is a percentage of the CPU request, at most 1000, got %g", r.Target.Value)
	case r.Target.Metric == MetricGPUUtil && r.Target.Value > 100:
		return FieldError("replicas.target.value", "gpu_util is a percentage, at most 100, got %g", r.Target.Value)
	case r.Target.Metric == MetricGPUUtil && (s.Resources.GPU == nil || s.Resources.GPU.MIG != "" || s.Resources.GPU.Share > 0):
		return FieldError("replicas.target.metric", "gpu_util needs whole GPUs in resources.gpu (a MIG instance's or share's utilisation is not measured apart from its GPU's)")
	}
	for k := range s.Labels {
		if strings.HasPrefix(k, "fusiond.io/") {
			return FieldError("labels."+k, "labels starting with fusiond.io/ are set by fusiond")
		}
	}
	return nil
}
