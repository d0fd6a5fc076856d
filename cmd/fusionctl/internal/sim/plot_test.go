package sim

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return img
}

// pixels counts the pixels of img exactly c.
func pixels(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B {
				n++
			}
		}
	}
	return n
}

func testReport() *Report {
	rep := &Report{Trace: "tiny"}
	for i, pol := range []string{"bestfit", "fusiond"} {
		for seed := range 2 {
			r := RunResult{Policy: pol, Seed: uint64(seed)}
			for a := 0; a <= 130; a += 5 {
				alloc := min(float64(a)*(1-0.2*float64(i)), 90+float64(seed))
				r.Curve = append(r.Curve, CurvePoint{ArrivedPct: float64(a), AllocPct: alloc, FailedPct: float64(a) - alloc})
			}
			rep.Runs = append(rep.Runs, r)
		}
	}
	return rep
}

func TestAllocChart(t *testing.T) {
	c := AllocChart(testReport())
	if c.XMax != 130 || c.YMax != 100 {
		t.Errorf("axes x..%g y..%g", c.XMax, c.YMax)
	}
	// guide, then per policy allocated and failed (mean of the seeds)
	if len(c.Series) != 5 || c.Series[1].Name != "bestfit" || !c.Series[2].Dashed {
		t.Fatalf("series %+v", c.Series)
	}
	last := len(c.Series[1].Y) - 1
	if got := c.Series[1].Y[last]; got != 90.5 {
		t.Errorf("mean allocation at 130%% = %g, want 90.5", got)
	}
	if got := c.Series[2].Y[last]; got != 39.5 {
		t.Errorf("mean failed at 130%% = %g, want 39.5", got)
	}
	var svg bytes.Buffer
	if err := c.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "tiny: GPU allocation vs arrived", ">bestfit</text>", ">fusiond</text>", "stroke-dasharray", "dashed: failed", ">130</text>", "arrived GPU request (% of GPU capacity)"} {
		if !strings.Contains(svg.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	path := filepath.Join(t.TempDir(), "a.png")
	if err := writePlotFile(c, path); err != nil {
		t.Fatal(err)
	}
	img := decodePNG(t, path)
	if img.Bounds().Dx() != plotW || img.Bounds().Dy() != plotH {
		t.Fatalf("PNG %v", img.Bounds())
	}
	// Both policies' lines and the text are drawn; most of it is white.
	for i, col := range palette[:2] {
		if n := pixels(img, col); n < 300 {
			t.Errorf("policy %d colour: %d pixels", i, n)
		}
	}
	if n := pixels(img, textColor); n < 1000 {
		t.Errorf("text: %d pixels", n)
	}
	if n := pixels(img, color.RGBA{255, 255, 255, 255}); n < plotW*plotH/2 {
		t.Errorf("background: %d white pixels", n)
	}
}

func TestCDF(t *testing.T) {
	c := cdf([]float64{4, 1, 3, 2})
	if len(c) != 101 || c[0].WaitS != 1 || c[50].WaitS != 2 || c[75].WaitS != 3 || c[100].WaitS != 4 || c[100].Frac != 1 {
		t.Errorf("cdf %v", c)
	}
	if cdf(nil) != nil {
		t.Error("cdf of nothing")
	}
}

// The time-ordered mode's pictures: utilisation over time at the path,
// the wait CDF beside it.
func TestTimedPlots(t *testing.T) {
	dir := t.TempDir()
	o := tinyOptions()
	o.Policies = []string{"fusiond", "spread"}
	o.Timed, o.LoadPct = true, 200
	o.Format = "table"
	o.PlotPaths = []string{filepath.Join(dir, "timed.svg"), filepath.Join(dir, "timed.png")}
	var out bytes.Buffer
	if err := Run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"timed.svg", "timed-wait.svg", "timed.png", "timed-wait.png"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Error(err)
		}
	}
	util, _ := os.ReadFile(filepath.Join(dir, "timed.svg"))
	wait, _ := os.ReadFile(filepath.Join(dir, "timed-wait.svg"))
	if !bytes.Contains(util, []byte("GPU allocation over time")) || !bytes.Contains(util, []byte("fusiond (mean ")) {
		t.Errorf("utilisation plot:\n%.400s", util)
	}
	if !bytes.Contains(wait, []byte("queueing delay CDF")) || !bytes.Contains(wait, []byte("spread (p95 ")) || !bytes.Contains(wait, []byte("under 1 s")) {
		t.Errorf("wait plot:\n%.400s", wait)
	}
	rep, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Timed {
		if len(r.WaitCDF) != 101 {
			t.Fatalf("%s: %d CDF points", r.Policy, len(r.WaitCDF))
		}
		for i := 1; i < len(r.WaitCDF); i++ {
			if r.WaitCDF[i].WaitS < r.WaitCDF[i-1].WaitS {
				t.Fatalf("%s: CDF not monotonic at %d", r.Policy, i)
			}
		}
	}
	if n := pixels(decodePNG(t, filepath.Join(dir, "timed-wait.png")), palette[1]); n < 100 {
		t.Errorf("wait CDF PNG: %d pixels of the second policy", n)
	}
}

// The pictures `make plots` commits are valid, small and on the benchmarks
// page.
func TestCommittedPlots(t *testing.T) {
	page, err := os.ReadFile("../../../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"openb-default-alloc", "openb-default-timed", "openb-default-timed-wait"} {
		for _, ext := range []string{".png", ".svg"} {
			path := filepath.Join("../../../../docs/img", name+ext)
			st, err := os.Stat(path)
			if err != nil {
				t.Errorf("%v (make plots writes it)", err)
				continue
			}
			if st.Size() > 300<<10 {
				t.Errorf("%s is %d KiB, over 300", path, st.Size()>>10)
			}
			if !bytes.Contains(page, []byte("img/"+name+ext)) {
				t.Errorf("docs/benchmarks.md does not show img/%s%s", name, ext)
			}
			if ext == ".png" {
				if img := decodePNG(t, path); img.Bounds().Dx() != plotW {
					t.Errorf("%s: %v", path, img.Bounds())
				}
			}
		}
	}
}
