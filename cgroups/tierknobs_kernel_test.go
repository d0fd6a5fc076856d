package cgroups

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestKernelTierKnobs(t *testing.T) {
	m := newKernelManager(t)
	cg := mustCreate(t, m, "hog", Placement{Tier: BestEffort, SharedCPUs: onlineCPUs(t), MemoryLimit: 256 * mib})
	startHelper(t, cg, "hog")
	if err := m.SetTierCPUQuota(BestEffort, 100); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	capped, _ := cpuShare(t, cg, 2*time.Second)
	t.Logf("tier quota 100m: job used %.3f of a core", capped)
	if capped > 0.15 {
		t.Errorf("best-effort job under a 100m tier quota used %.1f%% of a core", capped*100)
	}
	ts, err := m.TierStats(BestEffort)
	if err != nil {
		t.Fatal(err)
	}
	if ts.NrThrottled == 0 {
		t.Errorf("tier never throttled: %+v", ts)
	}
	if err := m.SetTierCPUQuota(BestEffort, 0); err != nil {
		t.Fatal(err)
	}
	// The host is shared with other work: the hog need not get a whole
	// core, but clearly more than under the cap.
	share, _ := cpuShare(t, cg, time.Second)
	t.Logf("no tier quota: job used %.3f of a core", share)
	if share < max(2*capped, 0.2) {
		t.Errorf("after removing the tier quota the hog used %.1f%% of a core (%.1f%% under the cap)", share*100, capped*100)
	}

	if err := m.SetTierMemoryHigh(BestEffort, 64*mib); err != nil {
		t.Fatal(err)
	}
	file := m.opts.root + "/" + m.tierRel(BestEffort) + "/memory.high"
	if m.Mode() == ModeV1 {
		file = m.opts.root + "/memory/" + m.tierRel(BestEffort) + "/memory.soft_limit_in_bytes"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "67108864" {
		t.Errorf("%s = %s, want 67108864", file, got)
	}
	if err := m.SetTierMemoryHigh(BestEffort, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg.CPUDir() + "/cgroup.procs"); err != nil {
		t.Errorf("CPUDir %s: %v", cg.CPUDir(), err)
	}
}

// A best-effort job whose own quota (500m) is over its tier's (300m, the
// QoS or reclaim loop throttling the tier) is still created: cgroup v1
// refuses a child quota over its parent's, so it is written at the
// tier's, which holds the job anyway, both at creation and when set at
// run time; and a tier throttled under a job's quota (CPU lent to it)
// brings the job's down first. v2 takes each as it is.
func TestKernelJobQuotaUnderThrottledTier(t *testing.T) {
	m := newKernelManager(t)
	if err := m.SetTierCPUQuota(BestEffort, 300); err != nil {
		t.Fatal(err)
	}
	cg := mustCreate(t, m, "lent", Placement{Tier: BestEffort, SharedCPUs: onlineCPUs(t), CPURequestMilli: 500, CPULimitMilli: 500})
	file, want := cg.CPUDir()+"/cpu.max", "50000 100000"
	if m.Mode() == ModeV1 {
		file, want = cg.CPUDir()+"/cpu.cfs_quota_us", "30000"
	}
	check := func(what string) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("%s: %s = %s, want %s", what, file, got, want)
		}
	}
	check("created")
	// The executor sets a job's quota again once its process runs.
	if err := cg.SetCPUQuota(500); err != nil {
		t.Fatal(err)
	}
	check("set at run time")
	// Lent CPU, then the tier throttled under it: v1 refuses a tier
	// quota under a job's, so the job's comes down to it first.
	if err := m.SetTierCPUQuota(BestEffort, 0); err != nil {
		t.Fatal(err)
	}
	if err := cg.SetCPUQuota(1500); err != nil {
		t.Fatal(err)
	}
	if err := m.SetTierCPUQuota(BestEffort, 300); err != nil {
		t.Fatalf("tier throttled under a job lent 1500m: %v", err)
	}
	if m.Mode() != ModeV1 {
		want = "150000 100000"
	}
	check("tier throttled under it")
	if err := m.SetTierCPUQuota(BestEffort, 0); err != nil {
		t.Fatal(err)
	}
}

// On the real kernel: a tier's threads are every thread of its jobs'
// processes, and FindCPUCgroup names a job's cgroup by its directory's
// inode.
func TestKernelTierThreadsAndFind(t *testing.T) {
	m := newKernelManager(t)
	cg := mustCreate(t, m, "threads-job", Placement{Tier: BestEffort, SharedCPUs: onlineCPUs(t), MemoryLimit: 256 * mib})
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := cg.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	tids, err := m.TierThreads(BestEffort)
	if err != nil || !slices.Contains(tids, cmd.Process.Pid) {
		t.Errorf("best-effort threads %v, %v: want the job's process %d", tids, err, cmd.Process.Pid)
	}
	if tids, err := m.TierThreads(Burstable); err != nil || slices.Contains(tids, cmd.Process.Pid) {
		t.Errorf("burstable threads %v, %v", tids, err)
	}
	st, err := os.Stat(cg.CPUDir())
	if err != nil {
		t.Fatal(err)
	}
	ino := st.Sys().(*syscall.Stat_t).Ino
	got, err := m.FindCPUCgroup(ino)
	if want := "/" + cg.Path(); err != nil || got != want {
		t.Errorf("FindCPUCgroup(%d) = %q, %v; want %q", ino, got, err, want)
	}
	if _, err := m.FindCPUCgroup(1<<62 + 7); err == nil {
		t.Error("an unknown id was found")
	}
}
