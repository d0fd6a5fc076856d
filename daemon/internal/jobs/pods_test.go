package jobs_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/daemon/internal/audit"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/daemon/internal/jobs/jobstest"
	"github.com/fusiond/fusiond/daemon/internal/store"
	"github.com/fusiond/fusiond/devices"
)

const gpuRes = "fusiond.io/gpu-h200"

// podHost is a host of two H200s served to kubelet.
func podHost() *hostplacer.Placer {
	ok := devices.Health{Healthy: true}
	hw := hostplacer.Hardware{Name: "pods", CPU: 8000, Memory: 8 << 30}
	for _, id := range []string{"GPU-a", "GPU-b"} {
		hw.GPUs = append(hw.GPUs, devices.Device{ID: id, Kind: devices.GPU, Model: "NVIDIA H200", MemoryMB: 143771, Health: ok})
	}
	return hostplacer.New(hw, hostplacer.Options{Seed: 1, Pods: &hostplacer.PodOptions{}})
}

// podStore opens the job store in dir, closed when the test ends.
func podStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// podManager is a manager over placer and the store in dir, running until
// the test ends.
func podManager(t *testing.T, dir string, placer *hostplacer.Placer, cfg jobs.Config) (*jobs.Manager, *records) {
	t.Helper()
	m, rec := newPodManager(t, podStore(t, dir), dir, placer, cfg)
	jobstest.Run(t, m)
	return m, rec
}

func newPodManager(t *testing.T, st *store.Store, dir string, placer *hostplacer.Placer, cfg jobs.Config) (*jobs.Manager, *records) {
	t.Helper()
	rec := &records{}
	cfg.LogDir, cfg.CancelGrace, cfg.Audit = filepath.Join(dir, "logs"), time.Second, rec
	return jobs.New(cfg, st, jobstest.Runner(t, cfg.LogDir, time.Second), placer, slog.New(slog.DiscardHandler)), rec
}

func gpuJob(n int) api.JobSpec {
	s := small()
	s.Resources.GPU = &api.GPURequest{Count: n}
	return s
}

// A pod's device hold enters through the admission steps (audited as
// kubelet's), holds kubelet's GPU in the one ledger at once, and a job
// never gets it; a GPU a job holds is refused to kubelet; the hold ends
// when kubelet frees it, and then the GPU is a job's again.
func TestPodHoldOneLedger(t *testing.T) {
	m, rec := podManager(t, t.TempDir(), podHost(), jobs.Config{})
	ctx := context.Background()

	hold, _, err := m.AdmitPod(ctx, api.PodHold{Resource: gpuRes, Devices: []string{"GPU-a"}}, "kubelet took fusiond's choice")
	if err != nil {
		t.Fatal(err)
	}
	if hold.State != api.StateRunning || hold.Allocation == nil || !slices.Equal(hold.Allocation.GPUs, []string{"GPU-a"}) || hold.Owner.UID != 0 {
		t.Fatalf("hold %s: %s, allocation %+v, owner %+v; want running on GPU-a for root", hold.ID, hold.State, hold.Allocation, hold.Owner)
	}
	if !strings.Contains(hold.Allocation.Explain, "fusiond's choice") {
		t.Errorf("hold's placement %q does not say how its devices were chosen", hold.Allocation.Explain)
	}
	if got := rec.last(); got.Source != string(admission.Kubelet) || got.Action != "kubelet.allocate" || got.Outcome != audit.OK || got.Target != hold.ID {
		t.Errorf("audit record %+v, want kubelet.allocate of %s accepted", got, hold.ID)
	}
	if hs := m.PodHolds(); len(hs) != 1 || hs[0].ID != hold.ID {
		t.Errorf("PodHolds = %v, want [%s]", hs, hold.ID)
	}

	// A job for one GPU gets the other; a job for two waits.
	one, err := m.Submit(ctx, nobody, gpuJob(1))
	if err != nil {
		t.Fatal(err)
	}
	got := jobstest.WaitFor(t, m, one.ID, func(j api.Job) bool { return j.State == api.StateRunning })
	if !slices.Equal(got.Allocation.GPUs, []string{"GPU-b"}) {
		t.Errorf("the job got %v while the pod holds GPU-a", got.Allocation.GPUs)
	}
	two, err := m.Submit(ctx, nobody, gpuJob(2))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a pass or more
	if j, _ := m.Get(ctx, root, two.ID); j.State != api.StatePending {
		t.Errorf("a job for both GPUs is %s while the pod and a job hold one each", j.State)
	}

	// Kubelet asking for the job's GPU is refused, the refusal audited and
	// recorded, and nothing stays held.
	_, _, err = m.AdmitPod(ctx, api.PodHold{Resource: gpuRes, Devices: []string{"GPU-b"}}, "")
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || !strings.Contains(ae.Message, one.ID) {
		t.Fatalf("kubelet given the job's GPU: %v, want a conflict naming job %s", err, one.ID)
	}
	if r := rec.last(); r.Source != string(admission.Kubelet) || r.Outcome != audit.Refused {
		t.Errorf("refused hold audited as %+v", r)
	}
	if hs := m.PodHolds(); len(hs) != 1 {
		t.Errorf("a refused hold is held: %v", hs)
	}

	// Nobody cancels a pod's hold but kubelet.
	if _, err := m.Cancel(ctx, root, hold.ID); !errors.As(err, &ae) || ae.Code != api.CodeConflict {
		t.Errorf("cancel of a pod hold: %v, want a conflict", err)
	}
	if err := m.BindPod(hold.ID, api.PodRef{Namespace: "ml", Name: "trainer", UID: "u-1", Container: "main"}); err != nil {
		t.Fatal(err)
	}
	if j, _ := m.Get(ctx, root, hold.ID); j.Pod == nil || j.Pod.Name != "trainer" {
		t.Errorf("bound hold names pod %+v", j.Pod)
	}

	// Kubelet allocates the pod's GPU to a new container: it has freed
	// it, so the old hold ends (before the reconcile loop sees the pod
	// gone) and the new one holds it.
	again, _, err := m.AdmitPod(ctx, api.PodHold{Resource: gpuRes, Devices: []string{"GPU-a"}}, "")
	if err != nil {
		t.Fatalf("kubelet's second allocation of a GPU it freed: %v", err)
	}
	if j, _ := m.Get(ctx, root, hold.ID); j.State != api.StateSucceeded || !strings.Contains(j.Reason, "another container") {
		t.Errorf("the superseded hold is %s (%s)", j.State, j.Reason)
	}
	hold = again

	// Kubelet frees the GPU: the hold ends and the waiting job runs once
	// the other job is done.
	if err := m.ReleasePod(hold.ID, "kubelet no longer has the pod"); err != nil {
		t.Fatal(err)
	}
	if j, _ := m.Get(ctx, root, hold.ID); j.State != api.StateSucceeded {
		t.Errorf("released hold is %s", j.State)
	}
	if err := m.ReleasePod(hold.ID, "again"); !errors.As(err, &ae) || ae.Code != api.CodeConflict {
		t.Errorf("a second release: %v, want a conflict", err)
	}
	if _, err := m.Cancel(ctx, root, one.ID); err != nil {
		t.Fatal(err)
	}
	jobstest.WaitFor(t, m, two.ID, func(j api.Job) bool { return j.State == api.StateRunning })
}

// Only kubelet makes pods' holds, within kubernetes.max_holds; a hold
// names valid devices of a resource the host offers.
func TestPodHoldAdmissionRules(t *testing.T) {
	m, rec := podManager(t, t.TempDir(), podHost(), jobs.Config{Limits: jobs.Limits{PodHolds: 1}})
	ctx := context.Background()
	var ae *api.Error

	spec := small()
	spec.Pod = &api.PodHold{Resource: gpuRes, Devices: []string{"GPU-a"}}
	if _, err := m.Submit(ctx, nobody, spec); !errors.As(err, &ae) || ae.Field != "pod" {
		t.Errorf("a user's spec with a pod hold: %v, want refused on field pod", err)
	}
	if _, err := m.Admit(ctx, jobs.Entry{Source: admission.Kubelet, Caller: root, Specs: []api.JobSpec{small()}}); !errors.As(err, &ae) || ae.Field != "pod" {
		t.Errorf("kubelet's entry without a pod: %v, want refused on field pod", err)
	}
	for _, h := range []api.PodHold{
		{Resource: "fusiond.io/gpu-a100", Devices: []string{"GPU-a"}},
		{Resource: gpuRes, Devices: []string{"GPU-z"}},
		{Resource: gpuRes, Devices: []string{"GPU-a", "GPU-a"}},
		{Resource: gpuRes},
	} {
		if _, _, err := m.AdmitPod(ctx, h, ""); !errors.As(err, &ae) || !strings.HasPrefix(ae.Field, "pod.") {
			t.Errorf("hold %+v: %v, want refused on a pod field", h, err)
		}
	}
	if _, _, err := m.AdmitPod(ctx, api.PodHold{Resource: gpuRes, Devices: []string{"GPU-a"}}, ""); err != nil {
		t.Fatal(err)
	}
	_, _, err := m.AdmitPod(ctx, api.PodHold{Resource: gpuRes, Devices: []string{"GPU-b"}}, "")
	if !errors.As(err, &ae) || ae.Limit != jobs.LimitPodHolds {
		t.Errorf("a second hold past max_holds 1: %v, want %s", err, jobs.LimitPodHolds)
	}
	if r := rec.last(); r.Outcome != audit.Refused || r.Field != jobs.LimitPodHolds {
		t.Errorf("the refusal audited as %+v", r)
	}
}

// A daemon restart keeps a pod's hold: the next manager holds its GPU
// again before it places anything, so no job gets it.
func TestPodHoldSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m1, _ := newPodManager(t, st, dir, podHost(), jobs.Config{LeaveJobsRunning: true})
	if err := m1.Recover(); err != nil {
		t.Fatal(err)
	}
	m1.Start()
	hold, _, err := m1.AdmitPod(ctx, api.PodHold{Resource: gpuRes, Devices: []string{"GPU-b"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	m1.Stop(stopCtx)
	cancel()
	st.Close()

	m2, _ := podManager(t, dir, podHost(), jobs.Config{})
	hs := m2.PodHolds()
	if len(hs) != 1 || hs[0].ID != hold.ID || hs[0].State != api.StateRunning {
		t.Fatalf("after a restart the holds are %v, want %s running", hs, hold.ID)
	}
	j, err := m2.Submit(ctx, nobody, gpuJob(1))
	if err != nil {
		t.Fatal(err)
	}
	got := jobstest.WaitFor(t, m2, j.ID, func(j api.Job) bool { return j.State == api.StateRunning })
	if !slices.Equal(got.Allocation.GPUs, []string{"GPU-a"}) {
		t.Errorf("after a restart a job got %v; GPU-b is the pod's", got.Allocation.GPUs)
	}
}
