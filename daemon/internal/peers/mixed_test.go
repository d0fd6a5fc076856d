package peers

import (
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices"
)

// mixedHost is a host with an H100 (GPU 0) beside two L4s.
func mixedHost() hostplacer.Hardware {
	ok := devices.Health{Healthy: true}
	hw := hostplacer.Hardware{Name: "mixed", CPU: 32000, Memory: 256 << 30}
	hw.GPUs = []devices.Device{
		{ID: "GPU-h100", Kind: devices.GPU, Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559, Health: ok},
		{ID: "GPU-l4a", Kind: devices.GPU, Model: "NVIDIA L4", MemoryMB: 23034, Health: ok},
		{ID: "GPU-l4b", Kind: devices.GPU, Model: "NVIDIA L4", MemoryMB: 23034, Health: ok},
	}
	return hw
}

// TestMixedHostGossipAgreesWithPlacer: what a host of two GPU models
// gossips, ranked by a peer, and what the host's own placer then does
// with the job agree: an L4 job is offered and lands on an L4; a job for
// three GPUs of one model is neither offered nor admitted; an H100 job
// with the H100 taken is not offered and waits at home.
func TestMixedHostGossipAgreesWithPlacer(t *testing.T) {
	p := hostplacer.New(mixedHost(), hostplacer.Options{})
	jobsOf := newFakeJobs()
	jobsOf.heldDevices = map[string]bool{} // the jobs' devices, as the manager reports them
	place := func(id string, s api.JobSpec) (string, bool) {
		allocs, why, ok := p.Place([]*api.Job{{ID: id, Spec: s, Tier: api.TierBurstable}})
		if ok {
			for _, g := range allocs[0].GPUs {
				jobsOf.heldDevices[g] = true
			}
			return strings.Join(allocs[0].GPUs, ","), true
		}
		return why, false
	}
	spec := func(count int, model string) api.JobSpec {
		s := api.JobSpec{Name: model, Class: api.ClassInference, Command: []string{"x"},
			Resources: api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: count, Model: model}}}
		s.ApplyDefaults()
		return s
	}
	rank := func(s api.JobSpec) ([]candidate, []string) {
		return ranker{}.rank(s, []candidate{{name: "mixed", load: localLoad(p, jobsOf)}})
	}
	l4 := spec(1, "L4")
	if ranked, skipped := rank(l4); len(ranked) != 1 {
		t.Fatalf("the L4 job is not offered to the mixed host: %v", skipped)
	}
	if err := p.Admit(l4); err != nil {
		t.Fatalf("the mixed host refuses the L4 job it gossips room for: %v", err)
	}
	if got, ok := place("j-l4", l4); !ok || !strings.HasPrefix(got, "GPU-l4") || strings.Contains(got, ",") {
		t.Fatalf("the L4 job placed on %q (ok %v), want one L4", got, ok)
	}

	three := spec(3, "")
	if ranked, _ := rank(three); len(ranked) != 0 {
		t.Fatal("three GPUs of one model offered to a host with one H100 and two L4s")
	}
	if err := p.Admit(three); err == nil {
		t.Fatal("the mixed host admits three GPUs of one model")
	}

	h100 := spec(1, "h100")
	if got, ok := place("j-h100", h100); !ok || got != "GPU-h100" {
		t.Fatalf("the H100 job placed on %q (ok %v), want the H100", got, ok)
	}
	ranked, skipped := rank(spec(1, "h100"))
	if len(ranked) != 0 || len(skipped) != 1 || !strings.Contains(skipped[0], "gpu model not allowed") {
		t.Fatalf("a second H100 job offered (%d) or refused for another reason: %v", len(ranked), skipped)
	}
	if got, ok := place("j-h100b", h100); ok || !strings.Contains(got, "gpu") {
		t.Fatalf("a second H100 job placed at home (%q): it would take an L4", got)
	}
}
