package hostplacer

import (
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// migHost is dgx() (7 whole GPUs left) with GPU-h in MIG mode holding two 1g instances (slices
// 0 and 1); slices 2..6 are free for on-demand instances.
func migHost() Hardware {
	hw := dgx()
	hw.GPUs[7].ReconfigMs = 1500
	hw.GPUs[7].MIG = &devices.MIG{Slots: 7, Profiles: map[string]int{"1g.18gb": 1, "3g.71gb": 3},
		Instances: []devices.MIGInstance{{ID: "MIG-h0", Profile: "1g.18gb", Start: 0, Slots: 1}, {ID: "MIG-h1", Profile: "1g.18gb", Start: 1, Slots: 1}}}
	return hw
}

func gpus(n int) api.Resources {
	return api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: n}}
}

func share(milli int) api.Resources {
	return api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Share: milli, Memory: 10 << 30}}
}

func migReq(profile string) api.Resources {
	return api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{MIG: profile}}
}

func TestSetHealthy(t *testing.T) {
	type step struct {
		// one of: place (job ID, resources), release (job ID), health.
		place   string
		res     api.Resources
		fits    bool
		release string
		device  string
		healthy bool
		// after the step: free milli of GPU-a and the in-use flags of
		// GPU-h's instances, when checked.
		freeA  *int64
		migUse []bool
	}
	i64 := func(v int64) *int64 { return &v }
	cases := []struct {
		name  string
		steps []step
	}{
		{"unhealthy GPU blocks a job for every whole GPU until it returns", []step{
			{device: "GPU-a", healthy: false, freeA: i64(0)},
			{place: "7", res: gpus(7), fits: false},
			{device: "GPU-a", healthy: true, freeA: i64(1000)},
			{place: "7", res: gpus(7), fits: true, freeA: i64(0)},
		}},
		{"held share survives; recovery frees exactly what is not held", []step{
			{place: "s1", res: share(300), fits: true},
			{place: "s2", res: share(300), fits: true},
			{device: "GPU-a", healthy: false, freeA: i64(0)},
			{release: "s1", freeA: i64(0)}, // release does not reopen a down GPU
			{device: "GPU-a", healthy: true, freeA: i64(700)},
			{release: "s2", freeA: i64(1000)},
		}},
		{"healthy twice and unknown devices change nothing", []step{
			{device: "GPU-a", healthy: true, freeA: i64(1000)},
			{device: "GPU-zz", healthy: false, freeA: i64(1000)},
			{place: "7", res: gpus(7), fits: true},
		}},
		{"unhealthy MIG GPU: no instance, no on-demand creation", []step{
			{place: "m1", res: migReq("1g.18gb"), fits: true, migUse: []bool{true, false}},
			{device: "GPU-h", healthy: false, migUse: []bool{true, true}},
			{place: "m2", res: migReq("1g.18gb"), fits: false},
			{place: "m3", res: migReq("3g.71gb"), fits: false},
			{device: "GPU-h", healthy: true, migUse: []bool{true, false}},
			{place: "m3", res: migReq("3g.71gb"), fits: true},
			{place: "m2", res: migReq("1g.18gb"), fits: true, migUse: []bool{true, true}},
		}},
		{"unhealthy MIG instance alone is skipped", []step{
			{device: "MIG-h0", healthy: false, migUse: []bool{true, false}},
			{place: "m1", res: migReq("1g.18gb"), fits: true, migUse: []bool{true, true}},
			{release: "m1", migUse: []bool{true, false}},
			{device: "MIG-h0", healthy: true, migUse: []bool{false, false}},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := New(migHost(), Options{Seed: 1})
			jobs := map[string]*api.Job{}
			for i, s := range c.steps {
				switch {
				case s.place != "":
					j := job(s.place, api.TierBurstable, s.res)
					_, why, ok := p.Place([]*api.Job{j})
					if ok != s.fits {
						t.Fatalf("step %d: place %s: fits=%v (%s), want %v", i, s.place, ok, why, s.fits)
					}
					if !ok && len(p.Unhealthy()) > 0 && !strings.Contains(why, "out of service") {
						t.Errorf("step %d: wait reason %q does not name the devices out of service", i, why)
					}
					if ok {
						jobs[s.place] = j
					}
				case s.release != "":
					p.Release(jobs[s.release])
				default:
					known := p.SetHealthy(s.device, s.healthy)
					if known != (s.device != "GPU-zz") {
						t.Errorf("step %d: SetHealthy(%s) known=%v", i, s.device, known)
					}
				}
				if s.freeA != nil {
					if got := p.node.GPUs[0].MilliFree; got != *s.freeA {
						t.Errorf("step %d: GPU-a free milli %d, want %d", i, got, *s.freeA)
					}
				}
				if s.migUse != nil {
					var got []bool
					for _, in := range p.node.GPUs[7].MIG.Instances {
						if in.Start < 2 && in.Profile != unhealthyMIG {
							got = append(got, in.InUse)
						}
					}
					if len(got) != len(s.migUse) || got[0] != s.migUse[0] || got[1] != s.migUse[1] {
						t.Errorf("step %d: GPU-h instances in use %v, want %v", i, got, s.migUse)
					}
				}
			}
		})
	}
}

func TestUnhealthyAtStartAdmitsButWaits(t *testing.T) {
	hw := dgx()
	hw.GPUs[3].Health.Healthy = false
	p := New(hw, Options{})
	if err := p.Admit(job("8", api.TierBurstable, gpus(8)).Spec); err != nil {
		t.Fatalf("8 GPUs refused while one is only out of service: %v", err)
	}
	if _, why, ok := p.Place([]*api.Job{job("8", api.TierBurstable, gpus(8))}); ok || !strings.Contains(why, "GPU-d") {
		t.Fatalf("placed=%v reason %q, want a wait naming GPU-d", ok, why)
	}
	if got := p.Allocated().GPUs; got != 0 {
		t.Errorf("an unhealthy GPU counts as allocated: %d", got)
	}
	p.SetHealthy("GPU-d", true)
	if _, why, ok := p.Place([]*api.Job{job("8", api.TierBurstable, gpus(8))}); !ok {
		t.Fatalf("8 GPUs not placed after recovery: %s", why)
	}
	if got := p.Allocated().GPUs; got != 8 {
		t.Errorf("allocated GPUs %d, want 8", got)
	}
	var free int64
	for _, g := range p.node.GPUs {
		free += g.MilliFree
	}
	if free != 0 || p.node.GPUs[3].MilliFree != 0 {
		t.Errorf("free milli after 8-GPU job: %d", free)
	}
}

func TestBestEffortOnly(t *testing.T) {
	p := New(dgx(), Options{Seed: 1})
	be := job("be", api.TierBestEffort, share(300))
	if _, why, ok := p.Place([]*api.Job{be}); !ok {
		t.Fatal(why)
	}
	got := p.BestEffortOnly()
	if len(got) != 1 {
		t.Fatalf("best-effort-only GPUs %v, want the one GPU the share is on", got)
	}
	var gpu string
	for id := range got {
		gpu = id
	}
	// A guaranteed share on the same GPU takes it out of the set.
	g := job("g", api.TierGuaranteed, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Share: 700, Memory: 10 << 30}})
	allocs, why, ok := p.Place([]*api.Job{g})
	if !ok {
		t.Fatal(why)
	}
	set, on := p.BestEffortOnly(), allocs[0].GPUShare.GPU
	if set[on] {
		t.Errorf("GPU %s holds a guaranteed job but is reported best-effort only", on)
	}
	if on != gpu && !set[gpu] {
		t.Errorf("GPU %s still holds only the best-effort share but left the set %v", gpu, set)
	}
	p.Release(be)
	p.Release(g)
	if got := p.BestEffortOnly(); len(got) != 0 {
		t.Errorf("idle GPUs reported: %v", got)
	}
}

// TestUpdateHardware replaces the inventory under held reservations: a MIG
// instance the driver created elsewhere than the engine chose is adopted
// by the job waiting for it, health and loaded bitstreams follow the new
// inventory, and nothing held is handed out again.
func TestUpdateHardware(t *testing.T) {
	p := New(migHost(), Options{Seed: 1})
	j := job("m1", api.TierBurstable, migReq("3g.71gb"))
	allocs, why, ok := p.Place([]*api.Job{j})
	if !ok {
		t.Fatal(why)
	}
	chosen := allocs[0].MIG.Start
	if allocs[0].MIG.Instance != "" {
		t.Fatalf("3g instance %+v exists before creation", allocs[0].MIG)
	}
	// The driver created the instance at the other free 3-slot start.
	created := 2
	if chosen == 2 {
		created = 4
	}
	hw := migHost()
	hw.GPUs[7].MIG.Instances = append(hw.GPUs[7].MIG.Instances, devices.MIGInstance{ID: "MIG-new", Profile: "3g.71gb", Start: created, Slots: 3})
	hw.GPUs[0].Health = devices.Health{Healthy: false, Reason: "Xid 79"}
	hw.FPGAs[0].Bitstream = "zstd"
	p.UpdateHardware(hw)

	if a := p.held["m1"].assign.MIG; a == nil || a.Start != created || a.Create {
		t.Fatalf("held MIG pick %+v, want the created instance at %d", a, created)
	}
	for _, in := range p.node.GPUs[7].MIG.Instances {
		if in.Start == created && !in.InUse {
			t.Errorf("created instance at %d is free while m1 holds it", created)
		}
		if in.Start == chosen && in.Profile != unhealthyMIG {
			t.Errorf("a phantom instance stays at the engine's slot %d: %+v", chosen, in)
		}
	}
	if got := p.Unhealthy(); len(got) != 1 || got[0] != "GPU-a" {
		t.Errorf("out of service %v, want [GPU-a]", got)
	}
	if got := p.node.GPUs[0].MilliFree; got != 0 {
		t.Errorf("unhealthy GPU-a offers %d milli", got)
	}
	if got := p.node.FPGAs[0].Bitstream; got != "zstd" {
		t.Errorf("region fpga-0 holds %q for the placer, want zstd", got)
	}
	// The 3g instance is held: another 3g job finds no room.
	if _, _, ok := p.Place([]*api.Job{job("m2", api.TierBurstable, migReq("3g.71gb"))}); ok {
		t.Error("a second 3g job placed: the held instance was handed out again")
	}
	// A new job for the loaded bitstream needs no programming.
	fj := job("f", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, FPGA: &api.FPGARequest{Bitstream: "zstd"}})
	allocs, why, ok = p.Place([]*api.Job{fj})
	if !ok {
		t.Fatal(why)
	}
	if a := allocs[0].FPGA; a.Region != "fpga-0" || a.Program {
		t.Errorf("FPGA allocation %+v, want fpga-0 without programming", a)
	}
	p.Release(j)
	p.UpdateHardware(migHost())
	if got := p.Unhealthy(); len(got) != 0 {
		t.Errorf("out of service after the GPU recovered: %v", got)
	}
	if len(p.held) != 1 {
		t.Errorf("held %d reservations, want the FPGA job's", len(p.held))
	}
}
