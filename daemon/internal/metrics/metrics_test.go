package metrics

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fusiond/fusiond/cgroups"
	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/devices"
)

func testMetrics(t *testing.T) *Metrics {
	t.Helper()
	return New(Options{Version: "1.2.3", Sources: Sources{
		Jobs: func() jobs.Stats {
			return jobs.Stats{Groups: []jobs.Group{
				{State: api.StateRunning, Class: api.ClassTraining, Tier: api.TierBurstable, Count: 2},
				{State: api.StatePending, Class: api.ClassBatch, Tier: api.TierBestEffort, Count: 3},
			}, Queued: 3, OldestWait: 90 * time.Second}
		},
		Capacity:  func() api.NodeResources { return api.NodeResources{CPU: 16000, Memory: 64 << 30, GPUs: 8} },
		Allocated: func() api.NodeResources { return api.NodeResources{CPU: 4500, Memory: 8 << 30, GPUs: 2} },
		Devices: func(context.Context) []devices.Device {
			return []devices.Device{
				{ID: "GPU-a", Kind: devices.GPU, Model: "H200", MemoryMB: 141 << 10, Health: devices.Health{Healthy: true},
					MIG: &devices.MIG{Slots: 8, Instances: []devices.MIGInstance{{ID: "MIG-1", Profile: "1g.18gb"}}}},
				{ID: "GPU-b", Kind: devices.GPU, Model: "H200", MemoryMB: 141 << 10, Health: devices.Health{Healthy: false, Reason: "Xid 79"}},
				{ID: "fpga0-region0", Kind: devices.FPGA, Model: "u250", Bitstream: "abc123", Health: devices.Health{Healthy: true}},
			}
		},
		Tiers: func() (map[api.Tier]cgroups.Stats, error) {
			return map[api.Tier]cgroups.Stats{api.TierBurstable: {CPUUsage: 12 * time.Second, MemoryCurrent: 1 << 20}}, nil
		},
		QoS: func() QoS {
			lat := make([]uint64, 32)
			lat[9], lat[16], lat[22], lat[31] = 5, 90, 4, 1 // ~0.5 µs, ~65 µs, ~4 ms, > 2 s
			return QoS{Enabled: true, BestEffortCPUMilli: 2500, BestEffortMemoryHigh: 1 << 30, Protected: 3, Breaching: 1,
				Actions:    []QoSAction{{Op: "shrink", Resource: "cpu", Result: "applied", Count: 4}, {Op: "shrink", Resource: "cpu", Result: "failed", Count: 1}},
				Latency:    map[api.Class]Log2Histogram{api.ClassService: {Buckets: lat, SumNs: 3_000_000_000}},
				ProbeStats: true, ProbeRuns: 400, ProbeRunNs: 50_000,
				ProbeSlots: 1024, ProbeSlotsUsed: 1024, Untimed: 3, UntimedTotal: 7,
				Delay: map[string]uint64{"outside": 1_500_000_000, "besteffort": 250_000_000}, LostWaits: 4}
		},
		Telemetry: func() Telemetry { return Telemetry{Followed: 512, Max: 512, Unfollowed: 2, UnfollowedTotal: 9} },
	}})
}

// exercise feeds every event kind the daemon reports.
func exercise(m *Metrics) {
	m.Submitted(api.ClassTraining, api.TierBurstable)
	m.Transitioned(api.StatePending, api.StatePlaced)
	m.Preempted(api.TierBestEffort)
	m.Moved(api.TierBurstable)
	m.Decided(true, 1, 300*time.Microsecond)
	m.Decided(false, 2, time.Millisecond)
	m.Waited(api.ClassTraining, 2*time.Second)
	m.ObserveRequest("GET /v1/jobs", 200, 3*time.Millisecond)
	m.Update(devices.Update{Kind: devices.Telemetry, Device: "GPU-a", Sample: &devices.Sample{Util: 0.75, MemUsedMB: 1024, PowerW: 420, TempC: 61}})
	m.Update(devices.Update{Kind: devices.HealthChanged, Device: "GPU-b", Health: &devices.Health{Healthy: false}})
}

func scrapeText(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, body)
	}
	return string(body)
}

func TestValues(t *testing.T) {
	m := testMetrics(t)
	exercise(m)
	text := scrapeText(t, m)
	for _, want := range []string{
		`fusiond_build_info{version="1.2.3"} 1`,
		`fusiond_jobs{class="training",state="running",tier="burstable"} 2`,
		`fusiond_queue_length 3`,
		`fusiond_queue_oldest_wait_seconds 90`,
		`fusiond_node_cpu_capacity_cores 16`,
		`fusiond_node_cpu_allocated_cores 4.5`,
		`fusiond_node_gpus_allocated 2`,
		`fusiond_job_submissions_total{class="training",tier="burstable"} 1`,
		`fusiond_job_transitions_total{from="pending",to="placed"} 1`,
		`fusiond_preemptions_total{tier="besteffort"} 1`,
		`fusiond_defrag_moves_total{tier="burstable"} 1`,
		`fusiond_placement_decisions_total{result="placed"} 1`,
		`fusiond_placement_decisions_total{result="unplaced"} 1`,
		`fusiond_placement_decision_duration_seconds_count 2`,
		`fusiond_queue_wait_seconds_sum{class="training"} 2`,
		`fusiond_api_requests_total{code="200",route="GET /v1/jobs"} 1`,
		`fusiond_api_request_duration_seconds_count{route="GET /v1/jobs"} 1`,
		`fusiond_device_healthy{device="GPU-a",kind="gpu",model="H200"} 1`,
		`fusiond_device_healthy{device="GPU-b",kind="gpu",model="H200"} 0`,
		`fusiond_device_health_changes_total{device="GPU-b",health="unhealthy"} 1`,
		`fusiond_device_updates_total{kind="telemetry"} 1`,
		`fusiond_mig_instance_healthy{gpu="GPU-a",instance="MIG-1",profile="1g.18gb"} 1`,
		`fusiond_fpga_region_programmed{bitstream="abc123",region="fpga0-region0"} 1`,
		`fusiond_gpu_utilization_ratio{gpu="GPU-a",model="H200"} 0.75`,
		`fusiond_gpu_memory_used_bytes{gpu="GPU-a",model="H200"} 1.073741824e+09`,
		`fusiond_gpu_power_watts{gpu="GPU-a",model="H200"} 420`,
		`fusiond_gpu_temperature_celsius{gpu="GPU-a",model="H200"} 61`,
		`fusiond_tier_cpu_seconds_total{tier="burstable"} 12`,
		`fusiond_tier_memory_bytes{tier="burstable"} 1.048576e+06`,
		`fusiond_qos_loop_enabled 1`,
		`fusiond_qos_besteffort_cpu_quota_cores 2.5`,
		`fusiond_qos_besteffort_memory_high_bytes 1.073741824e+09`,
		`fusiond_qos_protected_jobs 3`,
		`fusiond_qos_breaching_jobs 1`,
		`fusiond_qos_actions_total{action="shrink",resource="cpu",result="applied"} 4`,
		`fusiond_qos_actions_total{action="shrink",resource="cpu",result="failed"} 1`,
		`fusiond_qos_actions_total{action="restore",resource="memory",result="applied"} 0`,
		`fusiond_qos_runqueue_latency_seconds_bucket{class="service",le="1.024e-06"} 5`,
		`fusiond_qos_runqueue_latency_seconds_bucket{class="service",le="6.5536e-05"} 5`,
		`fusiond_qos_runqueue_latency_seconds_bucket{class="service",le="0.000131072"} 95`,
		`fusiond_qos_runqueue_latency_seconds_bucket{class="service",le="0.008388608"} 99`,
		`fusiond_qos_runqueue_latency_seconds_bucket{class="service",le="2.147483648"} 99`,
		`fusiond_qos_runqueue_latency_seconds_bucket{class="service",le="+Inf"} 100`,
		`fusiond_qos_runqueue_latency_seconds_sum{class="service"} 3`,
		`fusiond_qos_runqueue_latency_seconds_count{class="service"} 100`,
		`fusiond_qos_probe_events_total 400`,
		`fusiond_qos_probe_run_seconds_total 5e-05`,
		`fusiond_qos_probe_slots 1024`,
		`fusiond_qos_probe_slots_used 1024`,
		`fusiond_qos_untimed_jobs 3`,
		`fusiond_qos_untimed_jobs_total 7`,
		`fusiond_qos_delay_seconds_total{by="outside"} 1.5`,
		`fusiond_qos_delay_seconds_total{by="besteffort"} 0.25`,
		`fusiond_qos_probe_lost_waits_total 4`,
		`fusiond_telemetry_jobs_followed 512`,
		`fusiond_telemetry_jobs_max 512`,
		`fusiond_telemetry_jobs_unfollowed 2`,
		`fusiond_telemetry_jobs_unfollowed_total 9`,
		"# TYPE fusiond_telemetry_jobs_unfollowed_total counter",
		"# TYPE fusiond_qos_untimed_jobs_total counter",
		"# TYPE fusiond_qos_runqueue_latency_seconds histogram",
		"# TYPE fusiond_qos_actions_total counter",
		"# TYPE fusiond_api_request_duration_seconds histogram",
		"# TYPE fusiond_tier_cpu_seconds_total counter",
		"go_goroutines ",
		"process_resident_memory_bytes ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	// A GPU without a sample has no telemetry series (no invented zeros).
	if strings.Contains(text, `fusiond_gpu_utilization_ratio{gpu="GPU-b"`) {
		t.Error("utilisation reported for a GPU that sent no telemetry")
	}
}

func TestLint(t *testing.T) {
	m := testMetrics(t)
	exercise(m)
	problems, err := testutil.GatherAndLint(m.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// And the Prometheus project's own checker.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (Debian package prometheus; make deps installs it): %v", err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(scrapeText(t, m))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}
}

func TestReadOnly(t *testing.T) {
	srv := httptest.NewServer(testMetrics(t).Handler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"POST", "/metrics", 405},
		{"DELETE", "/metrics", 405},
		{"GET", "/v1/jobs", 404},
		{"HEAD", "/metrics", 200},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
	}
}

func TestSourceFailure(t *testing.T) {
	m := New(Options{Sources: Sources{Tiers: func() (map[api.Tier]cgroups.Stats, error) {
		return nil, io.ErrUnexpectedEOF
	}}})
	if text := scrapeText(t, m); !strings.Contains(text, `fusiond_metrics_source_failed{source="tiers"} 1`) {
		t.Errorf("a failing source is not reported:\n%s", text)
	}
}

// With the loop off only fusiond_qos_loop_enabled is reported, at 0.
func TestQoSOff(t *testing.T) {
	m := New(Options{Sources: Sources{QoS: func() QoS { return QoS{} }}})
	text := scrapeText(t, m)
	if !strings.Contains(text, "fusiond_qos_loop_enabled 0") {
		t.Errorf("loop off: no fusiond_qos_loop_enabled 0:\n%s", text)
	}
	for _, name := range []string{"fusiond_qos_breaching_jobs", "fusiond_qos_actions_total", "fusiond_qos_runqueue_latency_seconds", "fusiond_qos_probe_events_total"} {
		if strings.Contains(text, name) {
			t.Errorf("loop off, yet %s is reported", name)
		}
	}
}
