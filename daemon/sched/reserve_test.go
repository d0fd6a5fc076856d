package sched

import "testing"

// The reserve key sends a small request to a node that is already broken
// rather than to the last node a large shape could use, where FGD's
// measure over the typical shapes alone rates both alike.
func TestReserveKeepsRoomForLargeShapes(t *testing.T) {
	l := NewShapeLearner()
	small := Request{ID: "s", Class: ClassBatch, CPUMilli: 4000, MemMiB: 1024, GPUs: 1, GPUMilli: MilliPerGPU}
	big := Request{ID: "b", Class: ClassBatch, CPUMilli: 64000, MemMiB: 1024, GPUs: 8, GPUMilli: MilliPerGPU}
	for range 99 {
		l.Observe(&small)
	}
	l.Observe(&big)
	m := l.Model(0.95)
	if len(m.Shapes) != 1 || len(m.Reserve) != 1 || m.Reserve[0].GPUs != 8 || m.Reserve[0].P != 0.01 {
		t.Fatalf("typical %+v, reserve %+v", m.Shapes, m.Reserve)
	}
	nodes := func() []*Node {
		empty := NewNode("empty", 96000, 1<<20, 8, "G2")
		used := NewNode("used", 96000, 1<<20, 8, "G2")
		if err := used.Apply(&Assignment{CPUMilli: 4000, GPUs: []int{0}, GPUMilli: MilliPerGPU, FPGA: -1}); err != nil {
			t.Fatal(err)
		}
		return []*Node{empty, used}
	}
	score := func(p Policy) (float64, float64) {
		ns := nodes()
		return p.Score(&small, ns[0], 0, nil).Score, p.Score(&small, ns[1], 1, nil).Score
	}
	e, u := score(NewWeighted(nil, m))
	if u <= e {
		t.Errorf("with the reserve: used node %.6f, empty (the only 8-GPU host) %.6f", u, e)
	}
	plain := NewFragModel(m.Shapes)
	e, u = score(NewWeighted(nil, plain))
	if u != e {
		t.Errorf("without large shapes the two nodes should tie on fragmentation: %.6f vs %.6f", u, e)
	}
	// The whole engine agrees, whatever the seed's node ranking.
	for seed := range uint64(8) {
		eng := NewEngine(Options{Policy: NewWeighted(nil, m), Seed: seed, TieBreak: TieRanked})
		d, err := eng.Place(&small, nodes())
		if err != nil || d.Assignment.Node != "used" {
			t.Fatalf("seed %d: placed on %q (%v)", seed, d.Assignment.Node, err)
		}
	}
}
