package hostplacer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// h200MIGHost is one H200 in MIG mode (8 memory slots, NVIDIA's starts)
// holding an idle 1g instance at slot idle.
func h200MIGHost(idle int) Hardware {
	hw := dgx()
	hw.GPUs, hw.NVLink = hw.GPUs[:1], nil
	hw.GPUs[0].ReconfigMs = 1500
	hw.GPUs[0].MIG = &devices.MIG{Slots: 8,
		Profiles:  map[string]int{"1g.18gb": 1, "3g.71gb": 4, "4g.71gb": 4, "7g.141gb": 8},
		Starts:    map[string][]int{"1g.18gb": {0, 1, 2, 3, 4, 5, 6}, "3g.71gb": {0, 4}, "4g.71gb": {0}, "7g.141gb": {0}},
		Instances: []devices.MIGInstance{{ID: "MIG-idle", Profile: "1g.18gb", Start: idle, Slots: 1}}}
	return hw
}

// A 4g instance NVIDIA starts only at slot 0 is placed over the idle 1g
// instance there (to be destroyed), not on the free slots 4-7 (where the
// engine's own rule, multiples of 4, would put it); the reservation holds
// across inventories read before and after the driver destroyed the idle
// instance and created the new one.
//
// With the idle instance at slot 0 itself, the inventory read before the
// driver acted has an instance at the reservation's start, of another
// size: the reservation must not claim it as its own (it would hold one
// slot and leave 1-3 to others).
func TestPlaceMIGOverIdleInstance(t *testing.T) {
	for _, idle := range []int{2, 0} {
		t.Run(fmt.Sprintf("idle at %d", idle), func(t *testing.T) { placeMIGOverIdle(t, idle) })
	}
}

func placeMIGOverIdle(t *testing.T, idle int) {
	hw := h200MIGHost(idle)
	p := New(hw, Options{Seed: 1})
	allocs, why, ok := p.Place([]*api.Job{job("big", api.TierBurstable, migReq("4g.71gb"))})
	if !ok {
		t.Fatalf("no place for a 4g over an idle 1g: %s", why)
	}
	if m := allocs[0].MIG; m == nil || m.Start != 0 || m.Instance != "" || m.Profile != "4g.71gb" {
		t.Fatalf("allocation MIG %+v, want a 4g.71gb to create at slot 0", allocs[0].MIG)
	}
	held := func() []int {
		var out []int
		for _, in := range p.node.GPUs[0].MIG.Instances {
			if in.InUse {
				out = append(out, in.Start)
			}
		}
		slices.Sort(out)
		return out
	}
	// The inventory read again before the driver acted (the idle 1g still
	// at 2): the reservation stays whole.
	p.UpdateHardware(h200MIGHost(idle))
	if got := held(); !slices.Equal(got, []int{0}) || p.node.GPUs[0].MIG.Instances[0].Slices != 4 {
		t.Fatalf("instances in use before the driver acted: %v (%+v), want the 4g at 0", got, p.node.GPUs[0].MIG.Instances)
	}
	// The driver destroyed the idle 1g and created the 4g at 0.
	after := h200MIGHost(idle)
	after.GPUs[0].MIG.Instances = []devices.MIGInstance{{ID: "MIG-new", Profile: "4g.71gb", Start: 0, Slots: 4}}
	p.UpdateHardware(after)
	if got := held(); !slices.Equal(got, []int{0}) {
		t.Fatalf("instances in use after the driver acted: %v, want the 4g at 0", got)
	}
	small, why, ok := p.Place([]*api.Job{job("small", api.TierBurstable, migReq("1g.18gb"))})
	if !ok || small[0].MIG == nil || small[0].MIG.Instance != "" || small[0].MIG.Start < 4 {
		t.Fatalf("1g job: %+v (%s), want a new instance on the free slots", small, why)
	}
	// Both instances in use: a 7g finds no room (instances in use are
	// never destroyed).
	if _, _, ok := p.Place([]*api.Job{job("all", api.TierBurstable, migReq("7g.141gb"))}); ok {
		t.Fatal("a 7g placed over instances in use")
	}
}
