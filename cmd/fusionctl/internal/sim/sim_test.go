package sim

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func tinyOptions() Options {
	return Options{
		NodesPath: "testdata/nodes.csv",
		PodsPath:  "testdata/pods.csv",
		Policies:  append(append([]string{}, sched.BaselineNames...), "fusiond"),
		Seeds:     []uint64{1, 2, 3},
		Format:    "csv",
		Workers:   1,
	}
}

// goldenCSV renders the deterministic part of a report (no timings).
func goldenCSV(rep *Report) string {
	var b strings.Builder
	b.WriteString("policy,seed,pods,failed,alloc_100,alloc_110,alloc_120,alloc_130,frag_130\n")
	for _, r := range rep.Runs {
		rec := runRecord(&r)
		// trace,policy,seed,pods,failed,alloc×4,frag×4,seconds,dps
		b.WriteString(strings.Join(append(rec[1:9], rec[12]), ",") + "\n")
	}
	return b.String()
}

func TestGoldenTinyTrace(t *testing.T) {
	rep, err := Simulate(context.Background(), tinyOptions())
	if err != nil {
		t.Fatal(err)
	}
	got := goldenCSV(rep)
	if *update {
		if err := os.WriteFile("testdata/golden.csv", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/golden.csv")
	if err != nil {
		t.Fatalf("golden file: %v (run go test -run TestGoldenTinyTrace -update)", err)
	}
	if got != string(want) {
		t.Fatalf("simulation differs from testdata/golden.csv:\n got:\n%s\nwant:\n%s", got, want)
	}
	// The golden numbers are sane: nothing allocated beyond what arrived.
	for _, r := range rep.Runs {
		for i, a := range r.AllocPct {
			if !math.IsNaN(a) && (a < 0 || a > r.Thresholds[i]+1e-9) {
				t.Fatalf("%s seed %d: alloc %.2f at %.0f%% arrived", r.Policy, r.Seed, a, r.Thresholds[i])
			}
		}
	}
}

func TestRunOutputs(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions()
	o.Policies = []string{"bestfit", "fusiond"}
	o.Seeds = []uint64{1}
	o.CSVDir = filepath.Join(dir, "runs")
	o.PlotPaths = []string{filepath.Join(dir, "plot.svg"), filepath.Join(dir, "plot.png")}
	for _, format := range []string{"table", "json", "csv"} {
		o.Format = format
		var out bytes.Buffer
		if err := Run(context.Background(), o, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "fusiond") {
			t.Fatalf("%s output lacks the policy:\n%s", format, out.String())
		}
	}
	svg, err := os.ReadFile(o.PlotPaths[0])
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("polyline")) || !bytes.Contains(svg, []byte("bestfit")) {
		t.Fatalf("plot: %v\n%.300s", err, svg)
	}
	if img := decodePNG(t, o.PlotPaths[1]); img.Bounds().Dx() != plotW || img.Bounds().Dy() != plotH {
		t.Errorf("PNG is %v", img.Bounds())
	}
	o.PlotPaths = []string{filepath.Join(dir, "plot.gif")}
	if err := Run(context.Background(), o, io.Discard); !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), "plot.gif") {
		t.Errorf("a .gif plot: %v", err)
	}
	runs, _ := filepath.Glob(filepath.Join(o.CSVDir, "*.csv"))
	if len(runs) != 2 {
		t.Fatalf("per-run CSVs: %v", runs)
	}
}

func TestTimedMode(t *testing.T) {
	o := tinyOptions()
	o.Policies = []string{"fusiond", "spread"}
	o.Timed = true
	o.LoadPct = 200
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Timed) != 2 {
		t.Fatalf("timed results: %+v", rep.Timed)
	}
	for _, r := range rep.Timed {
		if r.Placed+r.NeverPlaced != r.Pods || r.Pods != 60*r.Copies || r.Copies < 1 {
			t.Fatalf("%s: placed %d + never %d != %d", r.Policy, r.Placed, r.NeverPlaced, r.Pods)
		}
		if r.PeakUtilPct <= 0 || r.PeakUtilPct > 100 || r.MeanUtilPct > r.PeakUtilPct || r.WaitP95 < r.WaitP50 {
			t.Fatalf("%s: implausible %+v", r.Policy, r)
		}
	}
}

func TestOptionsAndParsing(t *testing.T) {
	for _, s := range []string{"", "x", "5-3", "1-x"} {
		if _, err := ParseSeeds(s); !errors.Is(err, ErrBadOption) {
			t.Errorf("ParseSeeds(%q) = %v", s, err)
		}
	}
	seeds, err := ParseSeeds("42-44,7")
	if err != nil || len(seeds) != 4 || seeds[0] != 42 || seeds[3] != 7 {
		t.Fatalf("seeds %v %v", seeds, err)
	}
	o := tinyOptions()
	o.Policies = []string{"nosuch"}
	if _, err := Simulate(context.Background(), o); !errors.Is(err, ErrBadOption) {
		t.Fatalf("unknown policy: %v", err)
	}
	o = tinyOptions()
	o.Format = "yaml"
	if _, err := Simulate(context.Background(), o); !errors.Is(err, ErrBadOption) {
		t.Fatalf("bad format: %v", err)
	}
	if _, err := ReadPods(strings.NewReader("name,cpu_milli\nx,1\n")); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("missing columns: %v", err)
	}
	if _, err := ReadPods(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,2,500\n")); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("fractional multi-GPU: %v", err)
	}
	if _, err := ReadNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu\nn,-5,1,1\n")); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("negative cpu: %v", err)
	}
}

func TestWorkloadProtocol(t *testing.T) {
	f, err := os.Open("testdata/pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pods, err := ReadPods(f)
	if err != nil {
		t.Fatal(err)
	}
	const capMilli = 29000
	wl := Workload(pods, 42, 130, capMilli)
	var total int64
	for _, p := range wl {
		total += p.GPUMilliTotal()
	}
	if float64(total) < 1.3*capMilli {
		t.Fatalf("workload %d below 130%% of %d", total, capMilli)
	}
	again := Workload(pods, 42, 130, capMilli)
	other := Workload(pods, 43, 130, capMilli)
	same, diff := true, false
	for i := range wl {
		same = same && wl[i].Name == again[i].Name
		if i < len(other) && wl[i].Name != other[i].Name {
			diff = true
		}
	}
	if !same || !diff {
		t.Fatalf("resampling not seeded: same=%v diff=%v", same, diff)
	}
}

func TestCommand(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--nodes", "testdata/nodes.csv", "--pods", "testdata/pods.csv", "--policy", "fgd,bestfit", "--seeds", "1-2", "-o", "table"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "alloc@130%") || !strings.Contains(out.String(), "fgd") {
		t.Fatalf("output:\n%s", out.String())
	}
	for args, want := range map[string]string{
		"--trace default --pods testdata/pods.csv": "--trace names an embedded pod list and --pods a file",
		"--trace cpu999": `no such embedded openb trace "cpu999"`,
		"--tune --trace nope --seeds 1 --test-seeds 2": `no such embedded openb trace "nope"`,
		"--nodes testdata/missing.csv":                 "testdata/missing.csv: no such file",
		"--pods testdata/nodes.csv":                    "testdata/nodes.csv",
	} {
		cmd = NewCommand()
		out.Reset()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(strings.Fields(args))
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("simulate %s: %v, want an error naming %q", args, err, want)
		}
	}
}

// TestListTraces: --list-traces names every embedded trace with its pod
// count, read from the trace itself.
func TestListTraces(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--list-traces"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "node list: 1213 nodes, 6212 GPUs") {
		t.Errorf("--list-traces lacks the node list's size:\n%s", out.String())
	}
	lines := map[string]string{}
	for l := range strings.Lines(out.String()) {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = strings.Join(f, " ")
		}
	}
	for _, want := range []string{"default 8152 7064 3078 75 0 6086.8 yes", "multigpu50 9061 7973 3078 984 0 11358.8 yes",
		"gpuspec33 8152 7064 3078 75 2388 6086.8 yes", "cpu0 7064 7064 3078 75 0 6086.8 -"} {
		if got := lines[strings.Fields(want)[0]]; got != want {
			t.Errorf("--list-traces: %q, want %q:\n%s", got, want, out.String())
		}
	}
	if n := strings.Count(out.String(), "\n"); n != 24+3 {
		t.Errorf("--list-traces: %d lines, want a header, 24 traces and two notes:\n%s", n, out.String())
	}
}

func TestMarkdownTable(t *testing.T) {
	pub, err := ReadPublished(strings.NewReader("header\nopenb_pod_list_x  05-BestFit  n=10 gpus=6212 90.00 91.00 92.00 93.00\nopenb_pod_list_x  06-FGD  n=10 gpus=6212 94.00 95.00 95.10 95.20\n"))
	if err != nil {
		t.Fatal(err)
	}
	fail := []FailPoint{{ArrivedPct: 90}, {ArrivedPct: 100, Pods: 3, GPUs: 9, BigPods: 1}}
	rep := &Report{Trace: "openb_pod_list_x", BoundPct: 99.5, Summaries: []Summary{
		{Policy: "bestfit", AllocPct: []float64{1, 2, 3, 92.5}},
		{Policy: "fgd", AllocPct: []float64{1, 2, 3, 95.4}, FailAt: fail},
		{Policy: "fusiond", AllocPct: []float64{1, 2, 3, 95.7}, FailAt: []FailPoint{{ArrivedPct: 90}, {ArrivedPct: 100, Pods: 2, GPUs: 2}}},
	}}
	got := MarkdownTable([]*Report{rep}, pub)
	for _, want := range []string{"| x | 92.50 (93.00) | 95.40 (95.20) | 95.70 | 99.50 | +0.30 | +0.50 | 0.0 / 1.0 |", "| trace | bestfit | fgd | fusiond | bound |"} {
		if !strings.Contains(got, want) {
			t.Fatalf("table lacks %q:\n%s", want, got)
		}
	}
	if ft := MarkdownFailTable(rep); !strings.Contains(ft, "| fgd | 0.0/0.0/0.0 | 3.0/9.0/1.0 |") || !strings.Contains(ft, "| policy | @90 % | @100 % |") {
		t.Errorf("failure table:\n%s", ft)
	}
}
