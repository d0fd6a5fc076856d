package sched

import "testing"

// The strand measure counts the GPU share a shape cannot use because the
// node's free CPU runs out first, and nothing while CPU suffices.
func TestStrandFragSeesCPU(t *testing.T) {
	m := NewFragModel([]Shape{{CPUMilli: 8000, GPUs: 1, GPUMilli: MilliPerGPU, P: 1}})
	m.Strand = true
	n := NewNode("n", 16000, 1<<20, 8, "G2")
	if got := m.NodeFrag(n); got != 6000 {
		t.Errorf("16 cores for 8 GPUs of an 8-core/GPU shape: stranded %v, want 6000", got)
	}
	n = NewNode("n", 64000, 1<<20, 8, "G2")
	if got := m.NodeFrag(n); got != 0 {
		t.Errorf("enough CPU: stranded %v, want 0", got)
	}
}

// The sliver key tells a share left that popular shapes can use from one
// only rare shapes can.
func TestSliverKey(t *testing.T) {
	shapes := []Shape{{CPUMilli: 1000, GPUs: 1, GPUMilli: 810, P: 0.5}, {CPUMilli: 1000, GPUs: 1, GPUMilli: 100, P: 0.05}, {CPUMilli: 1000, GPUs: 1, GPUMilli: MilliPerGPU, P: 0.45}}
	u := usableShares(shapes)
	if len(u) != 3 || u[0].milli != 100 || u[2].cum < 0.999 {
		t.Fatalf("usable %+v", u)
	}
	n := NewNode("n", 16000, 1<<20, 1, "G2")
	big := &Request{CPUMilli: 1000, GPUs: 1, GPUMilli: 810}
	small := &Request{CPUMilli: 1000, GPUs: 1, GPUMilli: 190}
	if k := sliverKey(big, n, 0, 0.2, u); k != 0 {
		t.Errorf("810 on an empty GPU leaves 190 that 5 %% of requests use: key %v, want 0", k)
	}
	if k := sliverKey(small, n, 0, 0.2, u); k != 1 {
		t.Errorf("190 on an empty GPU leaves 810: key %v, want 1", k)
	}
	whole := &Request{CPUMilli: 1000, GPUs: 1, GPUMilli: MilliPerGPU}
	if k := sliverKey(whole, n, 0, 0.2, u); k != 1 {
		t.Errorf("whole GPU: key %v, want 1", k)
	}
}

// The zero FragParams are the defaults, and a parameter changes the score.
func TestFragParamsDefaultsAndEffect(t *testing.T) {
	l := NewShapeLearner()
	small := Request{ID: "s", Class: ClassBatch, CPUMilli: 4000, MemMiB: 1024, GPUs: 1, GPUMilli: MilliPerGPU}
	four := Request{ID: "f", Class: ClassBatch, CPUMilli: 32000, MemMiB: 1024, GPUs: 4, GPUMilli: MilliPerGPU}
	big := Request{ID: "b", Class: ClassBatch, CPUMilli: 64000, MemMiB: 1024, GPUs: 8, GPUMilli: MilliPerGPU}
	for range 97 {
		l.Observe(&small)
	}
	l.Observe(&four)
	l.Observe(&big)
	m := l.Model(0.95)
	if len(largeOf(m.Reserve, 0.5)) != 2 || len(largeOf(m.Reserve, 1)) != 1 {
		t.Fatalf("reserve %+v", m.Reserve)
	}
	n := NewNode("n", 96000, 1<<20, 8, "G2")
	zero := NewWeighted(nil, m)
	def := NewWeighted(nil, m)
	def.Frag = DefaultFragParams()
	if a, b := zero.Score(&small, n, -1, nil).Score, def.Score(&small, n, -1, nil).Score; a != b {
		t.Errorf("zero params %v, defaults %v", a, b)
	}
	exact := NewWeighted(nil, m)
	exact.Frag = FragParams{ExactLast: true}
	if a, b := zero.Score(&small, n, -1, nil).Score, exact.Score(&small, n, -1, nil).Score; a == b {
		t.Errorf("exact_last did not change the score (%v)", a)
	}
}

// By default a CPU-only request on a node whose GPUs are all taken
// scores as a perfect fit, with FullNodesAsFGD by the keys (neutral).
func TestFullNodesAsFGD(t *testing.T) {
	m := NewFragModel([]Shape{{CPUMilli: 4000, GPUs: 1, GPUMilli: MilliPerGPU, P: 1}})
	n := NewNode("full", 96000, 1<<20, 1, "G2")
	if err := n.Apply(&Assignment{CPUMilli: 4000, GPUs: []int{0}, GPUMilli: MilliPerGPU, FPGA: -1}); err != nil {
		t.Fatal(err)
	}
	cpu := &Request{ID: "c", Class: ClassBatch, CPUMilli: 1000, MemMiB: 1}
	plain := NewWeighted(nil, m)
	fgdLike := NewWeighted(nil, m)
	fgdLike.Frag.FullNodesAsFGD = true
	a, _ := plain.fragmentation(cpu, n, -1)
	b, _ := fgdLike.fragmentation(cpu, n, -1)
	if a != 1 || b >= 1 {
		t.Errorf("full node: default %v (want 1), FullNodesAsFGD %v (want below 1)", a, b)
	}
}

// The CPU-only rule turns the CPU-only capacity tail off, and scores full
// nodes as FGD does, exactly when the learned CPU-only share is above the
// respective threshold, and the policy follows the model it is given.
func TestCPUOnlyRule(t *testing.T) {
	model := func(cpuOnly int) *FragModel {
		l := NewShapeLearner()
		gpu := Request{ID: "g", Class: ClassBatch, CPUMilli: 4000, MemMiB: 1, GPUs: 1, GPUMilli: MilliPerGPU}
		cpu := Request{ID: "c", Class: ClassBatch, CPUMilli: 1000, MemMiB: 1}
		for range 100 - cpuOnly {
			l.Observe(&gpu)
		}
		for range cpuOnly {
			l.Observe(&cpu)
		}
		return l.Model(1)
	}
	few, some, many := model(10), model(20), model(30)
	if a, b, c := few.CPUOnlyShare(), some.CPUOnlyShare(), many.CPUOnlyShare(); a != 0.1 || b != 0.2 || c != 0.3 {
		t.Fatalf("CPU-only shares %v, %v, %v; want 0.1, 0.2, 0.3", a, b, c)
	}
	if s := (*FragModel)(nil).CPUOnlyShare(); s != 0 {
		t.Errorf("nil model: share %v", s)
	}
	rule := FragParams{CPUOnlyTailMax: 0.15, CPUOnlyFullMax: 0.25}
	for _, c := range []struct {
		m    *FragModel
		tail TailKey
		full bool
	}{{few, TailCapacityCPUOnly, false}, {some, TailNone, false}, {many, TailNone, true}} {
		if e := rule.Effective(c.m); e.Tail != c.tail || e.FullNodesAsFGD != c.full {
			t.Errorf("share %v: tail %v, full nodes as FGD %v; want %v, %v", c.m.CPUOnlyShare(), e.Tail, e.FullNodesAsFGD, c.tail, c.full)
		}
	}
	strand := FragParams{CPUOnlyTailMax: 0.15, Tail: TailStrandGPU}
	if e := strand.Effective(many); e.Tail != TailStrandGPU {
		t.Errorf("the rule changed a tail other than capacity-cpu: %v", e.Tail)
	}
	never := FragParams{CPUOnlyTailMax: 1, CPUOnlyFullMax: 1}
	if e := never.Effective(many); e.Tail != TailCapacityCPUOnly || e.FullNodesAsFGD {
		t.Errorf("thresholds 1 switched: %+v", e)
	}
	if e := (FragParams{}).Effective(nil); e.CPUOnlyTailMax != DefaultCPUOnlyTailMax || e.CPUOnlyFullMax != DefaultCPUOnlyFullMax {
		t.Errorf("zero thresholds resolved to %v, %v; want the defaults", e.CPUOnlyTailMax, e.CPUOnlyFullMax)
	}

	// The policy applies it: a CPU-only request on a node whose only GPU
	// is taken is a perfect fit under the few-CPU-only model and scored
	// by the keys under the many-CPU-only one, and SetFragModel
	// re-applies the rule.
	full := NewNode("full", 96000, 1<<20, 1, "G2")
	if err := full.Apply(&Assignment{CPUMilli: 4000, GPUs: []int{0}, GPUMilli: MilliPerGPU, FPGA: -1}); err != nil {
		t.Fatal(err)
	}
	cpu := &Request{ID: "c", Class: ClassBatch, CPUMilli: 1000, MemMiB: 1}
	p := NewWeighted(nil, few)
	p.Frag = rule
	if s, _ := p.fragmentation(cpu, full, -1); s != 1 {
		t.Errorf("few CPU-only: full node scored %v, want 1", s)
	}
	if p.fs.second == nil {
		t.Errorf("few CPU-only: no capacity tail")
	}
	p.SetFragModel(many)
	if s, _ := p.fragmentation(cpu, full, -1); s >= 1 {
		t.Errorf("many CPU-only: full node scored %v, want below 1 (by the keys)", s)
	}
	if p.fs.second != nil {
		t.Errorf("many CPU-only: the capacity tail is still set")
	}
}

// Where the reserve is off because the large shapes are common, the rule
// makes the CPU-only keys FGD's too, unless ReserveOffKeepsCPUKeys.
func TestReserveOffCPUKeys(t *testing.T) {
	model := func(large int) *FragModel {
		l := NewShapeLearner()
		small := Request{ID: "s", Class: ClassBatch, CPUMilli: 4000, MemMiB: 1, GPUs: 1, GPUMilli: MilliPerGPU}
		big := Request{ID: "b", Class: ClassBatch, CPUMilli: 64000, MemMiB: 1, GPUs: 8, GPUMilli: MilliPerGPU}
		cpu := Request{ID: "c", Class: ClassBatch, CPUMilli: 1000, MemMiB: 1}
		for range 90 - large {
			l.Observe(&small)
		}
		for range large {
			l.Observe(&big)
		}
		for range 10 {
			l.Observe(&cpu)
		}
		return l.Model(1)
	}
	rare, common := model(2), model(10) // large shares 0.02 and 0.10 against a limit of 0.03
	if large, c := DefaultFragParams().reserveOf(rare); len(large) != 1 || c {
		t.Fatalf("rare large shapes: reserve %+v, common %v", large, c)
	}
	if large, c := DefaultFragParams().reserveOf(common); large != nil || !c {
		t.Fatalf("common large shapes: reserve %+v, common %v", large, c)
	}
	if e := DefaultFragParams().Effective(rare); e.Tail != TailCapacityCPUOnly || e.FullNodesAsFGD {
		t.Errorf("reserve on: tail %v, full nodes as FGD %v; want capacity-cpu, false", e.Tail, e.FullNodesAsFGD)
	}
	if e := DefaultFragParams().Effective(common); e.Tail != TailNone || !e.FullNodesAsFGD {
		t.Errorf("reserve off: tail %v, full nodes as FGD %v; want none, true", e.Tail, e.FullNodesAsFGD)
	}
	keep := DefaultFragParams()
	keep.ReserveOffKeepsCPUKeys = true
	if e := keep.Effective(common); e.Tail != TailCapacityCPUOnly || e.FullNodesAsFGD {
		t.Errorf("reserve off, keys kept: tail %v, full nodes as FGD %v; want capacity-cpu, false", e.Tail, e.FullNodesAsFGD)
	}
	p := NewWeighted(nil, common)
	p.linkFrag()
	if p.fs.reserve != nil || p.fs.second != nil {
		t.Errorf("reserve off: reserve %v, capacity tail %v; want neither", p.fs.reserve != nil, p.fs.second != nil)
	}
}
