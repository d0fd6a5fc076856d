package sim

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// AllocChart is the protocol's picture: for each policy (mean over seeds)
// the GPU request allocated (solid) and the GPU request that failed to
// place (dashed) against the GPU request arrived, all in % of capacity,
// with the y = x line of perfect allocation.
func AllocChart(rep *Report) *chart {
	var policies []string
	for _, r := range rep.Runs {
		if !slices.Contains(policies, r.Policy) {
			policies = append(policies, r.Policy)
		}
	}
	c := &chart{
		Title:  fmt.Sprintf("%s: GPU allocation vs arrived GPU request (mean of seeds)", rep.Trace),
		XLabel: "arrived GPU request (% of GPU capacity)",
		YLabel: "% of GPU capacity",
		YMin:   0, YMax: 100,
		Notes: []string{"solid: allocated", "dashed: failed", "grey: arrived (y = x)"},
	}
	xmax := 0.0
	for i, p := range policies {
		// Mean curve: every run's points bucketed by whole arrived percent.
		type acc struct {
			alloc, failed float64
			n             int
		}
		buckets := map[int]*acc{}
		for _, r := range rep.Runs {
			if r.Policy != p {
				continue
			}
			for _, pt := range r.Curve {
				k := int(math.Floor(pt.ArrivedPct))
				a := buckets[k]
				if a == nil {
					a = &acc{}
					buckets[k] = a
				}
				a.alloc += pt.AllocPct
				a.failed += pt.FailedPct
				a.n++
			}
		}
		keys := make([]int, 0, len(buckets))
		for k := range buckets {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		col := palette[i%len(palette)]
		alloc := series{Name: p, Color: col}
		failed := series{Name: p + " failed", Color: col, Dashed: true, Hidden: true}
		for _, k := range keys {
			a := buckets[k]
			alloc.X, alloc.Y = append(alloc.X, float64(k)), append(alloc.Y, a.alloc/float64(a.n))
			failed.X, failed.Y = append(failed.X, float64(k)), append(failed.Y, a.failed/float64(a.n))
			xmax = max(xmax, float64(k))
		}
		c.Series = append(c.Series, alloc, failed)
	}
	c.XMax = math.Max(10, math.Ceil(xmax/10)*10)
	c.Series = append([]series{{Name: "arrived", X: []float64{0, 100}, Y: []float64{0, 100}, Color: guideColor, Dashed: true, Hidden: true}}, c.Series...)
	c.XTicks = linearTicks(0, c.XMax, 10, fmtG)
	c.YTicks = linearTicks(0, 100, 10, fmtG)
	return c
}

// UtilChart is the time-ordered replay's GPU allocation over time, one
// curve per policy.
func UtilChart(rep *Report) *chart {
	c := &chart{
		Title:  fmt.Sprintf("%s (time-ordered): GPU allocation over time", rep.Trace),
		XLabel: "time since the first arrival (hours), until the last arrival",
		YLabel: "GPU allocated (% of capacity)",
		YMin:   0, YMax: 100,
	}
	var t0 int64 = math.MaxInt64
	for _, r := range rep.Timed {
		if len(r.Util) > 0 {
			t0 = min(t0, r.Util[0].Time)
		}
	}
	var end int64
	for _, r := range rep.Timed {
		end = max(end, r.WindowEnd)
	}
	xmax := 0.0
	for i, r := range rep.Timed {
		s := series{Name: fmt.Sprintf("%s (mean %.1f%%)", r.Policy, r.MeanUtilPct), Color: palette[i%len(palette)]}
		for _, p := range r.Util {
			if p.Time > end {
				break // after the window
			}
			h := float64(p.Time-t0) / 3600
			s.X, s.Y = append(s.X, h), append(s.Y, p.UtilPct)
			xmax = max(xmax, h)
		}
		c.Series = append(c.Series, s)
	}
	step := niceStep(xmax, 10)
	c.XMax = math.Max(step, math.Ceil(xmax/step)*step)
	c.XTicks = linearTicks(0, c.XMax, step, fmtG)
	c.YTicks = linearTicks(0, 100, 10, fmtG)
	return c
}

// waitTicks label a log-scale axis of seconds.
var waitTicks = []struct {
	s     float64
	label string
}{{1, "1s"}, {10, "10s"}, {60, "1m"}, {600, "10m"}, {3600, "1h"}, {36000, "10h"}, {86400, "1d"}, {864000, "10d"}, {8640000, "100d"}}

// WaitChart is the time-ordered replay's queueing-delay CDF (log time
// axis; waits under a second count as one second), one curve per policy.
func WaitChart(rep *Report) *chart {
	c := &chart{
		Title:  fmt.Sprintf("%s (time-ordered): queueing delay CDF", rep.Trace),
		XLabel: "wait before placement (log scale; waits under 1 s drawn at 1 s)",
		YLabel: "pods placed within the wait (%; never placed: until the end)",
		YMin:   0, YMax: 100,
	}
	maxWait := 10.0
	for i, r := range rep.Timed {
		s := series{Name: fmt.Sprintf("%s (p95 %s)", r.Policy, humanSeconds(r.WaitP95)), Color: palette[i%len(palette)]}
		for _, p := range r.WaitCDF {
			w := math.Max(1, p.WaitS)
			s.X, s.Y = append(s.X, math.Log10(w)), append(s.Y, 100*p.Frac)
			maxWait = max(maxWait, w)
		}
		c.Series = append(c.Series, s)
	}
	c.XMin, c.XMax = 0, math.Ceil(math.Log10(maxWait))
	for _, t := range waitTicks {
		if l := math.Log10(t.s); l <= c.XMax+1e-9 {
			c.XTicks = append(c.XTicks, tick{V: l, Label: t.label})
		}
	}
	c.YTicks = linearTicks(0, 100, 10, fmtG)
	return c
}

func humanSeconds(s float64) string {
	switch {
	case s < 60:
		return fmt.Sprintf("%.0fs", s)
	case s < 3600:
		return fmt.Sprintf("%.0fm", s/60)
	case s < 86400:
		return fmt.Sprintf("%.1fh", s/3600)
	}
	return fmt.Sprintf("%.1fd", s/86400)
}

// WaitPlotPath is where the wait CDF of a time-ordered run goes when
// --plot names path: "-wait" before the extension.
func WaitPlotPath(path string) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "-wait" + ext
}

// writePlots writes rep's pictures to every path (.svg or .png): the
// allocation curves of the protocol, or the utilisation over time (at
// path) and the wait CDF (at WaitPlotPath(path)) of the time-ordered mode.
func writePlots(rep *Report, paths []string) error {
	for _, p := range paths {
		if rep.Timed != nil {
			if err := writePlotFile(UtilChart(rep), p); err != nil {
				return err
			}
			if err := writePlotFile(WaitChart(rep), WaitPlotPath(p)); err != nil {
				return err
			}
			continue
		}
		if err := writePlotFile(AllocChart(rep), p); err != nil {
			return err
		}
	}
	return nil
}

func writePlotFile(c *chart, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("sim: plot: %w", err)
	}
	werr := writeChart(c, f, path)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return fmt.Errorf("sim: plot: %w", werr)
	}
	return nil
}

// checkPlotPaths refuses, before any replay, a plot file that is neither
// .svg nor .png.
func checkPlotPaths(paths []string) error {
	for _, p := range paths {
		if ext := strings.ToLower(filepath.Ext(p)); ext != ".svg" && ext != ".png" {
			return fmt.Errorf("%w: --plot %q: want a .svg or .png file", ErrBadOption, p)
		}
	}
	return nil
}
