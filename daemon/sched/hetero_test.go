package sched

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// mixedNode is a workstation-style host: an H100 (GPU 0) beside two L4s
// (GPUs 1, 2), each GPU naming its model, all on NUMA node 0.
func mixedNode() *Node {
	n := NewNode("mixed", 32000, 1<<18, 3, "")
	n.GPUs[0].Model = "NVIDIA H100 80GB HBM3"
	n.GPUs[1].Model, n.GPUs[2].Model = "NVIDIA L4", "NVIDIA L4"
	for i := range n.GPUs {
		spec, _ := LookupGPU(n.ModelOf(i))
		n.GPUs[i].IdleWatts = spec.IdleW
		n.GPUs[i].PowerW = 2 * spec.IdleW // awake: idle depth plays no part
	}
	return n
}

func modelTable(profiles Profiles) *Weighted {
	p := NewWeighted(profiles, nil)
	p.ModelTable = true
	return p
}

// A job naming a model gets a GPU of that model, whichever comes first
// on the host and whatever else is free; the filter counts only the
// named model's GPUs.
func TestMixedHostModelPerDevice(t *testing.T) {
	n := mixedNode()
	l4 := Request{ID: "l4", Class: ClassInference, CPUMilli: 100, GPUs: 1, GPUMilli: 1000, GPUModels: []string{"NVIDIA L4"}}
	h100 := Request{ID: "h100", Class: ClassInference, CPUMilli: 100, GPUs: 1, GPUMilli: 1000, GPUModels: []string{"NVIDIA H100 80GB HBM3"}}
	for _, p := range []Policy{modelTable(nil), NewWeighted(nil, nil), BestFit{}, NewFGD(nil)} {
		d := placeOn(t, p, l4, n)
		if g := d.Assignment.GPUs; len(g) != 1 || g[0] == 0 {
			t.Fatalf("%s: the L4 job got gpus %v, want an L4 (1 or 2)\n%s", p.Name(), g, d.Explain())
		}
		if d.Assignment.GPUModel != "NVIDIA L4" || !strings.Contains(d.Explain(), "NVIDIA L4") {
			t.Fatalf("%s: assignment model %q, explanation:\n%s", p.Name(), d.Assignment.GPUModel, d.Explain())
		}
		d = placeOn(t, p, h100, n)
		if !slices.Equal(d.Assignment.GPUs, []int{0}) || d.Assignment.GPUModel != "NVIDIA H100 80GB HBM3" {
			t.Fatalf("%s: the H100 job got gpus %v (%s), want [0]\n%s", p.Name(), d.Assignment.GPUs, d.Assignment.GPUModel, d.Explain())
		}
	}
	// The H100 taken: a second H100 job waits (never the L4), an L4 job
	// still fits.
	e := NewEngine(Options{Seed: 1, Explain: 4})
	d, err := e.Place(&h100, []*Node{n})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Commit(&h100, &d.Assignment, []*Node{n}); err != nil {
		t.Fatal(err)
	}
	if Filter(&h100, n) != ReasonGPUs {
		t.Fatalf("a second H100 job: filter %q, want %q", Filter(&h100, n), ReasonGPUs)
	}
	if _, err := e.Place(&h100, []*Node{n}); !errors.Is(err, ErrUnschedulable) {
		t.Fatalf("a second H100 job was placed (%v): it would land on an L4", err)
	}
	if Filter(&l4, n) != Fits {
		t.Fatalf("an L4 job beside the busy H100: %q", Filter(&l4, n))
	}
	a100 := h100
	a100.GPUModels = []string{"NVIDIA A100-SXM4-80GB"}
	if r := Filter(&a100, n); r != ReasonGPUModel {
		t.Fatalf("a model the host lacks: %q, want %q", r, ReasonGPUModel)
	}
}

// The GPUs of one job are of one model: two GPUs on the mixed host are
// the two L4s, three do not fit (one H100 and two L4s are not three of a
// kind), and the queue knows such a job could never run there.
func TestMixedHostOneModelPerJob(t *testing.T) {
	n := mixedNode()
	two := Request{ID: "two", Class: ClassTraining, CPUMilli: 100, GPUs: 2, GPUMilli: 1000}
	for _, p := range []Policy{modelTable(nil), BestFit{}, NewFGD(nil), GpuPacking{}} {
		d := placeOn(t, p, two, n)
		if !slices.Equal(d.Assignment.GPUs, []int{1, 2}) {
			t.Fatalf("%s: two GPUs %v, want the two L4s [1 2]\n%s", p.Name(), d.Assignment.GPUs, d.Explain())
		}
	}
	three := two
	three.GPUs = 3
	if r := Filter(&three, n); r != ReasonGPUs {
		t.Fatalf("three GPUs of mixed models: %q, want %q", r, ReasonGPUs)
	}
	if reserveFor(&three, []*Node{n}) != -1 {
		t.Fatal("the queue would reserve the mixed host for three GPUs it can never give one job")
	}
	if reserveFor(&two, []*Node{n}) != 0 {
		t.Fatal("the queue would not reserve the mixed host for two L4s")
	}
	single := three
	single.Topology = TopologySingleNUMANode
	single.GPUs, single.ExclusiveCores = 2, 1
	n.FreeCores = []int{4}
	if r := Filter(&single, n); r != Fits {
		t.Fatalf("two L4s with a core on NUMA 0 under single-numa-node: %q", r)
	}
}

// A job that fits either model goes where the class profile's dimensions
// say: training to the H100 (compute), inference to an L4 (compute for a
// share prefers a modest GPU; performance per watt favours the L4), and
// each dimension alone decides inside the host, per device.
func TestMixedHostModelTableDecidesInside(t *testing.T) {
	n := mixedNode()
	train := Request{ID: "train", Class: ClassTraining, CPUMilli: 100, GPUs: 1, GPUMilli: 1000}
	infer := Request{ID: "infer", Class: ClassInference, CPUMilli: 100, GPUs: 1, GPUMilli: 250}
	cases := []struct {
		name    string
		p       Policy
		req     Request
		wantL4  bool
		explain string
	}{
		{"compute, training", modelTable(only(DimCompute)), train, false, "compute="},
		{"energy, training", modelTable(only(DimEnergy)), train, true, "energy="},
		{"default profile, training", modelTable(nil), train, false, "compute="},
		{"default profile, inference share", modelTable(nil), infer, true, "energy="},
	}
	for _, tc := range cases {
		d := placeOn(t, tc.p, tc.req, n)
		onL4 := len(d.Assignment.GPUs) == 1 && d.Assignment.GPUs[0] != 0
		if onL4 != tc.wantL4 {
			t.Errorf("%s: gpus %v (%s), want L4=%v\n%s", tc.name, d.Assignment.GPUs, d.Assignment.GPUModel, tc.wantL4, d.Explain())
		}
		// The explanation lists both models' candidates, scored apart.
		ex := d.Explain()
		if !strings.Contains(ex, "NVIDIA L4") || !strings.Contains(ex, "NVIDIA H100") || !strings.Contains(ex, tc.explain) {
			t.Errorf("%s: the explanation does not show both models scored by %s:\n%s", tc.name, tc.explain, ex)
		}
	}
	// Without the model table (and no measured efficiency) the models
	// score alike on compute: the dimension cannot tell them apart.
	p := NewWeighted(only(DimCompute), nil)
	cs := p.Choices(&train, n, 0, 8, nil)
	if len(cs) < 2 {
		t.Fatalf("%d choices, want one per model", len(cs))
	}
	if cs[0].Dims[DimCompute] != cs[1].Dims[DimCompute] {
		t.Errorf("without the table: compute %v vs %v", cs[0].Dims[DimCompute], cs[1].Dims[DimCompute])
	}
}

// Fragmentation on a mixed node is measured per model (each model's GPUs
// against the shapes that may use them) and summed; on one model it is
// the node's measure unchanged.
func TestMixedHostFragPerModel(t *testing.T) {
	shapes := []Shape{
		{CPUMilli: 100, GPUs: 1, GPUMilli: 1000, P: 0.5, Models: "NVIDIA L4"},
		{CPUMilli: 100, GPUs: 1, GPUMilli: 500, P: 0.5},
	}
	f := NewFragModel(shapes)
	n := mixedNode()
	n.GPUs[1].MilliFree = 400 // a sliver on an L4: fragmented for both shapes
	n.GPUs[0].MilliFree = 700 // the H100: only the 500-milli shape may use it
	h := NewNode("h", 32000, 1<<18, 1, "NVIDIA H100 80GB HBM3")
	h.GPUs[0].MilliFree = 700
	l := NewNode("l", 32000, 1<<18, 2, "NVIDIA L4")
	l.GPUs[0].MilliFree = 400
	got, want := f.NodeFrag(n), f.NodeFrag(h)+f.NodeFrag(l)
	if math.Abs(got-want) > 1e-9 {
		t.Fatalf("mixed node frag %v, want the sum of its models' %v", got, want)
	}
	if f.NodeFrag(h) != 0.5*700 {
		t.Fatalf("the H100's 700 milli are out of reach of the L4-only shape: frag %v, want 350", f.NodeFrag(h))
	}
}
