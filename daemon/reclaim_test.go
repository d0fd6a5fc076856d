package daemon

import (
	"fmt"
	"strings"
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
