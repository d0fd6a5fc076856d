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
// next to the paper's where published, and marks fusiond's result against
// the paper's FGD.
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
	b.WriteString(" fusiond − paper FGD |\n|---|")
	for range pols {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	for _, r := range reps {
		fmt.Fprintf(&b, "| %s |", strings.TrimPrefix(r.Trace, "openb_pod_list_"))
		var fus float64 = math.NaN()
		for _, p := range pols {
			i := slices.IndexFunc(r.Summaries, func(s Summary) bool { return s.Policy == p })
			if i < 0 {
				b.WriteString(" – |")
				continue
			}
			v := r.Summaries[i].AllocPct[len(r.Summaries[i].AllocPct)-1]
			if p == "fusiond" {
				fus = v
			}
			if w, ok := pub[r.Trace][p]; ok {
				fmt.Fprintf(&b, " %.2f (%.2f) |", v, w[3])
			} else {
				fmt.Fprintf(&b, " %.2f |", v)
			}
		}
		if w, ok := pub[r.Trace]["fgd"]; ok && !math.IsNaN(fus) {
			fmt.Fprintf(&b, " %+.2f |\n", fus-w[3])
		} else {
			b.WriteString(" – |\n")
		}
	}
	return b.String()
}
