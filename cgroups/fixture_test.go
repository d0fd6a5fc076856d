package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups/devicefilter"
)

type recordingFilter struct {
	dirs  []string
	rules [][]devicefilter.Rule
}

func (r *recordingFilter) Attach(dir string, rules []devicefilter.Rule) error {
	r.dirs = append(r.dirs, dir)
	r.rules = append(r.rules, rules)
	return nil
}

var _ DeviceFilter = (*recordingFilter)(nil)

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// fakeV2 is a unified hierarchy as regular files.
func fakeV2(t *testing.T) string {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n")
	writeFile(t, filepath.Join(root, "cgroup.subtree_control"), "")
	return root
}

func TestDetectMode(t *testing.T) {
	if m, err := DetectMode(fakeV2(t)); err != nil || m != ModeV2 {
		t.Errorf("v2 fixture: %v %v", m, err)
	}
	v1 := t.TempDir()
	for _, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer"} {
		writeFile(t, filepath.Join(v1, c, "cgroup.procs"), "")
	}
	if m, err := DetectMode(v1); err != nil || m != ModeV1 {
		t.Errorf("v1 fixture: %v %v", m, err)
	}
	if _, err := DetectMode(t.TempDir()); !errors.Is(err, ErrNoCgroups) {
		t.Errorf("empty dir: %v", err)
	}
}

func TestV2Fixture(t *testing.T) {
	root := fakeV2(t)
	filter := &recordingFilter{}
	m, err := NewManager(WithRoot(root), WithParent("system.slice/fusiond.service"), WithDeviceFilter(filter), WithKillTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if m.Mode() != ModeV2 {
		t.Fatalf("mode %v", m.Mode())
	}
	l, err := Plan(Placement{Tier: Burstable, CPURequestMilli: 500, CPULimitMilli: 1500, SharedCPUs: []int{0, 1}, MemoryRequest: gib, MemoryLimit: 2 * gib, PidsLimit: 64})
	if err != nil {
		t.Fatal(err)
	}
	cg, err := m.Create("job-1", Burstable, l)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "system.slice/fusiond.service/fusiond/burstable/job-1")
	if cg.Path() != "system.slice/fusiond.service/fusiond/burstable/job-1" {
		t.Errorf("path %q", cg.Path())
	}
	want := map[string]string{
		"cpu.max":     "150000 100000",
		"cpuset.cpus": "0-1",
		"memory.low":  "1073741824",
		"memory.max":  "2147483648",
		"pids.max":    "64",
		"cpu.weight":  itoa(l.CPUWeight),
		"memory.high": itoa(uint64(l.MemoryHigh)),
	}
	for f, v := range want {
		if got := readFile(t, filepath.Join(dir, f)); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
	for _, d := range []string{"", "system.slice", "system.slice/fusiond.service/fusiond", "system.slice/fusiond.service/fusiond/burstable"} {
		if got := readFile(t, filepath.Join(root, d, "cgroup.subtree_control")); !strings.Contains(got, "+cpu") || !strings.Contains(got, "+memory") {
			t.Errorf("%q subtree_control = %q", d, got)
		}
	}
	if len(filter.dirs) != 1 || filter.dirs[0] != dir || len(filter.rules[0]) != len(DefaultDevices()) {
		t.Errorf("device filter calls: %v", filter.dirs)
	}

	// Idempotent: applying again writes the same values.
	if _, err := m.Create("job-1", Burstable, l); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "cpu.max")); got != "150000 100000" {
		t.Errorf("re-apply cpu.max = %q", got)
	}

	if err := cg.SetCPUQuota(200); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "cpu.max")); got != "20000 100000" {
		t.Errorf("after SetCPUQuota cpu.max = %q", got)
	}
	if err := cg.SetCPUQuota(0); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "cpu.max")); got != "max 100000" {
		t.Errorf("unlimited cpu.max = %q", got)
	}

	if err := m.SetSharedCPUs([]int{1}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "cpuset.cpus")); got != "1" {
		t.Errorf("job cpuset after shrink = %q", got)
	}

	loaded, err := m.Load("job-1")
	if err != nil || loaded.Tier() != Burstable || loaded.Path() != cg.Path() {
		t.Fatalf("Load = %+v, %v", loaded, err)
	}
	if _, err := m.Load("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Load(nope) = %v", err)
	}
	if _, err := m.Create("../escape", Burstable, l); !errors.Is(err, ErrInvalidPlacement) {
		t.Errorf("bad job id: %v", err)
	}

	writeFile(t, filepath.Join(dir, "cpu.stat"), "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 10\nnr_throttled 4\nthrottled_usec 300000\n")
	writeFile(t, filepath.Join(dir, "memory.current"), "1000\n")
	writeFile(t, filepath.Join(dir, "memory.peak"), "5000\n")
	writeFile(t, filepath.Join(dir, "memory.events"), "low 0\nhigh 2\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
	writeFile(t, filepath.Join(dir, "cpu.pressure"), "some avg10=12.50 avg60=1.00 avg300=0.00 total=900\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.CPUUsage != 2500*time.Millisecond || st.ThrottledTime != 300*time.Millisecond || st.NrThrottled != 4 || st.MemoryPeak != 5000 || st.OOMKills != 1 || st.PSI == nil || st.PSI.CPU.Some.Avg10 != 12.5 {
		t.Errorf("stats = %+v psi=%+v", st, st.PSI)
	}
	tierDir := filepath.Join(root, "system.slice/fusiond.service/fusiond/burstable")
	writeFile(t, filepath.Join(tierDir, "cpu.stat"), "usage_usec 7000000\nuser_usec 6000000\nsystem_usec 1000000\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
	writeFile(t, filepath.Join(tierDir, "memory.current"), "4096\n")
	writeFile(t, filepath.Join(tierDir, "memory.peak"), "8192\n")
	writeFile(t, filepath.Join(tierDir, "memory.events"), "oom_kill 0\n")
	ts, err := m.TierStats(Burstable)
	if err != nil {
		t.Fatal(err)
	}
	if ts.CPUUsage != 7*time.Second || ts.MemoryCurrent != 4096 {
		t.Errorf("tier stats = %+v", ts)
	}

	writeFile(t, filepath.Join(dir, "cgroup.procs"), "")
	if err := cg.Kill(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "cgroup.kill")); got != "1" {
		t.Errorf("cgroup.kill = %q", got)
	}
	writeFile(t, filepath.Join(dir, "cgroup.procs"), "4242\n")
	if err := cg.Delete(); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("Delete with a process = %v", err)
	}
	be, err := m.Create("be-1", BestEffort, mustPlan(t, Placement{Tier: BestEffort, SharedCPUs: []int{0}}))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"memory.high", "memory.max", "cpu.max"} {
		if got := readFile(t, filepath.Join(root, be.Path(), f)); !strings.HasPrefix(got, "max") {
			t.Errorf("unlimited %s = %q, want max", f, got)
		}
	}
	if got := readFile(t, filepath.Join(root, be.Path(), "cpu.weight")); got != "1" {
		t.Errorf("best-effort cpu.weight = %q", got)
	}

	for tier, w := range map[Tier]string{Guaranteed: "10000", Burstable: "10000", BestEffort: "1"} {
		if got := readFile(t, filepath.Join(root, m.tierRel(tier), "cpu.weight")); got != w {
			t.Errorf("tier %s cpu.weight = %q, want %s", tier, got, w)
		}
	}

	jobs, err := m.Jobs()
	if err != nil || len(jobs[Burstable]) != 1 || jobs[Burstable][0] != "job-1" {
		t.Errorf("Jobs = %v, %v", jobs, err)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
