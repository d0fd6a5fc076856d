package peers

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/devices"
)

func okLoad(cpu api.MilliCPU, gpus map[string]int) api.PeerLoad {
	l := api.PeerLoad{CPU: cpu, Memory: 64 << 30, GPUs: gpus, Health: "ok"}
	for _, k := range gpus {
		l.GPUShareMilli += 1000 * k
	}
	return l
}

func names(cs []candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.name)
	}
	return out
}

// TestRankInferenceSharePrefersLessLoadedGPUs: two peers with the same
// free GPUs; an inference share goes to the one whose GPUs are less busy
// (the engine's load dimension, from the gossiped GPU load).
func TestRankInferenceSharePrefersLessLoadedGPUs(t *testing.T) {
	busy, idle := okLoad(8000, map[string]int{"NVIDIA H100 80GB HBM3": 2}), okLoad(8000, map[string]int{"NVIDIA H100 80GB HBM3": 2})
	busy.GPULoad, idle.GPULoad = 0.9, 0.1
	spec := api.JobSpec{Class: api.ClassInference, Resources: api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Share: 500}}}
	ranked, skipped := ranker{}.rank(spec, []candidate{{name: "a-busy", load: busy}, {name: "b-idle", load: idle}})
	if len(ranked) != 2 || len(skipped) != 0 || ranked[0].name != "b-idle" {
		t.Fatalf("ranked %v, skipped %v", names(ranked), skipped)
	}
	if ranked[0].parts[4] <= ranked[1].parts[4] || !strings.Contains(ranked[0].explain(), "load ") {
		t.Fatalf("the load dimension does not favour the idle peer: %s vs %s", ranked[0].explain(), ranked[1].explain())
	}
}

// TestRankTrainingPrefersNVLinkAndCapableModels: a 4-GPU training job goes
// to the peer whose free GPUs are joined by NVLink (locality), and among
// peers with as many linked GPUs to the more capable model (compute, from
// the engine's GPU model table).
func TestRankTrainingPrefersNVLinkAndCapableModels(t *testing.T) {
	spec := api.JobSpec{Class: api.ClassTraining, Resources: api.Resources{CPU: 4000, Memory: 8 << 30, GPU: &api.GPURequest{Count: 4}}}
	plain, linked := okLoad(64000, map[string]int{"NVIDIA H100 80GB HBM3": 8}), okLoad(64000, map[string]int{"NVIDIA H100 80GB HBM3": 8})
	plain.NVLink, linked.NVLink = map[string]int{"NVIDIA H100 80GB HBM3": 1}, map[string]int{"NVIDIA H100 80GB HBM3": 8}
	ranked, _ := ranker{}.rank(spec, []candidate{{name: "a-pcie", load: plain}, {name: "b-nvlink", load: linked}})
	if len(ranked) != 2 || ranked[0].name != "b-nvlink" || ranked[0].parts[1] <= ranked[1].parts[1] {
		t.Fatalf("NVLink: ranked %v (%s / %s)", names(ranked), ranked[0].explain(), ranked[1].explain())
	}
	a100, h200 := okLoad(64000, map[string]int{"NVIDIA A100-SXM4-80GB": 8}), okLoad(64000, map[string]int{"NVIDIA H200": 8})
	a100.NVLink, h200.NVLink = map[string]int{"NVIDIA A100-SXM4-80GB": 8}, map[string]int{"NVIDIA H200": 8}
	ranked, _ = ranker{}.rank(spec, []candidate{{name: "a-a100", load: a100}, {name: "b-h200", load: h200}})
	if len(ranked) != 2 || ranked[0].name != "b-h200" || ranked[0].parts[0] <= ranked[1].parts[0] {
		t.Fatalf("model: ranked %v (%s / %s)", names(ranked), ranked[0].explain(), ranked[1].explain())
	}
}

// TestRankFiltersWithReasons: a peer that cannot fit the job by its
// gossiped load is not offered, and the engine's filter says why; of two
// equal peers the one with the older view, or a queue, ranks lower.
func TestRankFiltersWithReasons(t *testing.T) {
	spec := api.JobSpec{Class: api.ClassBatch, Resources: api.Resources{CPU: 2000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 2, Model: "h100"}}}
	h100 := map[string]int{"NVIDIA H100": 2}
	cands := []candidate{
		{name: "small", load: okLoad(1000, h100)},
		{name: "a100", load: okLoad(8000, map[string]int{"NVIDIA A100": 4})},
		{name: "one", load: okLoad(8000, map[string]int{"NVIDIA H100": 1})},
		{name: "cordoned", load: func() api.PeerLoad { l := okLoad(8000, h100); l.Health = "cordoned"; return l }()},
		{name: "old", load: okLoad(8000, h100), age: 4 * time.Second},
		{name: "queued", load: func() api.PeerLoad { l := okLoad(8000, h100); l.Queue = 1; return l }()},
		{name: "fresh", load: okLoad(8000, h100), age: time.Second},
	}
	ranked, skipped := ranker{maxAge: 5 * time.Second}.rank(spec, cands)
	if got := strings.Join(names(ranked), " "); got != "fresh old queued" {
		t.Fatalf("ranked %q (%v)", got, skipped)
	}
	want := []string{"small: insufficient cpu (1000m free)", "a100: gpu model not allowed (free: map[NVIDIA A100:4])", "one: not enough free whole gpus (free: map[NVIDIA H100:1])", "cordoned: cordoned"}
	if strings.Join(skipped, "|") != strings.Join(want, "|") {
		t.Fatalf("skipped %q, want %q", skipped, want)
	}
}

// TestLocalLoadGossipsNVLinkAndGPULoad: the gossip carries the free GPUs
// joined by NVLink (a held GPU breaks its links) and their live load;
// a host without NVLink says nothing of links.
func TestLocalLoadGossipsNVLinkAndGPULoad(t *testing.T) {
	var gpus []devices.Device
	for _, id := range []string{"G0", "G1", "G2", "G3"} {
		gpus = append(gpus, devices.Device{ID: id, Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}})
	}
	h := &fakeHost{cpu: 8000, gpus: gpus, nvlink: [][2]int{{0, 1}, {1, 2}, {2, 3}}, gpuLoad: 0.333}
	j := newFakeJobs()
	j.heldDevices = map[string]bool{"G1": true}
	l := localLoad(h, j)
	if l.GPUs["NVIDIA H100"] != 3 || l.NVLink["NVIDIA H100"] != 2 || l.GPULoad != 0.33 {
		t.Fatalf("gossiped %+v", l)
	}
	h.nvlink = nil
	if l := localLoad(h, j); l.NVLink != nil {
		t.Fatalf("a host without NVLink gossips links %v", l.NVLink)
	}
	var _ Host = (*hostplacer.Placer)(nil)
}

// BenchmarkRank ranks ten 8-GPU peers for a 4-GPU training job.
//
//	go test -run '^$' -bench Rank ./daemon/internal/peers/
func BenchmarkRank(b *testing.B) {
	var cands []candidate
	for i := range 10 {
		l := okLoad(64000, map[string]int{"NVIDIA H100": 8})
		l.NVLink = map[string]int{"NVIDIA H100": 8 - i%4}
		cands = append(cands, candidate{name: string(rune('a' + i)), load: l})
	}
	spec := api.JobSpec{Class: api.ClassTraining, Resources: api.Resources{CPU: 4000, Memory: 8 << 30, GPU: &api.GPURequest{Count: 4}}}
	for b.Loop() {
		if r, _ := (ranker{}).rank(spec, cands); len(r) != 10 {
			b.Fatal(len(r))
		}
	}
}

// TestRankMIGAndFPGA: a MIG request fits only a peer with an instance to
// give — one of its profile, or an idle one of another profile that the
// peer's placer would destroy for it (docs/scheduling.md, "Resource
// model"), ranked after the one that needs no reconfiguration; an FPGA job
// prefers the peer whose free region holds its bitstream.
func TestRankMIGAndFPGA(t *testing.T) {
	mig := api.JobSpec{Class: api.ClassInference, Resources: api.Resources{CPU: 500, Memory: 1 << 30, GPU: &api.GPURequest{MIG: "1g.10gb"}}}
	with, other, none := okLoad(8000, nil), okLoad(8000, nil), okLoad(8000, nil)
	with.MIG, other.MIG, none.MIG = map[string]int{"1g.10gb": 3, "3g.40gb": 0}, map[string]int{"3g.40gb": 2}, map[string]int{"3g.40gb": 0}
	ranked, skipped := ranker{}.rank(mig, []candidate{{name: "other", load: other}, {name: "with", load: with}, {name: "none", load: none}})
	if len(ranked) != 2 || ranked[0].name != "with" || ranked[1].name != "other" || len(skipped) != 1 || !strings.HasPrefix(skipped[0], "none: ") {
		t.Fatalf("MIG: ranked %v, skipped %v", names(ranked), skipped)
	}
	fpga := api.JobSpec{Class: api.ClassBatch, Resources: api.Resources{CPU: 500, Memory: 1 << 20, FPGA: &api.FPGARequest{Bitstream: "fir"}}}
	loaded, blank, none := okLoad(8000, nil), okLoad(8000, nil), okLoad(8000, nil)
	loaded.FPGAFree, loaded.Bitstreams, blank.FPGAFree = 1, []string{"fir"}, 1
	ranked, skipped = ranker{}.rank(fpga, []candidate{{name: "a-blank", load: blank}, {name: "b-loaded", load: loaded}, {name: "c-none", load: none}})
	if len(ranked) != 2 || ranked[0].name != "b-loaded" || len(skipped) != 1 || !strings.HasPrefix(skipped[0], "c-none: ") {
		t.Fatalf("FPGA: ranked %v, skipped %v", names(ranked), skipped)
	}
}

// TestPeerNodesBounded: gossiped counts far beyond any host build bounded
// nodes (the gossip is a peer's word, and the engine models 64 devices).
func TestPeerNodesBounded(t *testing.T) {
	l := okLoad(1000, map[string]int{"NVIDIA H100": 1 << 40})
	l.GPUShareMilli, l.FPGAFree, l.MIG, l.NVLink = 1<<50, 1<<40, map[string]int{"1g.10gb": 1 << 40}, map[string]int{"NVIDIA H100": 1 << 40}
	if n := peerNode("x", l); len(n.GPUs) > 64 || len(n.FPGAs) > 64 || len(n.NVLink) > 64*63/2 {
		t.Fatalf("%d GPUs, %d FPGA regions, %d links", len(n.GPUs), len(n.FPGAs), len(n.NVLink))
	}
}

// TestRankNegativeQueueIsNoBonus: should a negative queue or wait get
// past decoding (validateLoad refuses them), it counts as none: the T4
// peer claiming a queue of −1000 does not outrank the H200 one.
func TestRankNegativeQueueIsNoBonus(t *testing.T) {
	spec := api.JobSpec{Class: api.ClassTraining, Resources: api.Resources{CPU: 1000, Memory: 1 << 30, GPU: &api.GPURequest{Count: 1}}}
	h200, t4 := okLoad(64000, map[string]int{"NVIDIA H200": 8}), okLoad(64000, map[string]int{"Tesla T4": 8})
	honest, _ := ranker{}.rank(spec, []candidate{{name: "h200", load: h200}, {name: "t4", load: t4}})
	t4.Queue, t4.Wait = -1000, api.Duration(-time.Hour)
	lied, _ := ranker{}.rank(spec, []candidate{{name: "h200", load: h200}, {name: "t4", load: t4}})
	if len(lied) != 2 || lied[0].name != "h200" || lied[1].score != honest[1].score {
		t.Fatalf("ranked %v (t4 %s; honest %s)", names(lied), lied[1].explain(), honest[1].explain())
	}
}

// TestLocalLoadGossipsPowerHeadroom: the gossip carries the power headroom
// of the GPUs a new job could get — free ones and shared ones with room —
// not of a GPU held whole, nor of one whose power was not measured; a host
// that measured none says so instead of claiming 0.
func TestLocalLoadGossipsPowerHeadroom(t *testing.T) {
	var gpus []devices.Device
	for _, id := range []string{"G0", "G1", "G2", "G3"} {
		gpus = append(gpus, devices.Device{ID: id, Kind: devices.GPU, Model: "NVIDIA H100", Health: devices.Health{Healthy: true}})
	}
	h := &fakeHost{cpu: 8000, gpus: gpus, headroom: map[string]float64{"G0": 600.4, "G1": 500, "G2": 100.3}}
	j := newFakeJobs()
	j.heldDevices = map[string]bool{"G1": true, "G2": true}
	j.shares = map[string]int{"G2": 500}
	l := localLoad(h, j)
	// G0 free (600.4), G2 shared with room (100.3), G1 held whole, G3 unmeasured.
	if !l.PowerMeasured || l.EnergyHeadroomWatts != 701 {
		t.Fatalf("gossiped power headroom %d W (measured %v), want 701 W", l.EnergyHeadroomWatts, l.PowerMeasured)
	}
	h.headroom = nil
	if l := localLoad(h, j); l.PowerMeasured || l.EnergyHeadroomWatts != 0 {
		t.Fatalf("a host without power readings gossips %d W (measured %v)", l.EnergyHeadroomWatts, l.PowerMeasured)
	}
}

// TestRankPowerHeadroom: of two peers with the same free GPUs, a 2-GPU
// training job goes to the one whose measured headroom covers what it
// would draw (2 × (700 − 70) W on H100 SXM by the model table), and the
// explanation says what the other lacks; a peer that measured no power is
// not penalised (nothing is assumed), nor is CPU-only work anywhere.
func TestRankPowerHeadroom(t *testing.T) {
	const model = "NVIDIA H100 80GB HBM3"
	spec := api.JobSpec{Class: api.ClassTraining, Resources: api.Resources{CPU: 4000, Memory: 8 << 30, GPU: &api.GPURequest{Count: 2}}}
	capped, roomy, unknown := okLoad(64000, map[string]int{model: 4}), okLoad(64000, map[string]int{model: 4}), okLoad(64000, map[string]int{model: 4})
	capped.PowerMeasured, capped.EnergyHeadroomWatts = true, 315 // a quarter of the 1260 W it needs
	roomy.PowerMeasured, roomy.EnergyHeadroomWatts = true, 2520
	ranked, _ := ranker{}.rank(spec, []candidate{{name: "a-capped", load: capped}, {name: "b-roomy", load: roomy}, {name: "c-unknown", load: unknown}})
	if len(ranked) != 3 || ranked[2].name != "a-capped" {
		t.Fatalf("ranked %v", names(ranked))
	}
	c := ranked[2]
	if c.powerNeed != 1260 || math.Abs(c.penalty-energyPenalty*0.75) > 1e-9 || ranked[0].penalty != 0 || ranked[1].penalty != 0 {
		t.Fatalf("need %.0f W, penalties %v/%v/%v", c.powerNeed, ranked[0].penalty, ranked[1].penalty, c.penalty)
	}
	if !strings.Contains(c.explain(), "needs 1260 W, 315 W of headroom") {
		t.Fatalf("explanation: %s", c.explain())
	}
	cpu := api.JobSpec{Class: api.ClassBatch, Resources: api.Resources{CPU: 1000, Memory: 1 << 30}}
	capped.EnergyHeadroomWatts = 0
	if r, _ := (ranker{}).rank(cpu, []candidate{{name: "a-capped", load: capped}}); len(r) != 1 || r[0].penalty != 0 {
		t.Fatalf("CPU-only job penalised for power: %+v", r)
	}
}
