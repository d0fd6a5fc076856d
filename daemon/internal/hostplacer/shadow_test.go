package hostplacer

import (
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// ShadowTime: on a 4-CPU host holding 2 and 1 CPU, a 3-CPU head fits once
// both have ended (the later end); a job of unknown end in the way gives
// no shadow time, nor does a gang head; an end already past counts as now.
func TestShadowTime(t *testing.T) {
	p := New(Hardware{Name: "t", CPU: 4000, Memory: 1 << 30}, Options{Seed: 1})
	a, b := cpuJob("a", api.TierBurstable, 2000), cpuJob("b", api.TierBurstable, 1000)
	for _, j := range []*api.Job{a, b} {
		if _, why, ok := p.Place([]*api.Job{j}); !ok {
			t.Fatal(why)
		}
	}
	now := time.Unix(1000, 0)
	head := []*api.Job{cpuJob("h", api.TierBurstable, 3000)}
	ends := map[string]time.Time{"a": now.Add(10 * time.Second), "b": now.Add(5 * time.Second)}
	if s, ok := p.ShadowTime(head, ends, now); !ok || !s.Equal(now.Add(10*time.Second)) {
		t.Fatalf("shadow %v %v, want +10s", s, ok)
	}
	small := []*api.Job{cpuJob("s", api.TierBurstable, 2000)}
	if s, ok := p.ShadowTime(small, ends, now); !ok || !s.Equal(now.Add(5*time.Second)) {
		t.Fatalf("shadow of a 2-CPU head %v %v, want +5s", s, ok)
	}
	if _, ok := p.ShadowTime(head, map[string]time.Time{"b": now}, now); ok {
		t.Fatal("a shadow time with a job of unknown end in the way")
	}
	if s, ok := p.ShadowTime(head, map[string]time.Time{"a": now.Add(-time.Hour), "b": now.Add(-time.Hour)}, now); !ok || !s.Equal(now) {
		t.Fatalf("past ends: %v %v, want now", s, ok)
	}
	if _, ok := p.ShadowTime(append(head, small...), ends, now); ok {
		t.Fatal("a shadow time for a gang head")
	}
}
