package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/fusiond/fusiond/cmd/fusionctl/internal/sim"
	"github.com/fusiond/fusiond/daemon/api"
)

func TestDemandSeries(t *testing.T) {
	pods := []sim.Pod{
		{CPUMilli: 2000, GPUs: 1, GPUMilli: 500, Creation: 0, Deletion: 600},
		{CPUMilli: 1000, GPUs: 2, GPUMilli: 1000, Creation: 250, Deletion: 0}, // to the end
		{CPUMilli: 4000, Creation: 310, Deletion: 320},                        // between two step starts: never seen
	}
	cpu, gpu := demandSeries(pods, 5*time.Minute)
	wantCPU, wantGPU := []float64{2, 3, 1}, []float64{0.5, 2.5, 2}
	if fmt.Sprint(cpu) != fmt.Sprint(wantCPU) || fmt.Sprint(gpu) != fmt.Sprint(wantGPU) {
		t.Fatalf("cpu %v gpu %v, want %v and %v", cpu, gpu, wantCPU, wantGPU)
	}
}

func TestForecastBacktestCommand(t *testing.T) {
	// Two days of a pod every 5 minutes by day, none by night, each living
	// 2 hours: a daily season.
	var sb strings.Builder
	sb.WriteString("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n")
	n := 0
	for day := range 6 {
		for m := 8 * 60; m < 20*60; m += 5 {
			c := int64(day*86400 + m*60)
			fmt.Fprintf(&sb, "p%d,1000,1024,1,500,,LS,Running,%d,%d,%d\n", n, c, c+7200, c)
			n++
		}
	}
	file := filepath.Join(t.TempDir(), "pods.csv")
	if err := os.WriteFile(file, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	root, _ := NewRootCommand(strings.NewReader(""), &out, &errb)
	root.SetArgs([]string{"forecast", "--backtest", "--trace", file, "-o", "json"})
	if err := root.Execute(); err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	var rep backtestReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Period["cpu cores"] != 288 || rep.PeriodFrom["cpu cores"] != "found by FFT" {
		t.Errorf("season %d (%s), want 288 steps found by FFT", rep.Period["cpu cores"], rep.PeriodFrom["cpu cores"])
	}
	errs := map[string]float64{}
	for _, r := range rep.Rows {
		if r.Series == "cpu cores" {
			errs[r.Model] = r.SMAPE
		}
	}
	if auto, naive := errs["auto (chosen by back-test)"], errs["naive"]; !(auto < naive) {
		t.Errorf("sMAPE %v: on a daily series the chosen model (%v%%) should beat naive (%v%%)", errs, auto, naive)
	}
	root, _ = NewRootCommand(strings.NewReader(""), &out, &errb)
	root.SetArgs([]string{"forecast", "--trace", file, "--horizon", "7m"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "multiple") {
		t.Errorf("a horizon not a multiple of the step: err = %v", err)
	}
}

func TestTelemetryLines(t *testing.T) {
	w := 123.4
	var b bytes.Buffer
	telemetryLines(&b, api.TelemetryStatus{Interval: api.Duration(100 * time.Millisecond), JobInterval: api.Duration(time.Second),
		Samples: 30, Ring: 3000, CPUBusy: 0.25, NodeBusy: []float64{0.1, 0.4}, MemoryUsed: 1 << 30,
		PSI: &api.PressureStatus{CPU: 1.5}, PackagePowerW: &w, Power: "RAPL (powercap)", JobPSI: "none: cgroup v1",
		GPUs: 8, GPUPowerW: 1500, IdleGPUs: 3, IdleGPUPowerW: 180,
		Forecasts: []api.SeriesForecast{{Series: "cpu_busy", Model: "holt", Horizon: api.Duration(15 * time.Minute), Value: 0.5, Now: 0.25, SMAPE: 3, Points: 120}}})
	s := b.String()
	for _, want := range []string{"CPU 25% busy (node0 10%, node1 40%)", "pressure cpu 1.5%", "CPU packages 123.4 W", "GPUs 1500.0 W (3 idle, drawing 180.0 W; placement scores waking an idle GPU lower)", "job PSI: none: cgroup v1", "cpu_busy in 15m0s: 0.5"} {
		if !strings.Contains(s, want) {
			t.Errorf("status lacks %q:\n%s", want, s)
		}
	}
	// At the bound the row says how many jobs are not followed.
	b.Reset()
	telemetryLines(&b, api.TelemetryStatus{Jobs: 512, MaxJobs: 512, UnfollowedJobs: 3, UnfollowedJobsTotal: 5})
	if s := b.String(); !strings.Contains(s, "512 jobs read (at most 512), 3 NOT FOLLOWED (telemetry.max_jobs reached)") {
		t.Errorf("status at the bound:\n%s", s)
	}
	if s := describeQoS(api.QoSStatus{Enabled: true, Probes: "attached", ProbeSlots: 2, ProbeSlotsUsed: 2, UntimedJobs: 4}); !strings.Contains(s, "2 of 2 probe slots used, 4 jobs NOT TIMED (qos.max_jobs reached)") {
		t.Errorf("QoS status at the bound: %s", s)
	}
}

func TestForecastRefusesTraceWithoutTimes(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pods.csv")
	if err := os.WriteFile(file, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,0,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	root, _ := NewRootCommand(strings.NewReader(""), &out, &errb)
	root.SetArgs([]string{"forecast", "--backtest", "--trace", file})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "too few to back-test") {
		t.Errorf("a trace without times: err = %v", err)
	}
	root, _ = NewRootCommand(strings.NewReader(""), &out, &errb)
	root.SetArgs([]string{"forecast", "--backtest=false", "--trace", file})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "only --backtest") {
		t.Errorf("--backtest=false: err = %v", err)
	}
}

func TestReclaimLine(t *testing.T) {
	s := reclaimLine(api.ReclaimStatus{Enabled: true, ReclaimableCPU: 1500, ReclaimableMemory: 2 << 30, ReclaimedCPU: 700,
		ReclaimedMemory: 1 << 30, BestEffortCPU: 900, BestEffortMemory: 1 << 30, BudgetCPU: 2500, Evictions: 1,
		PlacedCPU: 400, PlacedMemory: 512 << 20})
	for _, want := range []string{"reclaimable 1500m CPU and 2Gi memory", "reclaimed 700m CPU and 1Gi memory", "placed on it 400m CPU and 512Mi memory", "best-effort held to 2500m CPU", "1 evicted"} {
		if !strings.Contains(s, want) {
			t.Errorf("%q lacks %q", s, want)
		}
	}
	if s := reclaimLine(api.ReclaimStatus{Reason: "off: reclaim.enabled is false"}); !strings.Contains(s, "not running (off: reclaim.enabled is false)") {
		t.Errorf("off: %q", s)
	}
}

func TestPrintLoadEvents(t *testing.T) {
	var b bytes.Buffer
	o := &options{output: "table", stdout: &b}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, e := range []api.Event{
		{Kind: api.EventScale, JobID: "7", Reason: "replicas 1 → 2: cpu load"},
		{Kind: api.EventReclaim, Reason: "best-effort budget 900m CPU"},
	} {
		if err := printEvent(o, tw, e); err != nil {
			t.Fatal(err)
		}
	}
	s := b.String()
	if !strings.Contains(s, "7  scale  replicas 1 → 2") || !strings.Contains(s, "-  reclaim  best-effort budget") {
		t.Errorf("events:\n%s", s)
	}
}

// TestForecastEmbeddedTrace: with no --trace the back-test runs on the
// openb default trace fusionctl embeds (docs/load.md's figures); a name
// that is neither a file nor an embedded trace is refused, naming both.
func TestForecastEmbeddedTrace(t *testing.T) {
	var out, errb bytes.Buffer
	root, _ := NewRootCommand(strings.NewReader(""), &out, &errb)
	root.SetArgs([]string{"forecast", "--backtest", "-o", "json"})
	if err := root.Execute(); err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	var rep backtestReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Trace != "default" || rep.Points != 43010 || rep.Split != 28673 {
		t.Errorf("embedded default: trace %q, %d points split at %d; want default, 43010, 28673 (docs/load.md)", rep.Trace, rep.Points, rep.Split)
	}
	root, _ = NewRootCommand(strings.NewReader(""), &out, &errb)
	root.SetArgs([]string{"forecast", "--trace", "no-such-trace"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "no file no-such-trace, and no such embedded openb trace") {
		t.Errorf("unknown trace: err = %v", err)
	}
}
