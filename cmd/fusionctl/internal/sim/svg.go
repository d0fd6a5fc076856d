package sim

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
)

// svgColors are distinguishable line colours, one per policy.
var svgColors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// WriteSVG draws GPU allocation % against arrived GPU request % (mean over
// seeds, per policy), with the y = x line of perfect allocation. The plot
// is self-contained SVG 1.1.
func WriteSVG(w io.Writer, rep *Report) error {
	const (
		width, height          = 760, 480
		left, right, top, bott = 60, 170, 30, 50
	)
	type series struct {
		name string
		pts  []CurvePoint
	}
	var all []series
	var policies []string
	for _, r := range rep.Runs {
		if !slices.Contains(policies, r.Policy) {
			policies = append(policies, r.Policy)
		}
	}
	xmax := 0.0
	for _, p := range policies {
		// Mean curve: bucket every run's points by whole arrived percent.
		sum := map[int]float64{}
		cnt := map[int]int{}
		for _, r := range rep.Runs {
			if r.Policy != p {
				continue
			}
			for _, c := range r.Curve {
				b := int(math.Floor(c.ArrivedPct))
				sum[b] += c.AllocPct
				cnt[b]++
			}
		}
		var pts []CurvePoint
		for b := range sum {
			pts = append(pts, CurvePoint{ArrivedPct: float64(b), AllocPct: sum[b] / float64(cnt[b])})
			xmax = max(xmax, float64(b))
		}
		slices.SortFunc(pts, func(a, b CurvePoint) int { return int(a.ArrivedPct - b.ArrivedPct) })
		all = append(all, series{name: p, pts: pts})
	}
	xmax = math.Max(10, math.Ceil(xmax/10)*10)
	const ymax = 100.0
	pw, ph := float64(width-left-right), float64(height-top-bott)
	x := func(v float64) float64 { return left + v/xmax*pw }
	y := func(v float64) float64 { return top + ph - v/ymax*ph }
	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(b, `<text x="%d" y="18" font-size="14">%s: GPU allocation vs arrived GPU request (mean of seeds)</text>`+"\n", left, html.EscapeString(rep.Trace))
	for v := 0.0; v <= xmax; v += 10 {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="middle">%g</text>`+"\n", x(v), top, x(v), y(0), x(v), y(0)+16, v)
	}
	for v := 0.0; v <= ymax; v += 10 {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left, y(v), x(xmax), y(v), left-6, y(v)+4, v)
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">arrived GPU request (%% of capacity)</text>`+"\n", x(xmax/2), height-10)
	fmt.Fprintf(b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">GPU allocation (%%)</text>`+"\n", y(50), y(50))
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="4 4"/>`+"\n", x(0), y(0), x(ymax), y(ymax))
	for i, s := range all {
		col := svgColors[i%len(svgColors)]
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, col)
		for _, p := range s.pts {
			fmt.Fprintf(b, "%.1f,%.1f ", x(p.ArrivedPct), y(math.Min(p.AllocPct, ymax)))
		}
		b.WriteString("\"/>\n")
		ly := float64(top + 10 + 18*i)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="3"/><text x="%d" y="%.1f">%s</text>`+"\n",
			width-right+10, ly, width-right+30, ly, col, width-right+36, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.Flush()
}
