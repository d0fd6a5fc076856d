package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
)

func TestTelemetryConfig(t *testing.T) {
	var cfg Config = DefaultConfig()
	if err := ParseConfig([]byte("telemetry: {interval: 50ms, ring: 600}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if time.Duration(cfg.Telemetry.Interval) != 50*time.Millisecond || cfg.Telemetry.Ring != 600 ||
		time.Duration(cfg.Telemetry.JobInterval) != time.Second || cfg.Telemetry.HistoryMinutes != 1440 {
		t.Errorf("telemetry not merged over the defaults: %+v", cfg.Telemetry)
	}
	for in, field := range map[string]string{
		"telemetry: {interval: 1ms}\n":                     "telemetry.interval",
		"telemetry: {interval: 2s}\n":                      "telemetry.job_interval",
		"telemetry: {ring: 5}\n":                           "telemetry.ring",
		"telemetry: {history_minutes: 10000000}\n":         "telemetry.history_minutes",
		"telemetry: {interval: 100ms, job_interval: 10ms}": "telemetry.job_interval",
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
