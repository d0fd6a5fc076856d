package sched

import (
	"reflect"
	"strings"
	"testing"
)

// migGPUNode is a node with one MIG GPU of total slices holding insts.
func migGPUNode(name string, total int, insts ...MIGInstance) *Node {
	n := NewNode(name, 16000, 1<<16, 1, "H100")
	n.GPUs[0].MIG = &MIG{TotalSlices: total, ReconfigCost: 500, Instances: insts}
	return n
}

// pickMIG's order: an idle instance of the profile, then free slices, then
// slices only idle instances hold (destroying them); never a busy one.
func TestPickMIGIdleInstances(t *testing.T) {
	oneG := Request{MIGProfile: "1g.10gb", MIGSlices: 1}
	fourG := Request{MIGProfile: "4g.40gb", MIGSlices: 4}
	tests := []struct {
		name  string
		req   Request
		insts []MIGInstance
		want  MIGPick
		fits  bool
	}{
		{"idle instance of the profile", oneG, []MIGInstance{{Profile: "1g.10gb", Start: 5, Slices: 1}}, MIGPick{Start: 5, Slices: 1}, true},
		{"destroys where no free spot", fourG, []MIGInstance{{Profile: "1g.10gb", Start: 2, Slices: 1}, {Profile: "2g.20gb", Start: 6, Slices: 2, InUse: true}},
			MIGPick{Start: 0, Slices: 4, Create: true, Destroy: []int{2}}, true},
		{"free slices before destroying", fourG, []MIGInstance{{Profile: "1g.10gb", Start: 0, Slices: 1}}, MIGPick{Start: 4, Slices: 4, Create: true}, true},
		{"destroys the idle ones", fourG, []MIGInstance{{Profile: "1g.10gb", Start: 1, Slices: 1}, {Profile: "1g.10gb", Start: 3, Slices: 1}, {Profile: "2g.20gb", Start: 4, Slices: 2, InUse: true}},
			MIGPick{Start: 0, Slices: 4, Create: true, Destroy: []int{1, 3}}, true},
		{"fewest destroyed", fourG, []MIGInstance{{Profile: "1g.10gb", Start: 1, Slices: 1}, {Profile: "1g.10gb", Start: 3, Slices: 1}, {Profile: "2g.20gb", Start: 4, Slices: 2}},
			MIGPick{Start: 4, Slices: 4, Create: true, Destroy: []int{4}}, true},
		{"never a busy instance", fourG, []MIGInstance{{Profile: "1g.10gb", Start: 1, Slices: 1, InUse: true}, {Profile: "1g.10gb", Start: 5, Slices: 1, InUse: true}}, MIGPick{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := migGPUNode("m", 8, tc.insts...)
			got, ok := pickMIG(&tc.req, n)
			if ok != tc.fits || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("pickMIG = %+v, %v; want %+v, %v", got, ok, tc.want, tc.fits)
			}
			want := Fits
			if !tc.fits {
				want = ReasonMIG
			}
			if r := Filter(&tc.req, n); r != want {
				t.Fatalf("Filter = %q, want %q", r, want)
			}
		})
	}
}

// Starts (the driver's placements) bound where a new instance goes: a
// 4-slice profile NVIDIA starts only at 0 destroys the idle instance there
// rather than taking the free slices at 4.
func TestPickMIGStarts(t *testing.T) {
	n := migGPUNode("m", 8, MIGInstance{Profile: "1g.10gb", Start: 2, Slices: 1})
	n.GPUs[0].MIG.Starts = map[string][]int{"4g.40gb": {0}}
	req := Request{MIGProfile: "4g.40gb", MIGSlices: 4}
	got, ok := pickMIG(&req, n)
	if want := (MIGPick{Start: 0, Slices: 4, Create: true, Destroy: []int{2}}); !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("pickMIG = %+v, %v; want %+v", got, ok, want)
	}
	if c := got.Cost(n.GPUs[0].MIG); c != 1000 {
		t.Fatalf("cost %v, want a create and a destroy (2 × 500)", c)
	}
}

// The engine places a new instance over an idle one only where nothing
// free is offered; committing it removes the idle instances it overlaps,
// releasing it leaves it idle, and an instance in use is never destroyed.
func TestPlaceCommitDestroysIdle(t *testing.T) {
	e := NewEngine(Options{Seed: 1, TieBreak: TieRanked})
	n := migGPUNode("m", 8,
		MIGInstance{Profile: "1g.10gb", Start: 1, Slices: 1},
		MIGInstance{Profile: "1g.10gb", Start: 6, Slices: 1, InUse: true})
	nodes := []*Node{n}
	req := Request{ID: "big", Class: ClassInference, CPUMilli: 1000, MIGProfile: "4g.40gb", MIGSlices: 4}
	d, err := e.Place(&req, nodes)
	if err != nil {
		t.Fatalf("Place: %v", err)
	}
	if p := d.Assignment.MIG; p == nil || p.Start != 0 || !p.Create || !reflect.DeepEqual(p.Destroy, []int{1}) {
		t.Fatalf("MIG pick %+v, want a new instance at 0 destroying the idle one at 1", d.Assignment.MIG)
	}
	if !strings.Contains(d.Explain(), "destroying idle [1]") {
		t.Fatalf("explanation does not name the destroyed instance: %s", d.Explain())
	}
	a := d.Assignment
	if err := e.Commit(&req, &a, nodes); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	want := []MIGInstance{{Profile: "1g.10gb", Start: 6, Slices: 1, InUse: true}, {Start: 0, Slices: 4, InUse: true}}
	if got := n.GPUs[0].MIG.Instances; !reflect.DeepEqual(got, want) {
		t.Fatalf("instances after commit %+v, want %+v", got, want)
	}
	// Committing it again fails: the slices are in use now.
	if err := n.Apply(&a); err == nil {
		t.Fatal("a second create over an instance in use was applied")
	}
	e.Release(&req, &a, nodes)
	if in := n.GPUs[0].MIG.Instances[1]; in.InUse || in.Start != 0 {
		t.Fatalf("after release: %+v, want the 4-slice instance idle", in)
	}
	// Another 4-slice request reuses it; a 7-slice one finds the busy
	// instance at 6 in the way.
	if p, ok := pickMIG(&req, n); !ok || p.Create || p.Start != 0 {
		t.Fatalf("pickMIG = %+v, %v: want the idle 4-slice instance", p, ok)
	}
	seven := Request{ID: "all", Class: ClassInference, CPUMilli: 1000, MIGProfile: "7g.80gb", MIGSlices: 7}
	if _, err := e.Place(&seven, nodes); err == nil {
		t.Fatal("a 7-slice instance placed over an instance in use")
	}
}

// Candidates offer the destroying spot only where the node offers no
// existing instance or free slices: a node with free slices keeps its
// options as before.
func TestMIGOptionsDestroyLast(t *testing.T) {
	req := Request{MIGProfile: "4g.40gb", MIGSlices: 4}
	free := migGPUNode("m", 8, MIGInstance{Profile: "1g.10gb", Start: 2, Slices: 1})
	free.GPUs = append(free.GPUs, free.GPUs[0])
	free.GPUs[1].MIG = &MIG{TotalSlices: 8, ReconfigCost: 500, Instances: []MIGInstance{{Profile: "1g.10gb", Start: 0, Slices: 1}}}
	for _, o := range migOptions(&req, free, nil) {
		if len(o.mig.Destroy) > 0 {
			t.Fatalf("option %+v destroys while GPU 1 has free slices", o.mig)
		}
	}
	blocked := migGPUNode("m", 8, MIGInstance{Profile: "1g.10gb", Start: 2, Slices: 1}, MIGInstance{Profile: "1g.10gb", Start: 5, Slices: 1, InUse: true})
	opts := migOptions(&req, blocked, nil)
	if len(opts) != 1 || !reflect.DeepEqual(opts[0].mig, MIGPick{Start: 0, Slices: 4, Create: true, Destroy: []int{2}}) {
		t.Fatalf("options %+v, want one destroying the idle instance at 2", opts)
	}
}

// Defragmentation over MIG: a 4-slice head blocked by a movable 1-slice
// job in the middle of a GPU gets a one-move plan — the job moves to the
// other GPU's free slices, its instance goes idle and the head's new
// instance destroys it.
func TestPlanMovesMIGFreesSlices(t *testing.T) {
	e := NewEngine(Options{Seed: 1, TieBreak: TieRanked})
	a := migGPUNode("a", 7)
	b := migGPUNode("b", 7, MIGInstance{Profile: "4g.40gb", Start: 0, Slices: 4, InUse: true})
	nodes := []*Node{a, b}
	small := Request{ID: "small", Class: ClassInference, CPUMilli: 500, MIGProfile: "1g.10gb", MIGSlices: 1}
	mov := defragSetup(t, e, nodes, map[string]Assignment{
		"small": {Node: "a", NodeIdx: 0, CPUMilli: 500, MIG: &MIGPick{GPU: 0, Start: 2, Slices: 1, Create: true}, FPGA: -1},
	}, small)
	head := Request{ID: "head", Class: ClassInference, CPUMilli: 500, MIGProfile: "4g.40gb", MIGSlices: 4}
	if r := Filter(&head, a); r != ReasonMIG {
		t.Fatalf("head on a before the move: %q, want %q", r, ReasonMIG)
	}
	before := cloneNodes(nodes)
	plan, ok := e.PlanMoves(&head, nodes, mov, 3)
	if !ok || len(plan.Moves) != 1 || plan.Moves[0].ID != "small" {
		t.Fatalf("plan %+v (ok %v): want small moved", plan, ok)
	}
	if to := plan.Moves[0].To.MIG; to == nil || (plan.Moves[0].To.Node == "a" && to.Start < 4) {
		t.Fatalf("small moves to %+v (mig %+v), into the head's slices", plan.Moves[0].To, to)
	}
	if p := plan.Head.MIG; plan.Head.Node != "a" || p == nil || p.Start != 0 || !reflect.DeepEqual(p.Destroy, []int{2}) {
		t.Fatalf("head at %+v (mig %+v), want a new instance at 0 on a destroying the idle one at 2", plan.Head, plan.Head.MIG)
	}
	if !reflect.DeepEqual(before, nodes) {
		t.Fatal("PlanMoves changed the nodes")
	}
	applyPlan(t, e, &head, nodes, mov, plan)
	// The head's instance is in use at 0 and the idle one at 2 is gone.
	headIn := false
	for _, in := range a.GPUs[0].MIG.Instances {
		headIn = headIn || (in.Start == 0 && in.Slices == 4 && in.InUse)
		if in.Start == 2 {
			t.Fatalf("the idle instance at 2 survived: %+v", a.GPUs[0].MIG.Instances)
		}
	}
	if !headIn {
		t.Fatalf("a's instances after the plan: %+v", a.GPUs[0].MIG.Instances)
	}
}
