package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/sched"
)

func TestTelemetryConfig(t *testing.T) {
	var cfg Config = DefaultConfig()
	if err := ParseConfig([]byte("telemetry: {interval: 50ms, ring: 600}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if time.Duration(cfg.Telemetry.Interval) != 50*time.Millisecond || cfg.Telemetry.Ring != 600 ||
		time.Duration(cfg.Telemetry.JobInterval) != time.Second || cfg.Telemetry.HistoryMinutes != 1440 || cfg.Telemetry.MaxJobs != 512 {
		t.Errorf("telemetry not merged over the defaults: %+v", cfg.Telemetry)
	}
	if cfg.QoS.MaxJobs != 1024 {
		t.Errorf("qos.max_jobs default %d, want 1024", cfg.QoS.MaxJobs)
	}
	if err := ParseConfig([]byte("telemetry: {max_jobs: 8192}\nqos: {max_jobs: 2}\n"), &cfg); err != nil || cfg.Telemetry.MaxJobs != 8192 || cfg.QoS.MaxJobs != 2 {
		t.Errorf("max_jobs not read: %v %d %d", err, cfg.Telemetry.MaxJobs, cfg.QoS.MaxJobs)
	}
	for in, field := range map[string]string{
		"telemetry: {interval: 1ms}\n":                     "telemetry.interval",
		"telemetry: {interval: 2s}\n":                      "telemetry.job_interval",
		"telemetry: {ring: 5}\n":                           "telemetry.ring",
		"telemetry: {history_minutes: 10000000}\n":         "telemetry.history_minutes",
		"telemetry: {interval: 100ms, job_interval: 10ms}": "telemetry.job_interval",
		"telemetry: {max_jobs: 0}\n":                       "telemetry.max_jobs",
		"telemetry: {max_jobs: 8193}\n":                    "telemetry.max_jobs",
		"qos: {max_jobs: -1}\n":                            "qos.max_jobs",
		"qos: {max_jobs: 100000}\n":                        "qos.max_jobs",
	} {
		cfg := DefaultConfig()
		err := ParseConfig([]byte(in), &cfg)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Field != field {
			t.Errorf("%q: err = %v, want one for %s", in, err, field)
		}
	}
}

// TestStatusShowsTelemetry runs a daemon and reads the telemetry bus's
// summary through the API: it samples this host's /proc at 10 Hz.
func TestStatusShowsTelemetry(t *testing.T) {
	ctx, c, stop := serveDaemon(t, "telemetry", func(cfg *Config) {
		cfg.Telemetry.PowercapRoot = filepath.Join(t.TempDir(), "no-powercap")
	})
	var st *api.TelemetryStatus
	for deadline := time.Now().Add(20 * time.Second); ; {
		n, err := c.Node(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st = n.Telemetry; st != nil && st.Samples >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("telemetry after 20 s: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if time.Duration(st.Interval) != 100*time.Millisecond || st.Ring != 3000 || st.MemoryBound <= 0 || st.MemoryUsed <= 0 || st.SampleCost <= 0 {
		t.Errorf("status %+v", st)
	}
	if st.PackagePowerW != nil || !strings.HasPrefix(st.Power, "none: ") || !strings.Contains(st.Power, "no-powercap") {
		t.Errorf("power with no powercap tree: %v %q", st.PackagePowerW, st.Power)
	}
	mode, err := cgroups.DetectMode(cgroups.DefaultRoot)
	if err != nil {
		t.Fatal(err)
	}
	if mode == cgroups.ModeV1 && st.JobPSI != "none: cgroup v1 has no per-cgroup pressure files" {
		t.Errorf("job PSI on cgroup v1: %q", st.JobPSI)
	}
	if _, err := os.Stat("/proc/pressure/cpu"); err == nil && st.PSI == nil {
		t.Error("the kernel has /proc/pressure, yet no PSI in the status")
	}
	n, err := c.Node(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Reclaim == nil || !n.Reclaim.Enabled || n.Reclaim.ReclaimableCPU != 0 || n.Reclaim.BudgetCPU != 0 {
		t.Errorf("reclaim status with no jobs: %+v", n.Reclaim)
	}
	stop()
}

// TestStatusAtJobBounds runs a daemon that follows at most one job on the
// telemetry bus and times at most one with the latency probe, and three
// best-effort jobs: fusionctl status notes both bounds, and /metrics
// counts the jobs left out. Never silent.
func TestStatusAtJobBounds(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "metrics.sock")
	ctx, c, stop := serveDaemon(t, "bounds", func(cfg *Config) {
		cfg.LeaveJobsOnShutdown = false
		cfg.Telemetry.MaxJobs = 1
		cfg.QoS.MaxJobs = 1
		cfg.Metrics.Listen = "unix:" + sock
		cfg.Telemetry.PowercapRoot = filepath.Join(t.TempDir(), "no-powercap")
	})
	defer stop()
	for i := range 3 {
		if _, err := c.Submit(ctx, api.JobSpec{Name: fmt.Sprintf("be%d", i), Tier: api.TierBestEffort, Command: []string{"/bin/sleep", "120"},
			Resources: api.Resources{CPU: 100, Memory: 16 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	var n api.NodeStatus
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if n, err = c.Node(ctx); err != nil {
			t.Fatal(err)
		}
		if n.Telemetry != nil && n.Telemetry.UnfollowedJobs == 2 && n.QoS != nil && n.QoS.UntimedJobs == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: jobs %v, telemetry %+v, qos %+v", n.Jobs, n.Telemetry, n.QoS)
		}
	}
	if n.Telemetry.MaxJobs != 1 || n.Telemetry.UnfollowedJobsTotal != 2 || n.QoS.ProbeSlots != 1 || n.QoS.ProbeSlotsUsed != 1 || n.QoS.UntimedJobsTotal != 2 {
		t.Errorf("telemetry %+v, qos %+v", n.Telemetry, n.QoS)
	}
	notes := strings.Join(n.Notes, "\n")
	for _, want := range []string{
		"telemetry: 2 running jobs not followed: telemetry.max_jobs (1) reached",
		"qos: 2 running jobs not timed: all 1 latency probe slots (qos.max_jobs) are taken",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("status notes lack %q:\n%s", want, notes)
		}
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://fusiond/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"fusiond_telemetry_jobs_followed 1\n", "fusiond_telemetry_jobs_max 1\n",
		"fusiond_telemetry_jobs_unfollowed 2\n", "fusiond_telemetry_jobs_unfollowed_total 2\n",
		"fusiond_qos_probe_slots 1\n", "fusiond_qos_probe_slots_used 1\n",
		"fusiond_qos_untimed_jobs 2\n", "fusiond_qos_untimed_jobs_total 2\n",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
}

func TestBoundNotes(t *testing.T) {
	if n := boundNotes(&api.TelemetryStatus{MaxJobs: 512}, &api.QoSStatus{ProbeSlots: 1024}); n != nil {
		t.Errorf("notes under the bounds: %q", n)
	}
	if n := boundNotes(nil, nil); n != nil {
		t.Errorf("notes without a bus or loop: %q", n)
	}
	n := boundNotes(&api.TelemetryStatus{MaxJobs: 512, UnfollowedJobs: 1, UnfollowedJobsTotal: 4}, &api.QoSStatus{ProbeSlots: 1024, UntimedJobs: 1, UntimedJobsTotal: 1})
	if len(n) != 2 || !strings.HasPrefix(n[0], "telemetry: 1 running job not followed: telemetry.max_jobs (512) reached; it has no usage readings") ||
		!strings.HasSuffix(n[0], "4 refused since start") || !strings.HasPrefix(n[1], "qos: 1 running job not timed: all 1024 latency probe slots (qos.max_jobs) are taken; its run-queue") {
		t.Errorf("notes %q", n)
	}
}

// TestStatusShowsGPUEnergy runs a daemon over a simulated DGX H100 whose
// first four GPUs report 50 % SM utilisation and reads the GPU energy
// through the API: every GPU reports the simulated 140 W (a fifth of its
// 700 W TDP), the idle floor is the table's 70 W per GPU, and the
// delivered compute is the busy GPU-hours at the H100's 989.5 FP16
// TFLOPS over the A100's 312; each figure must agree with the window.
func TestStatusShowsGPUEnergy(t *testing.T) {
	ctx, c, stop, d := serveDaemonD(t, "gpuenergy", func(cfg *Config) {
		cfg.Simulate = "dgxh100"
		cfg.Telemetry.PowercapRoot = filepath.Join(t.TempDir(), "no-powercap")
	})
	defer stop()
	for i := range 4 {
		if err := d.hw.SetSimulatedGPUUtilization(i, 50); err != nil {
			t.Fatal(err)
		}
	}
	h100, _ := sched.LookupGPU("H100 SXM")
	var st *api.TelemetryStatus
	for deadline := time.Now().Add(30 * time.Second); ; {
		n, err := c.Node(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st = n.Telemetry
		if st != nil && st.GPUEnergy != nil && st.GPUEnergy.A100EqHours > 0 && time.Duration(st.GPUEnergy.Window) >= 2*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no GPU energy after 30 s: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e := st.GPUEnergy
	hours := time.Duration(e.Window).Hours()
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(1e-9, math.Abs(b)) }
	if st.GPUs != 8 || e.UnknownGPUs != 0 {
		t.Fatalf("%d GPUs, %d of an unknown model", st.GPUs, e.UnknownGPUs)
	}
	if !near(e.GPUHours, 8*hours) || !near(e.EnergyWh, 8*140*hours) || !near(e.MeasuredWh, e.EnergyWh) || !near(e.IdleFloorWh, 8*h100.IdleW*hours) {
		t.Errorf("window %v h: %+v", hours, e)
	}
	// At most four GPUs at half their time busy (the first samples may
	// precede the utilisation).
	if !(e.BusyGPUHours > 0 && e.BusyGPUHours <= 2*hours*(1+1e-9)) || !near(e.A100EqHours*312, e.BusyGPUHours*h100.FP16) {
		t.Errorf("busy %v GPU-hours, %v A100-eq hours in %v h", e.BusyGPUHours, e.A100EqHours, hours)
	}
	if !near(e.WhPerA100EqHour, e.EnergyWh/e.A100EqHours) || !near(e.FloorWhPerA100EqHour, e.IdleFloorWh/e.A100EqHours) || !near(e.WhPerBusyGPUHour, e.EnergyWh/e.BusyGPUHours) {
		t.Errorf("ratios %+v", e)
	}
	if r := st.GPUEnergyRecent; r == nil || r.EnergyWh <= 0 || r.Window > e.Window {
		t.Errorf("recent %+v of %+v", r, e)
	}
}
