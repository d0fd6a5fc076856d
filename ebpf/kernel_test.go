package ebpf

// Real-kernel tests: they need root, BTF and a cgroup hierarchy and fail
// (never skip) without them. On this machine the cpu controller is on
// cgroup v1; in the qemu VM of .ci/vm (make test-vm) everything is v2.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestKernelProbeCountsOnlyRegisteredCgroup(t *testing.T) {
	p := loadProbe(t)
	job := newTestCgroup(t, "job")
	other := newTestCgroup(t, "other")
	if err := p.Register(job.id, 1); err != nil {
		t.Fatal(err)
	}
	// The other cgroup holds a stopped process: it must see no event.
	blocked := startHelper(t, "block", "", other)
	if err := blocked.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := p.Register(other.id, 2); err != nil {
		t.Fatal(err)
	}
	const n = 300
	w := startHelper(t, "wake:300", "", job)
	w.start(t)
	w.wait(t)

	h, err := p.Histogram(job.id)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, b := range h.Buckets {
		sum += b
	}
	t.Logf("job: %d events, p50 %v, p99 %v, mean %v", h.Count, h.Quantile(0.5), h.Quantile(0.99), time.Duration(h.SumNs/max(h.Count, 1)))
	if h.Count < n || sum != h.Count {
		t.Errorf("job cgroup: %d events (buckets sum %d), want at least %d wake-ups", h.Count, sum, n)
	}
	if h.Quantile(0.5) <= 0 || h.Quantile(0.5) > h.Quantile(0.99) {
		t.Errorf("quantiles out of order: p50 %v p99 %v", h.Quantile(0.5), h.Quantile(0.99))
	}
	if lost, err := p.LostWaits(); err != nil || lost != 0 {
		t.Errorf("lost waits %d, %v: one timed thread at a time shares no slot", lost, err)
	}
	o, err := p.Histogram(other.id)
	if err != nil {
		t.Fatal(err)
	}
	if o.Count != 0 {
		t.Errorf("blocked cgroup: %d events, want 0", o.Count)
	}

	// Unregistered, the job's cgroup is no longer timed; registered
	// again, its histogram restarts at zero.
	if err := p.Unregister(job.id); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Histogram(job.id); err == nil {
		t.Error("histogram of an unregistered cgroup: no error")
	}
	if err := p.Register(job.id, 1); err != nil {
		t.Fatal(err)
	}
	if h, _ := p.Histogram(job.id); h.Count != 0 {
		t.Errorf("re-registered cgroup starts with %d events", h.Count)
	}
}

func TestKernelProbeCloseDetaches(t *testing.T) {
	p, err := Load(WithCgroupV1(cgroupV1(t)))
	if err != nil {
		t.Fatalf("the kernel cannot run the probe: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestKernelProbeSlotBound loads the probe with two slots: the maps the
// kernel made have two entries (jobs also the class-only cgroups), a third cgroup is refused with ErrFull
// naming the bound and counted, and once a slot is freed the third cgroup
// takes it and is timed.
func TestKernelProbeSlotBound(t *testing.T) {
	p, err := Load(WithCgroupV1(cgroupV1(t)), WithMaxCgroups(2))
	if err != nil {
		t.Fatalf("the kernel cannot run the probe: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	// jobs also holds up to MaxClassCgroups cgroups registered for
	// their class alone.
	for name, want := range map[string]uint32{"jobs": 2 + MaxClassCgroups, "hists": 2} {
		m := map[string]interface{ MaxEntries() uint32 }{"jobs": p.objs.Jobs, "hists": p.objs.Hists}[name]
		if n := m.MaxEntries(); n != want {
			t.Errorf("kernel map %s: %d entries, want %d", name, n, want)
		}
	}
	a, b, c := newTestCgroup(t, "a"), newTestCgroup(t, "b"), newTestCgroup(t, "c")
	for _, cg := range []*testCgroup{a, b} {
		if err := p.Register(cg.id, 1); err != nil {
			t.Fatal(err)
		}
	}
	// Registering a registered cgroup again takes no slot.
	if err := p.Register(a.id, 2); err != nil {
		t.Errorf("re-registering a registered cgroup at the bound: %v", err)
	}
	for range 2 {
		err := p.Register(c.id, 1)
		if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "all 2 slots") || !strings.Contains(err.Error(), fmt.Sprint(c.id)) {
			t.Fatalf("third cgroup: err %v, want ErrFull naming the cgroup and the 2 slots", err)
		}
	}
	if st := p.Slots(); st != (SlotStats{Used: 2, Max: 2, Refused: 2}) {
		t.Errorf("slots %+v, want 2 used of 2, 2 refused", st)
	}
	if _, err := p.Histogram(c.id); err == nil {
		t.Error("a refused cgroup has a histogram")
	}
	if err := p.Unregister(b.id); err != nil {
		t.Fatal(err)
	}
	if err := p.Register(c.id, 1); err != nil {
		t.Fatalf("third cgroup after a slot was freed: %v", err)
	}
	w := startHelper(t, "wake:100", "", c)
	w.start(t)
	w.wait(t)
	if h, err := p.Histogram(c.id); err != nil || h.Count < 100 {
		t.Errorf("third cgroup in the freed slot: %d events (%v), want at least 100", h.Count, err)
	}
	if st := p.Slots(); st != (SlotStats{Used: 2, Max: 2, Refused: 2}) {
		t.Errorf("slots %+v after the swap, want 2 used of 2, 2 refused", st)
	}
}

// TestKernelProbeMoreSlotsThanCompiled sizes the maps above the C
// source's MAX_JOBS (1024): every slot registers, which a map of the
// compiled size would refuse (E2BIG) past 1024.
func TestKernelProbeMoreSlotsThanCompiled(t *testing.T) {
	const n = 1500
	p, err := Load(WithCgroupV1(cgroupV1(t)), WithMaxCgroups(n))
	if err != nil {
		t.Fatalf("the kernel cannot run the probe: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	// Ids no cgroup has: the probe keys by id and never sees their tasks.
	for i := range uint64(n) {
		if err := p.Register(1<<40+i, 3); err != nil {
			t.Fatalf("registration %d of %d: %v", i+1, n, err)
		}
	}
	if err := p.Register(1<<41, 3); !errors.Is(err, ErrFull) {
		t.Errorf("registration %d: err %v, want ErrFull", n+1, err)
	}
	if st := p.Slots(); st != (SlotStats{Used: n, Max: n, Refused: 1}) {
		t.Errorf("slots %+v", st)
	}
}

func TestMaxCgroupsValidated(t *testing.T) {
	for _, n := range []int{0, -1, MaxCgroupsLimit + 1} {
		p, err := Load(WithMaxCgroups(n))
		if err == nil {
			_ = p.Close()
			t.Errorf("WithMaxCgroups(%d) loaded", n)
			continue
		}
		if !strings.Contains(err.Error(), "max cgroups") || errors.Is(err, ErrUnsupported) || errors.Is(err, ErrNoBTF) {
			t.Errorf("WithMaxCgroups(%d): %v, want an error naming the bound", n, err)
		}
	}
}

// pinHelper puts every thread of h on cpu (threads it starts later
// inherit it).
func pinHelper(t *testing.T, h *helper, cpu int) {
	t.Helper()
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", h.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tasks {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			t.Fatalf("pin thread %d to CPU %d: %v", tid, cpu, err)
		}
	}
}

// TestKernelProbeBlamesWhoHeldTheCPU puts a waking job and a CPU hog on
// one CPU: with the hog in a cgroup outside fusiond's the wait is charged
// to "outside" and to the hog's cgroup, with the hog under a best-effort
// tier cgroup (registered for its class, not timed) to best-effort; either
// way the shares sum to the measured wait.
func TestKernelProbeBlamesWhoHeldTheCPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		want Runner
	}{{"outside", RunnerOutside}, {"besteffort", RunnerBestEffort}} {
		t.Run(tc.name, func(t *testing.T) {
			p := loadProbe(t)
			job := newTestCgroup(t, "blame-job")
			hogCg := newTestCgroup(t, "blame-hog")
			if tc.want == RunnerBestEffort {
				// The hog runs in a child of a cgroup registered as the
				// best-effort tier: the probe finds its class by walking up.
				child := &testCgroup{dir: filepath.Join(hogCg.dir, "job")}
				if err := os.Mkdir(child.dir, 0o755); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = os.Remove(child.dir) })
				if err := p.RegisterClass(hogCg.id, uint32(RunnerBestEffort)); err != nil {
					t.Fatal(err)
				}
				hogCg = child
			}
			if err := p.Register(job.id, uint32(RunnerBurstable)); err != nil {
				t.Fatal(err)
			}
			// At a low CPU weight the job waits for the hog's slice
			// instead of preempting it on every wake-up.
			job.setLowWeight(t)
			hog := startHelper(t, "hog", "", hogCg)
			pinHelper(t, hog, 0)
			hog.start(t)
			w := startHelper(t, "wake:300", "", job)
			pinHelper(t, w, 0)
			w.start(t)
			w.wait(t)
			h, err := p.Histogram(job.id)
			if err != nil {
				t.Fatal(err)
			}
			var sum uint64
			for _, n := range h.BlameNs {
				sum += n
			}
			t.Logf("%d waits, %v in all, blame %v (sum %v)", h.Count, time.Duration(h.SumNs), h.BlameNs, time.Duration(sum))
			if h.Count < 300 {
				t.Fatalf("%d waits, want at least 300", h.Count)
			}
			if d := math.Abs(float64(sum) - float64(h.SumNs)); d > 0.05*float64(h.SumNs) {
				t.Errorf("blame sums to %v, the waits to %v: more than 5%% apart", time.Duration(sum), time.Duration(h.SumNs))
			}
			if share := float64(h.BlameNs[tc.want]) / float64(sum); share < 0.5 {
				t.Errorf("%s holds %.0f%% of the blame, want at least half: %v", tc.want, 100*share, h.BlameNs)
			}
			if tc.want != RunnerOutside {
				return
			}
			off, err := p.Offenders()
			if err != nil {
				t.Fatal(err)
			}
			// The host's other processes (a CI run's other test binaries
			// among them) sit in the root cgroup and may delay the job on
			// CPU 0 too: they are rightly charged there. Of what the other
			// cgroups are charged, the hog's must hold at least half, and
			// of the whole outside share at least a quarter.
			const rootCgroup = 1
			outside, rest := h.BlameNs[RunnerOutside], h.BlameNs[RunnerOutside]-min(off[rootCgroup], h.BlameNs[RunnerOutside])
			if off[hogCg.id] < rest/2 || off[hogCg.id] < outside/4 {
				t.Errorf("the hog's cgroup %d is charged %v of the %v outside share (%v of it not the root cgroup's): %v",
					hogCg.id, time.Duration(off[hogCg.id]), time.Duration(outside), time.Duration(rest), off)
			}
		})
	}
}
