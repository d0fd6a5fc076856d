package sched

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// defragSetup places each request with the engine and commits it, and
// returns them as movable work (all of them, in order).
func defragSetup(t *testing.T, e *Engine, nodes []*Node, asgs map[string]Assignment, reqs ...Request) []Movable {
	t.Helper()
	var out []Movable
	for _, r := range reqs {
		a, ok := asgs[r.ID]
		if !ok {
			d, err := e.Place(&r, nodes)
			if err != nil {
				t.Fatalf("placing %s: %v", r.ID, err)
			}
			a = d.Assignment
		}
		if err := e.Commit(&r, &a, nodes); err != nil {
			t.Fatalf("committing %s: %v", r.ID, err)
		}
		out = append(out, Movable{ID: r.ID, Req: r, Asg: a})
	}
	return out
}

func cloneNodes(nodes []*Node) []*Node {
	out := make([]*Node, len(nodes))
	for i, n := range nodes {
		if n != nil {
			out[i] = n.Clone()
		}
	}
	return out
}

// applyPlan carries a plan out on nodes as a caller would: every victim
// released, put at its new place, then the head; each step must fit.
func applyPlan(t *testing.T, e *Engine, head *Request, nodes []*Node, movable []Movable, p MovePlan) {
	t.Helper()
	byID := map[string]*Movable{}
	for i := range movable {
		byID[movable[i].ID] = &movable[i]
	}
	for _, m := range p.Moves {
		v := byID[m.ID]
		if v == nil {
			t.Fatalf("plan moves %q, which is not movable", m.ID)
		}
		if !reflect.DeepEqual(m.From, v.Asg) {
			t.Fatalf("move %s from %+v, but it runs at %+v", m.ID, m.From, v.Asg)
		}
		e.Release(&v.Req, &m.From, nodes)
	}
	for _, m := range p.Moves {
		if err := e.Commit(&byID[m.ID].Req, &m.To, nodes); err != nil {
			t.Fatalf("move %s to %+v: %v", m.ID, m.To, err)
		}
	}
	if err := e.Commit(head, &p.Head, nodes); err != nil {
		t.Fatalf("head at %+v after the moves: %v", p.Head, err)
	}
}

func share(id string, milli int64) Request {
	return Request{ID: id, Class: ClassInference, CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: milli}
}

func whole(id string, gpus int) Request {
	return Request{ID: id, Class: ClassTraining, CPUMilli: 1000, MemMiB: 1024, GPUs: gpus, GPUMilli: MilliPerGPU}
}

// Shares on two GPUs of a node: a whole-GPU request fits nowhere; one move
// (a share onto the other share's GPU) frees a GPU, under fusiond's policy
// and a paper baseline alike, and the plan carries out on the real nodes.
func TestPlanMovesScatteredShares(t *testing.T) {
	for _, policy := range []string{"fusiond", "bestfit", "fgd"} {
		t.Run(policy, func(t *testing.T) {
			p, ok := PolicyByName(policy, nil, nil)
			if !ok {
				t.Fatalf("no policy %q", policy)
			}
			e := NewEngine(Options{Policy: p, Seed: 3, TieBreak: TieRanked})
			n := NewNode("a", 32000, 1<<16, 2, "V100")
			nodes := []*Node{n}
			mov := defragSetup(t, e, nodes, map[string]Assignment{
				"s0": {Node: "a", NodeIdx: 0, CPUMilli: 1000, MemMiB: 1024, GPUs: []int{0}, GPUMilli: 400, GPUModel: "V100", FPGA: -1},
				"s1": {Node: "a", NodeIdx: 0, CPUMilli: 1000, MemMiB: 1024, GPUs: []int{1}, GPUMilli: 500, GPUModel: "V100", FPGA: -1},
			}, share("s0", 400), share("s1", 500))
			head := whole("head", 1)
			if _, err := e.Place(&head, nodes); err == nil {
				t.Fatal("the head fits before any move")
			}
			before := cloneNodes(nodes)
			plan, ok := e.PlanMoves(&head, nodes, mov, 5)
			if !ok {
				t.Fatal("no plan for scattered shares")
			}
			if !reflect.DeepEqual(before, nodes) {
				t.Fatal("PlanMoves changed the nodes")
			}
			if len(plan.Moves) != 1 {
				t.Fatalf("%d moves, want 1: %+v", len(plan.Moves), plan.Moves)
			}
			m := plan.Moves[0]
			if m.To.GPUs[0] == m.From.GPUs[0] || plan.Head.GPUs[0] != m.From.GPUs[0] {
				t.Fatalf("move %s gpu %v → %v, head on %v: the head should take the GPU the share left", m.ID, m.From.GPUs, m.To.GPUs, plan.Head.GPUs)
			}
			if !strings.Contains(plan.Why, "head blocked on a") || !strings.Contains(plan.Why, m.ID) {
				t.Fatalf("why %q names neither the node nor the move", plan.Why)
			}
			applyPlan(t, e, &head, nodes, mov, plan)
			if n.FullyFreeGPUs() != 0 || n.GPUs[plan.Head.GPUs[0]].MilliFree != 0 {
				t.Fatalf("after the plan: %+v", n.GPUs)
			}
		})
	}
}

// A GPU node whose CPU a CPU-only pod holds: the pod moves to a CPU node
// and the GPU request takes the GPU node.
func TestPlanMovesStrandedCPU(t *testing.T) {
	e := NewEngine(Options{Seed: 1, TieBreak: TieRanked})
	g := NewNode("gpu", 8000, 1<<16, 4, "A100")
	c := NewNode("cpu", 16000, 1<<16, 0, "")
	nodes := []*Node{g, c}
	other := Request{ID: "other", Class: ClassBatch, CPUMilli: 14000, MemMiB: 1024}
	mov := defragSetup(t, e, nodes, map[string]Assignment{
		"cpu-pod": {Node: "gpu", NodeIdx: 0, CPUMilli: 6000, MemMiB: 2048, FPGA: -1},
		"other":   {Node: "cpu", NodeIdx: 1, CPUMilli: 14000, MemMiB: 1024, FPGA: -1},
	}, Request{ID: "cpu-pod", Class: ClassBatch, CPUMilli: 6000, MemMiB: 2048}, other)
	head := whole("head", 2)
	head.CPUMilli = 4000
	before := cloneNodes(nodes)
	// The CPU node has 2000 millicores left: the pod cannot move yet.
	if p, ok := e.PlanMoves(&head, nodes, mov[:1], 3); ok {
		t.Fatalf("a plan although the pod fits nowhere else: %+v", p)
	}
	// With "other" movable too, two moves would not help either (other
	// cannot go to the GPU node beside the head), so still none.
	if p, ok := e.PlanMoves(&head, nodes, mov, 3); ok {
		t.Fatalf("a plan although no victim can be re-placed: %+v", p)
	}
	// Free the CPU node: one move.
	e.Release(&other, &mov[1].Asg, nodes)
	before = cloneNodes(nodes)
	plan, ok := e.PlanMoves(&head, nodes, mov[:1], 3)
	if !ok {
		t.Fatal("no plan for stranded CPU")
	}
	if !reflect.DeepEqual(before, nodes) {
		t.Fatal("PlanMoves changed the nodes")
	}
	if len(plan.Moves) != 1 || plan.Moves[0].ID != "cpu-pod" || plan.Moves[0].To.Node != "cpu" || plan.Head.Node != "gpu" || len(plan.Head.GPUs) != 2 {
		t.Fatalf("plan %+v", plan)
	}
	applyPlan(t, e, &head, nodes, mov[:1], plan)
}

// Nothing movable, moves not allowed, or bad input: no plan, no panic.
func TestPlanMovesNothingToDo(t *testing.T) {
	e := NewEngine(Options{Seed: 1})
	n := NewNode("a", 4000, 1<<14, 1, "T4")
	nodes := []*Node{n, nil}
	fixed := share("fixed", 600)
	if _, err := func() (Decision, error) {
		d, err := e.Place(&fixed, nodes)
		if err == nil {
			err = e.Commit(&fixed, &d.Assignment, nodes)
		}
		return d, err
	}(); err != nil {
		t.Fatal(err)
	}
	head := whole("head", 1)
	if _, ok := e.PlanMoves(&head, nodes, nil, 10); ok {
		t.Fatal("a plan with nothing movable")
	}
	// Movable work that cannot make room: the fixed share still blocks the GPU.
	mov := []Movable{{ID: "m", Req: share("m", 100), Asg: Assignment{Node: "a", NodeIdx: 0, CPUMilli: 1000, GPUs: []int{0}, GPUMilli: 100, FPGA: -1}}}
	n.Apply(&mov[0].Asg)
	if _, ok := e.PlanMoves(&head, nodes, mov, 10); ok {
		t.Fatal("a plan although the fixed share still blocks the GPU")
	}
	bad := []Movable{
		{ID: "out", Asg: Assignment{NodeIdx: 7}},
		{ID: "neg", Asg: Assignment{NodeIdx: -1}},
		{ID: "nil", Asg: Assignment{NodeIdx: 1}},
		{ID: "name", Asg: Assignment{Node: "b", NodeIdx: 0}},
		{ID: "invalid", Req: Request{CPUMilli: -1}, Asg: Assignment{Node: "a", NodeIdx: 0}},
	}
	for _, c := range []struct {
		name string
		req  *Request
		mov  []Movable
		max  int
	}{
		{"nil request", nil, mov, 3},
		{"invalid request", &Request{ID: "x", GPUMilli: 2000, GPUs: 1}, mov, 3},
		{"no budget", &head, mov, 0},
		{"negative budget", &head, mov, -4},
		{"bad movables", &head, bad, 3},
	} {
		if p, ok := e.PlanMoves(c.req, nodes, c.mov, c.max); ok {
			t.Errorf("%s: plan %+v", c.name, p)
		}
	}
	// A request that fits already is the caller's to place.
	small := share("small", 300)
	n.Release(&mov[0].Asg)
	if p, ok := e.PlanMoves(&small, nodes, mov, 3); ok {
		t.Fatalf("a plan for a request that fits: %+v", p)
	}
}

// Four 300-milli shares on four GPUs: two whole GPUs need two moves,
// three need three (the greedy search); fewer allowed moves, no plan.
func TestPlanMovesBudget(t *testing.T) {
	for _, c := range []struct{ gpus, need int }{{2, 2}, {3, 3}} {
		t.Run(fmt.Sprintf("%dgpus", c.gpus), func(t *testing.T) {
			e := NewEngine(Options{Seed: 2, TieBreak: TieRanked})
			n := NewNode("a", 64000, 1<<16, 4, "V100")
			nodes := []*Node{n}
			asgs := map[string]Assignment{}
			var reqs []Request
			for i := range 4 {
				id := fmt.Sprintf("s%d", i)
				asgs[id] = Assignment{Node: "a", NodeIdx: 0, CPUMilli: 1000, MemMiB: 1024, GPUs: []int{i}, GPUMilli: 250, FPGA: -1}
				reqs = append(reqs, share(id, 250))
			}
			mov := defragSetup(t, e, nodes, asgs, reqs...)
			head := whole("head", c.gpus)
			if p, ok := e.PlanMoves(&head, nodes, mov, c.need-1); ok {
				t.Fatalf("a plan of %d moves within %d: %+v", len(p.Moves), c.need-1, p.Moves)
			}
			before := cloneNodes(nodes)
			plan, ok := e.PlanMoves(&head, nodes, mov, c.need+2)
			if !ok {
				t.Fatalf("no plan within %d moves", c.need+2)
			}
			if len(plan.Moves) != c.need {
				t.Fatalf("%d moves, want %d", len(plan.Moves), c.need)
			}
			if !reflect.DeepEqual(before, nodes) {
				t.Fatal("PlanMoves changed the nodes")
			}
			applyPlan(t, e, &head, nodes, mov, plan)
			if n.FullyFreeGPUs() != 0 || n.GPUMilliFree() != int64(4-c.gpus)*MilliPerGPU-1000 {
				t.Fatalf("after the plan %+v", n.GPUs)
			}
		})
	}
}

// A MIG node: MIG work has nowhere else to go (the only MIG GPU is full),
// so a larger profile gets no plan; a CPU-only pod that holds the node's
// CPU still moves for a MIG request.
func TestPlanMovesMIGNode(t *testing.T) {
	e := NewEngine(Options{Seed: 1, TieBreak: TieRanked})
	m := NewNode("mig", 8000, 1<<16, 1, "A100")
	m.GPUs[0].MIG = &MIG{TotalSlices: 7}
	c := NewNode("cpu", 16000, 1<<16, 0, "")
	nodes := []*Node{m, c}
	small := Request{ID: "small", Class: ClassInference, CPUMilli: 500, MIGProfile: "3g.40gb", MIGSlices: 3}
	mov := defragSetup(t, e, nodes, map[string]Assignment{"cpu-pod": {Node: "mig", NodeIdx: 0, CPUMilli: 6000, FPGA: -1}}, small, small, Request{ID: "cpu-pod", Class: ClassBatch, CPUMilli: 6000})
	mov[1].ID = "small2"
	big := Request{ID: "big", Class: ClassInference, CPUMilli: 500, MIGProfile: "7g.80gb", MIGSlices: 7}
	if p, ok := e.PlanMoves(&big, nodes, mov, 5); ok {
		t.Fatalf("a plan for a 7-slice profile over two existing instances: %+v", p)
	}
	// Release the MIG work; the free instances stay, and a 3-slice request
	// with more CPU than is left needs the CPU pod moved.
	for _, v := range mov[:2] {
		e.Release(&v.Req, &v.Asg, nodes)
	}
	head := Request{ID: "head", Class: ClassInference, CPUMilli: 3000, MIGProfile: "3g.40gb", MIGSlices: 3}
	before := cloneNodes(nodes)
	plan, ok := e.PlanMoves(&head, nodes, mov[2:], 5)
	if !ok || len(plan.Moves) != 1 || plan.Moves[0].To.Node != "cpu" || plan.Head.MIG == nil || plan.Head.MIG.Create {
		t.Fatalf("plan %+v (ok %v): want the CPU pod moved and an existing instance used", plan, ok)
	}
	if !reflect.DeepEqual(before, nodes) {
		t.Fatal("PlanMoves changed the nodes")
	}
	applyPlan(t, e, &head, nodes, mov[2:], plan)
}
