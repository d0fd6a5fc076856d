package sched

import (
	"math"
	"testing"
)

// Add weighs a shape like that many Observe calls; weights that are not
// finite numbers above zero are ignored.
func TestShapeLearnerAdd(t *testing.T) {
	a, b := NewShapeLearner(), NewShapeLearner()
	r := Request{ID: "x", CPUMilli: 4000, GPUs: 1, GPUMilli: 500}
	for range 3 {
		a.Observe(&r)
	}
	a.Observe(&Request{ID: "y", CPUMilli: 1000})
	b.Add(Shape{CPUMilli: 4000, GPUs: 1, GPUMilli: 500, P: 99}, 3)
	b.Add(Shape{CPUMilli: 1000}, 1)
	for _, w := range []float64{0, -2, math.NaN(), math.Inf(1)} {
		b.Add(Shape{CPUMilli: 7000}, w)
	}
	if a.Total() != 4 || b.Total() != 4 {
		t.Fatalf("totals %v %v", a.Total(), b.Total())
	}
	ma, mb := a.Model(1), b.Model(1)
	if len(ma.Shapes) != 2 || len(mb.Shapes) != 2 || ma.Shapes[0] != mb.Shapes[0] || ma.Shapes[1] != mb.Shapes[1] {
		t.Fatalf("observed %+v, added %+v", ma.Shapes, mb.Shapes)
	}
}
