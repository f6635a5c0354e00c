package main

// The charts are written by hand: a line chart and a grouped bar chart are
// a few hundred lines of SVG, and doing it here keeps what the issue asks
// for under control (legend outside the plot, tick labels that never
// overlap, a log axis only when the data spans more than 10x, an overlap
// check the tests can run). The pure-Go alternatives on the module proxy
// either draw through a general canvas that lays text out with embedded
// fonts and places the legend inside the plot (gonum.org/v1/plot), emit
// HTML and JavaScript rather than SVG (go-echarts), or are no longer
// maintained (wcharczuk/go-chart); none is clearly better for two chart
// types.

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Okabe-Ito colours, distinguishable with the common colour-vision
// deficiencies; the headline implementation (listed first) is blue.
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}

const (
	fontFamily = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
	fontTitle  = 16
	fontSub    = 11
	fontAxis   = 12
	fontTick   = 11
	fontLegend = 12
	fontValue  = 10
	edge       = 14 // blank border of the canvas
)

// textWidth estimates the width of s in font size px of the sans-serif fonts
// above (DejaVu Sans is the widest common one), erring wide.
func textWidth(s string, size float64) float64 {
	w := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("iljtf.,:;'|!()[] ", r):
			w += 0.40
		case strings.ContainsRune("mwMW%", r):
			w += 1.00
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '×', r == 'µ':
			w += 0.70
		default:
			w += 0.62
		}
	}
	return w * size
}

// canvas accumulates SVG elements.
type canvas struct {
	b bytes.Buffer
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // writes to a strings.Builder cannot fail
	return b.String()
}

func num(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }

// text draws s with its baseline at y; anchor is start, middle or end;
// rotate, if set, turns it by -90 degrees about (x, y).
func (c *canvas) text(x, y, size float64, anchor, s string, bold, rotate bool, fill string) {
	fmt.Fprintf(&c.b, `<text x="%s" y="%s" font-size="%s" text-anchor="%s"`, num(x), num(y), num(size), anchor)
	if bold {
		c.b.WriteString(` font-weight="bold"`)
	}
	if fill != "" {
		fmt.Fprintf(&c.b, ` fill="%s"`, fill)
	}
	if rotate {
		fmt.Fprintf(&c.b, ` transform="rotate(-90 %s %s)"`, num(x), num(y))
	}
	fmt.Fprintf(&c.b, ">%s</text>\n", esc(s))
}

func (c *canvas) line(x1, y1, x2, y2 float64, stroke string, width float64) {
	fmt.Fprintf(&c.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="%s"/>`+"\n",
		num(x1), num(y1), num(x2), num(y2), stroke, num(width))
}

func (c *canvas) rect(x, y, w, h float64, fill string) {
	fmt.Fprintf(&c.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", num(x), num(y), num(w), num(h), fill)
}

func (c *canvas) polyline(xs, ys []float64, stroke string, width float64) {
	pts := make([]string, len(xs))
	for i := range xs {
		pts[i] = num(xs[i]) + "," + num(ys[i])
	}
	fmt.Fprintf(&c.b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%s" stroke-linejoin="round"/>`+"\n",
		strings.Join(pts, " "), stroke, num(width))
}

// markerOf is the marker shape of series i: with its colour, distinct for
// the first 32 series.
func markerOf(i int) int { return i + i/len(palette) }

// marker draws marker shape k (cycling through four) centred on (x, y).
func (c *canvas) marker(k int, x, y float64, fill string) {
	const r = 4.5
	style := fmt.Sprintf(`fill="%s" stroke="#ffffff" stroke-width="1"`, fill)
	switch k % 4 {
	case 0:
		fmt.Fprintf(&c.b, `<circle cx="%s" cy="%s" r="%s" %s/>`+"\n", num(x), num(y), num(r), style)
	case 1:
		fmt.Fprintf(&c.b, `<rect x="%s" y="%s" width="%s" height="%s" %s/>`+"\n", num(x-r), num(y-r), num(2*r), num(2*r), style)
	case 2:
		fmt.Fprintf(&c.b, `<polygon points="%s,%s %s,%s %s,%s" %s/>`+"\n",
			num(x), num(y-r-1), num(x+r+1), num(y+r), num(x-r-1), num(y+r), style)
	case 3:
		fmt.Fprintf(&c.b, `<polygon points="%s,%s %s,%s %s,%s %s,%s" %s/>`+"\n",
			num(x), num(y-r-1), num(x+r+1), num(y), num(x), num(y+r+1), num(x-r-1), num(y), style)
	}
}

// svg wraps the elements in an SVG document of w by h px titled title.
func (c *canvas) svg(w, h float64, title string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="%s" role="img">`+"\n",
		num(w), num(h), num(w), num(h), fontFamily)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(title))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%s" height="%s" fill="#ffffff"/>`+"\n", num(w), num(h))
	b.Write(c.b.Bytes())
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// axis maps data values to pixels, linearly or on a log10 scale.
type axis struct {
	log    bool
	lo, hi float64 // data range shown
	p0, p1 float64 // pixels of lo and hi
	ticks  []float64
}

func (a *axis) px(v float64) float64 {
	if a.log {
		return a.p0 + (math.Log10(v)-math.Log10(a.lo))/(math.Log10(a.hi)-math.Log10(a.lo))*(a.p1-a.p0)
	}
	return a.p0 + (v-a.lo)/(a.hi-a.lo)*(a.p1-a.p0)
}

// niceStep returns 1, 2 or 5 times a power of ten near raw.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f < 1.5:
		return p
	case f < 3:
		return 2 * p
	case f < 7:
		return 5 * p
	default:
		return 10 * p
	}
}

// valueAxis returns the axis of values in [min, max] (positive): on a log
// scale if allowLog and max > 10*min, else linear from 0 with about five
// nice ticks. A log axis spanning up to three decades runs between and
// ticks at 1, 2 and 5 times powers of ten; a longer one at powers of ten.
func valueAxis(min, max float64, allowLog bool) axis {
	if allowLog && min > 0 && max > 10*min {
		lo := math.Pow(10, math.Floor(math.Log10(min)))
		hi := math.Pow(10, math.Ceil(math.Log10(max)))
		a := axis{log: true, lo: lo, hi: hi}
		if math.Round(math.Log10(hi/lo)) > 3 {
			for t := lo; t <= hi*1.0001; t *= 10 {
				a.ticks = append(a.ticks, t)
			}
			return a
		}
		var ticks []float64
		for t := lo; t <= hi*1.0001; t *= 10 {
			ticks = append(ticks, t, 2*t, 5*t)
		}
		for _, t := range ticks {
			if t <= min*1.0001 {
				a.lo = t // the greatest tick at or below min
			}
		}
		for i := len(ticks) - 1; i >= 0; i-- {
			if ticks[i] >= max*0.9999 {
				a.hi = ticks[i] // the least tick at or above max
			}
		}
		for _, t := range ticks {
			if t >= a.lo*0.9999 && t <= a.hi*1.0001 {
				a.ticks = append(a.ticks, t)
			}
		}
		return a
	}
	if max <= 0 {
		max = 1
	}
	step := niceStep(max / 5)
	hi := math.Ceil(max*1.02/step) * step
	a := axis{lo: 0, hi: hi}
	for i := 0; float64(i)*step <= hi*(1+1e-9); i++ {
		a.ticks = append(a.ticks, float64(i)*step)
	}
	return a
}

// fmtTickNs formats a tick in nanoseconds as a short duration: 500 ns, 1 µs,
// 2.5 ms.
func fmtTickNs(ns float64) string {
	unit, v := "ns", ns
	switch {
	case ns >= 1e6:
		unit, v = "ms", ns/1e6
	case ns >= 1e3:
		unit, v = "µs", ns/1e3
	}
	return trimFloat(v) + " " + unit
}

// trimFloat formats v with at most 6 significant digits and no trailing
// zeros.
func trimFloat(v float64) string {
	s := strconv.FormatFloat(v, 'g', 6, 64)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		s = strconv.FormatFloat(f, 'f', -1, 64)
	}
	return s
}

// series is one line of a line chart or one colour of a bar chart.
type series struct {
	name string
	xs   []float64 // line charts: x of each point, ascending
	ys   []float64 // value of each point (bar charts: per category; NaN = none)
}

// lineChart is a chart of one line per series.
type lineChart struct {
	title, subtitle string
	xLabel, yLabel  string
	xTicks          []float64 // tick positions: the x values measured
	xFmt, yFmt      func(float64) string
	allowLog        bool
	series          []series
	// xFree places x, a percentage below 100, on a log scale of what is
	// left, 100 - x: 0, 90, 99 and 99.9% of a port range equally far apart.
	xFree bool
}

// legendWidth is the width of a legend of names.
func legendWidth(names []string) float64 {
	w := 0.0
	for _, n := range names {
		w = max(w, textWidth(n, fontLegend))
	}
	return 28 + 8 + w
}

// frame is the layout shared by both chart types.
type frame struct {
	c                        canvas
	w, h                     float64
	left, right, top, bottom float64 // the plot area
}

// newFrame lays out a chart whose plot area is at least plotW wide, with y tick
// labels up to yTickW wide, a legend of legend, and xLabelRows rows of x
// tick labels.
func newFrame(title, subtitle string, plotW, yTickW float64, legend []string, xLabelRows int) *frame {
	f := &frame{}
	f.left = edge + fontAxis + 10 + yTickW + 8
	f.top = 76
	f.w = f.left + plotW + 24 + legendWidth(legend) + edge
	// A title wider than that widens the plot rather than leaving a gap.
	f.w = max(f.w, edge+textWidth(title, fontTitle)+edge, edge+textWidth(subtitle, fontSub)+edge)
	f.right = f.w - edge - legendWidth(legend) - 24
	f.bottom = f.top + 280
	f.h = f.bottom + 18 + float64(xLabelRows-1)*14 + 28 + edge
	f.c.text(edge, 28, fontTitle, "start", title, true, false, "")
	f.c.text(edge, 48, fontSub, "start", subtitle, false, false, "#555555")
	return f
}

// yAxis draws the y axis a: grid lines, tick labels and the rotated label.
func (f *frame) yAxis(a *axis, label string, format func(float64) string) {
	for _, t := range a.ticks {
		y := a.px(t)
		f.c.line(f.left, y, f.right, y, "#e3e3e3", 1)
		f.c.text(f.left-8, y+fontTick*0.35, fontTick, "end", format(t), false, false, "")
	}
	f.c.line(f.left, f.top, f.left, f.bottom, "#333333", 1)
	f.c.line(f.left, f.bottom, f.right, f.bottom, "#333333", 1)
	f.c.text(edge+fontAxis, (f.top+f.bottom)/2, fontAxis, "middle", label, false, true, "")
}

// xLabel draws the x axis label below rows rows of tick labels.
func (f *frame) xLabel(label string, rows int) {
	f.c.text((f.left+f.right)/2, f.bottom+18+float64(rows-1)*14+24, fontAxis, "middle", label, false, false, "")
}

// legend draws one entry per name to the right of the plot; bars draws
// swatches instead of line samples.
func (f *frame) legend(names []string, bars bool) {
	x := f.right + 24
	for i, n := range names {
		y := f.top + 10 + float64(i)*22
		col := palette[i%len(palette)]
		if bars {
			f.c.rect(x+6, y-12, 16, 12, col)
		} else {
			f.c.line(x, y-4, x+28, y-4, col, 2.5)
			f.c.marker(markerOf(i), x+14, y-4, col)
		}
		f.c.text(x+36, y, fontLegend, "start", n, false, false, "")
	}
}

// maxTickWidth is the width of the widest tick label of a.
func maxTickWidth(a *axis, format func(float64) string) float64 {
	w := 0.0
	for _, t := range a.ticks {
		w = max(w, textWidth(format(t), fontTick))
	}
	return w
}

// dataRange returns the least and greatest finite positive values of ys.
func dataRange(ss []series) (lo, hi float64, ok bool) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, y := range s.ys {
			if y > 0 && !math.IsInf(y, 0) {
				lo, hi = min(lo, y), max(hi, y)
			}
		}
	}
	return lo, hi, lo <= hi
}

// valueAxisFor returns the value axis that fits every point of series, its
// label (marked when the scale is logarithmic) and the series' names for
// the legend.
func valueAxisFor(ss []series, allowLog bool, label string) (axis, string, []string) {
	lo, hi, ok := dataRange(ss)
	if !ok {
		lo, hi = 1, 1
	}
	ya := valueAxis(lo, hi, allowLog)
	if ya.log {
		label += ", log scale"
	}
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.name
	}
	return ya, label, names
}

// render draws the line chart.
func (lc *lineChart) render() []byte {
	ya, yLabel, names := valueAxisFor(lc.series, lc.allowLog, lc.yLabel)
	f := newFrame(lc.title, lc.subtitle, 480, maxTickWidth(&ya, lc.yFmt), names, 1)
	ya.p0, ya.p1 = f.bottom, f.top+6

	xs := slices.Clone(lc.xTicks)
	slices.Sort(xs)
	pos := func(x float64) float64 { return x }
	if lc.xFree {
		pos = func(x float64) float64 { return -math.Log10(100 - x) }
	}
	xa := axis{lo: pos(xs[0]), hi: pos(xs[len(xs)-1])}
	pad := (xa.hi - xa.lo) * 0.06
	if pad == 0 {
		pad = 1
	}
	xa.lo, xa.hi = xa.lo-pad, xa.hi+pad
	xa.p0, xa.p1 = f.left, f.right

	f.yAxis(&ya, yLabel, lc.yFmt)
	// x ticks, dropping any whose label would touch the previous one.
	lastRight := math.Inf(-1)
	for _, t := range xs {
		x := xa.px(pos(t))
		s := lc.xFmt(t)
		w := textWidth(s, fontTick)
		if x-w/2 < lastRight+6 {
			continue
		}
		lastRight = x + w/2
		f.c.line(x, f.bottom, x, f.bottom+5, "#333333", 1)
		f.c.line(x, f.top, x, f.bottom, "#f0f0f0", 1)
		f.c.text(x, f.bottom+18, fontTick, "middle", s, false, false, "")
	}
	f.xLabel(lc.xLabel, 1)

	// Lines, the headline's on top.
	for i := len(lc.series) - 1; i >= 0; i-- {
		s := lc.series[i]
		col := palette[i%len(palette)]
		var px, py []float64
		for j := range s.xs {
			if s.ys[j] > 0 && !math.IsInf(s.ys[j], 0) {
				px = append(px, xa.px(pos(s.xs[j])))
				py = append(py, ya.px(s.ys[j]))
			}
		}
		width := 2.0
		if i == 0 {
			width = 3
		}
		if len(px) > 1 {
			f.c.polyline(px, py, col, width)
		}
		for j := range px {
			f.c.marker(markerOf(i), px[j], py[j], col)
		}
	}
	f.legend(names, false)
	return f.c.svg(f.w, f.h, lc.title)
}

// barChart is a chart of one group of bars per category, a bar per series.
type barChart struct {
	title, subtitle string
	xLabel, yLabel  string
	categories      []string
	yFmt, valueFmt  func(float64) string
	allowLog        bool
	series          []series // ys[i] is the value for categories[i]
}

// wrapLabel splits a category label at '-' into lines no wider than w.
func wrapLabel(s string, w float64) []string {
	if textWidth(s, fontTick) <= w {
		return []string{s}
	}
	var lines []string
	cur := ""
	for _, part := range strings.SplitAfter(s, "-") {
		if cur != "" && textWidth(cur+part, fontTick) > w {
			lines = append(lines, cur)
			cur = ""
		}
		cur += part
	}
	return append(lines, cur)
}

// render draws the bar chart.
func (bc *barChart) render() []byte {
	ya, yLabel, names := valueAxisFor(bc.series, bc.allowLog, bc.yLabel)
	// Each bar is wide enough for its value label.
	barW := 24.0
	for _, s := range bc.series {
		for _, y := range s.ys {
			if !math.IsNaN(y) {
				barW = max(barW, textWidth(bc.valueFmt(y), fontValue)+6)
			}
		}
	}
	slot := barW*float64(len(bc.series)) + 24
	slot = max(slot, 140)
	rows := 1
	wrapped := make([][]string, len(bc.categories))
	for i, c := range bc.categories {
		wrapped[i] = wrapLabel(c, slot-10)
		rows = max(rows, len(wrapped[i]))
	}
	plotW := max(slot*float64(len(bc.categories)), 300)
	f := newFrame(bc.title, bc.subtitle, plotW, maxTickWidth(&ya, bc.yFmt), names, rows)
	slot = (f.right - f.left) / float64(len(bc.categories))
	rows = 1 // the plot may have grown: wrap again
	for i, c := range bc.categories {
		wrapped[i] = wrapLabel(c, slot-10)
		rows = max(rows, len(wrapped[i]))
	}
	ya.p0, ya.p1 = f.bottom, f.top+6
	f.yAxis(&ya, yLabel, bc.yFmt)
	for ci, lines := range wrapped {
		cx := f.left + slot*(float64(ci)+0.5)
		for li, l := range lines {
			f.c.text(cx, f.bottom+18+float64(li)*14, fontTick, "middle", l, false, false, "")
		}
		x0 := cx - barW*float64(len(bc.series))/2
		for si, s := range bc.series {
			v := s.ys[ci]
			if math.IsNaN(v) || v <= 0 {
				continue
			}
			top := ya.px(v)
			x := x0 + barW*float64(si)
			f.c.rect(x+2, top, barW-4, f.bottom-top, palette[si%len(palette)])
			f.c.text(x+barW/2, top-4, fontValue, "middle", bc.valueFmt(v), false, false, "")
		}
	}
	f.xLabel(bc.xLabel, rows)
	f.legend(names, true)
	return f.c.svg(f.w, f.h, bc.title)
}
