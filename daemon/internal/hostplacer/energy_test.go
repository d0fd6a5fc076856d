package hostplacer

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

// Consolidation leaves idle GPUs idle: on the DGX H200 host, with no power
// readings (the GPU model table's idle draw stands, see buildNode), a GPU
// share goes to the GPU an earlier share already woke, not to one of the
// idle ones. Two whole-GPU jobs come and go first, so the awake GPU is not
// the one a tie between idle GPUs would pick. With the energy dimension
// alone deciding (the other dimensions weighted 0) it is the energy
// dimension that does it; with the daemon's default profiles the inference
// class does the same.
func TestSharesGoToTheAwakeGPU(t *testing.T) {
	var energy sched.Weights
	energy[sched.DimEnergy] = 1
	for name, profiles := range map[string]sched.Profiles{
		"energy only": {sched.ClassInference: energy},
		"defaults":    nil,
	} {
		p := New(dgx(), Options{Seed: 1, Profiles: profiles})
		place := func(id string, res api.Resources) api.Allocation {
			t.Helper()
			j := job(id, api.TierBurstable, res)
			j.Spec.Class = api.ClassInference
			allocs, why, ok := p.Place([]*api.Job{j})
			if !ok {
				t.Fatalf("%s: job %s not placed: %s", name, id, why)
			}
			return allocs[0]
		}
		w1, w2 := place("w1", gpus(1)), place("w2", gpus(1))
		s1 := place("s1", share(300))
		if s1.GPUShare == nil {
			t.Fatalf("%s: s1 is not a share: %+v", name, s1)
		}
		first := s1.GPUShare.GPU
		p.Release(&api.Job{ID: "w1"})
		p.Release(&api.Job{ID: "w2"})
		for i, milli := range []int{300, 200} {
			a := place(string(rune('2'+i)), share(milli))
			if a.GPUShare == nil || a.GPUShare.GPU != first {
				t.Fatalf("%s: share %d woke %+v while %s (awake, room left) could hold it; %v and %v are idle again\n%s", name, i+2, a.GPUShare, first, w1.GPUs, w2.GPUs, a.Explain)
			}
			// The energy part is what tells them apart (the engine's
			// tie-break alone would also pack): the awake GPU's is above
			// every idle candidate's.
			parts := energyParts(t, a.Explain)
			for _, e := range parts[1:] {
				if parts[0] <= e {
					t.Fatalf("%s: share %d: the awake GPU's energy part %v is not above an idle one's %v\n%s", name, i+2, parts[0], e, a.Explain)
				}
			}
		}
		if n := p.Allocated().GPUs; n != 1 {
			t.Errorf("%s: %d GPUs hold work, want 1", name, n)
		}
	}
}

// The awake GPU is judged by its measured draw once telemetry reports
// one: a GPU another process keeps busy (drawing 400 W, not held by any
// job here) takes the share rather than a GPU at its idle draw; with the
// readings moved to another GPU the choice moves with them.
func TestShareFollowsMeasuredPower(t *testing.T) {
	var energy sched.Weights
	energy[sched.DimEnergy] = 1
	src := &fakeLive{}
	p := New(dgx(), Options{Seed: 1, Profiles: sched.Profiles{sched.ClassInference: energy}, Live: src})
	for i, awake := range []string{"GPU-e", "GPU-b"} {
		src.mu.Lock()
		src.l.GPUs = map[string]GPULive{}
		for _, g := range dgx().GPUs {
			src.l.GPUs[g.ID] = GPULive{PowerW: 70}
		}
		src.l.GPUs[awake] = GPULive{PowerW: 400, SMUtil: 0.3}
		src.mu.Unlock()
		p.liveAt = p.liveAt.AddDate(-1, 0, 0) // read the new readings now
		j := job(string(rune('1'+i)), api.TierBurstable, share(250))
		j.Spec.Class = api.ClassInference
		allocs, why, ok := p.Place([]*api.Job{j})
		if !ok || allocs[0].GPUShare == nil {
			t.Fatalf("job %d not placed: %s", i+1, why)
		}
		if got := allocs[0].GPUShare.GPU; got != awake {
			t.Fatalf("job %d went to %s, want the awake %s\n%s", i+1, got, awake, allocs[0].Explain)
		}
		p.Release(j)
	}
}

// energyParts is the energy part of each candidate in a placement's
// explanation, best candidate first; it fails the test when fewer than two
// candidates are listed.
func energyParts(t *testing.T, explain string) []float64 {
	t.Helper()
	var out []float64
	for line := range strings.SplitSeq(explain, "\n") {
		if !strings.Contains(line, " gpus [") {
			continue
		}
		_, after, ok := strings.Cut(line, "energy=")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(after)[0], 64)
		if err != nil {
			t.Fatalf("energy part %q: %v", after, err)
		}
		out = append(out, v)
	}
	if len(out) < 2 {
		t.Fatalf("want two or more candidates with an energy part:\n%s", explain)
	}
	return out
}
