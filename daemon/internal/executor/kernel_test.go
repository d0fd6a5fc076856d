package executor

// Real-kernel tests of the executor: root and a writable cgroup hierarchy
// are required, and their absence is a failure, never a skip. Here they
// drive cgroup v1; .ci/vm runs them on a pure cgroup v2 kernel.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology"
	"github.com/fusiond/fusiond/topology/simhost"
)

const mib = api.Bytes(1) << 20

func TestKernelBestEffortQuota(t *testing.T) {
	r := newTestRunner(t)
	p := r.start(r.request("hog", api.TierBestEffort, 200, 64*mib, "sh", "-c", "while :; do :; done"))
	up, ok := p.(jobs.UsageReporter)
	if !ok {
		t.Fatal("process reports no usage")
	}
	time.Sleep(500 * time.Millisecond)
	u0, err := up.Usage()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	time.Sleep(3 * time.Second)
	u1, err := up.Usage()
	if err != nil {
		t.Fatal(err)
	}
	share := (u1.CPUSeconds - u0.CPUSeconds) / time.Since(t0).Seconds()
	t.Logf("besteffort hog at 200m quota used %.1f%% of a core; throttled %d periods", 100*share, u1.ThrottledPeriods)
	if share > 0.25 {
		t.Errorf("hog used %.1f%% of a core, quota is 20%%", 100*share)
	}
	if share < 0.05 {
		t.Errorf("hog used only %.1f%% of a core: did it run?", 100*share)
	}
	if u1.ThrottledPeriods == 0 {
		t.Error("hog was never throttled")
	}
	// The quota moves at run time.
	if err := r.SetCPUQuota("hog", 50); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	u2, _ := up.Usage()
	t2 := time.Now()
	time.Sleep(2 * time.Second)
	u3, _ := up.Usage()
	share = (u3.CPUSeconds - u2.CPUSeconds) / time.Since(t2).Seconds()
	t.Logf("after SetCPUQuota(50): %.1f%% of a core", 100*share)
	if share > 0.08 {
		t.Errorf("hog used %.1f%% of a core after the quota fell to 5%%", 100*share)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e := waitExit(t, p, 10*time.Second)
	if e.Signal != "KILL" {
		t.Errorf("exit %+v, want killed by KILL", e)
	}
	assertNoCgroup(t, r, "hog")
}

func TestKernelGuaranteedAffinity(t *testing.T) {
	r := newTestRunner(t)
	host, err := topology.Discover(context.Background())
	cores := cgroups.CoresOf(host)
	if err != nil {
		t.Fatal(err)
	}
	if len(cores) < 2 {
		t.Fatalf("need 2 cores, host has %d", len(cores))
	}
	mine, shared := cores[len(cores)-1].CPUs, cores[0].CPUs
	if err := r.cg.SetSharedCPUs(shared); err != nil {
		t.Fatal(err)
	}
	r.cfg.SharedCPUs = func() []int { return shared }

	g := r.helperRequest("g", api.TierGuaranteed, 1000, 64*mib, "affinity")
	g.Allocation.CPUSet = cgroups.FormatCPUList(mine)
	g.Allocation.NUMANode = cores[len(cores)-1].Node
	be := r.helperRequest("be", api.TierBestEffort, 500, 64*mib, "affinity")
	for _, req := range []jobs.RunRequest{g, be} {
		if e := waitExit(t, r.start(req), 20*time.Second); e.Code != 0 {
			t.Fatalf("%s: exit %+v: %s", req.JobID, e, readLog(t, req))
		}
	}
	if got, want := strings.TrimSpace(readLog(t, g)), "affinity "+cgroups.FormatCPUList(mine); got != want {
		t.Errorf("guaranteed job: %q, want %q", got, want)
	}
	if got, want := strings.TrimSpace(readLog(t, be)), "affinity "+cgroups.FormatCPUList(shared); got != want {
		t.Errorf("besteffort job: %q, want %q", got, want)
	}
}

func TestKernelOOMKilled(t *testing.T) {
	r := newTestRunner(t)
	other := r.start(r.request("bystander", api.TierBurstable, 100, 64*mib, "sleep", "60"))
	big := r.helperRequest("big", api.TierBestEffort, 500, 48*mib, "alloc", "512")
	p := r.start(big)
	e := waitExit(t, p, 60*time.Second)
	if !e.OOMKilled || e.Signal != "KILL" {
		t.Fatalf("exit %+v, want oom-killed by KILL; log: %s", e, readLog(t, big))
	}
	u, err := p.(jobs.UsageReporter).Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.OOMKills == 0 || u.MemoryPeak < 40*mib {
		t.Errorf("usage %+v: want an OOM kill and a peak near the 48Mi limit", u)
	}
	if !alive(other.PID()) {
		t.Fatal("the other job died with the OOM-killed one")
	}
	if err := other.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if e := waitExit(t, other, 10*time.Second); e.Signal != "TERM" {
		t.Errorf("bystander exit %+v, want TERM", e)
	}
}

func TestKernelDevices(t *testing.T) {
	r := newTestRunner(t)
	dir := t.TempDir()
	granted := devices.DeviceNode{Path: filepath.Join(dir, "granted"), Type: devices.CharDevice, Major: 1, Minor: 11, Access: "r"}
	denied := filepath.Join(dir, "denied")
	if err := unix.Mknod(granted.Path, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 11))); err != nil {
		t.Fatalf("mknod: %v", err)
	}
	if err := unix.Mknod(denied, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 2))); err != nil {
		t.Fatalf("mknod: %v", err)
	}
	req := r.helperRequest("dev", api.TierBurstable, 100, 64*mib, "open", granted.Path, denied)
	req.Devices = []devices.DeviceNode{granted}
	req.DeviceEnv = map[string]string{"FUSIOND_TEST_DEVICE": "granted"}
	if e := waitExit(t, r.start(req), 20*time.Second); e.Code != 0 {
		t.Fatalf("exit %+v: %s", e, readLog(t, req))
	}
	out := readLog(t, req)
	if !strings.Contains(out, granted.Path+" ok") {
		t.Errorf("granted device not opened: %s", out)
	}
	if !strings.Contains(out, denied+" EPERM") {
		t.Errorf("ungranted device not refused: %s", out)
	}
}

func TestKernelIdentityAndEnv(t *testing.T) {
	r := newTestRunner(t)
	req := r.request("who", api.TierBurstable, 100, 64*mib, "sh", "-c", `echo "$(id -u) $(id -g) $(id -G) $FUSIOND_TEST_DEVICE $(pwd)"`)
	req.UID, req.GID, req.Groups = 65534, 65534, []uint32{65534, 100}
	req.Workdir = "/tmp"
	req.DeviceEnv = map[string]string{"FUSIOND_TEST_DEVICE": "gpu-0"}
	if e := waitExit(t, r.start(req), 20*time.Second); e.Code != 0 {
		t.Fatalf("exit %+v: %s", e, readLog(t, req))
	}
	if got, want := strings.TrimSpace(readLog(t, req)), "65534 65534 65534 100 gpu-0 /tmp"; got != want {
		t.Errorf("job saw %q, want %q", got, want)
	}
}

// TestKernelDeviceEnvWins: a job whose own environment sets the variables
// of its device grant (a spec env asking for the whole GPU under MPS) runs
// with fusiond's values only: the raw environment it gets holds each key
// once. (env itself prints it: a shell would fold duplicates.)
func TestKernelDeviceEnvWins(t *testing.T) {
	r := newTestRunner(t)
	req := r.request("mpsenv", api.TierBurstable, 100, 64*mib, "env")
	req.Env = append(req.Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_VISIBLE_DEVICES=all", "CUDA_CACHE_PATH=/tmp/c")
	req.DeviceEnv = map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_VISIBLE_DEVICES": "GPU-1"}
	if e := waitExit(t, r.start(req), 20*time.Second); e.Code != 0 {
		t.Fatalf("exit %+v: %s", e, readLog(t, req))
	}
	want := "CUDA_CACHE_PATH=/tmp/c\nCUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\nCUDA_VISIBLE_DEVICES=GPU-1"
	var cuda []string
	for _, l := range strings.Split(readLog(t, req), "\n") {
		if strings.HasPrefix(l, "CUDA_") {
			cuda = append(cuda, l)
		}
	}
	slices.Sort(cuda)
	if got := strings.Join(cuda, "\n"); got != want {
		t.Errorf("job environment\n%s\nwant\n%s", got, want)
	}
}

func TestKernelStartFailure(t *testing.T) {
	r := newTestRunner(t)
	req := r.request("nox", api.TierBurstable, 100, 64*mib, "/etc/hostname")
	if _, err := r.Start(t.Context(), req); err == nil || !strings.Contains(err.Error(), "exec /etc/hostname") {
		t.Fatalf("start of a non-executable: %v", err)
	}
	assertNoCgroup(t, r, "nox")
}

// TestKernelReattach: a second runner (a restarted daemon) finds a running
// job's monitor, can cancel it, and collects the result of a job that
// ended while nobody watched.
func TestKernelReattach(t *testing.T) {
	r := newTestRunner(t)
	flag := filepath.Join(t.TempDir(), "go")
	ends := r.request("ends", api.TierBurstable, 100, 64*mib, "sh", "-c", "while [ ! -e "+flag+" ]; do sleep 0.05; done; exit 7")
	runs := r.request("runs", api.TierBestEffort, 100, 64*mib, "sleep", "300")
	p1, p2 := r.start(ends), r.start(runs)

	// The "daemon" forgets both and restarts.
	r2 := r.newRunner(r.log)
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(p1.PID()) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	a1, err := r2.Attach("ends", 1)
	if err != nil {
		t.Fatal(err)
	}
	if e := waitExit(t, a1, 10*time.Second); e.Code != 7 {
		t.Errorf("ended job's recorded exit %+v, want code 7", e)
	}
	a2, err := r2.Attach("runs", 1)
	if err != nil {
		t.Fatal(err)
	}
	if a2.PID() != p2.PID() {
		t.Errorf("re-attached pid %d, started %d", a2.PID(), p2.PID())
	}
	if err := a2.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if e := waitExit(t, a2, 10*time.Second); e.Signal != "TERM" {
		t.Errorf("cancelled job exit %+v, want TERM", e)
	}
	if alive(p2.PID()) {
		t.Error("cancelled job's process survived")
	}
	assertNoCgroup(t, r, "runs")
	if _, err := r2.Attach("never", 1); !errors.Is(err, jobs.ErrNeverStarted) {
		t.Errorf("Attach of an attempt that never ran: %v, want ErrNeverStarted", err)
	}
}

// TestKernelCancelEscalates: a job ignoring SIGTERM is killed, with every
// process it forked, after the grace period.
func TestKernelCancelEscalates(t *testing.T) {
	r := newTestRunner(t)
	req := r.request("stubborn", api.TierBurstable, 100, 64*mib, "sh", "-c", "trap '' TERM; sleep 300 & sleep 300 & wait")
	p := r.start(req)
	cg, err := r.cg.Load("stubborn")
	if err != nil {
		t.Fatal(err)
	}
	// The shell forks its two sleeps when it gets to them: wait for them.
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pids, _ = cg.Procs()
		if len(pids) >= 3 || time.Now().After(deadline) {
			break
		}
	}
	if len(pids) < 3 {
		t.Fatalf("job has %d processes after 10 s, want 3", len(pids))
	}
	start := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e := waitExit(t, p, 15*time.Second)
	if e.Signal != "KILL" || time.Since(start) < time.Second {
		t.Errorf("exit %+v after %s: want KILL after the 2 s grace", e, time.Since(start))
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d of the job survived", pid)
		}
	}
	assertNoCgroup(t, r, "stubborn")
}

func assertNoCgroup(t *testing.T, r *testRunner, id string) {
	t.Helper()
	if _, err := r.cg.Load(id); !errors.Is(err, cgroups.ErrNotFound) {
		t.Errorf("cgroup of job %s still there (%v)", id, err)
	}
}

// TestKernelMonitorKilled: when the monitor itself dies without a result,
// Wait and Attach say so, and Reap kills what is left of the job and
// removes its cgroup.
func TestKernelMonitorKilled(t *testing.T) {
	r := newTestRunner(t)
	p := r.start(r.request("orphan", api.TierBurstable, 100, 64*mib, "sleep", "300"))
	mp := p.(*monitorProcess)
	if err := syscall.Kill(mp.monPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err == nil {
		t.Fatal("Wait after the monitor was killed reported an exit")
	}
	if _, err := r.Attach("orphan", 1); !errors.Is(err, jobs.ErrGone) {
		t.Fatalf("Attach: %v, want ErrGone", err)
	}
	if !alive(p.PID()) {
		t.Fatal("the job died with its monitor: it should run on until reaped")
	}
	n, err := r.Reap("orphan", p.PID())
	if err != nil || n != 1 {
		t.Fatalf("Reap killed %d, %v; want 1", n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(p.PID()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(p.PID()) {
		t.Error("job survived Reap")
	}
	assertNoCgroup(t, r, "orphan")
}

// TestKernelStartRefusesLiveAttempt: starting an attempt again while its
// monitor runs is refused and leaves the running attempt's files alone.
func TestKernelStartRefusesLiveAttempt(t *testing.T) {
	r := newTestRunner(t)
	req := r.request("twice", api.TierBurstable, 100, 64*mib, "sleep", "300")
	p := r.start(req)
	if _, err := r.Start(t.Context(), req); !errors.Is(err, ErrAttemptRunning) {
		t.Fatalf("second Start of a live attempt: %v, want ErrAttemptRunning", err)
	}
	if _, err := os.Stat(filepath.Join(r.AttemptDir("twice", 1), specFile)); err != nil {
		t.Fatalf("live attempt's directory was touched: %v", err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExit(t, p, 15*time.Second)
}

// TestKernelMemoryLessNode: a guaranteed job aligned to a NUMA node that
// has no memory gets its nearest memory node in cpuset.mems. The model
// is the simhost tree with node 1's memory gone (its nearest memory node
// is node 0, which this host has); the job, on one of this host's real
// cores, reads its Mems_allowed_list. Without the mapping cpuset.mems
// would name node 1, which the kernel refuses here (no memory there).
func TestKernelMemoryLessNode(t *testing.T) {
	r := newTestRunner(t)
	ctx := context.Background()
	host, err := topology.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cores := cgroups.CoresOf(host)
	if len(cores) < 2 {
		t.Fatalf("need 2 cores, host has %d", len(cores))
	}
	if n := host.Node(1); n != nil && n.MemoryBytes > 0 {
		t.Fatalf("this host has memory on node 1: the control below needs a host without")
	}
	dir := filepath.Join(t.TempDir(), "root")
	if err := simhost.Plan(simhost.WithCoresPerSocket(2)).Write(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sys/devices/system/node/node1/meminfo"), []byte("Node 1 MemTotal:       0 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fixture, err := topology.Discover(ctx, topology.WithRoot(dir), topology.WithoutNames())
	if err != nil {
		t.Fatal(err)
	}
	mine, shared := cores[len(cores)-1].CPUs, cores[0].CPUs
	if err := r.cg.SetSharedCPUs(shared); err != nil {
		t.Fatal(err)
	}
	r.cfg.SharedCPUs = func() []int { return shared }
	r.cfg.MemNodes = func(node int) []int {
		var out []int
		for _, n := range fixture.MemoryNodesFor(topology.NodeID(node)) {
			out = append(out, int(n))
		}
		return out
	}
	g := r.helperRequest("g", api.TierGuaranteed, 1000, 64*mib, "mems")
	g.Allocation.CPUSet = cgroups.FormatCPUList(mine)
	g.Allocation.NUMANode = 1
	if e := waitExit(t, r.start(g), 20*time.Second); e.Code != 0 {
		t.Fatalf("exit %+v: %s", e, readLog(t, g))
	}
	if got := strings.TrimSpace(readLog(t, g)); got != "mems 0" {
		t.Errorf("job on memory-less node 1: %q, want \"mems 0\"", got)
	}

	// The control: the job's own node in cpuset.mems. A refused
	// cpuset.mems leaves the job's directories in the hierarchies written
	// before cpuset (v1): removed here, before the runner's cleanup.
	t.Cleanup(func() {
		for _, d := range parentDirs(r.parent) {
			left, _ := filepath.Glob(filepath.Join(d, "*", "*", "c"))
			for _, l := range left {
				if err := os.Remove(l); err != nil {
					t.Errorf("cleanup %s: %v", l, err)
				}
			}
		}
	})
	r.cfg.MemNodes = nil
	c := r.helperRequest("c", api.TierGuaranteed, 1000, 64*mib, "mems")
	c.Allocation.CPUSet = cgroups.FormatCPUList(mine)
	c.Allocation.NUMANode = 1
	p, err := r.Start(t.Context(), c)
	if err == nil {
		e := waitExit(t, p, 20*time.Second)
		if out := strings.TrimSpace(readLog(t, c)); e.Code == 0 && out == "mems 1" {
			t.Fatalf("the kernel ran a job with cpuset.mems 1 on a host without memory on node 1: %q", out)
		}
		t.Logf("control: exit %+v, %q", e, readLog(t, c))
	} else {
		t.Logf("control: cpuset.mems 1 refused: %v", err)
	}
}
