package executor

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
)

// The test binary is fusiond for these tests: it dispatches the monitor and
// job-exec modes like cmd/fusiond does, and with FUSIOND_EXECTEST_HELPER
// set it is a job program (a CPU hog, an allocator, a device opener).
const helperEnv = "FUSIOND_EXECTEST_HELPER"

// mainThreadHelper is the helper mode that calls asCaller's goroutine on
// the main thread (TestAsCallerLeavesTheMainThread): init locks the main
// goroutine to it, so that TestMain runs there.
const mainThreadHelper = "ascaller-main-thread"

func init() {
	if os.Getenv(helperEnv) == mainThreadHelper {
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	if code, ok := Dispatch(os.Args); ok {
		os.Exit(code)
	}
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func runHelper(mode string, args []string) int {
	switch mode {
	case mainThreadHelper:
		// On the main thread, as asCaller's goroutine may find itself:
		// fn runs as the user, and the process stays root's.
		if unix.Gettid() != unix.Getpid() {
			fmt.Println("error: not on the main thread")
			return 1
		}
		uid, _ := strconv.ParseUint(args[0], 10, 32)
		done := make(chan error, 1)
		var fnUID int
		callerThread(uint32(uid), uint32(uid), nil, func() error { fnUID = unix.Geteuid(); return nil }, done)
		if err := <-done; err != nil {
			fmt.Println("error", err)
			return 1
		}
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Uid:"); ok {
				fmt.Printf("fn-euid %d; main thread euid %d; process uids %s\n", fnUID, unix.Geteuid(), strings.Join(strings.Fields(v), " "))
			}
		}
	case "affinity":
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			fmt.Println("error", err)
			return 1
		}
		var cpus []int
		for i := range 1024 {
			if set.IsSet(i) {
				cpus = append(cpus, i)
			}
		}
		fmt.Println("affinity", cgroups.FormatCPUList(cpus))
	case "mems":
		// The NUMA nodes the job may allocate from (its cpuset.mems).
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Mems_allowed_list:"); ok {
				fmt.Println("mems", strings.TrimSpace(v))
			}
		}
	case "alloc":
		n, _ := strconv.Atoi(args[0])
		var keep [][]byte
		for got := 0; got < n; got++ {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		fmt.Println("allocated", len(keep))
		time.Sleep(time.Hour)
	case "open":
		for _, p := range args {
			f, err := os.OpenFile(p, os.O_RDONLY, 0)
			switch {
			case err == nil:
				f.Close()
				fmt.Println(p, "ok")
			case errors.Is(err, unix.EPERM):
				fmt.Println(p, "EPERM")
			default:
				fmt.Println(p, "error", err)
			}
		}
	case "spin":
		// Count loop iterations for the given seconds: throughput.
		secs, _ := strconv.ParseFloat(args[0], 64)
		end := time.Now().Add(time.Duration(secs * float64(time.Second)))
		n := 0
		for time.Now().Before(end) {
			for range 1000 {
				n++
			}
		}
		fmt.Println("iterations", n)
	default:
		fmt.Println("unknown helper", mode)
		return 2
	}
	return 0
}

// testRunner is a MonitorRunner with cgroups under a parent unique to the
// test, removed when the test ends.
type testRunner struct {
	*MonitorRunner
	t      testing.TB
	cg     *cgroups.Manager
	parent string
	dir    string
}

func newTestRunner(t testing.TB) *testRunner {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("executor kernel tests need root")
	}
	root := cgroupRoot()
	name := strings.ToLower(strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()))
	parent := fmt.Sprintf("fusiond-exectest-%d-%s", os.Getpid(), name)
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	cg, err := cgroups.NewManager(cgroups.WithRoot(root), cgroups.WithParent(parent), cgroups.WithLogger(log),
		cgroups.WithKillTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("cgroups unusable at %s: %v", root, err)
	}
	dir := t.TempDir()
	r := &testRunner{t: t, cg: cg, parent: parent, dir: dir}
	r.MonitorRunner = r.newRunner(log)
	t.Cleanup(r.cleanup)
	return r
}

// newRunner builds another runner over the same directories and cgroups,
// as a restarted daemon would.
func (r *testRunner) newRunner(log *slog.Logger) *MonitorRunner {
	exe, _ := os.Executable()
	return NewMonitorRunner(MonitorConfig{
		JobsDir: filepath.Join(r.dir, "jobs"), Executable: exe,
		Cgroups: r.cg, CgroupRoot: cgroupRoot(), CgroupParent: r.parent,
		Grace: 2 * time.Second,
	}, log)
}

func (r *testRunner) cleanup() {
	jobsByTier, _ := r.cg.Jobs()
	for _, ids := range jobsByTier {
		for _, id := range ids {
			if cg, err := r.cg.Load(id); err == nil {
				_ = cg.Kill()
				_ = cg.Delete()
			}
		}
	}
	_ = r.cg.RemoveHierarchy()
	for _, d := range parentDirs(r.parent) {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			r.t.Errorf("cleanup %s: %v", d, err)
		}
	}
}

// parentDirs lists the directories of a top-level cgroup in every
// hierarchy (one on v2, one per controller on v1).
func parentDirs(parent string) []string {
	root := cgroupRoot()
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return []string{filepath.Join(root, parent)}
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "*", parent))
	return dirs
}

func cgroupRoot() string {
	if r := os.Getenv("FUSIOND_CGROUP_ROOT"); r != "" {
		return r
	}
	return cgroups.DefaultRoot
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// request builds a run request for a job of the test.
func (r *testRunner) request(id string, tier api.Tier, cpu api.MilliCPU, mem api.Bytes, command ...string) jobs.RunRequest {
	logDir := filepath.Join(r.dir, "jobs", id)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	return jobs.RunRequest{
		JobID: id, Attempt: 1, Command: command,
		Env:     []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FUSIOND_JOB_ID=" + id},
		Workdir: "/", LogPath: filepath.Join(logDir, "output.log"),
		Tier:       tier,
		Allocation: api.Allocation{CPU: cpu, Memory: mem, NUMANode: -1},
	}
}

// helperRequest runs the test binary as the job in a helper mode.
func (r *testRunner) helperRequest(id string, tier api.Tier, cpu api.MilliCPU, mem api.Bytes, mode string, args ...string) jobs.RunRequest {
	exe, _ := os.Executable()
	req := r.request(id, tier, cpu, mem, append([]string{exe}, args...)...)
	req.Env = append(req.Env, helperEnv+"="+mode)
	return req
}

func (r *testRunner) start(req jobs.RunRequest) jobs.Process {
	r.t.Helper()
	p, err := r.Start(r.t.Context(), req)
	if err != nil {
		r.t.Fatalf("start job %s: %v", req.JobID, err)
	}
	return p
}

// waitExit waits for p with a time limit.
func waitExit(t testing.TB, p jobs.Process, limit time.Duration) api.ExitStatus {
	t.Helper()
	type res struct {
		e   api.ExitStatus
		err error
	}
	ch := make(chan res, 1)
	go func() { e, err := p.Wait(); ch <- res{e, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("wait: %v", r.err)
		}
		return r.e
	case <-time.After(limit):
		_ = p.Signal(syscall.SIGKILL)
		t.Fatalf("job still running after %s", limit)
	}
	return api.ExitStatus{}
}

func readLog(t testing.TB, req jobs.RunRequest) string {
	t.Helper()
	b, err := os.ReadFile(req.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && len(b) > i+2 && b[i+2] != 'Z'
}

var _ io.Writer = testWriter{}
