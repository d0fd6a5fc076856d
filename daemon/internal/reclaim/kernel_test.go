package reclaim

// TestKernelThrottleBeforeEvict runs on the real kernel (root, a
// writable cgroup hierarchy: v1 here, v2 under `make test-vm`) and fails,
// never skips, without them.

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
)

// The test binary doubles as the jobs: with FUSIOND_RECLAIMHELPER=<file>
// it holds as many MiB as the file says (re-read every 50 ms), and with
// FUSIOND_RECLAIMSPIN=<n> spins n threads; it starts after a line on
// stdin.
const helperEnv, spinEnv = "FUSIOND_RECLAIMHELPER", "FUSIOND_RECLAIMSPIN"

func TestMain(m *testing.M) {
	if f := os.Getenv(helperEnv); f != "" {
		os.Exit(runHelper(f))
	}
	os.Exit(m.Run())
}

func runHelper(file string) int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 2
	}
	spin, _ := strconv.Atoi(os.Getenv(spinEnv))
	runtime.GOMAXPROCS(max(spin, 1) + 1)
	var sink atomic.Uint64
	for range spin {
		go func() {
			for x := uint64(0); ; x++ {
				sink.Add(x)
			}
		}()
	}
	var keep [][]byte
	for {
		b, _ := os.ReadFile(file)
		want, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		for len(keep) < want {
			p := make([]byte, 1<<20)
			for i := 0; i < len(p); i += 4096 {
				p[i] = 1
			}
			keep = append(keep, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type kernelJob struct {
	id     string
	tier   api.Tier
	req    Usage
	cg     *cgroups.Cgroup
	size   string // the file of MiB the helper holds
	cmd    *exec.Cmd
	prev   time.Duration
	prevAt time.Time
	recent []Usage
}

// kernelHost is the loop's host over real cgroups: usage from the job
// cgroups' accounting, limits on the best-effort tier, eviction by
// killing the job's cgroup.
type kernelHost struct {
	t       *testing.T
	m       *cgroups.Manager
	jobs    []*kernelJob
	actions []string
	times   []time.Time
	// beCPU is the best-effort job's CPU time at each action, limits the
	// tier quota each throttle set.
	beCPU  []time.Duration
	limits []int64
	lent   int64
}

func (h *kernelHost) bestEffortCPU() time.Duration {
	for _, j := range h.jobs {
		if j.tier == api.TierBestEffort && j.cg != nil {
			if st, err := j.cg.Stats(); err == nil {
				return st.CPUUsage
			}
		}
	}
	return 0
}

func (h *kernelHost) Capacity() Usage { return Usage{CPU: 1100, Memory: 480 << 20} }

func (h *kernelHost) Running() []Job {
	var out []Job
	now := time.Now()
	for _, j := range h.jobs {
		if j.cg == nil {
			continue
		}
		st, err := j.cg.Stats()
		if err != nil {
			h.t.Errorf("stats of %s: %v", j.id, err)
			continue
		}
		if !j.prevAt.IsZero() {
			cpu := float64(st.CPUUsage-j.prev) / float64(now.Sub(j.prevAt)) * 1000
			j.recent = append(j.recent, Usage{CPU: cpu, Memory: float64(st.MemoryCurrent)})
			if len(j.recent) > 20 {
				j.recent = j.recent[1:]
			}
		}
		j.prev, j.prevAt = st.CPUUsage, now
		out = append(out, Job{ID: j.id, Tier: j.tier, Request: j.req, Recent: append([]Usage(nil), j.recent...)})
	}
	return out
}

func (h *kernelHost) Limit(cpu, mem int64) error {
	h.actions = append(h.actions, fmt.Sprintf("throttle cpu=%d mem=%d", cpu, mem))
	h.times = append(h.times, time.Now())
	h.beCPU = append(h.beCPU, h.bestEffortCPU())
	h.limits = append(h.limits, cpu)
	if err := h.m.SetTierCPUQuota(cgroups.BestEffort, cpu); err != nil {
		return err
	}
	return h.m.SetTierMemoryHigh(cgroups.BestEffort, mem)
}

func (h *kernelHost) Evict(id, _ string) error {
	for _, j := range h.jobs {
		if j.id == id && j.cg != nil {
			h.actions = append(h.actions, "evict "+id)
			h.times = append(h.times, time.Now())
			h.beCPU = append(h.beCPU, h.bestEffortCPU())
			h.limits = append(h.limits, 0)
			if err := j.cg.Kill(); err != nil {
				return err
			}
			_, _ = j.cmd.Process.Wait()
			j.cg = nil
			return nil
		}
	}
	return fmt.Errorf("no job %s", id)
}

// Lend raises the best-effort job's own CPU quota (it has no request
// here, so the quota is what is lent; 0 lifts it).
func (h *kernelHost) Lend(cpu int64) error {
	if cpu == h.lent {
		return nil
	}
	h.lent = cpu
	for _, j := range h.jobs {
		if j.tier == api.TierBestEffort && j.cg != nil {
			if err := j.cg.SetCPUQuota(cpu); err != nil {
				return err
			}
		}
	}
	return nil
}

func (h *kernelHost) Publish(api.Event) {}

func (h *kernelHost) start(j *kernelJob, p cgroups.Placement, mib, spin int) {
	t := h.t
	l, err := cgroups.Plan(p)
	if err != nil {
		t.Fatal(err)
	}
	if j.cg, err = h.m.Create(j.id, p.Tier, l); err != nil {
		t.Fatal(err)
	}
	j.size = filepath.Join(t.TempDir(), "mib")
	j.setSize(t, mib)
	j.cmd = exec.Command(os.Args[0], "-test.run=^$")
	j.cmd.Env = append(os.Environ(), helperEnv+"="+j.size, spinEnv+"="+strconv.Itoa(spin))
	in, err := j.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = j.cmd.Process.Kill()
		_, _ = j.cmd.Process.Wait()
	})
	if err := j.cg.AddProc(j.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	h.jobs = append(h.jobs, j)
}

func (j *kernelJob) setSize(t *testing.T, mib int) {
	if err := os.WriteFile(j.size, []byte(strconv.Itoa(mib)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func newKernelManager(t *testing.T) *cgroups.Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("real-kernel reclaim tests need root")
	}
	root := os.Getenv("FUSIOND_CGROUP_ROOT")
	if root == "" {
		root = cgroups.DefaultRoot
	}
	m, err := cgroups.NewManager(cgroups.WithRoot(root), cgroups.WithParent(fmt.Sprintf("fusiond-test-reclaim-%d", os.Getpid())),
		cgroups.WithKillTimeout(5*time.Second), cgroups.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("cgroups unusable at %s: %v", root, err)
	}
	t.Cleanup(func() {
		jobs, _ := m.Jobs()
		for _, ids := range jobs {
			for _, id := range ids {
				if cg, err := m.Load(id); err == nil {
					_ = cg.Kill()
					if err := cg.Delete(); err != nil {
						t.Errorf("cleanup %s: %v", id, err)
					}
				}
			}
		}
		if err := m.RemoveHierarchy(); err != nil {
			t.Errorf("cleanup hierarchy: %v", err)
		}
	})
	return m
}

// A burstable service reserved 1 CPU and 320 MiB of a host given as 1.1
// CPU and 480 MiB, and uses little; a best-effort job uses the slack (240
// MiB, two spinning threads). When the service ramps to a core and 300
// MiB, the best-effort tier is throttled first — its CPU quota cut to what
// the service leaves (near the 100m floor) and the CPU lent to the job to
// what the service does not use, which the kernel enforces (the job's CPU
// use under the quota stays within it) — and evicted only after staying over its
// memory budget for evict_after. The service is never throttled or
// evicted.
func TestKernelThrottleBeforeEvict(t *testing.T) {
	m := newKernelManager(t)
	if err := m.EnsureHierarchy(); err != nil {
		t.Fatal(err)
	}
	cpus := make([]int, runtime.NumCPU())
	for i := range cpus {
		cpus[i] = i
	}
	h := &kernelHost{t: t, m: m}
	svc := &kernelJob{id: "svc", tier: api.TierBurstable, req: Usage{CPU: 1000, Memory: 320 << 20}}
	h.start(svc, cgroups.Placement{Tier: cgroups.Burstable, CPURequestMilli: 1000, SharedCPUs: cpus, MemoryRequest: 320 << 20}, 16, 0)
	be := &kernelJob{id: "be", tier: api.TierBestEffort}
	h.start(be, cgroups.Placement{Tier: cgroups.BestEffort, SharedCPUs: cpus}, 240, 2)

	const evictAfter = time.Second
	loop, err := New(Config{Window: 100 * time.Millisecond, EvictAfter: evictAfter, MinCPU: 100, Params: Params{Margin: 0.1, Lead: 3}}, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	step := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			loop.Step()
		}
	}
	// The service idles: the best-effort job fits in what it leaves.
	step(2 * time.Second)
	for _, a := range h.actions {
		if strings.HasPrefix(a, "evict") {
			t.Fatalf("evicted while the service idled: %v", h.actions)
		}
	}
	before := len(h.actions)
	// Throttling shows in the tier's counter (its quota: the budget) or the
	// job's (its own quota: what is lent to it).
	throttled := func() uint64 {
		ts, err := m.TierStats(cgroups.BestEffort)
		if err != nil {
			t.Fatal(err)
		}
		js, err := be.cg.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return ts.NrThrottled + js.NrThrottled
	}
	throttledBefore := throttled()

	// The service ramps: a spinning core (a helper of its own) and 300 MiB.
	svc.setSize(t, 300)
	spinner := &kernelJob{id: "svc-spin"}
	spinner.cg, spinner.size = svc.cg, filepath.Join(t.TempDir(), "mib")
	spinner.setSize(t, 0)
	spinner.cmd = exec.Command(os.Args[0], "-test.run=^$")
	spinner.cmd.Env = append(os.Environ(), helperEnv+"="+spinner.size, spinEnv+"=1")
	in, err := spinner.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := spinner.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spinner.cmd.Process.Kill(); _, _ = spinner.cmd.Process.Wait() })
	if err := svc.cg.AddProc(spinner.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	var throttledAtEvict uint64
	// The service's 300 MiB arrive at the speed the kernel lets it touch
	// pages: under the emulated cgroup v2 kernel of make test-vm that takes
	// most of 20 s, so the deadline leaves room for it.
	for deadline := time.Now().Add(60 * time.Second); be.cg != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("best-effort job not evicted 60 s after the ramp; actions %v", h.actions)
		}
		throttledAtEvict = throttled()
		step(100 * time.Millisecond)
	}
	after := h.actions[before:]
	t.Logf("actions after the ramp: %v", after)
	if len(after) < 2 || !strings.HasPrefix(after[0], "throttle") || after[len(after)-1] != "evict be" {
		t.Fatalf("actions after the ramp %v: want a throttle first and the best-effort job's eviction last", after)
	}
	var throttleAt, evictAt time.Time
	for i, a := range h.actions[before:] {
		if strings.HasPrefix(a, "throttle") && throttleAt.IsZero() {
			throttleAt = h.times[before+i]
		}
		if strings.HasPrefix(a, "evict") {
			evictAt = h.times[before+i]
			if i != len(after)-1 {
				t.Errorf("more than one eviction: %v", after)
			}
		}
	}
	if evictAt.Sub(throttleAt) < evictAfter {
		t.Errorf("evicted %v after the throttle, want at least evict_after %v", evictAt.Sub(throttleAt), evictAfter)
	}
	t.Logf("best-effort nr_throttled (tier + job) %d before the ramp, %d at the eviction", throttledBefore, throttledAtEvict)
	// The kernel held the best-effort job to the tier quota in force from
	// the throttle that set it until the eviction (it may have had less:
	// the host is shared).
	ev := len(h.actions) - 1
	low := h.limits[ev-1]
	lowAt := ev - 1
	for lowAt > before && h.limits[lowAt-1] == low {
		lowAt--
	}
	if low <= 0 {
		t.Fatalf("no CPU quota in force at the eviction: %v", after)
	}
	// (The budget follows the service's CPU use, so the last quota may be
	// younger than evict_after; over less than three periods the rate
	// says nothing.)
	if h.times[ev].Sub(h.times[lowAt]) >= 300*time.Millisecond {
		rate := float64(h.beCPU[ev]-h.beCPU[lowAt]) / float64(h.times[ev].Sub(h.times[lowAt])) * 1000
		t.Logf("best-effort job used %.0fm under a %dm tier quota until its eviction", rate, low)
		// The quota can still be in force from an earlier, higher value
		// within one period, and the first period after a cut can run at
		// the old rate: allow one 100 ms period at two cores.
		slack := 2000 * 0.1 / h.times[ev].Sub(h.times[lowAt]).Seconds()
		if rate > float64(low)*1.2+slack {
			t.Errorf("best-effort job used %.0fm under a %dm tier quota: the kernel did not hold it", rate, low)
		}
	}
	// The service was neither throttled nor evicted, and still runs.
	st, err := svc.cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.NrThrottled != 0 {
		t.Errorf("the service was throttled %d times", st.NrThrottled)
	}
	if procs, err := svc.cg.Procs(); err != nil || len(procs) != 2 {
		t.Errorf("service processes %v, %v: want both alive", procs, err)
	}
	for _, a := range h.actions {
		if strings.Contains(a, "svc") {
			t.Errorf("an action on the service: %q", a)
		}
	}
	if rs := loop.Status(); rs.Evictions != 1 || rs.LastAction == "" {
		t.Errorf("status %+v", rs)
	}
}
