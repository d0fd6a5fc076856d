package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
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
// next to the paper's where published, the upper bound (AllocBound), and
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
