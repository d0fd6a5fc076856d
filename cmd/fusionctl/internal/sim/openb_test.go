package sim

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/sched"
)

// openbDir returns the openb data directory: $FUSIOND_OPENB_DIR, or
// ../shared/data/openb beside the repository root. It fails the test when
// the data is missing: CI has shared/ beside the clone.
func openbDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("FUSIOND_OPENB_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "..", "..", "shared", "data", "openb")
	}
	if _, err := os.Stat(filepath.Join(dir, "openb_node_list_gpu_node.csv")); err != nil {
		t.Fatalf("openb trace not found in %s (set FUSIOND_OPENB_DIR to the directory holding openb_node_list_gpu_node.csv): %v", dir, err)
	}
	return dir
}

func expected(t testing.TB, dir string) Published {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "FGD_expected_allocation.txt"))
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
	dir := openbDir(t)
	want := expected(t, dir)["openb_pod_list_default"]
	o := Options{NodesPath: filepath.Join(dir, "openb_node_list_gpu_node.csv"), PodsPath: filepath.Join(dir, "openb_pod_list_default.csv"),
		Policies: []string{"bestfit", "fgd", "fusiond"}, Seeds: []uint64{42}, Workers: 2}
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
	dir := openbDir(t)
	o := Options{NodesPath: filepath.Join(dir, "openb_node_list_gpu_node.csv"), PodsPath: filepath.Join(dir, "openb_pod_list_default.csv"),
		Policies: []string{"fusiond", "fgd"}, Seeds: []uint64{42}, Workers: 2}
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bound@130 %.2f\n", rep.BoundPct)
	big := map[string][]float64{}
	for _, s := range rep.Summaries {
		fmt.Fprintf(&b, "%s alloc", s.Policy)
		for _, v := range s.AllocPct {
			fmt.Fprintf(&b, " %.2f", v)
			if v > rep.BoundPct+1e-9 {
				t.Errorf("%s allocates %.2f%%, above the bound %.2f%%", s.Policy, v, rep.BoundPct)
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
			t.Errorf("fusiond failed %.0f big pods before 100%% arrived, FGD %.0f", big["fusiond"][i], big["fgd"][i])
		}
	}
	golden := filepath.Join("testdata", "openb_default_seed42.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestOpenBDefaultGolden -update)", err)
	}
	if b.String() != string(want) {
		t.Errorf("default trace, seed 42, differs from %s:\n got:\n%s\nwant:\n%s", golden, b.String(), want)
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
	dir := openbDir(t)
	for trace, pols := range expected(t, dir) {
		o := Options{NodesPath: filepath.Join(dir, "openb_node_list_gpu_node.csv"), PodsPath: filepath.Join(dir, trace+".csv"),
			Policies: sched.BaselineNames, Seeds: []uint64{42, 43, 44, 45, 46, 47, 48, 49, 50, 51}}
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
	dir := openbDir(t)
	pub := expected(t, dir)
	var traces []string
	for tr := range pub {
		traces = append(traces, tr)
	}
	slices.Sort(traces)
	var reps []*Report
	for _, tr := range traces {
		o := Options{NodesPath: filepath.Join(dir, "openb_node_list_gpu_node.csv"), PodsPath: filepath.Join(dir, tr+".csv"),
			Policies: append(slices.Clone(sched.BaselineNames), "fusiond"), Seeds: []uint64{42, 43, 44, 45, 46, 47, 48, 49, 50, 51}}
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
