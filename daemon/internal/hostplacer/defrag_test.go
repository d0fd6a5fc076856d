package hostplacer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// Eight GPUs each holding one 500 milli-GPU share (16 placed, one of each
// GPU's released): a whole-GPU job does not fit. PlanMoves names one move
// (a share beside another) and changes nothing; pinned, the whole-GPU job
// takes the GPU the share leaves once it is released (not before: the pin
// waits), and the moved share goes where the plan put it even behind a
// head whose reservation would refuse it as backfill.
func TestPlanMovesAndPins(t *testing.T) {
	p := New(dgx(), Options{})
	byGPU := map[string][]*api.Job{}
	for i := range 16 {
		j := job(fmt.Sprint(i+1), api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Share: 500}})
		a, why, ok := p.Place([]*api.Job{j})
		if !ok {
			t.Fatal(why)
		}
		byGPU[a[0].GPUShare.GPU] = append(byGPU[a[0].GPUShare.GPU], j)
	}
	if len(byGPU) != 8 {
		t.Fatalf("16 shares of 500 on %d GPUs, want 8", len(byGPU))
	}
	var movable []string
	for _, on := range byGPU {
		p.Release(on[1])
		movable = append(movable, on[0].ID)
	}
	head := job("100", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}})
	if _, _, ok := p.Place([]*api.Job{head}); ok {
		t.Fatal("a whole GPU placed beside a share on every GPU")
	}
	if _, err := p.PlanMoves(head, movable, 0); !errors.Is(err, jobs.ErrNoMoves) {
		t.Errorf("a plan with a budget of 0: %v, want ErrNoMoves", err)
	}
	before := p.Allocated()
	plan, err := p.PlanMoves(head, movable, 2)
	if err != nil {
		t.Fatal(err)
	}
	if after := p.Allocated(); after != before {
		t.Errorf("planning changed what is allocated: %+v, was %+v", after, before)
	}
	if len(plan.Moves) != 1 || plan.For != head.ID || len(plan.Pins) != 2 || plan.Why == "" {
		t.Fatalf("plan %+v: want one move, pins for it and the head, and why", plan)
	}
	mv := plan.Moves[0]
	victim := &api.Job{}
	for _, on := range byGPU {
		if on[0].ID == mv.ID {
			victim = on[0]
		}
	}
	if victim.ID == "" || !strings.Contains(mv.From, "(500 milli-GPU)") || !strings.Contains(mv.To, "(500 milli-GPU)") || mv.From == mv.To {
		t.Errorf("move %+v: want from one shared GPU to another, in words", mv)
	}
	p.Pin(plan)
	if _, _, ok := p.Place([]*api.Job{head}); ok {
		t.Fatal("the whole-GPU job placed before the share moved out")
	}
	p.Release(victim) // stopped for the move
	a, why, ok := p.Place([]*api.Job{head})
	if !ok || !strings.Contains(a[0].Explain, "defragmentation plan") || !strings.HasPrefix(mv.From, a[0].GPUs[0]) {
		t.Fatalf("whole-GPU job after the move: %+v %q %v; want the GPU in %q, where the plan put it", a, why, ok, mv.From)
	}
	big := job("101", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 8}})
	a, why, ok = p.PlaceBehind([]*api.Job{victim}, []*api.Job{big})
	if !ok || !strings.HasPrefix(mv.To, a[0].GPUShare.GPU) {
		t.Fatalf("moved share: %+v %q %v; want it on %q", a, why, ok, mv.To)
	}
	// Pins are used once: the share placed again goes where the engine
	// chooses, behind the head's reservation as any backfill.
	p.Release(victim)
	if _, why, ok := p.PlaceBehind([]*api.Job{victim}, []*api.Job{big}); ok || !strings.Contains(why, "first in the queue") {
		t.Errorf("the share placed again behind an 8-GPU head: %v (%s); want refused as backfill", ok, why)
	}
}

// Pins dropped by Unpin (the queue's, once the head is placed or gone)
// or by a hardware rebuild (their device indices are the old
// inventory's) no longer bypass the backfill guard: the moved share is
// refused behind an 8-GPU head's reservation as any backfill.
func TestUnpinAndRebuildDropPins(t *testing.T) {
	for _, how := range []string{"unpin", "rebuild"} {
		t.Run(how, func(t *testing.T) {
			p := New(dgx(), Options{})
			byGPU := map[string][]*api.Job{}
			for i := range 16 {
				j := job(fmt.Sprint(i+1), api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Share: 500}})
				a, why, ok := p.Place([]*api.Job{j})
				if !ok {
					t.Fatal(why)
				}
				byGPU[a[0].GPUShare.GPU] = append(byGPU[a[0].GPUShare.GPU], j)
			}
			var movable []string
			for _, on := range byGPU {
				p.Release(on[1])
				movable = append(movable, on[0].ID)
			}
			head := job("100", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}})
			plan, err := p.PlanMoves(head, movable, 2)
			if err != nil || len(plan.Moves) != 1 {
				t.Fatalf("plan %+v, %v: want one move", plan, err)
			}
			var victim *api.Job
			for _, on := range byGPU {
				if on[0].ID == plan.Moves[0].ID {
					victim = on[0]
				}
			}
			p.Pin(plan)
			p.Release(victim) // stopped for the move
			switch how {
			case "unpin":
				p.Unpin([]string{victim.ID, head.ID})
			case "rebuild":
				p.UpdateHardware(dgx())
			}
			big := job("101", api.TierBurstable, api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 8}})
			if a, why, ok := p.PlaceBehind([]*api.Job{victim}, []*api.Job{big}); ok {
				t.Errorf("the moved share placed behind an 8-GPU head after %s: %+v; want refused as backfill", how, a)
			} else if !strings.Contains(why, "first in the queue") {
				t.Errorf("refused for %q, want as backfill", why)
			}
		})
	}
}
