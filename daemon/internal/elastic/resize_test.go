package elastic

import (
	"fmt"
	"testing"
	"time"
)

func TestRecommend(t *testing.T) {
	usage := make([]float64, 100)
	for i := range usage {
		usage[i] = float64(i + 1) // 1..100: p95 is 95
	}
	p := ResizeParams{Percentile: 95, Headroom: 2, MinSamples: 30, Change: 0.1}
	if l, ok := Recommend(usage, 50, 0, p); !ok || l != 190 {
		t.Errorf("limit %d %v, want 95 × 2 = 190", l, ok)
	}
	if l, ok := Recommend(usage, 500, 0, p); !ok || l != 500 {
		t.Errorf("limit %d %v, want the 500m request (never below it)", l, ok)
	}
	if _, ok := Recommend(usage, 50, 180, p); ok {
		t.Error("a change under 10% recommended")
	}
	if _, ok := Recommend(usage[:10], 50, 0, p); ok {
		t.Error("recommended from 10 readings")
	}
}

type fakeResize struct {
	jobs []Resizable
	set  []string
}

func (f *fakeResize) Burstable() []Resizable { return f.jobs }
func (f *fakeResize) SetCPULimit(id string, milli int64, reason string) error {
	f.set = append(f.set, fmt.Sprintf("%s=%d", id, milli))
	return nil
}

func TestResizerAppliesOnce(t *testing.T) {
	flat := func(v float64) []float64 {
		out := make([]float64, 40)
		for i := range out {
			out[i] = v
		}
		return out
	}
	h := &fakeResize{jobs: []Resizable{{ID: "1", Request: 500, Usage: flat(1000)}, {ID: "2", Request: 2000, Usage: flat(100)}}}
	r, err := NewResizer(h, time.Second, ResizeParams{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Step()
	r.Step() // the same usage: nothing new
	if fmt.Sprint(h.set) != "[1=1300 2=2000]" {
		t.Errorf("limits %v, want job 1 at 1000 × 1.3 and job 2 at its 2000m request", h.set)
	}
	h.jobs[0].Usage = flat(2000)
	r.Step()
	if h.set[len(h.set)-1] != "1=2600" {
		t.Errorf("after usage doubled: %v", h.set)
	}
	if _, err := NewResizer(h, time.Second, ResizeParams{Headroom: 0.5}, nil); err == nil {
		t.Error("headroom below 1 accepted")
	}
}
