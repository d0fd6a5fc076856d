package sched

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestDeviceChoice(t *testing.T) {
	t.Run("nvlink pair on one numa node", func(t *testing.T) {
		n := migNode()
		n.GPUs[0].MilliFree = 0 // 1 and 3 remain linked, 2-3 linked
		a, loc := assign(&Request{GPUs: 2, GPUMilli: 1000}, n, 0, -1)
		if loc != 1 {
			t.Fatalf("locality %v for %v, want a linked pair", loc, a.GPUs)
		}
		for _, g := range a.GPUs {
			if n.GPUs[g].NUMA != n.GPUs[a.GPUs[0]].NUMA {
				t.Fatalf("gpus %v span NUMA nodes", a.GPUs)
			}
		}
	})
	t.Run("cores follow the gpus' numa node", func(t *testing.T) {
		n := migNode()
		for i := range 4 {
			n.GPUs[i].MilliFree = 0
		}
		a, _ := assign(&Request{GPUs: 2, GPUMilli: 1000, ExclusiveCores: 4}, n, 0, -1)
		if a.Cores[1] != 4 || len(a.Cores) != 1 {
			t.Fatalf("cores %v, want 4 on NUMA 1", a.Cores)
		}
	})
	t.Run("shared request takes the fullest fitting gpu", func(t *testing.T) {
		n := migNode()
		n.GPUs[3].MilliFree = 600
		n.GPUs[5].MilliFree = 300
		a, _ := assign(&Request{GPUs: 1, GPUMilli: 500}, n, 0, -1)
		if !slices.Equal(a.GPUs, []int{3}) {
			t.Fatalf("gpus %v, want [3]", a.GPUs)
		}
	})
	t.Run("mig reuses a free instance before creating one", func(t *testing.T) {
		n := migNode()
		p, ok := pickMIG(&Request{MIGProfile: "1g.5gb", MIGSlices: 1}, n)
		if !ok || p.Create || p.Start != 0 {
			t.Fatalf("pick %+v", p)
		}
	})
	t.Run("mig creates where the longest run stays free", func(t *testing.T) {
		n := migNode() // slice 0 taken by the existing instance
		p, ok := pickMIG(&Request{MIGProfile: "2g.10gb", MIGSlices: 2}, n)
		// Aligned starts 0,2,4: 0 overlaps; 2 leaves run 3 (4..6), 4 leaves 3 (1..3 is 3: slices 1,2,3). Both 3: first wins.
		if !ok || !p.Create || p.Start != 2 {
			t.Fatalf("pick %+v", p)
		}
	})
	t.Run("fpga prefers the loaded bitstream, then fastest programming", func(t *testing.T) {
		n := migNode()
		if r := pickFPGA(&Request{Bitstream: "aes"}, n); r != 0 {
			t.Fatalf("region %d, want 0 (holds aes)", r)
		}
		if r := pickFPGA(&Request{Bitstream: "fft"}, n); r != 1 {
			t.Fatalf("region %d, want 1 (programs in 300ms)", r)
		}
	})
}

func TestDimensions(t *testing.T) {
	frag := NewFragModel([]Shape{{CPUMilli: 1000, GPUs: 1, GPUMilli: 1000, P: 0.5}, {CPUMilli: 1000, GPUs: 1, GPUMilli: 500, P: 0.5}})
	p := NewWeighted(nil, frag)
	p.Capability["A100"] = 0.9
	p.Capability["T4"] = 0.3
	fresh := func(model string) *Node { n := NewNode("n", 32000, 1<<17, 2, model); return n }
	tests := []struct {
		name         string
		dim          Dimension
		req          Request
		better, wrse func() *Node
	}{
		{"compute: training prefers the stronger gpu", DimCompute, Request{Class: ClassTraining, GPUs: 1, GPUMilli: 1000},
			func() *Node { return fresh("A100") }, func() *Node { return fresh("T4") }},
		{"compute: inference slices prefer the modest gpu", DimCompute, Request{Class: ClassInference, GPUs: 1, GPUMilli: 300},
			func() *Node { return fresh("T4") }, func() *Node { return fresh("A100") }},
		{"locality: linked pair beats unlinked", DimLocality, Request{GPUs: 2, GPUMilli: 1000},
			func() *Node { n := fresh("A100"); n.NVLink = [][2]int{{0, 1}}; return n },
			func() *Node { n := fresh("A100"); n.NVLink = [][2]int{{0, 0}}; n.GPUs[1].NUMA = 1; return n }},
		{"fragmentation: topping up a half gpu beats breaking a whole one", DimFragmentation, Request{GPUs: 1, GPUMilli: 500, CPUMilli: 100},
			func() *Node { n := fresh("A100"); n.GPUs[0].MilliFree = 500; return n }, func() *Node { return fresh("A100") }},
		{"energy: efficient gpu beats waking an idle one", DimEnergy, Request{GPUs: 1, GPUMilli: 1000},
			func() *Node { n := fresh("A100"); n.GPUs[0].PerfPerWatt, n.GPUs[1].PerfPerWatt = 0.9, 0.9; return n },
			func() *Node {
				n := fresh("A100")
				for i := range n.GPUs {
					n.GPUs[i].PerfPerWatt, n.GPUs[i].IdleWatts = 0.9, 50
				}
				return n
			}},
		{"load: idle host beats a busy one", DimLoad, Request{CPUMilli: 100},
			func() *Node { return fresh("A100") }, func() *Node { n := fresh("A100"); n.Load = 0.8; return n }},
		{"priority: guaranteed jobs get headroom", DimPriority, Request{Tier: TierGuaranteed, CPUMilli: 1000},
			func() *Node { return fresh("A100") }, func() *Node { n := fresh("A100"); n.CPUFreeMilli = 4000; return n }},
		{"priority: best-effort jobs pack", DimPriority, Request{Tier: TierBestEffort, CPUMilli: 1000},
			func() *Node { n := fresh("A100"); n.CPUFreeMilli = 4000; return n }, func() *Node { return fresh("A100") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sb := dims(p, &tc.req, tc.better())
			sw := dims(p, &tc.req, tc.wrse())
			for d := range NumDims {
				if sb[d] < 0 || sb[d] > 1 || sw[d] < 0 || sw[d] > 1 {
					t.Fatalf("dimension %v out of [0,1]: %v %v", Dimension(d), sb[d], sw[d])
				}
			}
			if !(sb[tc.dim] > sw[tc.dim]) {
				t.Fatalf("%v: better %.4f not above worse %.4f", tc.dim, sb[tc.dim], sw[tc.dim])
			}
		})
	}
}

func TestFragModel(t *testing.T) {
	m := NewFragModel([]Shape{{GPUs: 1, GPUMilli: 1000, CPUMilli: 1000, P: 0.5}, {GPUs: 1, GPUMilli: 500, CPUMilli: 1000, P: 0.25}, {CPUMilli: 1000, P: 0.25}})
	n := NewNode("n", 8000, 1<<16, 2, "T4")
	n.GPUs[0].MilliFree = 300
	// shape 1 (1000): gpu1 fits, gpu0 (300) is fragment → 0.5*300
	// shape 2 (500): gpu1 fits, gpu0 fragment → 0.25*300
	// shape 3 (cpu only): all idle → 0.25*1300
	want := 0.5*300 + 0.25*300 + 0.25*1300
	if got := m.NodeFrag(n); math.Abs(got-want) > 1e-9 {
		t.Fatalf("frag %v, want %v", got, want)
	}
	n.CPUFreeMilli = 500 // nothing fits: everything idle is fragment
	if got := m.NodeFrag(n); math.Abs(got-1300) > 1e-9 {
		t.Fatalf("frag %v, want 1300", got)
	}
}

func TestShapeLearner(t *testing.T) {
	l := NewShapeLearner()
	for range 90 {
		l.Observe(&Request{CPUMilli: 1000, GPUs: 1, GPUMilli: 1000})
	}
	for range 9 {
		l.Observe(&Request{CPUMilli: 2000, GPUs: 1, GPUMilli: 500})
	}
	l.Observe(&Request{CPUMilli: 3000})
	m := l.Model(0.95)
	if len(m.Shapes) != 2 {
		t.Fatalf("shapes %+v, want the 2 covering 95%%", m.Shapes)
	}
	if math.Abs(m.Shapes[0].P-90.0/99) > 1e-9 || m.Shapes[0].GPUMilli != 1000 {
		t.Fatalf("first shape %+v", m.Shapes[0])
	}
}

func TestBaselinePolicies(t *testing.T) {
	idle := NewNode("idle", 64000, 1<<18, 8, "G2")
	used := NewNode("used", 64000, 1<<18, 8, "G2")
	used.GPUs[0].MilliFree = 500
	used.CPUFreeMilli = 32000
	frag := NewFragModel([]Shape{{CPUMilli: 4000, GPUs: 1, GPUMilli: 500, P: 1}})
	req := Request{CPUMilli: 4000, MemMiB: 1, GPUs: 1, GPUMilli: 500}
	for _, name := range []string{"bestfit", "gpupacking", "dotprod", "fgd", "fusiond"} {
		p, ok := PolicyByName(name, frag, nil)
		if !ok {
			t.Fatalf("no policy %s", name)
		}
		e := NewEngine(Options{Policy: p, Seed: 1, Explain: 2})
		d, err := e.Place(&req, []*Node{idle, used})
		if err != nil {
			t.Fatal(err)
		}
		if d.Assignment.Node != "used" || !slices.Equal(d.Assignment.GPUs, []int{0}) {
			t.Errorf("%s placed on %s %v, want used [0] (pack the half GPU)\n%s", name, d.Assignment.Node, d.Assignment.GPUs, d.Explain())
		}
	}
	if _, ok := PolicyByName("nope", nil, nil); ok {
		t.Fatal("unknown policy accepted")
	}
}

func TestExplain(t *testing.T) {
	nodes := []*Node{NewNode("small", 2000, 1024, 0, ""), NewNode("big", 64000, 1<<18, 8, "G2"), NewNode("t4", 64000, 1<<18, 2, "T4")}
	e := NewEngine(Options{Seed: 3, Explain: 5})
	d, err := e.Place(&Request{ID: "job1", Class: ClassTraining, CPUMilli: 4000, MemMiB: 10, GPUs: 2, GPUMilli: 1000, GPUModels: []string{"G2"}}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	out := d.Explain()
	for _, want := range []string{"job1: placed on big", "fragmentation=", "filtered 1 node(s): insufficient cpu", "filtered 1 node(s): gpu model not allowed"} {
		if !strings.Contains(out, want) {
			t.Errorf("explanation lacks %q:\n%s", want, out)
		}
	}
	_, err = e.Place(&Request{ID: "job2", GPUs: 1, GPUMilli: 1000, GPUModels: []string{"H100"}}, nodes)
	if err == nil || !strings.Contains(err.Error(), "gpu model not allowed") {
		t.Fatalf("err %v", err)
	}
}

// randomCluster builds a reproducible mixed cluster.
func randomCluster(r *rand.Rand, n int) []*Node {
	out := make([]*Node, n)
	for i := range out {
		g := []int{0, 1, 2, 4, 8}[r.IntN(5)]
		out[i] = NewNode("n"+string(rune('a'+i%26)), int64(8000+r.IntN(8)*8000), int64(32768+r.IntN(4)*32768), g, []string{"T4", "G2", "A100"}[r.IntN(3)])
		out[i].FreeCores = []int{4, 4}
	}
	return out
}

func randomRequest(r *rand.Rand, i int) Request {
	req := Request{ID: "r" + string(rune(i)), CPUMilli: int64(r.IntN(16)) * 500, MemMiB: int64(r.IntN(8)) * 1024, Tier: []Tier{TierBestEffort, TierBurstable, TierGuaranteed, TierGuaranteed}[r.IntN(4)]}
	switch r.IntN(4) {
	case 1:
		req.GPUs, req.GPUMilli = 1, int64(100+r.IntN(9)*100)
	case 2:
		req.GPUs, req.GPUMilli = 1<<r.IntN(4), 1000
	}
	if r.IntN(5) == 0 {
		req.ExclusiveCores = 1 + r.IntN(3)
	}
	return req
}

// Property: whatever the policy, placements never exceed any capacity.
func TestPropertyNeverExceedsCapacity(t *testing.T) {
	for _, name := range append([]string{"fusiond", "spread"}, BaselineNames...) {
		r := rand.New(rand.NewPCG(7, 7))
		nodes := randomCluster(r, 20)
		frag := NewFragModel([]Shape{{CPUMilli: 1000, GPUs: 1, GPUMilli: 500, P: 1}})
		p, _ := PolicyByName(name, frag, nil)
		e := NewEngine(Options{Policy: p, Seed: 9})
		for i := range 600 {
			req := randomRequest(r, i)
			d, err := e.Place(&req, nodes)
			if err != nil {
				continue
			}
			if err := e.Commit(&req, &d.Assignment, nodes); err != nil {
				t.Fatalf("%s: commit of a placed decision failed: %v", name, err)
			}
			for _, n := range nodes {
				if n.CPUFreeMilli < 0 || n.MemFreeMiB < 0 {
					t.Fatalf("%s: node %s over-committed: %+v", name, n.Name, n)
				}
				for _, c := range n.FreeCores {
					if c < 0 {
						t.Fatalf("%s: cores over-committed", name)
					}
				}
				for _, g := range n.GPUs {
					if g.MilliFree < 0 || g.MilliFree > MilliPerGPU {
						t.Fatalf("%s: gpu over-committed: %+v", name, g)
					}
				}
			}
		}
	}
}

// Property: the same seed gives the same decisions.
func TestPropertyDeterministic(t *testing.T) {
	run := func() []string {
		r := rand.New(rand.NewPCG(11, 11))
		nodes := randomCluster(r, 30)
		e := NewEngine(Options{Policy: Random{}, Seed: 42})
		var out []string
		for i := range 300 {
			req := randomRequest(r, i)
			d, err := e.Place(&req, nodes)
			if err != nil {
				out = append(out, "-")
				continue
			}
			_ = e.Commit(&req, &d.Assignment, nodes)
			out = append(out, d.Assignment.Node+string(rune('0'+d.Assignment.NodeIdx)))
		}
		return out
	}
	a, b := run(), run()
	if !slices.Equal(a, b) {
		t.Fatal("two runs with the same seed differ")
	}
}

func TestPoliciesWithoutShapes(t *testing.T) {
	for _, name := range []string{"fgd", "fgd-exact", "fusiond", "gpuclustering", "random"} {
		p, _ := PolicyByName(name, nil, nil)
		e := NewEngine(Options{Policy: p, Seed: 1})
		nodes := []*Node{NewNode("a", 8000, 8192, 2, "T4"), nil}
		req := Request{CPUMilli: 100, GPUs: 1, GPUMilli: 300}
		d, err := e.Place(&req, nodes)
		if err != nil || d.Assignment.Node != "a" {
			t.Fatalf("%s: %v %+v", name, err, d.Assignment)
		}
	}
}
