package hostplacer

import (
	"errors"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// dgx is an HGX-class host: 2 NUMA nodes, 8 GPUs (4 per node) all joined by
// NVLink, two FPGA regions on node 1, one holding "gzip".
func dgx() Hardware {
	hw := Hardware{Name: "dgx", CPU: 224000, Memory: 2 << 40, Cores: smtCores(2, 56)}
	ok := devices.Health{Healthy: true}
	for i := range 8 {
		hw.GPUs = append(hw.GPUs, devices.Device{ID: "GPU-" + string(rune('a'+i)), Kind: devices.GPU, Model: "NVIDIA H200", MemoryMB: 143771, NUMA: i / 4, Health: ok})
	}
	for a := range 8 {
		for b := a + 1; b < 8; b++ {
			hw.NVLink = append(hw.NVLink, [2]int{a, b})
		}
	}
	hw.FPGAs = []devices.Device{{ID: "fpga-0", Kind: devices.FPGA, ReconfigMs: 4000, NUMA: 1, Health: ok}, {ID: "fpga-1", Kind: devices.FPGA, Bitstream: "gzip", ReconfigMs: 4000, NUMA: 1, Health: ok}}
	return hw
}

func job(id string, tier api.Tier, res api.Resources) *api.Job {
	spec := api.JobSpec{Name: id, Class: api.ClassTraining, Command: []string{"x"}, Resources: res}
	spec.ApplyDefaults()
	return &api.Job{ID: id, Spec: spec, Tier: tier}
}

func TestAdmit(t *testing.T) {
	p := New(dgx(), Options{})
	cases := []struct {
		res   api.Resources
		field string
	}{
		{api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 9}}, "resources.gpu.count"},
		{api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1, Model: "A100"}}, "resources.gpu.model"},
		{api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1, MIG: "1g.18gb"}}, "resources.gpu.mig"},
		{api.Resources{CPU: 300000, Memory: 1 << 30}, "resources.cpu"},
		{api.Resources{CPU: 1000, Memory: 4 << 40}, "resources.memory"},
	}
	for _, c := range cases {
		spec := job("x", api.TierBurstable, c.res).Spec
		err := p.Admit(spec)
		var e *api.Error
		if !errors.As(err, &e) || e.Code != api.CodeUnsatisfiable || e.Field != c.field {
			t.Errorf("%+v: got %v, want unsatisfiable on %s", c.res, err, c.field)
		}
	}
	if err := p.Admit(job("ok", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 8, Model: "h200"}}).Spec); err != nil {
		t.Errorf("8 × H200 refused: %v", err)
	}
}

func TestPlaceLocalityGangAndRelease(t *testing.T) {
	p := New(dgx(), Options{Seed: 1})
	four := job("1", api.TierGuaranteed, api.Resources{CPU: 8000, Memory: 64 << 30, GPU: &api.GPURequest{Count: 4}})
	allocs, why, ok := p.Place([]*api.Job{four})
	if !ok {
		t.Fatalf("4-GPU job not placed: %s", why)
	}
	a := allocs[0]
	if len(a.Devices) != 4 || a.NUMANode < 0 {
		t.Fatalf("allocation %+v", a)
	}
	numa := map[int]bool{}
	for _, d := range a.Devices {
		numa[int(d[len(d)-1]-'a')/4] = true
	}
	if len(numa) != 1 {
		t.Errorf("4 GPUs spread over NUMA nodes %v; they fit on one", numa)
	}
	// A gang of two 4-GPU members fits only once the first job is gone:
	// nothing of it is placed meanwhile.
	g1 := job("2", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 4}})
	g2 := job("3", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 4}})
	if _, why, ok := p.Place([]*api.Job{g1, g2}); ok {
		t.Fatal("gang of 8 GPUs placed while 4 are taken")
	} else if !strings.Contains(why, "gang") {
		t.Errorf("reason %q", why)
	}
	if got := p.Allocated().GPUs; got != 4 {
		t.Errorf("a failed gang changed the allocation: %d GPUs held", got)
	}
	p.Release(four)
	p.Release(four)
	if got := p.Allocated(); got.GPUs != 0 || got.CPU != 0 {
		t.Errorf("after release: %+v", got)
	}
	if _, why, ok := p.Place([]*api.Job{g1, g2}); !ok {
		t.Fatalf("gang not placed on an empty host: %s", why)
	}
}

func TestSharesAndFPGAAffinity(t *testing.T) {
	p := New(dgx(), Options{Seed: 1})
	var gpus []string
	for i := range 4 {
		j := job(string(rune('a'+i)), api.TierBurstable, api.Resources{CPU: 500, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1, Share: 250}})
		allocs, why, ok := p.Place([]*api.Job{j})
		if !ok {
			t.Fatalf("share %d: %s", i, why)
		}
		gpus = append(gpus, allocs[0].GPUShare.GPU)
	}
	if p.Allocated().GPUs != 1 {
		t.Errorf("four quarter shares used %d GPUs (%v); they pack onto one", p.Allocated().GPUs, gpus)
	}
	f := job("f", api.TierBurstable, api.Resources{CPU: 500, Memory: 1 << 30, FPGA: &api.FPGARequest{Bitstream: "gzip"}})
	allocs, why, ok := p.Place([]*api.Job{f})
	if !ok || allocs[0].Devices[0] != "fpga-1" {
		t.Errorf("FPGA job got %v (%s), want fpga-1 which already holds gzip", allocs, why)
	}
}

// After a daemon restart a re-attached job's devices are reserved again
// from its recorded allocation: nothing is handed out twice.
func TestReclaim(t *testing.T) {
	first := New(dgx(), Options{Seed: 1})
	j := job("1", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 4}})
	allocs, why, ok := first.Place([]*api.Job{j})
	if !ok {
		t.Fatal(why)
	}
	j.Allocation = &allocs[0]
	share := job("2", api.TierBurstable, api.Resources{CPU: 500, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1, Share: 500, Memory: 1 << 30}})
	allocs, why, ok = first.Place([]*api.Job{share})
	if !ok {
		t.Fatal(why)
	}
	share.Allocation = &allocs[0]

	restarted := New(dgx(), Options{Seed: 1})
	for _, held := range []*api.Job{j, share} {
		if err := restarted.Reclaim(held); err != nil {
			t.Fatal(err)
		}
		if err := restarted.Reclaim(held); err != nil {
			t.Fatalf("second reclaim: %v", err)
		}
	}
	if got := restarted.Allocated(); got.GPUs != 5 || got.CPU != 1500 {
		t.Errorf("after reclaim: %+v, want 5 GPUs and 1500m CPU held", got)
	}
	four := job("3", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 4}})
	if _, _, ok := restarted.Place([]*api.Job{four}); ok {
		t.Error("4 more whole GPUs placed: only 3 are untouched")
	}
	restarted.Release(j)
	if _, why, ok := restarted.Place([]*api.Job{four}); !ok {
		t.Errorf("released GPUs not free again: %s", why)
	}
	gone := job("4", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30})
	gone.Allocation = &api.Allocation{CPU: 1000, Memory: 1 << 30, GPUs: []string{"GPU-nope"}}
	if err := restarted.Reclaim(gone); err == nil {
		t.Error("reclaimed a GPU the host does not have")
	}
}

// TestReclaimByPCIAndNoDoubleBooking: a GPU that answers to a new UUID
// after a restart is found by the PCI address its allocation recorded (and
// the allocation renamed); a second job claiming a GPU already reclaimed
// is refused.
func TestReclaimByPCIAndNoDoubleBooking(t *testing.T) {
	withPCI := func(prefix string) Hardware {
		hw := dgx()
		for i := range hw.GPUs {
			hw.GPUs[i].ID = prefix + string(rune('a'+i))
			hw.GPUs[i].PCI = "0000:0" + string(rune('1'+i)) + ":00.0"
		}
		return hw
	}
	first := New(withPCI("GPU-old-"), Options{Seed: 1})
	j := job("1", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 8}})
	allocs, why, ok := first.Place([]*api.Job{j})
	if !ok {
		t.Fatal(why)
	}
	if len(allocs[0].GPUPCI) != 8 {
		t.Fatalf("allocation records PCI addresses %v, want all 8", allocs[0].GPUPCI)
	}
	j.Allocation = &allocs[0]

	restarted := New(withPCI("GPU-new-"), Options{Seed: 1})
	if err := restarted.Reclaim(j); err != nil {
		t.Fatalf("reclaim by PCI address: %v", err)
	}
	if got := restarted.Allocated().GPUs; got != 8 {
		t.Errorf("%d GPUs held after reclaim, want 8", got)
	}
	for _, id := range j.Allocation.GPUs {
		if !strings.HasPrefix(id, "GPU-new-") || j.Allocation.GPUPCI[id] == "" {
			t.Errorf("allocation still names %s (pci %v)", id, j.Allocation.GPUPCI)
		}
	}
	twin := job("2", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 8}})
	twin.Allocation = &api.Allocation{CPU: 1000, Memory: 1 << 30, NUMANode: -1, GPUs: []string{"GPU-new-a"}}
	if err := restarted.Reclaim(twin); err == nil {
		t.Error("a second job reclaimed a GPU the first already holds: double-booked")
	}
	if got := restarted.Allocated().GPUs; got != 8 {
		t.Errorf("%d GPUs held after the refused reclaim, want 8", got)
	}
}

// A spec's model names a host's GPU model by whole words: "L4" is not an
// L40S, nor "A10" an A100, on a host that holds both.
func TestModelMatches(t *testing.T) {
	for _, tc := range []struct {
		host, spec string
		want       bool
	}{
		{"NVIDIA H200", "h200", true},
		{"NVIDIA H100 80GB HBM3", "H100", true},
		{"NVIDIA H100 80GB HBM3", "h100 80gb", true},
		{"NVIDIA A100-SXM4-80GB", "a100-sxm4", true},
		{"NVIDIA L4", "L4", true},
		{"NVIDIA L40S", "L4", false},
		{"NVIDIA A100-SXM4-80GB", "A10", false},
		{"NVIDIA L4", "", false},
		{"NVIDIA L4", "nvidia l4", true},
	} {
		if got := ModelMatches(tc.host, tc.spec); got != tc.want {
			t.Errorf("ModelMatches(%q, %q) = %v, want %v", tc.host, tc.spec, got, tc.want)
		}
	}
}
