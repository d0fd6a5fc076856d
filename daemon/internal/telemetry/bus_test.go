package telemetry

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/devices/rapl"
)

// fakeProc is a proc tree in a temporary directory whose counters the
// test moves.
type fakeProc struct {
	t    *testing.T
	root string
	// per-CPU busy and idle jiffies
	busy, idle []uint64
}

func newFakeProc(t *testing.T, cpus int) *fakeProc {
	p := &fakeProc{t: t, root: t.TempDir(), busy: make([]uint64, cpus), idle: make([]uint64, cpus)}
	p.write("meminfo", "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    4000000 kB\n")
	p.write("pressure/cpu", "some avg10=2.50 avg60=1.00 avg300=0.50 total=100\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	p.write("pressure/memory", "some avg10=0.25 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.10 avg60=0.00 avg300=0.00 total=5\n")
	p.write("pressure/io", "some avg10=7.00 avg60=0.00 avg300=0.00 total=10\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=5\n")
	p.stat()
	return p
}

func (p *fakeProc) write(name, s string) {
	p.t.Helper()
	f := filepath.Join(p.root, name)
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// advance adds 100 jiffies to every CPU, busy[i] of them busy.
func (p *fakeProc) advance(busy ...uint64) {
	for i, b := range busy {
		p.busy[i] += b
		p.idle[i] += 100 - b
	}
	p.stat()
}

func (p *fakeProc) stat() {
	var sb strings.Builder
	var tb, ti uint64
	for i := range p.busy {
		tb += p.busy[i]
		ti += p.idle[i]
	}
	// user nice system idle iowait irq softirq steal guest guest_nice:
	// busy split between user and system, idle between idle and iowait,
	// guest repeated (it is part of user) to check it is not counted twice.
	line := func(name string, b, i uint64) {
		fmt.Fprintf(&sb, "%s %d 0 %d %d %d 0 0 0 %d 0\n", name, b-b/2, b/2, i-i/4, i/4, b-b/2)
	}
	line("cpu ", tb, ti)
	for i := range p.busy {
		line(fmt.Sprintf("cpu%d", i), p.busy[i], p.idle[i])
	}
	sb.WriteString("intr 12345 0 0\nctxt 999\nbtime 1700000000\nprocesses 10\n")
	p.write("stat", sb.String())
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newBus(t *testing.T, cfg Config) *Bus {
	t.Helper()
	b, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSampleHostFromProc(t *testing.T) {
	p := newFakeProc(t, 4)
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, CPUNode: map[int]int{0: 0, 1: 0, 2: 1, 3: 1},
		GPUs: func() []GPU { return []GPU{{ID: "GPU-a", SMUtil: 40, MemUtil: 10, PowerW: 200}} }})
	if err := b.Sample(); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Latest(); ok {
		t.Fatal("one reading of the counters is no interval, yet a sample is there")
	}
	p.advance(100, 50, 20, 0)
	clk.add(100 * time.Millisecond)
	if err := b.Sample(); err != nil {
		t.Fatal(err)
	}
	s, ok := b.Latest()
	if !ok {
		t.Fatal("no sample after two readings")
	}
	if !near(s.CPUBusy, 170.0/400) {
		t.Errorf("host busy %v, want %v", s.CPUBusy, 170.0/400)
	}
	want := []float32{1, 0.5, 0.2, 0}
	for i, w := range want {
		if math.Abs(float64(s.CPUs[i]-w)) > 1e-6 {
			t.Errorf("cpu%d busy %v, want %v", i, s.CPUs[i], w)
		}
	}
	if len(s.Nodes) != 2 || !near(s.Nodes[0], 0.75) || !near(s.Nodes[1], 0.1) {
		t.Errorf("node busy %v, want [0.75 0.1]", s.Nodes)
	}
	if !s.PSIValid || s.PSI != (PSI{CPU: 2.5, Memory: 0.25, IO: 7}) {
		t.Errorf("psi %+v valid %v", s.PSI, s.PSIValid)
	}
	if s.MemTotal != 16000000<<10 || s.MemAvailable != 4000000<<10 {
		t.Errorf("memory %d/%d", s.MemAvailable, s.MemTotal)
	}
	if n, ok := b.NodeBusy(1, time.Second); !ok || !near(n, 0.1) {
		t.Errorf("NodeBusy(1) = %v %v", n, ok)
	}
	if _, ok := b.NodeBusy(2, time.Second); ok {
		t.Error("NodeBusy of a node the host does not have says ok")
	}
	if g, ok := b.GPU("GPU-a", time.Second); !ok || g.SMUtil != 40 || g.PowerW != 200 {
		t.Errorf("GPU = %+v %v", g, ok)
	}
	if _, ok := b.GPU("GPU-b", time.Second); ok {
		t.Error("an unknown GPU says ok")
	}
	st := b.Status()
	if st.GPUPowerW != 200 || st.IdleGPUs != 0 {
		t.Errorf("GPU power %v, idle %d: want 200 W, none idle at 40%% SM", st.GPUPowerW, st.IdleGPUs)
	}
	if st.PSI == nil || st.PSI.IO != 7 || st.Power != "none: " || st.GPUs != 1 || st.MemoryUsed == 0 || len(st.NodeBusy) != 2 {
		t.Errorf("status %+v", st)
	}
}

func TestHostWithoutPressure(t *testing.T) {
	p := newFakeProc(t, 1)
	if err := os.RemoveAll(filepath.Join(p.root, "pressure")); err != nil {
		t.Fatal(err)
	}
	clk := &fakeClock{t: time.Unix(0, 0)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now})
	for range 2 {
		p.advance(30)
		clk.add(100 * time.Millisecond)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	if s, _ := b.Latest(); s.PSIValid {
		t.Error("no /proc/pressure, yet PSI valid")
	}
	if b.Status().PSI != nil {
		t.Error("status shows PSI the kernel does not give")
	}
}

func TestBadProcIsAnError(t *testing.T) {
	p := newFakeProc(t, 1)
	p.write("stat", "cpu  1 2 x 4\n")
	b := newBus(t, Config{Proc: p.root})
	if err := b.Sample(); err == nil || !strings.Contains(err.Error(), "/proc/stat") {
		t.Fatalf("err = %v, want one naming /proc/stat", err)
	}
	p.write("meminfo", "Nothing: 1 kB\n")
	if err := b.Sample(); err == nil || !strings.Contains(err.Error(), "meminfo") {
		t.Fatalf("err = %v, want one naming meminfo", err)
	}
}

func TestRingIsBounded(t *testing.T) {
	p := newFakeProc(t, 2)
	clk := &fakeClock{t: time.Unix(0, 0)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Ring: 10})
	for i := range 25 {
		p.advance(uint64(i%10)*10, 0)
		clk.add(100 * time.Millisecond)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	w := b.Window(time.Hour)
	if len(w) != 10 {
		t.Fatalf("window holds %d samples, want all 10 of the ring", len(w))
	}
	for i := 1; i < len(w); i++ {
		if !w[i].At.After(w[i-1].At) {
			t.Fatalf("window out of order at %d: %v then %v", i, w[i-1].At, w[i].At)
		}
	}
	last, _ := b.Latest()
	if !last.At.Equal(clk.now()) || !(math.Abs(float64(last.CPUs[0])-0.4) < 1e-6) {
		t.Errorf("latest %v cpu0 %v, want %v and 0.4", last.At, last.CPUs[0], clk.now())
	}
	if got := b.Window(350 * time.Millisecond); len(got) != 4 { // now, and 100, 200 and 300 ms before
		t.Errorf("350 ms window holds %d samples, want 4", len(got))
	}
}

func TestHistoryPerMinute(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Interval: 10 * time.Second, JobInterval: 10 * time.Second})
	if err := b.Sample(); err != nil {
		t.Fatal(err)
	}
	// Minute 10:00 at 20% busy, 10:01 at 60%, then one sample of 10:02.
	for i := range 13 {
		busy := uint64(20)
		if i >= 5 { // the sixth sample is 10:01:00
			busy = 60
		}
		p.advance(busy)
		clk.add(10 * time.Second)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	h := b.History()
	if len(h) != 2 {
		t.Fatalf("history %+v, want 2 minutes", h)
	}
	if !h[0].At.Equal(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)) || !near(h[0].CPUBusy, 0.2) || !near(h[1].CPUBusy, 0.6) {
		t.Errorf("history %+v, want 10:00 at 0.2 and 10:01 at 0.6", h)
	}
	if !near(h[0].MemUsed, 12000000<<10) {
		t.Errorf("memory used %v", h[0].MemUsed)
	}
}

type fakeJobs struct {
	mu    sync.Mutex
	jobs  []JobRef
	usage map[string]time.Duration
	psi   *cgroups.PSI
}

func (f *fakeJobs) Running() []JobRef {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]JobRef(nil), f.jobs...)
}
func (f *fakeJobs) Stats(id string) (cgroups.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u, ok := f.usage[id]
	if !ok {
		return cgroups.Stats{}, fmt.Errorf("cgroup of %s unreadable", id)
	}
	if u < 0 {
		return cgroups.Stats{}, fmt.Errorf("job %s: %w", id, os.ErrNotExist)
	}
	return cgroups.Stats{CPUUsage: u, MemoryCurrent: 1 << 30, PSI: f.psi}, nil
}

func TestJobUsage(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(0, 0)}
	jobs := &fakeJobs{jobs: []JobRef{{ID: "1"}, {ID: "2"}}, usage: map[string]time.Duration{"1": 0, "2": 0}}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Jobs: jobs, JobPSINote: "cgroup v1 has no per-cgroup PSI"})
	for i := range 21 { // 2 s at 10 Hz: job readings at 0, 1 s and 2 s
		if i > 0 {
			clk.add(100 * time.Millisecond)
			jobs.mu.Lock()
			jobs.usage["1"] += 50 * time.Millisecond // half a core
			jobs.usage["2"] += 200 * time.Millisecond
			jobs.mu.Unlock()
		}
		p.advance(50)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	u, ok := b.Job("1", 10*time.Second)
	if !ok || math.Abs(u.CPUMilli-500) > 1e-6 || u.Memory != 1<<30 || u.PSI != nil {
		t.Errorf("job 1: %+v %v, want 500 millicores, 1 GiB, no PSI", u, ok)
	}
	if w := b.JobWindow("1", 10*time.Second); len(w) != 2 || !w[1].At.After(w[0].At) || math.Abs(w[1].CPUMilli-500) > 1e-6 {
		t.Errorf("job 1 window %+v, want its two readings, oldest first", w)
	}
	if w := b.JobWindow("7", time.Minute); w != nil {
		t.Errorf("an unknown job's window: %+v", w)
	}
	if u, _ := b.Job("2", 10*time.Second); math.Abs(u.CPUMilli-2000) > 1e-6 {
		t.Errorf("job 2: %v millicores, want 2000", u.CPUMilli)
	}
	if st := b.Status(); st.Jobs != 2 || st.JobPSI != "none: cgroup v1 has no per-cgroup PSI" {
		t.Errorf("status jobs %d psi %q", st.Jobs, st.JobPSI)
	}
	// Job 2 ends and its cgroup goes; job 1 now has PSI (a v2 host).
	jobs.mu.Lock()
	jobs.jobs = jobs.jobs[:1]
	jobs.psi = &cgroups.PSI{Memory: cgroups.Pressure{Some: cgroups.PressureLine{Avg10: 3}}}
	jobs.usage["1"] += 500 * time.Millisecond
	jobs.mu.Unlock()
	clk.add(time.Second)
	p.advance(50)
	if err := b.Sample(); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Job("2", time.Minute); ok {
		t.Error("an ended job's readings are still kept")
	}
	if u, _ := b.Job("1", time.Minute); u.PSI == nil || u.PSI.Memory != 3 {
		t.Errorf("job 1 PSI %+v, want memory 3", u.PSI)
	}
	// A job whose cgroup is gone (it ended since Running) is no error; one
	// whose cgroup cannot be read is, naming it.
	jobs.mu.Lock()
	jobs.jobs = append(jobs.jobs, JobRef{ID: "8"})
	jobs.usage["8"] = -1
	jobs.mu.Unlock()
	clk.add(time.Second)
	if err := b.Sample(); err != nil {
		t.Errorf("a job whose cgroup is gone: %v", err)
	}
	jobs.mu.Lock()
	jobs.jobs = append(jobs.jobs, JobRef{ID: "9"})
	jobs.mu.Unlock()
	clk.add(time.Second)
	if err := b.Sample(); err == nil || !strings.Contains(err.Error(), "job 9") {
		t.Errorf("err = %v, want one naming job 9", err)
	}
}

type fakePower struct{ w []float64 }

func (f *fakePower) Read(time.Time) ([]rapl.Reading, error) {
	out := make([]rapl.Reading, len(f.w))
	for i, w := range f.w {
		out[i] = rapl.Reading{Zone: fmt.Sprintf("package-%d", i), PowerW: w, Valid: true}
	}
	return out, nil
}

func TestPackagePower(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(0, 0)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Power: &fakePower{w: []float64{80, 95.5}}})
	for range 2 {
		clk.add(100 * time.Millisecond)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	st := b.Status()
	if st.PackagePowerW == nil || *st.PackagePowerW != 175.5 || st.Power != "RAPL (powercap)" {
		t.Errorf("power %v %q, want 175.5 W from RAPL", st.PackagePowerW, st.Power)
	}
}

func TestConfigValidated(t *testing.T) {
	for _, c := range []Config{
		{Interval: time.Millisecond},
		{Interval: time.Second, JobInterval: 100 * time.Millisecond},
		{Ring: 5},
		{History: 10},
		{MaxJobs: -1},
		{MaxJobs: MaxJobsLimit + 1},
		{JobRing: 1},
	} {
		if _, err := New(c, nil); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

func TestMemoryBound(t *testing.T) {
	c := Config{}
	small := c.MemoryBound(2, 1, 0, 0)
	big := c.MemoryBound(128, 2, 2, 8)
	if small <= 0 || big <= small {
		t.Fatalf("bounds %d (2 CPUs) and %d (128 CPUs, 8 GPUs)", small, big)
	}
	// The bound grows by exactly Ring × 4 bytes per CPU.
	if d := c.MemoryBound(3, 1, 0, 0) - small; d != 3000*4 {
		t.Errorf("one more CPU adds %d bytes, want %d", d, 3000*4)
	}
	t.Logf("ring memory bound: %d bytes (2 CPUs), %d bytes (128 CPUs, 2 nodes, 2 packages, 8 GPUs)", small, big)
}

// A host whose CPU use rises one point a minute is forecast to keep
// rising: 15 minutes past the last full minute's 59%, 74%.
func TestHostForecastFromHistory(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, Interval: 10 * time.Second, JobInterval: 10 * time.Second, History: 120})
	if err := b.Sample(); err != nil {
		t.Fatal(err)
	}
	for i := range 60 * 6 {
		p.advance(uint64((i + 1) / 6)) // the sample at 10:mm:ss is in minute mm, at mm% busy
		clk.add(10 * time.Second)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	f, ok := b.Forecast("cpu_busy")
	if !ok {
		t.Fatalf("no cpu_busy forecast after an hour; status %+v", b.Status().Forecasts)
	}
	if f.Points != 60 || math.Abs(f.Now-0.59) > 1e-9 || math.Abs(f.Value-0.74) > 1e-6 || time.Duration(f.Horizon) != 15*time.Minute {
		t.Errorf("forecast %+v, want 0.74 from 0.59 over 60 points", f)
	}
	if _, ok := b.Forecast("gpu_sm_util_pct"); ok {
		t.Error("a host without GPUs has a GPU forecast")
	}
	if len(b.Status().Forecasts) != 2 {
		t.Errorf("status forecasts %+v, want cpu_busy and memory_used_bytes", b.Status().Forecasts)
	}
}

// A GPU that does nothing for the idle window is counted idle with its
// power: what consolidation leaves behind.
func TestIdleGPUs(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(0, 0)}
	b := newBus(t, Config{Proc: p.root, Now: clk.now, GPUs: func() []GPU {
		return []GPU{{ID: "GPU-busy", SMUtil: 80, PowerW: 400}, {ID: "GPU-idle", SMUtil: 0, PowerW: 62.5}}
	}})
	for range 5 {
		clk.add(100 * time.Millisecond)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	st := b.Status()
	if st.GPUs != 2 || st.GPUPowerW != 462.5 || st.IdleGPUs != 1 || st.IdleGPUPowerW != 62.5 {
		t.Errorf("status %d GPUs %v W, %d idle at %v W; want 2, 462.5, 1 at 62.5", st.GPUs, st.GPUPowerW, st.IdleGPUs, st.IdleGPUPowerW)
	}
}

// TestJobsAtTheBound runs more jobs than MaxJobs: the jobs followed stay
// followed, the others have no readings and are counted (each once) in
// the status, and the episode is logged once when it starts and once when
// it ends, however many readings and jobs it spans.
func TestJobsAtTheBound(t *testing.T) {
	p := newFakeProc(t, 1)
	clk := &fakeClock{t: time.Unix(0, 0)}
	jobs := &fakeJobs{jobs: []JobRef{{ID: "1"}, {ID: "2"}}, usage: map[string]time.Duration{}}
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		jobs.usage[id] = 0
	}
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(b)
	}), nil))
	b, err := New(Config{Proc: p.root, Now: clk.now, Jobs: jobs, MaxJobs: 2}, log)
	if err != nil {
		t.Fatal(err)
	}
	step := func(running ...string) {
		t.Helper()
		jobs.mu.Lock()
		jobs.jobs = nil
		for _, id := range running {
			jobs.jobs = append(jobs.jobs, JobRef{ID: id})
			jobs.usage[id] += 100 * time.Millisecond
		}
		jobs.mu.Unlock()
		clk.add(time.Second)
		p.advance(50)
		if err := b.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	count := func(s string) int {
		logMu.Lock()
		defer logMu.Unlock()
		return strings.Count(logs.String(), s)
	}
	step("1", "2")
	step("1", "2")
	if st := b.Status(); st.MaxJobs != 2 || st.UnfollowedJobs != 0 || st.UnfollowedJobsTotal != 0 || st.Jobs != 2 {
		t.Fatalf("under the bound: status max %d unfollowed %d total %d jobs %d", st.MaxJobs, st.UnfollowedJobs, st.UnfollowedJobsTotal, st.Jobs)
	}
	// Jobs 3 and 4 start, listed before the followed ones: the bound keeps
	// 1 and 2 (no churn of their rings) and refuses 3 and 4.
	for range 3 {
		step("3", "4", "1", "2")
	}
	if _, ok := b.Job("3", time.Minute); ok {
		t.Error("job 3 has readings beyond the bound")
	}
	if u, ok := b.Job("1", time.Minute); !ok || math.Abs(u.CPUMilli-100) > 1e-6 {
		t.Errorf("job 1 (followed before the bound was reached): %+v %v, want 100 millicores", u, ok)
	}
	st := b.Status()
	fs := b.FollowStats()
	if st.UnfollowedJobs != 2 || st.UnfollowedJobsTotal != 2 || fs != (FollowStats{Followed: 2, Max: 2, Unfollowed: 2, UnfollowedTotal: 2}) {
		t.Errorf("at the bound: status unfollowed %d total %d, stats %+v; want 2 and 2 over three readings", st.UnfollowedJobs, st.UnfollowedJobsTotal, fs)
	}
	if n := count("job bound is reached"); n != 1 {
		t.Errorf("%d warnings over three readings at the bound, want 1:\n%s", n, logs.String())
	}
	// Job 1 ends: job 3 takes its place (and starts reading); 4 still waits.
	step("3", "4", "2")
	step("3", "4", "2")
	if _, ok := b.Job("3", time.Minute); !ok {
		t.Error("job 3 not followed after job 1 ended")
	}
	if fs := b.FollowStats(); fs.Unfollowed != 1 || fs.UnfollowedTotal != 2 {
		t.Errorf("after job 1 ended: %+v, want 1 unfollowed, 2 in total", fs)
	}
	// Job 5 starts unfollowed in the same episode: counted, not logged again.
	step("3", "4", "2", "5")
	if fs := b.FollowStats(); fs.Unfollowed != 2 || fs.UnfollowedTotal != 3 {
		t.Errorf("job 5 started: %+v, want 2 unfollowed, 3 in total", fs)
	}
	if n := count("job bound is reached"); n != 1 {
		t.Errorf("%d warnings in one episode, want 1", n)
	}
	// Jobs 2 and 5 end: 3 and 4 followed, the episode ends (one line); a
	// new one is warned about again.
	step("3", "4")
	if fs := b.FollowStats(); fs.Unfollowed != 0 || fs.Followed != 2 {
		t.Errorf("back under the bound: %+v", fs)
	}
	if n := count("every running job is followed again"); n != 1 {
		t.Errorf("%d end-of-episode lines, want 1:\n%s", n, logs.String())
	}
	step("3", "4", "6")
	if n := count("job bound is reached"); n != 2 {
		t.Errorf("%d warnings after a second episode started, want 2", n)
	}
	if fs := b.FollowStats(); fs.UnfollowedTotal != 4 {
		t.Errorf("unfollowed total %d, want 4 (jobs 3, 4, 5 and 6)", fs.UnfollowedTotal)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
