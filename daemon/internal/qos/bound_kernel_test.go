package qos

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/ebpf"
)

// lockedLog is a log sink a test reads while the loop writes.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// TestKernelLoopAtProbeBound runs the loop over the real probe loaded
// with two slots (ids no cgroup has: the slots are what is tested). Jobs
// beyond the slots are untimed, counted once each and logged once per
// episode; a protected job takes the slot of the newest unprotected one,
// never of a protected one.
func TestKernelLoopAtProbeBound(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("real-kernel eBPF tests need root")
	}
	probe, err := ebpf.Load(ebpf.WithCgroupV1(cgroupsV1()), ebpf.WithMaxCgroups(2))
	if err != nil {
		t.Fatalf("the kernel cannot run the probe: %v", err)
	}
	t.Cleanup(func() { _ = probe.Close() })
	logs := &lockedLog{}
	host := &fakeHost{}
	l, err := New(Config{Window: time.Second, Params: params()}, probe, host, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	slo := &api.QoS{RunqueueP99: api.Duration(2 * time.Millisecond)}
	be := func(id string) Job { return Job{ID: id, Tier: api.TierBestEffort} }
	svc := func(id string) Job { return Job{ID: id, Tier: api.TierBurstable, SLO: slo} }
	check := func(what string, used, untimed int, total uint64, timed ...string) {
		t.Helper()
		st, c := l.Status(), l.Counters()
		if st.ProbeSlots != 2 || st.ProbeSlotsUsed != used || st.UntimedJobs != untimed || st.UntimedJobsTotal != total {
			t.Errorf("%s: status slots %d used %d untimed %d total %d; want 2, %d, %d, %d", what, st.ProbeSlots, st.ProbeSlotsUsed, st.UntimedJobs, st.UntimedJobsTotal, used, untimed, total)
		}
		if c.Slots.Max != 2 || c.Slots.Used != used || c.Untimed != untimed || c.UntimedTotal != total {
			t.Errorf("%s: counters %+v untimed %d total %d", what, c.Slots, c.Untimed, c.UntimedTotal)
		}
		for _, j := range host.jobs {
			want := false
			for _, id := range timed {
				want = want || id == j.ID
			}
			if got := l.JobLatency(j.ID) != nil; got != want {
				t.Errorf("%s: job %s timed %v, want %v", what, j.ID, got, want)
			}
		}
	}
	host.jobs = []Job{be("job-1000001"), be("job-1000002")}
	l.Step()
	check("two jobs, two slots", 2, 0, 0, "job-1000001", "job-1000002")
	if n := logs.count("probe slot is taken"); n != 0 {
		t.Errorf("%d bound warnings under the bound", n)
	}
	// A protected job takes the newest unprotected job's slot.
	host.jobs = append(host.jobs, svc("job-1000003"))
	l.Step()
	l.Step() // job-1000002 is refused again: counted once
	check("a protected job arrives", 2, 1, 1, "job-1000001", "job-1000003")
	// An unprotected job finds no slot: untimed, in the same episode.
	host.jobs = append(host.jobs, be("job-1000004"))
	l.Step()
	check("an unprotected job arrives", 2, 2, 2, "job-1000001", "job-1000003")
	// A second protected job takes the last unprotected slot; a third
	// finds only protected jobs timed and is refused.
	host.jobs = append(host.jobs, svc("job-1000005"))
	l.Step()
	check("a second protected job", 2, 3, 3, "job-1000003", "job-1000005")
	host.jobs = append(host.jobs, svc("job-1000006"))
	for range 3 {
		l.Step()
	}
	check("a third protected job", 2, 4, 4, "job-1000003", "job-1000005")
	if n := logs.count("probe slot is taken"); n != 1 {
		t.Errorf("%d bound warnings in one episode, want 1:\n%s", n, logs.b.String())
	}
	if n := probe.Slots().Refused; n < 4 {
		t.Errorf("the probe counted %d refused registrations, want at least 4", n)
	}
	// Back under the bound: the episode ends in one line.
	host.jobs = []Job{svc("job-1000003"), svc("job-1000006")}
	l.Step()
	l.Step()
	check("back under the bound", 2, 0, 4, "job-1000003", "job-1000006")
	if n := logs.count("every running job is timed again"); n != 1 {
		t.Errorf("%d end-of-episode lines, want 1", n)
	}
}

// cgroupsV1 reports whether the cpu controller is on cgroup v1 here.
func cgroupsV1() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err != nil
}
