package qos

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/ebpf"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the workloads: with FUSIOND_QOSHELPER set,
// TestMain runs one instead of the tests, after a line on stdin.
const helperEnv = "FUSIOND_QOSHELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

func runHelper(mode string) int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 2
	}
	switch mode {
	case "wake": // a latency-sensitive loop: wake every millisecond
		for {
			time.Sleep(time.Millisecond)
		}
	case "busy": // a service that works 400 µs after each 1 ms sleep
		for {
			time.Sleep(time.Millisecond)
			for end := time.Now().Add(400 * time.Microsecond); time.Now().Before(end); {
			}
		}
	case "hog": // a best-effort CPU hog; reports its work on SIGTERM-less kill via a file
		var n uint64
		out := os.Getenv("FUSIOND_QOSHELPER_OUT")
		go func() {
			for {
				time.Sleep(100 * time.Millisecond)
				_ = os.WriteFile(out+".tmp", fmt.Appendf(nil, "%d", atomic.LoadUint64(&n)), 0o644)
				_ = os.Rename(out+".tmp", out)
			}
		}()
		for {
			for range 1 << 16 {
				atomic.AddUint64(&n, 1)
			}
		}
	}
	return 2
}

type proc struct {
	cmd *exec.Cmd
	out string
}

// work is how many loop iterations a hog reported so far.
func (p *proc) work() uint64 {
	b, err := os.ReadFile(p.out)
	if err != nil {
		return 0
	}
	var n uint64
	fmt.Sscanf(string(b), "%d", &n)
	return n
}

func startProc(t testing.TB, cg *cgroups.Cgroup, mode string) *proc {
	t.Helper()
	return startProcIn(t, mode, cg.AddProc)
}

// startProcIn starts a helper, has move put it in its cgroup, then lets it
// run.
func startProcIn(t testing.TB, mode string, move func(pid int) error) *proc {
	t.Helper()
	out := filepath.Join(t.TempDir(), "work")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "FUSIOND_QOSHELPER_OUT="+out)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if err := move(cmd.Process.Pid); err != nil {
		t.Fatalf("move helper: %v", err)
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	return &proc{cmd: cmd, out: out}
}

// kernelEnv is a cgroup hierarchy of the test's own, the real probe and a
// Host over them with one protected and one best-effort job.
type kernelEnv struct {
	m     *cgroups.Manager
	probe *ebpf.Probe
	host  *cgHost
	svc   *cgroups.Cgroup
	be    *cgroups.Cgroup
	pool  int64
}

type cgHost struct {
	m    *cgroups.Manager
	jobs atomic.Pointer[[]Job]
	pool int64
	// equal gives the best-effort tier the burstable tier's CPU weight
	// again after every quota write (which sets the tier's own weight):
	// a host where best-effort work competes on equal terms.
	equal bool
}

// equalTierWeights gives the best-effort tier the burstable tier's CPU
// weight.
func (h *cgHost) equalTierWeights() error {
	file := "cpu.weight"
	if h.m.Mode() == cgroups.ModeV1 {
		file = "cpu.shares"
	}
	w, err := os.ReadFile(filepath.Join(h.m.TierCPUDir(cgroups.Burstable), file))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(h.m.TierCPUDir(cgroups.BestEffort), file), w, 0)
}

func (h *cgHost) SharedPoolMilli() int64 { return h.pool }

func (h *cgHost) Running() []Job { return *h.jobs.Load() }
func (h *cgHost) CgroupID(id string) (uint64, error) {
	c, err := h.m.Load(id)
	if err != nil {
		return 0, err
	}
	return ebpf.CgroupID(c.CPUDir())
}
func (h *cgHost) MemoryPSI(string) (*float64, error) { return nil, nil }
func (h *cgHost) TierCgroupID(t api.Tier) (uint64, error) {
	return ebpf.CgroupID(h.m.TierCPUDir(cgroups.Tier(t)))
}
func (h *cgHost) CgroupPath(id uint64) (string, error) { return h.m.FindCPUCgroup(id) }
func (h *cgHost) BestEffortMemory() (int64, error)     { return 0, nil }
func (h *cgHost) SetBestEffortCPU(milli int64) error {
	if err := h.m.SetTierCPUQuota(cgroups.BestEffort, milli); err != nil || !h.equal {
		return err
	}
	return h.equalTierWeights()
}
func (h *cgHost) SetBestEffortMemoryHigh(b int64) error {
	return h.m.SetTierMemoryHigh(cgroups.BestEffort, b)
}

func newKernelEnv(t testing.TB, slo time.Duration) *kernelEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("real-kernel QoS tests need root")
	}
	parent := fmt.Sprintf("fusiond-qostest-%d", os.Getpid())
	m, err := cgroups.NewManager(cgroups.WithParent(parent), cgroups.WithKillTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("cgroups unusable: %v", err)
	}
	cpus := affinityCPUs(t)
	if err := m.SetSharedCPUs(cpus); err != nil {
		t.Fatal(err)
	}
	probe, err := ebpf.Load(ebpf.WithCgroupV1(m.Mode() == cgroups.ModeV1))
	if err != nil {
		t.Fatalf("the kernel cannot run the probe: %v", err)
	}
	e := &kernelEnv{m: m, probe: probe, host: &cgHost{m: m, pool: int64(len(cpus)) * 1000}, pool: int64(len(cpus)) * 1000}
	mk := func(id string, tier cgroups.Tier) *cgroups.Cgroup {
		l, err := cgroups.Plan(cgroups.Placement{Tier: tier, SharedCPUs: cpus, MemoryLimit: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		cg, err := m.Create(id, tier, l)
		if err != nil {
			t.Fatal(err)
		}
		return cg
	}
	e.svc, e.be = mk("svc", cgroups.Burstable), mk("hogs", cgroups.BestEffort)
	e.setSLO(slo)
	t.Cleanup(func() {
		for _, cg := range []*cgroups.Cgroup{e.svc, e.be} {
			_ = cg.Kill()
			if err := cg.Delete(); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		_ = m.SetTierCPUQuota(cgroups.BestEffort, 0)
		if err := m.RemoveHierarchy(); err != nil {
			t.Errorf("cleanup hierarchy: %v", err)
		}
		removeParent(t, m.Mode(), parent)
		if err := probe.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

func (e *kernelEnv) setSLO(d time.Duration) {
	jobs := []Job{{ID: "svc", Tier: api.TierBurstable, SLO: &api.QoS{RunqueueP99: api.Duration(d)}}, {ID: "hogs", Tier: api.TierBestEffort}}
	e.host.jobs.Store(&jobs)
}

func removeParent(t testing.TB, mode cgroups.Mode, parent string) {
	dirs := []string{filepath.Join(cgroups.DefaultRoot, parent)}
	if mode == cgroups.ModeV1 {
		dirs = nil
		for _, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer"} {
			dirs = append(dirs, filepath.Join(cgroups.DefaultRoot, c, parent))
		}
	}
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cleanup %s: %v", d, err)
		}
	}
}

// tierQuotaFile reads the best-effort tier's CPU cap as the kernel has it:
// millicores, 0 for none.
func (e *kernelEnv) tierQuota(t testing.TB) int64 {
	t.Helper()
	rel := filepath.Join(fmt.Sprintf("fusiond-qostest-%d", os.Getpid()), "fusiond", string(cgroups.BestEffort))
	if e.m.Mode() == cgroups.ModeV2 {
		b, err := os.ReadFile(filepath.Join(cgroups.DefaultRoot, rel, "cpu.max"))
		if err != nil {
			t.Fatal(err)
		}
		var q, p int64
		f := strings.Fields(string(b))
		if f[0] == "max" {
			return 0
		}
		fmt.Sscanf(f[0], "%d", &q)
		fmt.Sscanf(f[1], "%d", &p)
		return q * 1000 / p
	}
	read := func(name string) int64 {
		b, err := os.ReadFile(filepath.Join(cgroups.DefaultRoot, "cpu", rel, name))
		if err != nil {
			t.Fatal(err)
		}
		var v int64
		fmt.Sscanf(string(b), "%d", &v)
		return v
	}
	q := read("cpu.cfs_quota_us")
	if q < 0 {
		return 0
	}
	return q * 1000 / read("cpu.cfs_period_us")
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// affinityCPUs is the CPUs this test may run on.
func affinityCPUs(t testing.TB) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for i := range 1024 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// pinProc puts every thread of p on cpu (threads it starts later inherit
// it).
func pinProc(t testing.TB, p *proc, cpu int) {
	t.Helper()
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tasks {
		var tid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &tid); err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			t.Fatalf("pin thread %d to CPU %d: %v", tid, cpu, err)
		}
	}
}

// outsideCgroup is a cgroup outside the test's fusiond hierarchy, in the
// cpu hierarchy's root: path is its name from that root.
type outsideCgroup struct{ dir, path string }

func newOutsideCgroup(t testing.TB) *outsideCgroup {
	t.Helper()
	root := cgroups.DefaultRoot
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		root = filepath.Join(root, "cpu")
	}
	name := fmt.Sprintf("fusiond-qostest-%d-outside", os.Getpid())
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100; i++ {
			if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cleanup %s", dir)
	})
	return &outsideCgroup{dir: dir, path: "/" + name}
}

// startOutsideHog starts a CPU hog in c.
func startOutsideHog(t testing.TB, c *outsideCgroup) *proc {
	t.Helper()
	return startProcIn(t, "hog", func(pid int) error {
		return os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), fmt.Appendf(nil, "%d", pid), 0)
	})
}
