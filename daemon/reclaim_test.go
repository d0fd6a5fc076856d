package daemon

import (
	"fmt"
	"maps"
	"strings"
	"syscall"
	"testing"

	"github.com/fusiond/fusiond/cgroups"
)

type knobWrites struct{ writes []string }

func (k *knobWrites) SetTierCPUQuota(t cgroups.Tier, milli int64) error {
	k.writes = append(k.writes, fmt.Sprintf("%s cpu %d", t, milli))
	return nil
}

func (k *knobWrites) SetTierMemoryHigh(t cgroups.Tier, bytes int64) error {
	k.writes = append(k.writes, fmt.Sprintf("%s mem %d", t, bytes))
	return nil
}

// The QoS loop and the reclaim loop each set a best-effort limit; the
// tighter one is written, and lifting one leaves the other.
func TestBestEffortKnobsTighterWins(t *testing.T) {
	w := &knobWrites{}
	k := &beKnobs{cg: w}
	steps := []struct {
		do   func() error
		want string
	}{
		{func() error { return k.setReclaim(1500, 4<<30) }, "besteffort cpu 1500,besteffort mem 4294967296"},
		{func() error { return k.setQoSCPU(800) }, "besteffort cpu 800"},
		{func() error { return k.setReclaim(1200, 4<<30) }, ""}, // the QoS limit is tighter: nothing changes
		{func() error { return k.setReclaim(500, 1<<30) }, "besteffort cpu 500,besteffort mem 1073741824"},
		{func() error { return k.setQoSMemory(2 << 30) }, ""},
		{func() error { return k.setReclaim(0, 0) }, "besteffort cpu 800,besteffort mem 2147483648"},
		{func() error { return k.setQoSCPU(0) }, "besteffort cpu 0"},
	}
	for i, s := range steps {
		w.writes = nil
		if err := s.do(); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(w.writes, ","); got != s.want {
			t.Errorf("step %d wrote %q, want %q", i, got, s.want)
		}
	}
}

func TestReclaimConfig(t *testing.T) {
	cfg := DefaultConfig()
	if err := ParseConfig([]byte("reclaim: {margin: 0.2, evict_after: 30s}\n"), &cfg); err != nil || cfg.Reclaim.Margin != 0.2 || !cfg.Reclaim.Enabled {
		t.Errorf("reclaim %+v, %v", cfg.Reclaim, err)
	}
	for in, field := range map[string]string{"reclaim: {margin: 1}": "reclaim.margin", "reclaim: {window: 1ms}": "reclaim.window",
		"reclaim: {lookback: 100ms}": "reclaim.lookback", "reclaim: {evict_after: -1s}": "reclaim.evict_after"} {
		cfg := DefaultConfig()
		if err := ParseConfig([]byte(in), &cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%q: err = %v, want one for %s", in, err, field)
		}
	}
}

// v1CPU holds cgroup v1's rule for CFS quotas (kernel/sched/core.c,
// tg_cfs_schedulable_down): a job's quota may not exceed its tier's, nor
// the tier's go under one of its jobs' (EINVAL); an unlimited job quota
// (0) takes the tier's.
type v1CPU struct {
	tier       int64
	req, quota map[string]int64
}

func (v *v1CPU) SetTierCPUQuota(_ cgroups.Tier, milli int64) error {
	for id, q := range v.quota {
		if milli > 0 && q > milli {
			return fmt.Errorf("tier quota %dm under job %s's %dm: %w", milli, id, q, syscall.EINVAL)
		}
	}
	v.tier = milli
	return nil
}

func (v *v1CPU) SetTierMemoryHigh(cgroups.Tier, int64) error { return nil }

func (v *v1CPU) bestEffort() map[string]int64 { return maps.Clone(v.req) }

func (v *v1CPU) setJobCPUQuota(id string, milli int64) error {
	if v.tier > 0 && milli > v.tier {
		return fmt.Errorf("job %s quota %dm over the tier's %dm: %w", id, milli, v.tier, syscall.EINVAL)
	}
	v.quota[id] = milli
	return nil
}

// Lending CPU raises the best-effort jobs' own quotas over their requests;
// when the budget or the QoS loop then lowers the tier's quota under them,
// the jobs' quotas are brought under it first, so cgroup v1 takes both
// (the colocation run found the tier's quota refused, EINVAL, and the
// best-effort tier not throttled at all), and raised again after it.
func TestBestEffortKnobsJobsUnderTier(t *testing.T) {
	v := &v1CPU{req: map[string]int64{"a": 500, "b": 300}, quota: map[string]int64{"a": 500, "b": 300}} // as the executor set them
	k := &beKnobs{cg: v, jobs: v}
	steps := []struct {
		name   string
		do     func() error
		tier   int64
		quotas map[string]int64
	}{
		{"lend 1000", func() error { return k.setLend(1000) }, 0, map[string]int64{"a": 1500, "b": 1300}},
		{"budget 800", func() error { return k.setReclaim(800, 0) }, 800, map[string]int64{"a": 800, "b": 800}},
		{"lend 200", func() error { return k.setLend(200) }, 800, map[string]int64{"a": 700, "b": 500}},
		{"QoS 250", func() error { return k.setQoSCPU(250) }, 250, map[string]int64{"a": 250, "b": 250}},
		{"QoS lifted", func() error { return k.setQoSCPU(0) }, 800, map[string]int64{"a": 700, "b": 500}},
		{"budget 1800", func() error { return k.setReclaim(1800, 0) }, 1800, map[string]int64{"a": 700, "b": 500}},
		{"lend 1500", func() error { return k.setLend(1500) }, 1800, map[string]int64{"a": 1800, "b": 1800}},
		{"budget 600", func() error { return k.setReclaim(600, 0) }, 600, map[string]int64{"a": 600, "b": 600}},
		{"limits lifted", func() error {
			if err := k.setLend(0); err != nil {
				return err
			}
			return k.setReclaim(0, 0)
		}, 0, map[string]int64{"a": 500, "b": 300}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if v.tier != s.tier || !maps.Equal(v.quota, s.quotas) {
			t.Errorf("%s: tier %dm, jobs %v; want %dm, %v", s.name, v.tier, v.quota, s.tier, s.quotas)
		}
	}
	// A job that ended is forgotten; one that started gets its quota.
	delete(v.req, "a")
	v.req["c"] = 400
	if err := k.setLend(100); err != nil {
		t.Fatal(err)
	}
	if v.quota["b"] != 400 || v.quota["c"] != 500 || len(k.jobCPU) != 2 {
		t.Errorf("after a job ended and one started: jobs %v, written %v", v.quota, k.jobCPU)
	}
}
