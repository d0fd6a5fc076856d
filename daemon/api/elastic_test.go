package api

import (
	"errors"
	"testing"
)

func TestValidateReplicas(t *testing.T) {
	base := func() JobSpec {
		return JobSpec{Name: "web", Class: ClassService, Command: []string{"/bin/true"},
			Resources: Resources{CPU: 1000, Memory: 64 << 20},
			Replicas:  &Replicas{Min: 1, Max: 4, Target: ScaleTarget{Metric: MetricCPU, Value: 70}}}
	}
	if s := base(); s.Validate() != nil {
		t.Fatalf("a valid elastic service: %v", s.Validate())
	}
	gpu := base()
	gpu.Class = ClassInference
	gpu.Resources.GPU = &GPURequest{Count: 1}
	gpu.Replicas.Target = ScaleTarget{Metric: MetricGPUUtil, Value: 60}
	if err := gpu.Validate(); err != nil {
		t.Fatalf("a valid elastic inference job on whole GPUs: %v", err)
	}
	for name, c := range map[string]struct {
		edit  func(*JobSpec)
		field string
	}{
		"batch":          {func(s *JobSpec) { s.Class = ClassBatch }, "replicas"},
		"gang":           {func(s *JobSpec) { s.Gang = &Gang{Name: "g", Size: 2} }, "replicas"},
		"min 0":          {func(s *JobSpec) { s.Replicas.Min = 0 }, "replicas.min"},
		"max below min":  {func(s *JobSpec) { s.Replicas.Min, s.Replicas.Max = 3, 2 }, "replicas.max"},
		"max too big":    {func(s *JobSpec) { s.Replicas.Max = MaxReplicas + 1 }, "replicas.max"},
		"metric":         {func(s *JobSpec) { s.Replicas.Target.Metric = "rps" }, "replicas.target.metric"},
		"value 0":        {func(s *JobSpec) { s.Replicas.Target.Value = 0 }, "replicas.target.value"},
		"cpu over 1000%": {func(s *JobSpec) { s.Replicas.Target.Value = 1500 }, "replicas.target.value"},
		"gpu_util no GPU": {func(s *JobSpec) {
			s.Replicas.Target = ScaleTarget{Metric: MetricGPUUtil, Value: 50}
		}, "replicas.target.metric"},
		"gpu_util share": {func(s *JobSpec) {
			s.Resources.GPU = &GPURequest{Count: 1, Share: 500}
			s.Replicas.Target = ScaleTarget{Metric: MetricGPUUtil, Value: 50}
		}, "replicas.target.metric"},
		"gpu_util over 100": {func(s *JobSpec) {
			s.Resources.GPU = &GPURequest{Count: 1}
			s.Replicas.Target = ScaleTarget{Metric: MetricGPUUtil, Value: 101}
		}, "replicas.target.value"},
		"reserved label": {func(s *JobSpec) { s.Labels = map[string]string{LabelReplicaOf: "7"} }, "labels." + LabelReplicaOf},
	} {
		s := base()
		c.edit(&s)
		var ae *Error
		if err := s.Validate(); !errors.As(err, &ae) || ae.Field != c.field {
			t.Errorf("%s: err = %v, want one for %s", name, err, c.field)
		}
	}
}
