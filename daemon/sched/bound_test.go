package sched

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// unbounded hides a policy's boundedChooser: the Engine then scores every
// feasible node, as it did before the bound.
type unbounded struct{ AssignmentPolicy }

// countBelow counts the nodes the bound left unscored, and those of them
// left unscored only because their bound equals the best and they are
// ranked after it (orEqual).
type countBelow struct {
	*Weighted
	below, onlyEqual int
	buf              []Choice
}

func (c *countBelow) choicesAbove(req *Request, n *Node, idx int, floor float64, orEqual bool, out []Choice) ([]Choice, bool) {
	if orEqual {
		var strict bool
		if c.buf, strict = c.Weighted.choicesAbove(req, n, idx, floor, false, c.buf[:0]); !strict {
			defer func(before int) {
				if c.below > before {
					c.onlyEqual++
				}
			}(c.below)
		}
	}
	out, below := c.Weighted.choicesAbove(req, n, idx, floor, orEqual, out)
	if below {
		c.below++
	}
	return out, below
}

// boundCluster is a mixed cluster with per-GPU live loads and power (so
// that the dimensions besides fragmentation differ between options), MIG,
// FPGA, NVLink and mixed-model hosts among plain ones.
func boundCluster(r *rand.Rand) []*Node {
	nodes := randomCluster(r, 24)
	nodes = append(nodes, migNode(), migNode(), mixedNode())
	for i, n := range nodes {
		n.Name = fmt.Sprintf("n%d", i)
		if r.IntN(2) == 0 {
			continue
		}
		n.Load = r.Float64()
		for g := range n.GPUs {
			n.GPUs[g].Load = float64(r.IntN(4)) / 4
			n.GPUs[g].IdleWatts, n.GPUs[g].PowerW = 30, float64(30+r.IntN(3)*20)
		}
	}
	return nodes
}

// boundRequest adds MIG, FPGA, topology and class variety to
// randomRequest.
func boundRequest(r *rand.Rand, i int) Request {
	req := randomRequest(r, i)
	req.ID = fmt.Sprintf("r%d", i)
	req.Class = []Class{ClassBatch, ClassTraining, ClassInference, ClassService}[r.IntN(4)]
	switch r.IntN(10) {
	case 0:
		req.GPUs, req.GPUMilli, req.MIGProfile, req.MIGSlices = 0, 0, "1g.5gb", 1
	case 1:
		req.Bitstream = []string{"aes", "fft"}[r.IntN(2)]
	case 2:
		req.Topology = TopologySingleNUMANode
		req.ExclusiveCores = 1 + r.IntN(4)
	}
	return req
}

// Skipping the nodes whose score bound is below the best changes no
// decision: on random clusters and request streams, with the shape model's
// reserve and the GPU model table, fusiond's policy places every request
// alike with and without the bounds (same assignment, score, feasible and
// filter counts, same error), under both tie-breaking rules and with each
// setting of the fragmentation keys (the bounds rely on fragKeys being
// non-decreasing in each measure), and the bounds do skip nodes, some
// (with ranked ties) only because their bound equals the best score and
// they rank after its node.
func TestBoundChangesNoDecision(t *testing.T) {
	shapes := []Shape{{CPUMilli: 1000, GPUs: 1, GPUMilli: 500, P: 0.4}, {CPUMilli: 4000, GPUs: 1, GPUMilli: 1000, P: 0.3}, {CPUMilli: 2000, P: 0.2}, {CPUMilli: 8000, GPUs: 2, GPUMilli: 1000, P: 0.1}}
	params := []FragParams{{}, {ExactLast: true, Tail: TailStrandAll}, {SliverMass: 0.5, Tail: TailCapacityAll, ReserveSteps: 50}, {Tail: TailNone, FullNodesAsFGD: true}, {Tail: TailStrandGPU, ReserveUncovered: true}}
	skipped, onlyEqual := 0, 0
	for seed := range uint64(10) {
		for _, tie := range []TieBreak{TieRanked, TieRandom} {
			model := func() *FragModel {
				m := NewFragModel(shapes)
				m.Reserve = []Shape{{CPUMilli: 16000, GPUs: 8, GPUMilli: 1000, P: 0.01}}
				return m
			}
			newPolicy := func() *Weighted {
				p := NewWeighted(nil, model())
				p.ModelTable = seed%2 == 0
				p.Frag = params[seed%uint64(len(params))]
				if seed == 9 {
					// A negative weight (the daemon's config refuses them,
					// the public field does not): no bound holds, none may
					// skip a node.
					prof := map[Class]Weights{}
					for c, w := range p.Profiles {
						w[DimEnergy] = -0.3
						prof[c] = w
					}
					p.Profiles = prof
				}
				return p
			}
			bounded := &countBelow{Weighted: newPolicy()}
			eb := NewEngine(Options{Policy: bounded, Seed: seed, TieBreak: tie})
			ep := NewEngine(Options{Policy: unbounded{newPolicy()}, Seed: seed, TieBreak: tie})
			r := rand.New(rand.NewPCG(seed, 3))
			nb := boundCluster(r)
			np := make([]*Node, len(nb))
			for i, n := range nb {
				np[i] = n.Clone()
			}
			r = rand.New(rand.NewPCG(seed, 4))
			for i := range 400 {
				req := boundRequest(r, i)
				db, errb := eb.Place(&req, nb)
				dp, errp := ep.Place(&req, np)
				if (errb == nil) != (errp == nil) || (errb != nil && errb.Error() != errp.Error()) {
					t.Fatalf("seed %d tie %d request %d: error %v with the bound, %v without", seed, tie, i, errb, errp)
				}
				db.Policy, dp.Policy = "", ""
				if !reflect.DeepEqual(db, dp) {
					t.Fatalf("seed %d tie %d request %d %+v:\n with the bound %+v\n without      %+v", seed, tie, i, req, db, dp)
				}
				if errb != nil {
					if !errors.Is(errb, ErrUnschedulable) {
						t.Fatalf("request %d: %v", i, errb)
					}
					continue
				}
				if err := eb.Commit(&req, &db.Assignment, nb); err != nil {
					t.Fatal(err)
				}
				if err := ep.Commit(&req, &dp.Assignment, np); err != nil {
					t.Fatal(err)
				}
			}
			skipped += bounded.below
			onlyEqual += bounded.onlyEqual
		}
	}
	if skipped == 0 {
		t.Error("the bound never skipped a node: the test compares nothing")
	}
	if onlyEqual == 0 {
		t.Error("no node was skipped for a bound equal to the best: the tie rule is untested")
	}
	t.Logf("%d nodes left unscored, %d of them for a bound equal to the best", skipped, onlyEqual)
}

// scoreBound is at least the score of any choice whose fragmentation
// dimension is at most the bound's and whose priority is the bound's,
// whatever the other dimensions and weights.
func TestScoreBound(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for i := range 20000 {
		var w Weights
		for d := range w {
			w[d] = r.Float64() * float64(r.IntN(2))
		}
		frag, prio := r.Float64()*1.2-0.1, r.Float64()*1.2-0.1
		var c Choice
		for d := range c.Dims {
			c.Dims[d] = r.Float64()*1.2 - 0.1
		}
		c.Dims[DimPriority] = prio
		mig := i%5 == 0
		if !mig {
			c.Dims[DimFragmentation] = frag - r.Float64()*float64(r.IntN(2))
		}
		c.score(&w)
		if b := scoreBound(&w, nil, frag, prio, mig); c.Score > b {
			t.Fatalf("score %v above its bound %v (dims %v, weights %v, mig %v)", c.Score, b, c.Dims, w, mig)
		}
	}
}

// The state bound assumes the FGD measure after a placement is not
// negative: it declines a model with a negative popularity and a node
// with a negative free share, and bounds the plain case.
func TestFragBoundDeclinesNegatives(t *testing.T) {
	shapes := []Shape{{CPUMilli: 1000, GPUs: 1, GPUMilli: 500, P: 0.7}, {CPUMilli: 2000, P: 0.3}}
	req := Request{CPUMilli: 1000, GPUs: 1, GPUMilli: 500}
	n := NewNode("n", 8000, 8192, 2, "T4")
	p := NewWeighted(nil, NewFragModel(shapes))
	if _, ok := p.fragBound(&req, n, 0); !ok {
		t.Error("no bound for a plain node and model")
	}
	n.GPUs[1].MilliFree = -100
	n.Version++
	if _, ok := p.fragBound(&req, n, 0); ok {
		t.Error("bounded a node with a negative free share")
	}
	neg := slices.Clone(shapes)
	neg[1].P = -0.3
	p = NewWeighted(nil, NewFragModel(neg))
	if _, ok := p.fragBound(&req, NewNode("m", 8000, 8192, 2, "T4"), 1); ok {
		t.Error("bounded with a negative popularity")
	}
}

// otherBounds bounds the compute, locality, energy and load dimensions of
// every assignment (Choices keeping them all), and on a node whose GPUs
// are alike (liveUniform) or for a CPU-only request is every
// assignment's compute, energy and load exactly; it declines MIG, FPGA
// and exclusive-core requests.
func TestOtherBounds(t *testing.T) {
	clamp := func(v float64) float64 { return min(1, max(0, v)) }
	checked, exact := 0, 0
	for seed := range uint64(6) {
		r := rand.New(rand.NewPCG(seed, 7))
		nodes := boundCluster(r)
		p := NewWeighted(nil, nil)
		p.ModelTable = seed%2 == 0
		for i := range 300 {
			req := boundRequest(r, i)
			for _, n := range nodes {
				if Filter(&req, n) != Fits {
					continue
				}
				var ob [NumDims]float64
				ok := p.otherBounds(&req, n, &ob)
				if req.MIGProfile != "" || req.Bitstream != "" || req.ExclusiveCores > 0 {
					if ok {
						t.Fatalf("bounded request %+v", req)
					}
					continue
				}
				if !ok {
					if req.GPUs == 0 || liveUniform(n) {
						t.Fatalf("declined request %+v on node %s", req, n.Name)
					}
					continue
				}
				same := req.GPUs == 0 || liveUniform(n)
				for _, c := range p.Choices(&req, n, 0, 64, nil) {
					checked++
					for _, d := range []Dimension{DimCompute, DimLocality, DimEnergy, DimLoad} {
						if c.Dims[d] > clamp(ob[d]) {
							t.Fatalf("request %+v node %s: %s %v above its bound %v", req, n.Name, d, c.Dims[d], ob[d])
						}
						if same && d != DimLocality && c.Dims[d] != clamp(ob[d]) {
							t.Fatalf("request %+v node %s of alike GPUs: %s %v, bound %v", req, n.Name, d, c.Dims[d], ob[d])
						}
					}
					if same {
						exact++
					}
				}
			}
		}
	}
	if checked == 0 || exact == 0 {
		t.Fatalf("checked %d choices, %d on alike GPUs: the test compares nothing", checked, exact)
	}
}

// stateScore, kept per node state and weights, agrees with fragBound and
// scoreBound (priority at 1) computed afresh: on random clusters while
// requests of every class (so changing weights) are placed, for GPU and
// CPU-only requests alike.
func TestStateScoreAgrees(t *testing.T) {
	shapes := []Shape{{CPUMilli: 1000, GPUs: 1, GPUMilli: 500, P: 0.6}, {CPUMilli: 2000, P: 0.4}}
	compared := 0
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 9))
		nodes := boundCluster(r)
		p := NewWeighted(nil, NewFragModel(shapes))
		p.Frag.FullNodesAsFGD = seed%2 == 0
		e := NewEngine(Options{Policy: p, Seed: seed, TieBreak: TieRanked})
		fresh := NewWeighted(nil, NewFragModel(shapes))
		fresh.Frag = p.Frag
		for i := range 300 {
			req := boundRequest(r, i)
			if req.MIGProfile != "" {
				continue
			}
			w := p.weightsFor(&req)
			for idx, n := range nodes {
				fb, sb, ok := p.stateScore(&req, n, idx, &w)
				fresh.fs.cache = nil
				wantFB, wantOK := fresh.fragBound(&req, n, idx)
				if ok != wantOK || (ok && (fb != wantFB || sb != scoreBound(&w, nil, wantFB, 1, false))) {
					t.Fatalf("seed %d request %d node %d: stateScore %v %v %v, afresh %v %v", seed, i, idx, fb, sb, ok, wantFB, wantOK)
				}
				if ok {
					compared++
				}
			}
			if d, err := e.Place(&req, nodes); err == nil {
				if err := e.Commit(&req, &d.Assignment, nodes); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if compared == 0 {
		t.Fatal("nothing compared")
	}
}
