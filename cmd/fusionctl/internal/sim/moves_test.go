package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

// scatterTrace is 20 one-GPU nodes, then 20 best-effort 400-milli shares
// (the random policy scatters them, one or two to a GPU) and 20 whole-GPU
// pods: without moves a whole-GPU pod fits only on a GPU no share took;
// moving a lone share beside another frees a GPU for one.
func scatterTrace() ([]NodeSpec, []Pod) {
	var specs []NodeSpec
	for i := range 20 {
		specs = append(specs, NodeSpec{Name: fmt.Sprintf("n%02d", i), CPUMilli: 32000, MemMiB: 65536, GPUs: 1, Model: "V100"})
	}
	var pods []Pod
	for i := range 20 {
		pods = append(pods, Pod{Name: fmt.Sprintf("be%02d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 400, QoS: "BE"})
	}
	for i := range 20 {
		pods = append(pods, Pod{Name: fmt.Sprintf("ls%02d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 1000, QoS: "LS"})
	}
	return specs, pods
}

// Moves raise allocation on scattered shares, and the budget holds after
// every arrival: at most N·i/1000 moves after i arrivals.
func TestMovesRaiseAllocationWithinBudget(t *testing.T) {
	specs, pods := scatterTrace()
	run := func(moves int, movesAt *[]int) RunResult {
		t.Helper()
		p, _ := sched.PolicyByName("random", nil, nil)
		r, err := runProtocol(context.Background(), specs, pods, p, "random", 7, ShapeModel(pods, 0.95), []float64{100}, sched.TieRanked, replayOpts{moves: moves, movesAt: movesAt})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	plain := run(0, nil)
	if plain.Failed == 0 {
		t.Fatal("the scattered trace fails nothing without moves: no test")
	}
	for _, n := range []int{1000, 100} {
		var at []int
		r := run(n, &at)
		if len(at) != len(pods) {
			t.Fatalf("moves %d: %d budget records for %d arrivals", n, len(at), len(pods))
		}
		for i, used := range at {
			if limit := n * (i + 1) / 1000; used > limit {
				t.Fatalf("moves %d: %d moves after %d arrivals, budget %d", n, used, i+1, limit)
			}
		}
		if r.MovesUsed != at[len(at)-1] || r.MovesUsed == 0 || r.PlacedByMoves == 0 || r.PodsMoved == 0 || r.PodsMoved > r.MovesUsed {
			t.Fatalf("moves %d: used %d (last record %d), pods moved %d, placed by moves %d", n, r.MovesUsed, at[len(at)-1], r.PodsMoved, r.PlacedByMoves)
		}
		if r.Failed >= plain.Failed || r.AllocPct[0] <= plain.AllocPct[0] {
			t.Fatalf("moves %d: failed %d alloc %.2f, without moves failed %d alloc %.2f", n, r.Failed, r.AllocPct[0], plain.Failed, plain.AllocPct[0])
		}
	}
}

// With moves the node view must stay in step: every pod lands on the
// same node with and without deduplication, and the same moves are made.
// Twenty alike nodes of each of two models (the view groups them); 600-
// milli best-effort shares of either model, one to a GPU, then whole-GPU
// pods of model A, which fit only after a share moves off an A GPU onto
// a B node; then 300-milli shares of model B, which the moved shares'
// B nodes and the empty ones compete for.
func TestMovesKeepNodeViewInStep(t *testing.T) {
	var specs []NodeSpec
	for i := range 40 {
		specs = append(specs, NodeSpec{Name: fmt.Sprintf("n%02d", i), CPUMilli: 32000, MemMiB: 65536, GPUs: 1, Model: []string{"A", "B"}[i/20]})
	}
	var pods []Pod
	for i := range 30 {
		pods = append(pods, Pod{Name: fmt.Sprintf("be%02d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 600, GPUSpec: "A|B", QoS: "BE"})
	}
	for i := range 20 {
		pods = append(pods, Pod{Name: fmt.Sprintf("ls%02d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 1000, GPUSpec: "A", QoS: "LS"})
	}
	for i := range 20 {
		pods = append(pods, Pod{Name: fmt.Sprintf("b%02d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 300, GPUSpec: "B", QoS: "LS"})
	}
	frag := ShapeModel(pods, 0.95)
	made := 0
	for _, seed := range []uint64{1, 2, 3} {
		for _, pol := range []string{"fusiond", "fgd", "bestfit"} {
			var places [2][]int
			var at [2][]int
			for k, dedupe := range []bool{false, true} {
				p, _ := sched.PolicyByName(pol, frag, nil)
				if _, err := runProtocol(context.Background(), specs, pods, p, pol, seed, frag, []float64{100}, sched.TieRanked, replayOpts{dedupe: dedupe, placed: &places[k], moves: 1000, movesAt: &at[k]}); err != nil {
					t.Fatal(err)
				}
			}
			if i := firstDiff(places[0], places[1]); i >= 0 {
				t.Errorf("%s seed %d: pod %d on node %d without the view, %d with it", pol, seed, i, places[0][i], places[1][i])
			}
			if !slices.Equal(at[0], at[1]) {
				t.Errorf("%s seed %d: moves differ with the view", pol, seed)
			}
			made += at[0][len(at[0])-1]
		}
	}
	if made == 0 {
		t.Fatal("no moves: the test checks nothing")
	}
}

// With --moves the report puts each policy's no-move figures beside: they
// are those of the plain run; every output format carries the moves.
func TestSimulateMovesReport(t *testing.T) {
	o := tinyOptions()
	o.Policies = []string{"fusiond", "bestfit"}
	plain, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	o.Moves = 200
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for i, r := range rep.Runs {
		p := plain.Runs[i]
		if r.Moves != 200 || !slices.Equal(r.NoMoveAllocPct, p.AllocPct) || r.Idle == nil || r.NoMoveIdle == nil {
			t.Fatalf("%s seed %d: moves %d, no-move alloc %v, plain run %v", r.Policy, r.Seed, r.Moves, r.NoMoveAllocPct, p.AllocPct)
		}
		if r.MovesUsed == 0 && !slices.Equal(r.AllocPct, p.AllocPct) {
			t.Errorf("%s seed %d: no move made, yet allocation %v differs from %v", r.Policy, r.Seed, r.AllocPct, p.AllocPct)
		}
		if p.Moves != 0 || p.MovesUsed != 0 || p.Idle != nil || p.NoMoveAllocPct != nil {
			t.Fatalf("plain run carries move figures: %+v", p)
		}
		used += r.MovesUsed
	}
	if used == 0 {
		t.Fatal("no moves on the tiny trace")
	}
	var tbl, js, cs bytes.Buffer
	for f, b := range map[string]*bytes.Buffer{"table": &tbl, "json": &js, "csv": &cs} {
		if err := WriteReport(b, rep, f); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(tbl.String(), "moves: at most 200 per 1,000 arrivals") || !strings.Contains(tbl.String(), "placed by moves") {
		t.Errorf("table without the moves:\n%s", tbl.String())
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Summaries[0].Moves != 200 || back.Summaries[0].NoMoveAllocPct == nil {
		t.Errorf("json: %v %+v", err, back.Summaries)
	}
	lines := strings.Split(strings.TrimSpace(cs.String()), "\n")
	hdr := strings.Split(lines[0], ",")
	if !slices.Contains(hdr, "moves_used") || len(strings.Split(lines[1], ",")) != len(hdr) {
		t.Errorf("csv header %v, first row %s", hdr, lines[1])
	}
	var ptbl bytes.Buffer
	if err := WriteReport(&ptbl, plain, "table"); err != nil || strings.Contains(ptbl.String(), "moves") {
		t.Errorf("the plain table mentions moves (%v):\n%s", err, ptbl.String())
	}
}

// Bad --moves values are refused with a clear error.
func TestMovesOptions(t *testing.T) {
	for _, c := range []struct {
		moves int
		timed bool
		want  string
	}{{-1, false, "want 0 or more"}, {1001, false, "at most 1000"}, {5, true, "not to --timed"}} {
		o := tinyOptions()
		o.Moves, o.Timed = c.moves, c.timed
		_, err := Simulate(context.Background(), o)
		if !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("moves %d timed %v: %v, want %q", c.moves, c.timed, err, c.want)
		}
	}
	specs, pods := scatterTrace()
	if _, err := runProtocol(context.Background(), specs, pods, sched.BestFit{}, "bestfit", 1, ShapeModel(pods, 0.95), []float64{100}, sched.TieRanked, replayOpts{moves: -3}); !errors.Is(err, ErrBadOption) {
		t.Errorf("runProtocol with -3 moves: %v", err)
	}
	cmd := NewCommand()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--nodes", "testdata/nodes.csv", "--pods", "testdata/pods.csv", "--moves", "-2"})
	if err := cmd.Execute(); !errors.Is(err, ErrBadOption) {
		t.Errorf("simulate --moves -2: %v", err)
	}
}

// The mover regroups every node a plan touches: after each arrival every
// node's group key and summary are its state's and each group has exactly
// one representative. Twenty alike one-GPU nodes: 400-milli best-effort shares alone
// on nodes 0..9 and 800-milli guaranteed ones on 10..19 (committed as
// given), then whole-GPU pods, each placed by moving a share beside
// another.
func TestMoverKeepsViewGroups(t *testing.T) {
	var specs []NodeSpec
	for i := range 20 {
		specs = append(specs, NodeSpec{Name: fmt.Sprintf("n%02d", i), CPUMilli: 32000, MemMiB: 65536, GPUs: 1, Model: "A"})
	}
	p, _ := sched.PolicyByName("fusiond", nil, nil)
	nodes := BuildNodes(specs)
	eng := sched.NewEngine(sched.Options{Policy: p, Seed: 5, TieBreak: sched.TieRanked})
	view := newNodeView(nodes, 5, memoryBlind(p))
	mv := newMover(1000, eng, nodes, view)
	check := func(when string) {
		t.Helper()
		shown := map[string]int{}
		for j, n := range nodes {
			if k := view.stateKey(n); view.key[j] != k {
				t.Fatalf("%s: node %d grouped as %q, its state is %q", when, j, view.key[j], k)
			}
			if view.sum[j] != fitSummaryOf(n) {
				t.Fatalf("%s: node %d summarised as %+v, its state is %+v", when, j, view.sum[j], fitSummaryOf(n))
			}
			if view.repAt[j] >= 0 {
				shown[view.key[j]]++
			}
		}
		for k, g := range view.groups {
			if shown[k] != 1 || len(g) == 0 {
				t.Fatalf("%s: group %q (%d members) shows %d", when, k, len(g), shown[k])
			}
		}
	}
	for i := range 20 {
		pod := Pod{Name: fmt.Sprintf("be%02d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 400, QoS: "BE"}
		if i >= 10 {
			pod = Pod{Name: fmt.Sprintf("g%02d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 800, QoS: "Guaranteed"}
		}
		req := pod.Request()
		a := sched.Assignment{Node: nodes[i].Name, NodeIdx: i, CPUMilli: req.CPUMilli, MemMiB: req.MemMiB, GPUs: []int{0}, GPUMilli: req.GPUMilli, GPUModel: "A", FPGA: -1}
		if err := eng.Commit(&req, &a, nodes); err != nil {
			t.Fatal(err)
		}
		view.changed(i)
		mv.placed(&req, &a, i+1)
	}
	check("setup")
	placed := 0
	for i := range 8 {
		req := (&Pod{Name: fmt.Sprintf("w%d", i), CPUMilli: 1000, MemMiB: 1024, GPUs: 1, GPUMilli: 1000, QoS: "LS"}).Request()
		if _, err := eng.Place(&req, view.forRequest(&req)); err == nil {
			t.Fatalf("whole pod %d fits without moves", i)
		}
		_, ok, err := mv.tryMoves(&req, 1000+i)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			placed++
		}
		check(fmt.Sprintf("after whole pod %d", i))
	}
	// Ten lone 400s pair up into five GPUs: five whole GPUs, one move each.
	if placed != 5 || mv.used != 5 {
		t.Fatalf("%d whole pods placed with %d moves, want 5 and 5", placed, mv.used)
	}
}

// Pods of one name (a user's file may repeat names) are moved apart: the
// scattered trace with every pod named alike makes the same moves.
func TestMovesPodsOfOneName(t *testing.T) {
	specs, pods := scatterTrace()
	run := func(pods []Pod) RunResult {
		t.Helper()
		p, _ := sched.PolicyByName("random", nil, nil)
		r, err := runProtocol(context.Background(), specs, pods, p, "random", 7, ShapeModel(pods, 0.95), []float64{100}, sched.TieRanked, replayOpts{moves: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	named := run(pods)
	same := slices.Clone(pods)
	for i := range same {
		same[i].Name = "pod"
	}
	alike := run(same)
	if named.MovesUsed == 0 || alike.MovesUsed != named.MovesUsed || alike.AllocPct[0] != named.AllocPct[0] {
		t.Fatalf("distinct names: %d moves, %.2f%%; one name: %d moves, %.2f%%", named.MovesUsed, named.AllocPct[0], alike.MovesUsed, alike.AllocPct[0])
	}
}
