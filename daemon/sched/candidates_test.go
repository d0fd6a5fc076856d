package sched

import (
	"math/bits"
	"slices"
	"strings"
	"testing"
)

// dims is s_d of every dimension of the best assignment of req on n.
func dims(p *Weighted, req *Request, n *Node) [NumDims]float64 {
	cs := p.Choices(req, n, -1, 1, nil)
	if len(cs) == 0 {
		return [NumDims]float64{}
	}
	return cs[0].Dims
}

// only is a profile that weighs one dimension alone.
func only(d Dimension) Profiles {
	var w Weights
	w[d] = 1
	return Profiles{ClassBatch: w, ClassTraining: w, ClassInference: w, ClassService: w}
}

// placeOn places req on nodes with policy p and returns the decision.
func placeOn(t *testing.T, p Policy, req Request, nodes ...*Node) Decision {
	t.Helper()
	d, err := NewEngine(Options{Policy: p, Seed: 1, Explain: 8}).Place(&req, nodes)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Load: two GPUs differing only in live utilisation; the job goes to the
// idle one, and follows it when the loads swap (a constant load input
// would give the same GPU both times).
func TestLoadDecidesTheGPU(t *testing.T) {
	for _, req := range []Request{
		{Class: ClassInference, CPUMilli: 100, GPUs: 1, GPUMilli: 1000},
		{Class: ClassInference, CPUMilli: 100, GPUs: 1, GPUMilli: 300},
	} {
		n := NewNode("n", 8000, 1<<16, 2, "NVIDIA H200")
		p := NewWeighted(nil, NewFragModel([]Shape{{CPUMilli: 100, GPUs: 1, GPUMilli: 1000, P: 1}}))
		n.GPUs[0].Load, n.GPUs[1].Load = 0.9, 0.1
		if d := placeOn(t, p, req, n); !slices.Equal(d.Assignment.GPUs, []int{1}) {
			t.Fatalf("milli %d: gpus %v, want [1] (GPU 0 is 90%% busy)\n%s", req.GPUMilli, d.Assignment.GPUs, d.Explain())
		}
		n.GPUs[0].Load, n.GPUs[1].Load = 0.1, 0.9
		if d := placeOn(t, p, req, n); !slices.Equal(d.Assignment.GPUs, []int{0}) {
			t.Fatalf("milli %d: gpus %v, want [0] after the loads swap\n%s", req.GPUMilli, d.Assignment.GPUs, d.Explain())
		}
	}
}

// Load per NUMA node: CPU-only work with exclusive cores goes to the
// quieter NUMA node.
func TestNUMALoadDecidesTheCores(t *testing.T) {
	n := NewNode("n", 64000, 1<<16, 0, "")
	n.FreeCores = []int{8, 8}
	p := NewWeighted(only(DimLoad), nil)
	req := Request{ExclusiveCores: 4, Topology: TopologySingleNUMANode}
	n.NUMALoad = []float64{0.9, 0.2}
	if d := placeOn(t, p, req, n); d.Assignment.Cores[1] != 4 {
		t.Fatalf("cores %v, want 4 on the quiet NUMA node 1", d.Assignment.Cores)
	}
	n.NUMALoad = []float64{0.2, 0.9}
	if d := placeOn(t, p, req, n); d.Assignment.Cores[0] != 4 {
		t.Fatalf("cores %v, want 4 on NUMA node 0 once it is the quiet one", d.Assignment.Cores)
	}
}

// Energy, idle wake: a GPU in its idle power state costs waking; one
// already drawing power does not. Swapping the measured draws swaps the
// choice.
func TestEnergyReadsMeasuredPower(t *testing.T) {
	n := NewNode("n", 8000, 1<<16, 2, "NVIDIA H200")
	for i := range n.GPUs {
		n.GPUs[i].IdleWatts = 75
	}
	p := NewWeighted(only(DimEnergy), nil)
	p.ModelTable = true
	req := Request{CPUMilli: 100, GPUs: 1, GPUMilli: 1000}
	n.GPUs[0].PowerW, n.GPUs[1].PowerW = 70, 250
	if d := placeOn(t, p, req, n); !slices.Equal(d.Assignment.GPUs, []int{1}) {
		t.Fatalf("gpus %v, want [1] (awake)\n%s", d.Assignment.GPUs, d.Explain())
	}
	n.GPUs[0].PowerW, n.GPUs[1].PowerW = 250, 70
	if d := placeOn(t, p, req, n); !slices.Equal(d.Assignment.GPUs, []int{0}) {
		t.Fatalf("gpus %v, want [0] (awake now)\n%s", d.Assignment.GPUs, d.Explain())
	}
}

// Energy and compute from the model table: the model decides between
// nodes, per class; without the table both count the neutral default.
func TestModelTableDecides(t *testing.T) {
	h200, l4 := NewNode("h200", 8000, 1<<16, 1, "NVIDIA H200"), NewNode("l4", 8000, 1<<16, 1, "NVIDIA L4")
	req := Request{Class: ClassTraining, CPUMilli: 100, GPUs: 1, GPUMilli: 1000}
	for _, tc := range []struct {
		dim  Dimension
		want string
	}{{DimCompute, "h200"}, {DimEnergy, "l4"}} {
		p := NewWeighted(only(tc.dim), nil)
		p.ModelTable = true
		if d := placeOn(t, p, req, h200, l4); d.Assignment.Node != tc.want {
			t.Errorf("%v: placed on %s, want %s\n%s", tc.dim, d.Assignment.Node, tc.want, d.Explain())
		}
		sa := dims(p, &req, h200)
		sb := dims(p, &req, l4)
		if sa[tc.dim] == sb[tc.dim] {
			t.Errorf("%v: the table gives H200 and L4 the same score %v", tc.dim, sa[tc.dim])
		}
		p.ModelTable = false
		sa = dims(p, &req, h200)
		sb = dims(p, &req, l4)
		if sa[tc.dim] != sb[tc.dim] {
			t.Errorf("%v: without the table the models still differ: %v %v", tc.dim, sa[tc.dim], sb[tc.dim])
		}
	}
}

func TestGPUModelTable(t *testing.T) {
	for name, want := range map[string]string{
		"NVIDIA H200": "H200 SXM", "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe",
		"NVIDIA A100-SXM4-80GB": "A100 SXM", "NVIDIA A100-PCIE-40GB": "A100 PCIe", "NVIDIA L40S": "L40S",
		"NVIDIA L4": "L4", "Tesla T4": "T4", "NVIDIA B200": "B200", "Tesla V100-SXM2-16GB": "V100 SXM2",
	} {
		s, ok := LookupGPU(name)
		if !ok || s.Name != want {
			t.Errorf("%q: got %q (%v), want %q", name, s.Name, ok, want)
		}
	}
	if _, ok := LookupGPU("G2"); ok {
		t.Error("an unknown model was found")
	}
	if c, e := ModelCapability("G2", ClassTraining), ModelPerfPerWatt("G2", ClassTraining); c != neutralPerf || e != neutralPerf {
		t.Errorf("unknown model: capability %v, perf/W %v, want the neutral %v", c, e, neutralPerf)
	}
	// Inference reads FP8/INT8, training FP16: the H100 gains more from
	// FP8 than the A100 (no FP8) does from INT8.
	if ModelCapability("NVIDIA H100", ClassTraining) <= ModelCapability("NVIDIA A100", ClassTraining) {
		t.Error("H100 not above A100 for training")
	}
	for _, c := range Classes {
		top := 0.0
		for _, s := range gpuSpecs() {
			v := ModelPerfPerWatt(s.Name, c)
			if v <= 0 || v > 1 {
				t.Errorf("%s %s: perf/W %v outside (0,1]", s.Name, c, v)
			}
			top = max(top, v)
		}
		if top != 1 {
			t.Errorf("%s: best perf/W %v, want 1 (normalised to the best model)", c, top)
		}
	}
}

// Fragmentation reads the shapes seen: the same half-used node gets a
// share on a different GPU once the learner has seen other shapes.
func TestSeenShapesDecideFragmentation(t *testing.T) {
	n := NewNode("n", 64000, 1<<16, 2, "T4")
	n.GPUs[1].MilliFree = 600
	req := Request{CPUMilli: 100, GPUs: 1, GPUMilli: 400}
	learn := func(milli int64) *FragModel {
		l := NewShapeLearner()
		for range 30 {
			l.Observe(&Request{CPUMilli: 100, GPUs: 1, GPUMilli: milli})
		}
		return l.Model(0.95)
	}
	p := NewWeighted(only(DimFragmentation), learn(1000))
	if d := placeOn(t, p, req, n); !slices.Equal(d.Assignment.GPUs, []int{1}) {
		t.Fatalf("whole-GPU shapes: gpus %v, want [1] (keep GPU 0 whole)\n%s", d.Assignment.GPUs, d.Explain())
	}
	p.SetFragModel(learn(600))
	if d := placeOn(t, p, req, n); !slices.Equal(d.Assignment.GPUs, []int{0}) {
		t.Fatalf("600-milli shapes: gpus %v, want [0] (keep GPU 1's 600 milli)\n%s", d.Assignment.GPUs, d.Explain())
	}
}

// Locality: the NVLink pair wins over GPUs without a link.
func TestLocalityDecidesTheSet(t *testing.T) {
	n := NewNode("n", 64000, 1<<16, 4, "A100")
	n.NVLink = [][2]int{{2, 3}}
	p := NewWeighted(only(DimLocality), nil)
	if d := placeOn(t, p, Request{GPUs: 2, GPUMilli: 1000}, n); !slices.Equal(d.Assignment.GPUs, []int{2, 3}) {
		t.Fatalf("gpus %v, want the linked [2 3]", d.Assignment.GPUs)
	}
	n.NVLink = [][2]int{{0, 1}}
	if d := placeOn(t, p, Request{GPUs: 2, GPUMilli: 1000}, n); !slices.Equal(d.Assignment.GPUs, []int{0, 1}) {
		t.Fatalf("gpus %v, want the linked [0 1]", d.Assignment.GPUs)
	}
}

// MIG: an existing free instance beats creating one; packing a partly
// used MIG GPU beats breaking a whole one.
func TestMIGChoices(t *testing.T) {
	n := NewNode("n", 64000, 1<<16, 2, "A100")
	for i := range n.GPUs {
		n.GPUs[i].MIG = &MIG{TotalSlices: 7}
	}
	n.GPUs[1].MIG.Instances = []MIGInstance{{Profile: "3g.20gb", Start: 0, Slices: 3, InUse: true}}
	p := NewWeighted(nil, nil)
	req := Request{Class: ClassInference, MIGProfile: "1g.5gb", MIGSlices: 1}
	d := placeOn(t, p, req, n)
	if m := d.Assignment.MIG; m == nil || m.GPU != 1 || !m.Create {
		t.Fatalf("mig %+v, want a new instance on the partly used GPU 1\n%s", m, d.Explain())
	}
	n.GPUs[0].MIG.Instances = []MIGInstance{{Profile: "1g.5gb", Start: 4, Slices: 1}}
	d = placeOn(t, p, req, n)
	if m := d.Assignment.MIG; m == nil || m.GPU != 0 || m.Create || m.Start != 4 {
		t.Fatalf("mig %+v, want the free instance on GPU 0\n%s", m, d.Explain())
	}
}

// Symmetric alternatives are one candidate: any 2 of 8 alike GPUs without
// NVLink on one NUMA node; GPUs that differ (here in load) are not alike.
func TestSymmetricCandidatesCollapse(t *testing.T) {
	n := NewNode("n", 64000, 1<<16, 8, "T4")
	p := NewWeighted(nil, nil)
	req := Request{GPUs: 2, GPUMilli: 1000}
	if cs := p.Choices(&req, n, -1, 8, nil); len(cs) != 1 {
		t.Fatalf("%d candidates for 2 of 8 alike GPUs, want 1", len(cs))
	}
	share := Request{GPUs: 1, GPUMilli: 300}
	if cs := p.Choices(&share, n, -1, 8, nil); len(cs) != 1 {
		t.Fatalf("%d candidates for a share of 8 alike GPUs, want 1", len(cs))
	}
	n.GPUs[5].Load = 0.5
	cs := p.Choices(&req, n, -1, 8, nil)
	if len(cs) < 2 || len(cs) > maxChoices {
		t.Fatalf("%d candidates once GPU 5 is loaded, want 2..%d", len(cs), maxChoices)
	}
	for _, c := range cs {
		if bits.OnesCount64(c.gpus) != 2 {
			t.Fatalf("candidate with GPUs %b", c.gpus)
		}
	}
}

// Explain lists the top candidate assignments with each dimension's part,
// and the filtered nodes.
func TestExplainCandidates(t *testing.T) {
	n := migNode()
	n.GPUs[1].Load = 0.7
	small := NewNode("small", 1000, 1024, 0, "")
	e := NewEngine(Options{Seed: 1, Explain: 3})
	d, err := e.Place(&Request{ID: "j", Class: ClassInference, CPUMilli: 2000, GPUs: 1, GPUMilli: 1000}, []*Node{n, small})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Candidates) != 3 {
		t.Fatalf("%d candidates, want 3", len(d.Candidates))
	}
	for i, c := range d.Candidates {
		if c.Assignment == nil || len(c.Assignment.GPUs) != 1 {
			t.Fatalf("candidate %d without its GPU: %+v", i, c)
		}
		if i > 0 && c.Score > d.Candidates[i-1].Score {
			t.Fatalf("candidates not best first: %+v", d.Candidates)
		}
	}
	out := d.Explain()
	for _, want := range []string{"top 3 candidates", "mig gpus [", "load=", "fragmentation=", "filtered 1 node(s): insufficient cpu"} {
		if !strings.Contains(out, want) {
			t.Errorf("explanation lacks %q:\n%s", want, out)
		}
	}
}
