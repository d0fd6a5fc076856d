package qos

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/ebpf"
)

type fakeProbe struct {
	reg   map[uint64]uint32
	hists map[uint64]ebpf.Histogram
}

func (p *fakeProbe) Register(id uint64, tier uint32) error { p.reg[id] = tier; return nil }
func (p *fakeProbe) Unregister(id uint64) error            { delete(p.reg, id); return nil }
func (p *fakeProbe) Histogram(id uint64) (ebpf.Histogram, error) {
	if _, ok := p.reg[id]; !ok {
		return ebpf.Histogram{}, fmt.Errorf("not registered")
	}
	return p.hists[id], nil
}

// add records n events of about d each in cgroup id's cumulative histogram.
func (p *fakeProbe) add(id uint64, n uint64, d time.Duration) {
	h := p.hists[id]
	b := 0
	for uint64(1)<<(b+1) <= uint64(d) {
		b++
	}
	h.Buckets[b] += n
	h.Count += n
	p.hists[id] = h
}

// statsProbe is a fakeProbe with the kernel's accounting (what
// *ebpf.Probe reports while kernel.bpf_stats_enabled is 1).
type statsProbe struct{ *fakeProbe }

func (statsProbe) Stats() ([]ebpf.ProgramStats, error) {
	return []ebpf.ProgramStats{{Name: "sched_switch", RunCount: 300, RunTimeNs: 30000}, {Name: "sched_wakeup", RunCount: 100, RunTimeNs: 20000}}, nil
}

func TestLoopStatusReportsProbeCost(t *testing.T) {
	probe := statsProbe{&fakeProbe{reg: map[uint64]uint32{}, hists: map[uint64]ebpf.Histogram{}}}
	l, err := New(Config{Window: time.Second, Params: params()}, probe, &fakeHost{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if st := l.Status(); st.ProbeEvents != 400 || st.ProbeNsPerEvent != 125 {
		t.Errorf("status %+v, want 400 events at 125 ns", st)
	}
	l2, _ := New(Config{Window: time.Second, Params: params()}, probe.fakeProbe, &fakeHost{}, slog.New(slog.DiscardHandler))
	if st := l2.Status(); st.ProbeEvents != 0 {
		t.Errorf("a probe without stats reported %+v", st)
	}
}

type fakeHost struct {
	jobs  []Job
	quota []int64
	pool  int64 // 0: 4 CPUs
}

func (h *fakeHost) SharedPoolMilli() int64 {
	if h.pool == 0 {
		return 4000
	}
	return h.pool
}

func (h *fakeHost) Running() []Job { return h.jobs }
func (h *fakeHost) CgroupID(id string) (uint64, error) {
	var n uint64
	_, err := fmt.Sscanf(id, "job-%d", &n)
	return n, err
}
func (h *fakeHost) MemoryPSI(string) (*float64, error) { return nil, nil }
func (h *fakeHost) TierCgroupID(t api.Tier) (uint64, error) {
	return 100 + uint64(TierNumber(t)), nil
}
func (h *fakeHost) CgroupPath(id uint64) (string, error) { return fmt.Sprintf("/outside/%d", id), nil }
func (h *fakeHost) BestEffortMemory() (int64, error)     { return 0, nil }
func (h *fakeHost) SetBestEffortCPU(milli int64) error   { h.quota = append(h.quota, milli); return nil }
func (h *fakeHost) SetBestEffortMemoryHigh(int64) error  { return nil }

func TestLoopFollowsJobsAndActs(t *testing.T) {
	probe := &fakeProbe{reg: map[uint64]uint32{}, hists: map[uint64]ebpf.Histogram{}}
	slo := &api.QoS{RunqueueP99: api.Duration(2 * time.Millisecond)}
	host := &fakeHost{jobs: []Job{{ID: "job-1", Tier: api.TierGuaranteed, SLO: slo}, {ID: "job-2", Tier: api.TierBestEffort}}}
	now := time.Unix(0, 0)
	var events []api.Event
	p := params()
	l, err := New(Config{Window: time.Second, Params: p, Now: func() time.Time { return now }, Publish: func(e api.Event) { events = append(events, e) }},
		probe, host, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l.Step()
	if probe.reg[1] != TierNumber(api.TierGuaranteed) || probe.reg[2] != TierNumber(api.TierBestEffort) {
		t.Fatalf("registered %v", probe.reg)
	}
	// A window whose p99 is 8 ms: the loop halves the quota and says why.
	probe.add(1, 100, 8*time.Millisecond)
	now = now.Add(time.Second)
	l.Step()
	if len(host.quota) != 1 || host.quota[0] != 2000 {
		t.Fatalf("quota writes %v, want [2000]", host.quota)
	}
	if len(events) != 1 || events[0].Kind != api.EventQoS || events[0].JobID != "job-1" || !strings.Contains(events[0].Reason, "p99") {
		t.Fatalf("events %+v", events)
	}
	lat := l.JobLatency("job-1")
	if lat == nil || lat.State != "breach" || lat.Count != 100 || time.Duration(lat.P99) < 8*time.Millisecond {
		t.Fatalf("latency %+v", lat)
	}
	st := l.Status()
	if st.BestEffortQuota != 2000 || st.Protected != 1 || st.Breaching != 1 || st.LastAction == "" {
		t.Fatalf("status %+v", st)
	}
	if l.JobLatency("job-2").State != "unprotected" {
		t.Errorf("best-effort job: %+v", l.JobLatency("job-2"))
	}
	// The next window is fast: the histogram is per window, not
	// cumulative, so the job is ok again.
	probe.add(1, 100, 100*time.Microsecond)
	now = now.Add(time.Second)
	l.Step()
	if lat := l.JobLatency("job-1"); lat.State != "ok" || lat.Histogram[16] != 100 || lat.Histogram[22] != 100 {
		t.Fatalf("healthy window: %+v", lat)
	}
	// A finished job is unregistered.
	host.jobs = host.jobs[:1]
	l.Step()
	if _, ok := probe.reg[2]; ok || l.JobLatency("job-2") != nil {
		t.Error("finished job still followed")
	}
}

type failingHost struct {
	fakeHost
	fail bool
}

func (h *failingHost) SetBestEffortCPU(milli int64) error {
	if h.fail {
		return fmt.Errorf("read-only cgroup")
	}
	return h.fakeHost.SetBestEffortCPU(milli)
}

// A quota write the host refuses leaves the loop where the cgroup is: the
// status shows no quota, and once writes succeed the shrink starts from
// the pool again, not from the quota that was never written. The pool is
// the host's shared pool of the window (2 CPUs here, the rest held
// exclusively).
func TestLoopFailedWriteKeepsState(t *testing.T) {
	probe := &fakeProbe{reg: map[uint64]uint32{}, hists: map[uint64]ebpf.Histogram{}}
	slo := &api.QoS{RunqueueP99: api.Duration(2 * time.Millisecond)}
	host := &failingHost{fakeHost: fakeHost{jobs: []Job{{ID: "job-1", Tier: api.TierGuaranteed, SLO: slo}}, pool: 2000}, fail: true}
	now := time.Unix(0, 0)
	l, err := New(Config{Window: time.Second, Params: params(), Now: func() time.Time { return now }}, probe, host, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l.Step()
	for range 2 {
		probe.add(1, 100, 8*time.Millisecond)
		now = now.Add(time.Second)
		l.Step()
		if st := l.Status(); st.BestEffortQuota != 0 || st.SharedPool != 2000 {
			t.Fatalf("refused write: quota %v, pool %v; want none of 2", st.BestEffortQuota, st.SharedPool)
		}
	}
	host.fail = false
	probe.add(1, 100, 8*time.Millisecond)
	now = now.Add(time.Second)
	l.Step()
	if st := l.Status(); st.BestEffortQuota != 1000 || len(host.quota) != 1 || host.quota[0] != 1000 {
		t.Fatalf("first written shrink: status %v, writes %v; want 1000m (half the 2-CPU pool)", st.BestEffortQuota, host.quota)
	}
}

// The loop's counters: actions by op, resource and result; the protected
// jobs' latency summed per class, each window's events once, kept after
// the job ends; an unprotected job's latency left out.
func TestLoopCounters(t *testing.T) {
	probe := &fakeProbe{reg: map[uint64]uint32{}, hists: map[uint64]ebpf.Histogram{}}
	slo := &api.QoS{RunqueueP99: api.Duration(2 * time.Millisecond)}
	host := &fakeHost{jobs: []Job{
		{ID: "job-1", Tier: api.TierGuaranteed, Class: api.Class("service"), SLO: slo},
		{ID: "job-2", Tier: api.TierBestEffort, Class: api.Class("batch")},
		{ID: "job-3", Tier: api.TierBurstable, Class: api.Class("service"), SLO: slo},
	}}
	now := time.Unix(0, 0)
	l, err := New(Config{Window: time.Second, Params: params(), Now: func() time.Time { return now }}, probe, host, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l.Step()
	probe.add(1, 100, 8*time.Millisecond)
	probe.add(2, 1000, time.Millisecond)
	probe.add(3, 50, 100*time.Microsecond)
	now = now.Add(time.Second)
	l.Step() // breach: shrink the CPU
	probe.add(1, 10, 100*time.Microsecond)
	for range 4 { // healthy past RestoreAfter: one restore step
		now = now.Add(time.Second)
		l.Step()
	}
	host.jobs = host.jobs[:1] // job-3 ends; its events stay counted
	now = now.Add(time.Second)
	l.Step()
	c := l.Counters()
	if c.Actions[ActionKey{"shrink", "cpu", "applied"}] != 1 || c.Actions[ActionKey{"restore", "cpu", "applied"}] != 1 || len(c.Actions) != 2 {
		t.Errorf("actions %v, want one applied shrink and one applied restore of the CPU", c.Actions)
	}
	svc, ok := c.Latency["service"]
	if !ok || len(c.Latency) != 1 {
		t.Fatalf("latency classes %v, want service only (batch is unprotected)", c.Latency)
	}
	if svc.Count != 160 || svc.Buckets[22] != 100 || svc.Buckets[16] != 60 {
		t.Errorf("service latency count %d, bucket 22 %d, bucket 16 %d; want 160, 100, 60", svc.Count, svc.Buckets[22], svc.Buckets[16])
	}
	if c.ProbeStats {
		t.Error("a probe without kernel stats reported them")
	}

	// An action the host refuses is counted as failed.
	fh := &failingHost{fakeHost: fakeHost{jobs: host.jobs[:1]}, fail: true}
	probe2 := statsProbe{&fakeProbe{reg: map[uint64]uint32{}, hists: map[uint64]ebpf.Histogram{}}}
	l2, _ := New(Config{Window: time.Second, Params: params(), Now: func() time.Time { return now }}, probe2, fh, slog.New(slog.DiscardHandler))
	l2.Step()
	probe2.add(1, 100, 8*time.Millisecond)
	l2.Step()
	c2 := l2.Counters()
	if c2.Actions[ActionKey{"shrink", "cpu", "failed"}] != 1 || c2.Actions[ActionKey{"shrink", "cpu", "applied"}] != 0 {
		t.Errorf("refused action counted %v", c2.Actions)
	}
	if st := l2.Status(); st.BestEffortQuota != 0 || !strings.Contains(st.LastAction, "failed") {
		t.Errorf("after a refused write: status quota %v, last %q; want no quota, the failure said", st.BestEffortQuota, st.LastAction)
	}
	if !c2.ProbeStats || c2.ProbeRuns != 400 || c2.ProbeRunNs != 50000 {
		t.Errorf("probe stats %v %d %d, want 400 runs over 50000 ns", c2.ProbeStats, c2.ProbeRuns, c2.ProbeRunNs)
	}
}

// blameProbe is a fakeProbe that classifies tiers and charges outside
// cgroups, as *ebpf.Probe does.
type blameProbe struct {
	*fakeProbe
	classes   map[uint64]uint32
	offenders map[uint64]uint64
}

func (p *blameProbe) RegisterClass(id uint64, tier uint32) error { p.classes[id] = tier; return nil }
func (p *blameProbe) Offenders() (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	for k, v := range p.offenders {
		out[k] = v
	}
	return out, nil
}

// blame charges ns of cgroup id's wait to runner r.
func (p *blameProbe) blame(id uint64, r ebpf.Runner, ns uint64) {
	h := p.hists[id]
	h.BlameNs[r] += ns
	p.hists[id] = h
}

// The loop registers the tiers' cgroups for their class, shows the wait
// by runner in show and status, and, for a breach charged to outside
// load, writes nothing and publishes whose it was, naming the outside
// cgroups charged the most in that window.
func TestLoopSparesBestEffortForOutsideLoad(t *testing.T) {
	probe := &blameProbe{fakeProbe: &fakeProbe{reg: map[uint64]uint32{}, hists: map[uint64]ebpf.Histogram{}},
		classes: map[uint64]uint32{}, offenders: map[uint64]uint64{}}
	slo := &api.QoS{RunqueueP99: api.Duration(2 * time.Millisecond)}
	host := &fakeHost{jobs: []Job{{ID: "job-1", Tier: api.TierBurstable, SLO: slo}}}
	var events []api.Event
	p := params()
	p.MinBlame = 0.1
	now := time.Unix(0, 0)
	l, err := New(Config{Window: time.Second, Params: p, Now: func() time.Time { return now }, Publish: func(e api.Event) { events = append(events, e) }},
		probe, host, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l.Step()
	for _, tier := range api.Tiers {
		if probe.classes[100+uint64(TierNumber(tier))] != TierNumber(tier) {
			t.Fatalf("tier cgroups registered for their class: %v", probe.classes)
		}
	}
	probe.offenders[77], probe.offenders[78] = 1000, 5 // before this window
	l.Step()
	probe.add(1, 100, 8*time.Millisecond)
	probe.blame(1, ebpf.RunnerOutside, 700_000_000)
	probe.blame(1, ebpf.RunnerBestEffort, 10_000_000)
	probe.blame(1, ebpf.RunnerIdle, 90_000_000)
	probe.offenders[77] += 600_000_000
	probe.offenders[78] += 100_000_000
	now = now.Add(time.Second)
	l.Step()
	if len(host.quota) != 0 {
		t.Errorf("quota writes %v for a breach outside load caused", host.quota)
	}
	if len(events) != 1 || events[0].JobID != "job-1" || !strings.Contains(events[0].Reason, "not throttled") ||
		!strings.Contains(events[0].Reason, "outside 88%") || !strings.Contains(events[0].Reason, "top outside cgroups: /outside/77 600ms, /outside/78 100ms") {
		t.Fatalf("events %+v", events)
	}
	st := l.Status()
	if st.DelayedBy == nil || st.DelayedBy.Outside != api.Duration(700*time.Millisecond) || st.DelayedBy.BestEffort != api.Duration(10*time.Millisecond) ||
		len(st.TopOutside) != 2 || st.TopOutside[0].Cgroup != "/outside/77" || st.TopOutside[0].Wait != api.Duration(600*time.Millisecond) {
		t.Errorf("status %+v (delayed by %+v)", st, st.DelayedBy)
	}
	lat := l.JobLatency("job-1")
	if lat.WindowDelayedBy == nil || lat.WindowDelayedBy.Total() != api.Duration(800*time.Millisecond) || lat.DelayedBy.Idle != api.Duration(90*time.Millisecond) {
		t.Errorf("latency %+v", lat)
	}
	if c := l.Counters(); c.Delay[ebpf.RunnerOutside] != 700_000_000 || c.Actions[ActionKey{Op: "spare", Resource: "cpu", Result: "noted"}] != 1 {
		t.Errorf("counters %+v", c)
	}
}

// The API's names for the runners are the probe's: each runner's wait
// lands in the JSON field of its name.
func TestDelayedByNamesAreTheProbes(t *testing.T) {
	for r := range ebpf.Runners {
		var b [ebpf.Runners]uint64
		b[r] = 7
		raw, err := json.Marshal(delayedBy(b))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]string
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		if m[ebpf.Runner(r).String()] != "7ns" {
			t.Errorf("runner %s: JSON %s", ebpf.Runner(r), raw)
		}
	}
}
