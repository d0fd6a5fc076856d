package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// metricFamilies is every family fusiond exports (docs/metrics.md): after
// the demo workload in TestMetrics each must be in a scrape.
var metricFamilies = map[string]string{
	"fusiond_build_info":                          "gauge",
	"fusiond_jobs":                                "gauge",
	"fusiond_job_submissions_total":               "counter",
	"fusiond_job_transitions_total":               "counter",
	"fusiond_queue_length":                        "gauge",
	"fusiond_queue_oldest_wait_seconds":           "gauge",
	"fusiond_queue_wait_seconds":                  "histogram",
	"fusiond_placement_decisions_total":           "counter",
	"fusiond_placement_decision_duration_seconds": "histogram",
	"fusiond_node_cordoned":                       "gauge",
	"fusiond_node_cpu_capacity_cores":             "gauge",
	"fusiond_node_cpu_allocated_cores":            "gauge",
	"fusiond_node_memory_capacity_bytes":          "gauge",
	"fusiond_node_memory_allocated_bytes":         "gauge",
	"fusiond_node_gpus":                           "gauge",
	"fusiond_node_gpus_allocated":                 "gauge",
	"fusiond_api_requests_total":                  "counter",
	"fusiond_api_request_duration_seconds":        "histogram",
	"fusiond_device_updates_total":                "counter",
	"fusiond_device_health_changes_total":         "counter",
	"fusiond_device_healthy":                      "gauge",
	"fusiond_mig_instance_healthy":                "gauge",
	"fusiond_fpga_region_programmed":              "gauge",
	"fusiond_gpu_utilization_ratio":               "gauge",
	"fusiond_gpu_memory_used_bytes":               "gauge",
	"fusiond_gpu_memory_total_bytes":              "gauge",
	"fusiond_gpu_power_watts":                     "gauge",
	"fusiond_gpu_temperature_celsius":             "gauge",
	"fusiond_tier_cpu_seconds_total":              "counter",
	"fusiond_tier_cpu_throttled_seconds_total":    "counter",
	"fusiond_tier_memory_bytes":                   "gauge",
	"fusiond_tier_oom_kills_total":                "counter",
	"fusiond_qos_loop_enabled":                    "gauge",
	"fusiond_qos_besteffort_cpu_quota_cores":      "gauge",
	"fusiond_qos_besteffort_memory_high_bytes":    "gauge",
	"fusiond_qos_protected_jobs":                  "gauge",
	"fusiond_qos_breaching_jobs":                  "gauge",
	"fusiond_qos_actions_total":                   "counter",
	"fusiond_qos_runqueue_latency_seconds":        "histogram",
}

func metricsClient(sock string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
}

func scrape(t *testing.T, hc *http.Client) string {
	t.Helper()
	resp, err := hc.Get("http://metrics/metrics")
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

// TestMetrics runs a demo workload on the simulated DGX H200 — a MIG
// layout, a GPU job, a CPU job, a job that waits, an FPGA region
// programmed, a GPU fault — and scrapes the metrics socket: every family
// is there with its type, promtool accepts the exposition, and the values
// follow the workload.
func TestMetrics(t *testing.T) {
	dir := publicTempDir(t)
	msock := filepath.Join(dir, "metrics.sock")
	d := newDaemon(t, dir, "metrics: {listen: \"unix:"+msock+"\"}\n")
	d.args = []string{"--simulate", "dgxh200"}
	d.start()
	ok := func(args ...string) string {
		t.Helper()
		r := d.ctl(nil, "", args...)
		if r.code != 0 {
			t.Fatalf("fusionctl %v: exit %d: %s%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	layout, err := filepath.Abs(filepath.Join("..", "..", "examples", "mig-layouts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ok("mig", "apply", "-f", layout, "-c", "inference-split")
	ok("fpga", "bitstream", "add", filepath.Join(dir, "state", "sim", "fpga-samples", "dma.gbs"))
	ok("fpga", "program", "dfl/0000:af:00.0/0", "dma")
	ok("run", "-w", "--class", "training", "--cpu", "100m", "--memory", "16Mi", "--gpu", "1", "--", "true")
	ok("run", "-w", "--class", "batch", "--cpu", "100m", "--memory", "16Mi", "--", "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
	// The sleeper holds most of the host's CPU; the next job waits.
	var n api.NodeStatus
	if err := json.Unmarshal([]byte(ok("status", "-o", "json")), &n); err != nil {
		t.Fatal(err)
	}
	// A service job has an SLO (qos.classes): the QoS loop protects it
	// and times its run-queue latency.
	ok("run", "--class", "service", "--tier", "burstable", "--cpu", "100m", "--memory", "16Mi", "--", "sleep", "600")
	ok("run", "--cpu", fmt.Sprintf("%dm", n.Capacity.CPU-200), "--memory", "16Mi", "--", "sleep", "600")
	ok("run", "--cpu", "200m", "--memory", "16Mi", "--", "true")
	ok("gpu", "fault", "7", "--xid", "79")

	hc := metricsClient(msock)
	var text string
	deadline := time.Now().Add(20 * time.Second)
	for {
		text = scrape(t, hc)
		var missing []string
		for name, typ := range metricFamilies {
			if !strings.Contains(text, "# TYPE "+name+" "+typ+"\n") || !strings.Contains(text, "\n"+name) {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("families missing or untyped after the workload: %v\n%s", missing, text)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, want := range []string{
		`fusiond_job_submissions_total{class="training",tier="burstable"} 1`,
		`fusiond_job_submissions_total{class="batch",tier="besteffort"} 3`,
		`fusiond_jobs{class="training",state="succeeded",tier="burstable"} 1`,
		`fusiond_jobs{class="batch",state="succeeded",tier="besteffort"} 1`,
		`fusiond_jobs{class="batch",state="pending",tier="besteffort"} 1`,
		`fusiond_queue_length 1`,
		`fusiond_node_gpus 8`,
		`fusiond_device_healthy{device="dfl/0000:af:00.0/0",kind="fpga"`,
		`fusiond_api_requests_total{code="201",route="POST /v1/jobs"} 5`,
		`fusiond_api_requests_total{code="200",route="GET /v1/node"} `,
		`fusiond_api_requests_total{code="200",route="POST /v1/mig/apply"} 1`,
		`fusiond_job_transitions_total{from="running",to="succeeded"} 2`,
		`fusiond_placement_decisions_total{result="unplaced"} `,
		`fusiond_mig_instance_healthy{gpu="`,
		`fusiond_qos_loop_enabled 1`,
		`fusiond_qos_protected_jobs 1`,
		`fusiond_qos_runqueue_latency_seconds_count{class="service"} `,
		`,health="unhealthy"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if !strings.Contains(text, `fusiond_fpga_region_programmed{bitstream="`) || !strings.Contains(text, `region="dfl/0000:af:00.0/0"} 1`) {
		t.Errorf("the programmed region is not reported programmed")
	}
	if !strings.Contains(text, `kind="gpu",model="NVIDIA H200 141GB HBM3e"} 0`) {
		t.Errorf("the faulted GPU is not reported unhealthy")
	}

	if t.Failed() {
		t.Logf("scrape:\n%s", text)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (Debian package prometheus; make deps installs it): %v", err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}

	// Read-only: nothing but GET /metrics.
	resp, err := hc.Post("http://metrics/metrics", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics = %d, want 405", resp.StatusCode)
	}
	resp, err = hc.Get("http://metrics/v1/jobs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/jobs on the metrics socket = %d, want 404", resp.StatusCode)
	}
}
