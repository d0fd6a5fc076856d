package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/cmd/fusionctl/internal/sim/openb"
	"github.com/fusiond/fusiond/daemon/sched"
)

// openbPath is where the tests read an openb file: in
// $FUSIOND_OPENB_DIR when that is set (the plain file, or its .zst), else
// the compressed copy in openb/ beside this file, inside the checkout.
func openbPath(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("FUSIOND_OPENB_DIR")
	if dir == "" {
		dir = "openb"
	}
	for _, p := range []string{filepath.Join(dir, name), filepath.Join(dir, name+".zst")} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("openb file %s not found in %s (FUSIOND_OPENB_DIR, when set, names a directory of openb CSV files, plain or .zst)", name, dir)
	return ""
}

// openbOptions are Options over the openb node list and the pod list
// trace ("openb_pod_list_default").
func openbOptions(t testing.TB, trace string) Options {
	t.Helper()
	return Options{NodesPath: openbPath(t, "openb_node_list_gpu_node.csv"), PodsPath: openbPath(t, trace+".csv")}
}

// loadTrace reads the openb node list and one pod list.
func loadTrace(t testing.TB, trace string) ([]NodeSpec, []Pod) {
	t.Helper()
	o := openbOptions(t, trace)
	specs, pods, err := load(&o)
	if err != nil {
		t.Fatal(err)
	}
	return specs, pods
}

func expected(t testing.TB) Published {
	t.Helper()
	f, err := openb.OpenFile(openbPath(t, "FGD_expected_allocation.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pub, err := ReadPublished(f)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestOpenBDefaultSeed42 runs one seed of the default trace for the
// baselines nearest fusiond's policy and checks them against the paper's
// 10-seed means (one seed varies by about ±0.3 points, so ±1.5 here; the
// full 10-seed ±1 validation is TestOpenBValidationFull).
func TestOpenBDefaultSeed42(t *testing.T) {
	want := expected(t)["openb_pod_list_default"]
	o := openbOptions(t, "openb_pod_list_default")
	o.Policies, o.Seeds, o.Workers = []string{"bestfit", "fgd", "fusiond"}, []uint64{42}, 2
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range rep.Summaries {
		got[s.Policy] = s.AllocPct[3]
	}
	for _, p := range []string{"bestfit", "fgd"} {
		if math.Abs(got[p]-want[p][3]) > 1.5 {
			t.Errorf("%s: %.2f%% at 130%%, paper %.2f%%", p, got[p], want[p][3])
		}
	}
	if got["fusiond"] < got["bestfit"] {
		t.Errorf("fusiond %.2f%% below bestfit %.2f%%", got["fusiond"], got["bestfit"])
	}
}

// TestOpenBDefaultGolden keeps the default trace's figures for seed 42
// (fusiond and FGD): allocation at 100..130 % arrived, what failed by
// 90..130 % (pods/GPUs/big pods) and the upper bound, exactly as in
// testdata/openb_default_seed42.txt (regenerate with -update after a
// deliberate change, and say why in the commit). It also checks what must
// hold whatever the numbers: nothing above the bound, and fusiond fails
// no more 8-GPU pods than FGD before 100 % arrived.
func TestOpenBDefaultGolden(t *testing.T) {
	o := openbOptions(t, "openb_pod_list_default")
	o.Policies, o.Seeds, o.Workers = []string{"fusiond", "fgd"}, []uint64{42}, 2
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkDefaultGolden(t, rep, "explicit files")
}

// TestSimulateEmbeddedDefault runs `fusionctl simulate` as a user would:
// with no trace flags it replays the embedded default trace, says so in
// its first line, and gives the golden figures of TestOpenBDefaultGolden;
// given the same trace as plain CSV files it gives them too.
func TestSimulateEmbeddedDefault(t *testing.T) {
	run := func(args ...string) string {
		t.Helper()
		cmd := NewCommand()
		var out strings.Builder
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("simulate %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	report := func(args ...string) *Report {
		t.Helper()
		var rep Report
		if err := json.Unmarshal([]byte(run(args...)), &rep); err != nil {
			t.Fatalf("simulate %v -o json: %v", args, err)
		}
		return &rep
	}
	first, _, _ := strings.Cut(run("--policy", "bestfit"), "\n")
	if !strings.HasPrefix(first, `input: embedded openb trace "default" (8152 pods) on the embedded openb node list (1213 nodes)`) {
		t.Errorf("first line of simulate without trace flags: %q", first)
	}
	checkDefaultGolden(t, report("--policy", "fusiond,fgd", "--seeds", "42", "-o", "json"), "no trace flags")

	dir := t.TempDir()
	for name, dst := range map[string]string{"openb_node_list_gpu_node.csv": "nodes.csv", "openb_pod_list_default.csv": "pods.csv"} {
		r, err := openb.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || os.WriteFile(filepath.Join(dir, dst), b, 0o644) != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	rep := report("--nodes", filepath.Join(dir, "nodes.csv"), "--pods", filepath.Join(dir, "pods.csv"), "--policy", "fusiond,fgd", "-o", "json")
	if !strings.Contains(rep.Input, "pods from "+filepath.Join(dir, "pods.csv")) {
		t.Errorf("input with files: %q", rep.Input)
	}
	rep.Trace = "openb_pod_list_default" // the file is pods.csv
	checkDefaultGolden(t, rep, "plain files")
}

// checkDefaultGolden compares the default trace's seed-42 figures for
// fusiond and FGD with testdata/openb_default_seed42.txt (rewritten with
// -update), and checks what must hold whatever the numbers.
func checkDefaultGolden(t *testing.T, rep *Report, how string) {
	t.Helper()
	if rep.Trace != "openb_pod_list_default" {
		t.Errorf("%s: trace %q", how, rep.Trace)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bound@130 %.2f\n", rep.BoundPct)
	big := map[string][]float64{}
	for _, s := range rep.Summaries {
		fmt.Fprintf(&b, "%s alloc", s.Policy)
		for _, v := range s.AllocPct {
			fmt.Fprintf(&b, " %.2f", v)
			if v > rep.BoundPct+1e-9 {
				t.Errorf("%s: %s allocates %.2f%%, above the bound %.2f%%", how, s.Policy, v, rep.BoundPct)
			}
		}
		fmt.Fprintf(&b, " failed")
		for _, f := range s.FailAt {
			fmt.Fprintf(&b, " %s", fmtFail(f))
			if f.ArrivedPct < 100 {
				big[s.Policy] = append(big[s.Policy], f.BigPods)
			}
		}
		b.WriteString("\n")
	}
	for i := range big["fgd"] {
		if big["fusiond"][i] > big["fgd"][i] {
			t.Errorf("%s: fusiond failed %.0f big pods before 100%% arrived, FGD %.0f", how, big["fusiond"][i], big["fgd"][i])
		}
	}
	golden := filepath.Join("testdata", "openb_default_seed42.txt")
	if *update && how == "explicit files" {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestOpenBDefaultGolden -update)", err)
	}
	if b.String() != string(want) {
		t.Errorf("default trace, seed 42, %s: differs from %s:\n got:\n%s\nwant:\n%s", how, golden, b.String(), want)
	}
}

// TestOpenBValidationFull is the ±1-point validation of every baseline on
// every trace (mean of seeds 42..51): `make sim-validate`, run by .ci/run
// (about 5 minutes on 2 cores). It runs only with FUSIOND_SIM_FULL=1 so
// that `make test` stays short.
func TestOpenBValidationFull(t *testing.T) {
	if os.Getenv("FUSIOND_SIM_FULL") != "1" {
		t.Skip("make sim-validate runs it (FUSIOND_SIM_FULL=1)")
	}
	for trace, pols := range expected(t) {
		o := openbOptions(t, trace)
		o.Policies, o.Seeds = sched.BaselineNames, []uint64{42, 43, 44, 45, 46, 47, 48, 49, 50, 51}
		rep, err := Simulate(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range rep.Summaries {
			tol := 1.0
			if trace == "openb_pod_list_gpushare100" && s.Policy == "dotprod" {
				tol = 2 // known gap (80.69 vs 82.42), see docs/benchmarks.md
			}
			if w, ok := pols[s.Policy]; ok && math.Abs(s.AllocPct[3]-w[3]) > tol {
				t.Errorf("%s %s: %.2f%% at 130%%, paper %.2f%%", trace, s.Policy, s.AllocPct[3], w[3])
			}
		}
	}
}

// TestOpenBTable regenerates the 17 traces × policies table of
// docs/benchmarks.md (mean of seeds 42..51 at 130 %) and each trace's
// failure table. It takes about 10 minutes on 2 cores: it runs only when
// FUSIOND_SIM_TABLE names the markdown file to write.
func TestOpenBTable(t *testing.T) {
	outPath := os.Getenv("FUSIOND_SIM_TABLE")
	if outPath == "" {
		t.Skip("set FUSIOND_SIM_TABLE=FILE.md to regenerate the benchmark table")
	}
	pub := expected(t)
	var traces []string
	for tr := range pub {
		traces = append(traces, tr)
	}
	slices.Sort(traces)
	var reps []*Report
	for _, tr := range traces {
		o := openbOptions(t, tr)
		o.Policies, o.Seeds = append(slices.Clone(sched.BaselineNames), "fusiond"), []uint64{42, 43, 44, 45, 46, 47, 48, 49, 50, 51}
		rep, err := Simulate(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, rep)
	}
	var out strings.Builder
	out.WriteString(MarkdownTable(reps, pub))
	for _, r := range reps {
		fmt.Fprintf(&out, "\n%s: failed pods / GPUs / big pods by arrived GPU request\n\n%s", r.Trace, MarkdownFailTable(r))
	}
	if err := os.WriteFile(outPath, []byte(out.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestOpenBDiffTable writes fusiond − FGD (allocation at 130 %, paired
// 95 % t-intervals) and the 8-GPU pods each failed by 100 % arrived, on
// every embedded pod list (openb.Traces) and on the seed sets 42..51 and
// 52..61 (FUSIOND_SIM_DIFF_SEEDS: others, ";"-separated, each as --seeds
// takes it). 24 traces × 20 seeds × 2 policies take about 4 minutes of 2
// idle cores: it runs only when FUSIOND_SIM_DIFF names the markdown file
// to write.
func TestOpenBDiffTable(t *testing.T) {
	outPath := os.Getenv("FUSIOND_SIM_DIFF")
	if outPath == "" {
		t.Skip("set FUSIOND_SIM_DIFF=FILE.md to write the fusiond − FGD table")
	}
	setsSpec := cmp.Or(os.Getenv("FUSIOND_SIM_DIFF_SEEDS"), "42-51;52-61")
	var sets [][]uint64
	var all []uint64
	for spec := range strings.SplitSeq(setsSpec, ";") {
		s, err := ParseSeeds(spec)
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, s)
		for _, v := range s {
			if !slices.Contains(all, v) {
				all = append(all, v)
			}
		}
	}
	var reps []*Report
	for _, tr := range openb.Traces() {
		o := Options{Trace: tr, Policies: []string{"fusiond", "fgd"}, Seeds: all}
		rep, err := Simulate(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, rep)
	}
	out, err := MarkdownDiffTable(reps, sets)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outPath, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
}
