package sim

import (
	"bufio"
	"fmt"
	"html"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A chart is a line plot with axes, ticks, a title, axis labels and a
// legend, rendered as SVG or PNG from the same layout.
type chart struct {
	Title, XLabel, YLabel  string
	XMin, XMax, YMin, YMax float64
	XTicks, YTicks         []tick
	Series                 []series
	// Notes are legend lines without a line sample (what dashes mean).
	Notes []string
}

type tick struct {
	V     float64
	Label string
}

type series struct {
	Name   string
	X, Y   []float64
	Color  color.RGBA
	Dashed bool
	// Legend false keeps the series out of the legend (a paired curve
	// that the notes explain).
	Hidden bool
}

// palette: distinguishable line colours (matplotlib's tab10).
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xd6, 0x27, 0x28, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff},
	{0xbc, 0xbd, 0x22, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

var (
	gridColor  = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	axisColor  = color.RGBA{0x33, 0x33, 0x33, 0xff}
	textColor  = color.RGBA{0x11, 0x11, 0x11, 0xff}
	guideColor = color.RGBA{0x99, 0x99, 0x99, 0xff}
)

// Layout, in pixels.
const (
	plotW, plotH                      = 840, 500
	padLeft, padRight, padTop, padBot = 70, 190, 48, 56
)

func (c *chart) px(x float64) float64 {
	return padLeft + (x-c.XMin)/(c.XMax-c.XMin)*float64(plotW-padLeft-padRight)
}

func (c *chart) py(y float64) float64 {
	return float64(plotH-padBot) - (y-c.YMin)/(c.YMax-c.YMin)*float64(plotH-padTop-padBot)
}

func (c *chart) clampY(y float64) float64 { return math.Max(c.YMin, math.Min(c.YMax, y)) }

func hex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// linearTicks are ticks every step from lo to hi.
func linearTicks(lo, hi, step float64, format func(float64) string) []tick {
	var out []tick
	for v := lo; v <= hi+step/1e6; v += step {
		out = append(out, tick{V: v, Label: format(v)})
	}
	return out
}

func fmtG(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }

// niceStep is a 1-2-5 step giving about n intervals over span.
func niceStep(span float64, n int) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

// WriteSVG renders the chart as self-contained SVG 1.1.
func (c *chart) WriteSVG(w io.Writer) error {
	b := bufio.NewWriter(w)
	esc := html.EscapeString
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", padLeft, esc(c.Title))
	x0, x1, y0, y1 := c.px(c.XMin), c.px(c.XMax), c.py(c.YMin), c.py(c.YMax)
	for _, t := range c.XTicks {
		x := c.px(t.V)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, y1, x, y0, hex(gridColor), x, y0+18, esc(t.Label))
	}
	for _, t := range c.YTicks {
		y := c.py(t.V)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0, y, x1, y, hex(gridColor), x0-6, y+4, esc(t.Label))
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="%s"/>`+"\n", x0, y1, x1-x0, y0-y1, hex(axisColor))
	fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", (x0+x1)/2, plotH-14, esc(c.XLabel))
	fmt.Fprintf(b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">%s</text>`+"\n", (y0+y1)/2, (y0+y1)/2, esc(c.YLabel))
	for _, s := range c.Series {
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="`, hex(s.Color), dash)
		for i := range s.X {
			fmt.Fprintf(b, "%.1f,%.1f ", c.px(s.X[i]), c.py(c.clampY(s.Y[i])))
		}
		b.WriteString("\"/>\n")
	}
	ly := float64(padTop + 8)
	lx := float64(plotW - padRight + 14)
	for _, s := range c.Series {
		if s.Hidden {
			continue
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			lx, ly, lx+24, ly, hex(s.Color), dash, lx+30, ly+4, esc(s.Name))
		ly += 18
	}
	for _, n := range c.Notes {
		ly += 4
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="11" fill="#444">%s</text>`+"\n", lx, ly+4, esc(n))
		ly += 14
	}
	b.WriteString("</svg>\n")
	return b.Flush()
}

// WritePNG renders the chart as a PNG (the standard library's encoder,
// x/image's 7×13 bitmap font).
func (c *chart) WritePNG(w io.Writer) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	cv := &canvas{img: img}
	x0, x1, y0, y1 := c.px(c.XMin), c.px(c.XMax), c.py(c.YMin), c.py(c.YMax)
	for _, t := range c.XTicks {
		x := c.px(t.V)
		cv.line(x, y1, x, y0, gridColor, 1, false)
		cv.text(x, y0+18, t.Label, textColor, alignCenter)
	}
	for _, t := range c.YTicks {
		y := c.py(t.V)
		cv.line(x0, y, x1, y, gridColor, 1, false)
		cv.text(x0-6, y+4, t.Label, textColor, alignRight)
	}
	cv.line(x0, y0, x1, y0, axisColor, 1, false)
	cv.line(x0, y1, x1, y1, axisColor, 1, false)
	cv.line(x0, y0, x0, y1, axisColor, 1, false)
	cv.line(x1, y0, x1, y1, axisColor, 1, false)
	for _, s := range c.Series {
		for i := 1; i < len(s.X); i++ {
			cv.line(c.px(s.X[i-1]), c.py(c.clampY(s.Y[i-1])), c.px(s.X[i]), c.py(c.clampY(s.Y[i])), s.Color, 2, s.Dashed)
		}
	}
	cv.boldText(padLeft, 24, c.Title, textColor)
	cv.text((x0+x1)/2, plotH-14, c.XLabel, textColor, alignCenter)
	// The bitmap font does not rotate: the y label sits above the axis.
	cv.text(x0, y1-8, c.YLabel, textColor, alignLeft)
	ly := float64(padTop + 8)
	lx := float64(plotW - padRight + 14)
	for _, s := range c.Series {
		if s.Hidden {
			continue
		}
		for d := -1.0; d <= 1; d++ {
			cv.line(lx, ly+d, lx+24, ly+d, s.Color, 1, s.Dashed)
		}
		cv.text(lx+30, ly+4, s.Name, textColor, alignLeft)
		ly += 18
	}
	for _, n := range c.Notes {
		ly += 4
		cv.text(lx, ly+4, n, axisColor, alignLeft)
		ly += 14
	}
	return png.Encode(w, img)
}

type align int

const (
	alignLeft align = iota
	alignCenter
	alignRight
)

// canvas draws lines and text on an RGBA image.
type canvas struct {
	img *image.RGBA
	// dash is the distance drawn along the current dashed polyline.
	dash float64
}

// blend paints c at (x, y) with coverage a (0..1).
func (cv *canvas) blend(x, y int, c color.RGBA, a float64) {
	if !(image.Point{x, y}.In(cv.img.Bounds())) || a <= 0 {
		return
	}
	a = math.Min(a, 1)
	o := cv.img.RGBAAt(x, y)
	mix := func(dst, src uint8) uint8 { return uint8(float64(dst)*(1-a) + float64(src)*a + 0.5) }
	cv.img.SetRGBA(x, y, color.RGBA{mix(o.R, c.R), mix(o.G, c.G), mix(o.B, c.B), 0xff})
}

// line draws an anti-aliased segment of width px (sampled every quarter
// pixel; coverage from the distance to the segment), dashed 6 on, 4 off.
func (cv *canvas) line(x0, y0, x1, y1 float64, c color.RGBA, width float64, dashed bool) {
	dx, dy := x1-x0, y1-y0
	length := math.Hypot(dx, dy)
	if length == 0 {
		return
	}
	steps := int(math.Ceil(length * 4))
	half := width / 2
	painted := map[image.Point]float64{}
	for i := 0; i <= steps; i++ {
		t := float64(i) / float64(steps)
		if dashed && math.Mod(cv.dash+t*length, 10) >= 6 {
			continue
		}
		px, py := x0+t*dx, y0+t*dy
		for yy := int(math.Floor(py - half - 1)); yy <= int(math.Ceil(py+half+1)); yy++ {
			for xx := int(math.Floor(px - half - 1)); xx <= int(math.Ceil(px+half+1)); xx++ {
				d := math.Hypot(float64(xx)+0.5-px, float64(yy)+0.5-py)
				cov := math.Max(0, math.Min(1, half+0.5-d))
				p := image.Point{xx, yy}
				painted[p] = math.Max(painted[p], cov)
			}
		}
	}
	if dashed {
		cv.dash += length
	}
	for p, a := range painted {
		cv.blend(p.X, p.Y, c, a)
	}
}

func (cv *canvas) text(x, y float64, s string, c color.RGBA, a align) {
	face := basicfont.Face7x13
	d := &font.Drawer{Dst: cv.img, Src: image.NewUniform(c), Face: face}
	wpx := float64(d.MeasureString(s).Round())
	switch a {
	case alignCenter:
		x -= wpx / 2
	case alignRight:
		x -= wpx
	}
	d.Dot = fixed.P(int(math.Round(x)), int(math.Round(y)))
	d.DrawString(s)
}

// boldText draws s twice, one pixel apart.
func (cv *canvas) boldText(x, y float64, s string, c color.RGBA) {
	cv.text(x, y, s, c, alignLeft)
	cv.text(x+1, y, s, c, alignLeft)
}

// writeChart writes c to path as SVG or PNG, by the file's extension.
func writeChart(c *chart, w io.Writer, path string) error {
	switch {
	case strings.HasSuffix(strings.ToLower(path), ".svg"):
		return c.WriteSVG(w)
	case strings.HasSuffix(strings.ToLower(path), ".png"):
		return c.WritePNG(w)
	}
	return fmt.Errorf("%w: plot %q: want a .svg or .png file", ErrBadOption, path)
}
