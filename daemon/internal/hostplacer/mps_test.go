package hostplacer

import (
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// mpsHost is a host whose GPUs share through CUDA MPS.
func mpsHost(gpus int) Hardware {
	hw := Hardware{Name: "mps", CPU: 16000, Memory: 64 << 30}
	for i := range gpus {
		hw.GPUs = append(hw.GPUs, devices.Device{ID: "GPU-" + string(rune('a'+i)), Kind: devices.GPU, Model: "NVIDIA H100", MemoryMB: 81559,
			Health: devices.Health{Healthy: true}, MPS: true})
	}
	return hw
}

func shareJob(id string, uid uint32) *api.Job {
	j := job(id, api.TierBurstable, api.Resources{CPU: 100, Memory: 1 << 20, GPU: &api.GPURequest{Share: 250, Memory: 1 << 30}})
	j.Spec.Class = api.ClassInference
	j.Owner = api.Owner{UID: uid}
	return j
}

// Two users' shares are never placed on one MPS GPU: the second user's
// goes to another GPU, or waits saying why; the first user's shares pack
// together; after a restart (Reclaim) the GPU still serves its user; when
// its last share is released it serves the next user.
func TestMPSSharesOneUserPerGPU(t *testing.T) {
	p := New(mpsHost(2), Options{Seed: 1})
	gpuOf := func(j *api.Job) string {
		t.Helper()
		allocs, why, ok := p.Place([]*api.Job{j})
		if !ok {
			t.Fatalf("%s not placed: %s", j.ID, why)
		}
		j.Allocation = &allocs[0]
		return allocs[0].GPUShare.GPU
	}
	a1, a2, b1 := shareJob("a1", 1000), shareJob("a2", 1000), shareJob("b1", 2000)
	ga := gpuOf(a1)
	if g := gpuOf(a2); g != ga {
		t.Fatalf("uid 1000's second share on %s, want beside its first on %s", g, ga)
	}
	gb := gpuOf(b1)
	if gb == ga {
		t.Fatalf("uid 2000's share on %s beside uid 1000's", gb)
	}
	if !strings.Contains(b1.Allocation.Explain, "(MPS: one user's shares at a time) serves uid:1000") {
		t.Errorf("the explanation does not say which user each MPS GPU serves:\n%s", b1.Allocation.Explain)
	}
	c1 := shareJob("c1", 3000)
	if _, why, ok := p.Place([]*api.Job{c1}); ok || !strings.Contains(why, "another user's shares") {
		t.Fatalf("a third user's share: placed=%v, %q; want it to wait for an MPS GPU of its own", ok, why)
	}
	// The daemon restarts: the held shares are reclaimed from their
	// records, and the GPUs still serve their users.
	q := New(mpsHost(2), Options{Seed: 1})
	for _, j := range []*api.Job{a1, a2, b1} {
		if err := q.Reclaim(j); err != nil {
			t.Fatal(err)
		}
	}
	if _, why, ok := q.Place([]*api.Job{shareJob("c2", 3000)}); ok {
		t.Fatalf("after a restart a third user's share was placed beside the reclaimed ones (%s)", why)
	}
	// uid 1000's shares end: its GPU serves uid 3000.
	for _, j := range []*api.Job{a1, a2} {
		q.Release(j)
	}
	allocs, why, ok := q.Place([]*api.Job{shareJob("c3", 3000)})
	if !ok || allocs[0].GPUShare.GPU != ga {
		t.Fatalf("uid 3000 after uid 1000 left: ok=%v %s %+v, want %s", ok, why, allocs, ga)
	}
}
