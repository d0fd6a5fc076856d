package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// status and show say who held the CPU while protected jobs waited, and
// escape the outside cgroups' paths, which their owners name.
func TestDescribeDelays(t *testing.T) {
	ms := func(n int) api.Duration { return api.Duration(time.Duration(n) * time.Millisecond) }
	at := time.Unix(0, 0)
	q := api.QoSStatus{Enabled: true, Probes: "attached", DelayedBy: &api.DelayedBy{Outside: ms(85), BestEffort: ms(10), Idle: ms(5)},
		TopOutside:   []api.OutsideDelay{{Cgroup: "/user.slice/\x1b[31mred", ID: 9, Wait: ms(60)}, {ID: 10, Wait: ms(20)}},
		LastAction:   "best-effort not throttled: top outside cgroups: /user.slice/\x1b[31mred 60ms",
		LastActionAt: &at}
	s := describeQoS(q)
	for _, want := range []string{"protected jobs waited 100ms last window: outside 85%, besteffort 10%, idle 5%",
		`top outside cgroups: /user.slice/\x1b[31mred 60ms, cgroup id 10 (gone) 20ms`} {
		if !strings.Contains(s, want) {
			t.Errorf("status line %q lacks %q", s, want)
		}
	}
	if strings.Contains(s, "\x1b") {
		t.Errorf("status line %q passes an escape sequence to the terminal", s)
	}
	l := api.Latency{WindowDelayedBy: &api.DelayedBy{Outside: ms(3), Burstable: ms(1)}, DelayedBy: &api.DelayedBy{BestEffort: ms(30), Outside: ms(10)}}
	if got, want := describeDelayedBy(l), "last window 4ms: outside 75%, burstable 25%; since start 40ms: besteffort 75%, outside 25%"; got != want {
		t.Errorf("describeDelayedBy %q, want %q", got, want)
	}
}
