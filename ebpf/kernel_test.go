package ebpf

// Real-kernel tests: they need root, BTF and a cgroup hierarchy and fail
// (never skip) without them. On this machine the cpu controller is on
// cgroup v1; in the qemu VM of .ci/vm (make test-vm) everything is v2.

import (
	"syscall"
	"testing"
	"time"
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
