package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Published maps trace → policy (lower case) → the FGD paper's mean GPU
// allocation at 100/110/120/130 % arrived, as in FGD_expected_allocation.txt.
type Published map[string]map[string][4]float64

// ReadPublished parses FGD_expected_allocation.txt.
func ReadPublished(r io.Reader) (Published, error) {
	out := Published{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 8 || !strings.HasPrefix(fs[0], "openb_") {
			continue
		}
		_, pol, _ := strings.Cut(fs[1], "-")
		var v [4]float64
		for i := range 4 {
			f, err := strconv.ParseFloat(fs[4+i], 64)
			if err != nil {
				return nil, fmt.Errorf("%w: %q", ErrBadTrace, sc.Text())
			}
			v[i] = f
		}
		if out[fs[0]] == nil {
			out[fs[0]] = map[string][4]float64{}
		}
		out[fs[0]][strings.ToLower(pol)] = v
	}
	return out, sc.Err()
}

// MarkdownTable renders allocation at 130 % per trace and policy, ours
// next to the paper's where published, the upper bound (Bound), and
// fusiond against FGD (ours and the paper's), with the big pods fusiond
// and FGD failed by 100 % arrived.
func MarkdownTable(reps []*Report, pub Published) string {
	var b strings.Builder
	var pols []string
	for _, r := range reps {
		for _, s := range r.Summaries {
			if !slices.Contains(pols, s.Policy) {
				pols = append(pols, s.Policy)
			}
		}
	}
	b.WriteString("| trace |")
	for _, p := range pols {
		fmt.Fprintf(&b, " %s |", p)
	}
	b.WriteString(" bound | fusiond − FGD (ours) | fusiond − paper FGD | big pods failed by 100 %: fusiond / FGD |\n|---|")
	for range pols {
		b.WriteString("---|")
	}
	b.WriteString("---|---|---|---|\n")
	at := func(r *Report, p string) (Summary, bool) {
		i := slices.IndexFunc(r.Summaries, func(s Summary) bool { return s.Policy == p })
		if i < 0 {
			return Summary{}, false
		}
		return r.Summaries[i], true
	}
	last := func(v []float64) float64 { return v[len(v)-1] }
	bigBy100 := func(s Summary) float64 {
		for _, f := range s.FailAt {
			if f.ArrivedPct == 100 {
				return f.BigPods
			}
		}
		return math.NaN()
	}
	for _, r := range reps {
		fmt.Fprintf(&b, "| %s |", strings.TrimPrefix(r.Trace, "openb_pod_list_"))
		for _, p := range pols {
			s, ok := at(r, p)
			if !ok {
				b.WriteString(" – |")
				continue
			}
			if w, ok := pub[r.Trace][p]; ok {
				fmt.Fprintf(&b, " %.2f (%.2f) |", last(s.AllocPct), w[3])
			} else {
				fmt.Fprintf(&b, " %.2f |", last(s.AllocPct))
			}
		}
		fmt.Fprintf(&b, " %.2f |", r.BoundPct)
		fus, okF := at(r, "fusiond")
		fgd, okG := at(r, "fgd")
		if okF && okG {
			fmt.Fprintf(&b, " %+.2f |", last(fus.AllocPct)-last(fgd.AllocPct))
		} else {
			b.WriteString(" – |")
		}
		if w, ok := pub[r.Trace]["fgd"]; ok && okF {
			fmt.Fprintf(&b, " %+.2f |", last(fus.AllocPct)-w[3])
		} else {
			b.WriteString(" – |")
		}
		if okF && okG {
			fmt.Fprintf(&b, " %.1f / %.1f |\n", bigBy100(fus), bigBy100(fgd))
		} else {
			b.WriteString(" – |\n")
		}
	}
	return b.String()
}

// MarkdownFailTable renders what each policy had failed by each
// FailThresholds point (pods / GPUs / big pods, mean over seeds).
func MarkdownFailTable(rep *Report) string {
	var b strings.Builder
	var points []FailPoint
	for _, s := range rep.Summaries {
		if len(s.FailAt) > len(points) {
			points = s.FailAt
		}
	}
	if len(points) == 0 {
		return ""
	}
	b.WriteString("| policy |")
	for _, f := range points {
		fmt.Fprintf(&b, " @%g %% |", f.ArrivedPct)
	}
	b.WriteString("\n|---|")
	for range points {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, s := range rep.Summaries {
		fmt.Fprintf(&b, "| %s |", s.Policy)
		for _, f := range s.FailAt {
			fmt.Fprintf(&b, " %s |", fmtFail(f))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// t975 is the 0.975 quantile of Student's t with df degrees of freedom,
// df 1..30 (the 95 % two-sided interval); above 30 the normal's 1.96 is
// used, which is within 2 % of it.
var t975 = [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

// pairedCI is the mean of the paired differences d and the half-width of
// its 95 % t-interval (NaN with fewer than two differences).
func pairedCI(d []float64) (mean, half float64) {
	n := len(d)
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	for _, v := range d {
		mean += v / float64(n)
	}
	if n < 2 {
		return mean, math.NaN()
	}
	var ss float64
	for _, v := range d {
		ss += (v - mean) * (v - mean)
	}
	q := 1.96
	if n-1 <= len(t975) {
		q = t975[n-2]
	}
	return mean, q * math.Sqrt(ss/float64(n-1)/float64(n))
}

// runByPolicySeed indexes a report's runs.
func runByPolicySeed(r *Report) map[string]map[uint64]RunResult {
	out := map[string]map[uint64]RunResult{}
	for _, run := range r.Runs {
		if out[run.Policy] == nil {
			out[run.Policy] = map[uint64]RunResult{}
		}
		out[run.Policy][run.Seed] = run
	}
	return out
}

// MarkdownDiffTable renders, per trace and per seed set, fusiond's
// allocation at the last threshold minus FGD's (mean of the per-seed
// differences, with the 95 % t-interval paired over the seeds) and the
// 8-GPU pods each failed by 100 % arrived (means). A seed a report lacks
// for either policy is an error.
func MarkdownDiffTable(reps []*Report, sets [][]uint64) (string, error) {
	var b strings.Builder
	b.WriteString("| trace |")
	for _, s := range sets {
		name := seedSetName(s)
		fmt.Fprintf(&b, " fusiond − FGD, seeds %s (95 %% CI) | 8-GPU pods failed by 100 %%, seeds %s: fusiond / FGD |", name, name)
	}
	b.WriteString("\n|---|")
	for range sets {
		b.WriteString("---|---|")
	}
	b.WriteString("\n")
	for _, r := range reps {
		by := runByPolicySeed(r)
		fmt.Fprintf(&b, "| %s |", strings.TrimPrefix(r.Trace, "openb_pod_list_"))
		for _, set := range sets {
			var d []float64
			var bigF, bigG float64
			for _, seed := range set {
				f, okF := by["fusiond"][seed]
				g, okG := by["fgd"][seed]
				if !okF || !okG || len(f.AllocPct) == 0 || len(g.AllocPct) == 0 {
					return "", fmt.Errorf("%s: seed %d lacks a fusiond or fgd run", r.Trace, seed)
				}
				d = append(d, f.AllocPct[len(f.AllocPct)-1]-g.AllocPct[len(g.AllocPct)-1])
				bigF += bigBy100(f) / float64(len(set))
				bigG += bigBy100(g) / float64(len(set))
			}
			m, h := pairedCI(d)
			fmt.Fprintf(&b, " %+.2f [%+.2f, %+.2f] | %.1f / %.1f |", m, m-h, m+h, bigF, bigG)
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

// seedSetName writes a seed set as a range when it is one ("42..51").
func seedSetName(s []uint64) string {
	if len(s) == 0 {
		return "none"
	}
	if int(s[len(s)-1]-s[0]) == len(s)-1 {
		return fmt.Sprintf("%d..%d", s[0], s[len(s)-1])
	}
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, ",")
}

// The paired interval is mean ± t(n−1)·s/√n, and the diff table pairs
// each seed's fusiond run with its FGD run.
func TestPairedCIAndDiffTable(t *testing.T) {
	m, h := pairedCI([]float64{1, 2, 3, 4, 5}) // s = √2.5, t(4) = 2.776
	if math.Abs(m-3) > 1e-12 || math.Abs(h-2.776*math.Sqrt(2.5/5)) > 1e-9 {
		t.Errorf("pairedCI = %v ± %v, want 3 ± %v", m, h, 2.776*math.Sqrt(0.5))
	}
	if _, h := pairedCI([]float64{1}); !math.IsNaN(h) {
		t.Errorf("one difference: half-width %v, want NaN", h)
	}
	run := func(pol string, seed uint64, alloc, big float64) RunResult {
		return RunResult{Policy: pol, Seed: seed, AllocPct: []float64{50, alloc}, FailAt: []FailPoint{{ArrivedPct: 90}, {ArrivedPct: 100, BigPods: big}}}
	}
	rep := &Report{Trace: "openb_pod_list_x", Runs: []RunResult{
		run("fusiond", 1, 91, 1), run("fgd", 1, 90, 2),
		run("fgd", 2, 92, 0), run("fusiond", 2, 95, 3),
	}}
	got, err := MarkdownDiffTable([]*Report{rep}, [][]uint64{{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	// differences 1 and 3: mean 2, s = √2, t(1) = 12.706, half 12.706.
	if want := "| x | +2.00 [-10.71, +14.71] | 2.0 / 1.0 |"; !strings.Contains(got, want) {
		t.Errorf("table\n%s\nlacks %q", got, want)
	}
	if _, err := MarkdownDiffTable([]*Report{rep}, [][]uint64{{1, 3}}); err == nil {
		t.Error("a seed without runs gave no error")
	}
}
