package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgText is a text element of an SVG and its estimated bounding box.
type svgText struct {
	s                      string
	size                   float64
	x0, y0, x1, y1         float64
	rotated                bool
	anchorX, anchorY, grow float64
}

var rotateRE = regexp.MustCompile(`^rotate\(-90 ([-0-9.]+) ([-0-9.]+)\)$`)

// parseSVG checks that data is a well-formed SVG document and returns its
// size and text elements with bounding boxes estimated from font size and
// text length (textWidth), ascent 0.8 and descent 0.25 of the font size.
func parseSVG(data []byte) (w, h float64, texts []svgText, err error) {
	d := xml.NewDecoder(bytes.NewReader(data))
	depth := 0
	var cur *svgText
	var chars strings.Builder
	sawRoot := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, 0, nil, err
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range tok.Attr {
				attr[a.Name.Local] = a.Value
			}
			if depth == 0 {
				if tok.Name.Local != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg" {
					return 0, 0, nil, fmt.Errorf("root element %v", tok.Name)
				}
				sawRoot = true
				if w, err = strconv.ParseFloat(attr["width"], 64); err != nil {
					return 0, 0, nil, fmt.Errorf("width: %v", err)
				}
				if h, err = strconv.ParseFloat(attr["height"], 64); err != nil {
					return 0, 0, nil, fmt.Errorf("height: %v", err)
				}
				if attr["viewBox"] != fmt.Sprintf("0 0 %s %s", attr["width"], attr["height"]) {
					return 0, 0, nil, fmt.Errorf("viewBox %q", attr["viewBox"])
				}
			}
			depth++
			if tok.Name.Local == "text" {
				if cur != nil {
					return 0, 0, nil, errors.New("nested text")
				}
				cur = &svgText{}
				x, errX := strconv.ParseFloat(attr["x"], 64)
				y, errY := strconv.ParseFloat(attr["y"], 64)
				size, errS := strconv.ParseFloat(attr["font-size"], 64)
				if err := errors.Join(errX, errY, errS); err != nil {
					return 0, 0, nil, fmt.Errorf("text attributes %v: %v", attr, err)
				}
				cur.anchorX, cur.anchorY, cur.size = x, y, size
				switch attr["text-anchor"] {
				case "start":
					cur.grow = 0
				case "middle":
					cur.grow = 0.5
				case "end":
					cur.grow = 1
				default:
					return 0, 0, nil, fmt.Errorf("text-anchor %q", attr["text-anchor"])
				}
				if tr := attr["transform"]; tr != "" {
					m := rotateRE.FindStringSubmatch(tr)
					if m == nil || m[1] != attr["x"] || m[2] != attr["y"] {
						return 0, 0, nil, fmt.Errorf("transform %q", tr)
					}
					cur.rotated = true
				}
				chars.Reset()
			}
		case xml.CharData:
			if cur != nil {
				chars.Write(tok)
			}
		case xml.EndElement:
			depth--
			if tok.Name.Local == "text" {
				cur.s = chars.String()
				tw := textWidth(cur.s, cur.size)
				// Along the text: from -grow*tw to (1-grow)*tw; across it:
				// from -0.8*size (ascent) to 0.25*size (descent).
				a, b := -cur.grow*tw, (1-cur.grow)*tw
				up, down := -0.8*cur.size, 0.25*cur.size
				if cur.rotated {
					// rotate(-90) maps (dx, dy) to (dy, -dx).
					cur.x0, cur.x1 = cur.anchorX+up, cur.anchorX+down
					cur.y0, cur.y1 = cur.anchorY-b, cur.anchorY-a
				} else {
					cur.x0, cur.x1 = cur.anchorX+a, cur.anchorX+b
					cur.y0, cur.y1 = cur.anchorY+up, cur.anchorY+down
				}
				texts = append(texts, *cur)
				cur = nil
			}
		}
	}
	if !sawRoot {
		return 0, 0, nil, errors.New("no root element")
	}
	return w, h, texts, nil
}

// overlaps returns the pairs of texts whose boxes intersect, and the texts
// reaching outside the w by h canvas.
func overlaps(w, h float64, texts []svgText) []string {
	var bad []string
	for i, a := range texts {
		if a.x0 < 0 || a.y0 < 0 || a.x1 > w || a.y1 > h {
			bad = append(bad, fmt.Sprintf("%q [%.0f,%.0f]-[%.0f,%.0f] leaves the %.0fx%.0f canvas", a.s, a.x0, a.y0, a.x1, a.y1, w, h))
		}
		for _, b := range texts[i+1:] {
			if a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1 {
				bad = append(bad, fmt.Sprintf("%q overlaps %q", a.s, b.s))
			}
		}
	}
	return bad
}

func textSet(texts []svgText) []string {
	s := make([]string, len(texts))
	for i, t := range texts {
		s[i] = t.s
	}
	return s
}

// checkChart checks a chart: valid SVG, no overlapping text, the title, the
// axis labels and a legend entry per implementation.
func checkChart(t *testing.T, c chartFile, want ...string) {
	t.Helper()
	w, h, texts, err := parseSVG(c.svg)
	if err != nil {
		t.Errorf("%s: invalid SVG: %v", c.name, err)
		return
	}
	if w < 300 || h < 200 || w > 2000 || h > 1200 {
		t.Errorf("%s: size %vx%v", c.name, w, h)
	}
	for _, o := range overlaps(w, h, texts) {
		t.Errorf("%s: %s", c.name, o)
	}
	have := textSet(texts)
	for _, s := range append([]string{c.alt}, want...) {
		if !slices.Contains(have, s) {
			t.Errorf("%s: no text %q in %q", c.name, s, have)
		}
	}
}

// chartNames returns the file names of cs.
func chartNames(cs []chartFile) []string {
	var names []string
	for _, c := range cs {
		names = append(names, c.name)
	}
	return names
}

func TestChartsRecorded(t *testing.T) {
	rep := recorded(t)
	cs := charts(rep)
	names := chartNames(cs)
	wantNames := []string{
		"throughput-lookup-1K.svg", "throughput-lookup-1M.svg",
		"throughput-mixed-1K.svg", "throughput-mixed-1M.svg",
		"throughput-churn-1K.svg", "throughput-churn-1M.svg",
		"throughput-batch-1K.svg", "throughput-batch-1M.svg", "sharing.svg",
		"connect-flat.svg", "connect-odd-even.svg", "udp.svg",
	}
	if !slices.Equal(names, wantNames) {
		t.Fatalf("charts %q, want %q", names, wantNames)
	}
	for _, c := range cs {
		gd := rep.group(c.group)
		want := slices.Clone(gd.impls)
		switch {
		case strings.HasPrefix(c.name, "throughput-"):
			want = append(want, "goroutines (GOMAXPROCS)", "throughput (million ops/s)", "1", "2")
		case strings.HasPrefix(c.name, "connect-"):
			want = append(want, "occupancy of the port range (log scale of the share left free)", "time per op (Connect + Delete), log scale", "0%", "50%")
		case c.name == "udp.svg":
			want = append(want, "kind of packet", "time per lookup, log scale", "connected", "2.94 µs", "55.7 ns")
		case c.name == "sharing.svg":
			want = append(want, "entries, implementation", "1K, hash4", "1K, xsync", "211 ns", "58.7 ns", "time per delete+insert")
		}
		checkChart(t, c, want...)
	}
	// connect-flat has ticks at every occupancy, 90, 99 and 99.9%
	// included, in order from left to right.
	i := slices.IndexFunc(cs, func(c chartFile) bool { return c.name == "connect-flat.svg" })
	_, _, texts, _ := parseSVG(cs[i].svg)
	last := math.Inf(-1)
	for _, s := range []string{"0%", "50%", "90%", "99%", "99.9%"} {
		j := slices.IndexFunc(texts, func(t svgText) bool { return t.s == s })
		if j < 0 {
			t.Errorf("connect-flat.svg lacks tick %q", s)
			continue
		}
		if texts[j].anchorX <= last {
			t.Errorf("connect-flat.svg: tick %q at x %v, not right of the one before (%v)", s, texts[j].anchorX, last)
		}
		last = texts[j].anchorX
	}
}

// The traffic benchmarks are charted as bars at GOMAXPROCS, a group per
// row of the table.
func TestChartsTraffic(t *testing.T) {
	rep := recordedTraffic(t)
	cs := charts(rep)
	names := chartNames(cs)
	if want := []string{"turnover.svg", "zipf.svg", "natmix.svg", "uniform.svg", "writes.svg", "burst.svg"}; !slices.Equal(names, want) {
		t.Fatalf("charts %q, want %q", names, want)
	}
	for _, c := range cs {
		want := append(slices.Clone(rep.group(c.group).impls), "time per op", rep.subtitle("2 goroutines"))
		switch c.name {
		case "burst.svg":
			// hash4-batch uniform and nat: 45.09 and 29.89 ns.
			want = append(want, "entries, mix", "1M, uniform", "1M, nat", "45.1 ns", "29.9 ns")
		case "zipf.svg":
			want = append(want, "entries", "1M", "60.5 ns", "150 ns")
		}
		checkChart(t, c, want...)
	}
}

// On the scale of the share free, 0, 90, 99 and 99.9% stand equally far
// apart.
func TestChartsFreeScale(t *testing.T) {
	lc := &lineChart{
		title: "t", subtitle: "s", xLabel: "occupancy", yLabel: "time",
		xTicks: []float64{0, 50, 90, 99, 99.9}, xFree: true,
		xFmt: func(v float64) string { return trimFloat(v) + "%" }, yFmt: fmtTickNs, allowLog: true,
		series: []series{{name: "a", xs: []float64{0, 50, 90, 99, 99.9}, ys: []float64{100, 200, 300, 1000, 10000}}},
	}
	c := chartFile{name: "free", alt: "t", svg: lc.render()}
	checkChart(t, c, "0%", "50%", "90%", "99%", "99.9%")
	_, _, texts, _ := parseSVG(c.svg)
	x := map[string]float64{}
	for _, tx := range texts {
		x[tx.s] = tx.anchorX
	}
	gap := x["90%"] - x["0%"]
	if gap <= 0 || math.Abs(x["99%"]-x["90%"]-gap) > 0.2 || math.Abs(x["99.9%"]-x["99%"]-gap) > 0.2 {
		t.Errorf("ticks at x %v: want 0, 90, 99 and 99.9%% equally far apart", x)
	}
	if x["50%"] <= x["0%"] || x["50%"] >= x["90%"] {
		t.Errorf("50%% at x %v, not between 0 and 90%%", x["50%"])
	}
}

// Charts stay readable with many goroutine counts, long names and values
// spanning many decades.
func TestChartsStress(t *testing.T) {
	lc := &lineChart{
		title: "A long title of a chart with many goroutine counts", subtitle: "subtitle",
		xLabel: "goroutines", yLabel: "time per op",
		xFmt: func(v float64) string { return strconv.Itoa(int(v)) }, yFmt: fmtTickNs, allowLog: true,
	}
	for i := 1; i <= 64; i++ {
		lc.xTicks = append(lc.xTicks, float64(i))
	}
	for i, name := range []string{"hash4", "a-rather-long-implementation-name", "c", "d", "e", "f", "g", "h", "i"} {
		s := series{name: name}
		for _, x := range lc.xTicks {
			s.xs = append(s.xs, x)
			s.ys = append(s.ys, math.Pow(10, float64(i%6))*x)
		}
		lc.series = append(lc.series, s)
	}
	checkChart(t, chartFile{name: "stress-line", alt: lc.title, svg: lc.render()}, "goroutines", "time per op, log scale", "1", "hash4")

	bc := &barChart{
		title: "bars", subtitle: "subtitle", xLabel: "case", yLabel: "time",
		categories: []string{"a-very-long-category-name-that-wraps", "b", "c", "d", "e"},
		yFmt:       fmtTickNs, valueFmt: fmtNs, allowLog: false,
	}
	for i, name := range []string{"x=on", "x=off", "third"} {
		s := series{name: name}
		for j := range bc.categories {
			v := 1000.0 + float64(i*j)*1.5
			if i == 2 && j == 1 {
				v = math.NaN()
			}
			s.ys = append(s.ys, v)
		}
		bc.series = append(bc.series, s)
	}
	checkChart(t, chartFile{name: "stress-bar", alt: "bars", svg: bc.render()}, "case", "time", "x=on", "third", "b")
}

// The overlap check finds overlaps: two texts at one spot, a rotated text
// across a horizontal one, and a text off the canvas.
func TestOverlapCheck(t *testing.T) {
	var c canvas
	c.text(100, 100, 12, "start", "first label", false, false, "")
	c.text(130, 104, 12, "middle", "second", false, false, "")
	c.text(300, 100, 12, "middle", "rotated label", false, true, "")
	c.text(280, 90, 12, "start", "crossed", false, false, "")
	c.text(395, 50, 12, "start", "off the edge", false, false, "")
	c.text(200, 300, 12, "end", "alone", false, false, "")
	w, h, texts, err := parseSVG(c.svg(400, 400, "t"))
	if err != nil {
		t.Fatal(err)
	}
	got := overlaps(w, h, texts)
	want := []string{
		`"first label" overlaps "second"`,
		`"rotated label" overlaps "crossed"`,
		`"off the edge" [395,40]-[471,53] leaves the 400x400 canvas`,
	}
	if len(got) != len(want) {
		t.Fatalf("overlaps %q, want %q", got, want)
	}
	for _, s := range want {
		if !slices.Contains(got, s) {
			t.Errorf("overlaps %q lack %q", got, s)
		}
	}
}

func TestParseSVGRejects(t *testing.T) {
	for _, in := range []string{
		`<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" viewBox="0 0 10 10"><text`,
		`<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" viewBox="0 0 10 10"><g></svg>`,
		`<html></html>`,
		``,
	} {
		if _, _, _, err := parseSVG([]byte(in)); err == nil {
			t.Errorf("parseSVG accepted %q", in)
		}
	}
}

func TestValueAxis(t *testing.T) {
	for _, tc := range []struct {
		min, max float64
		log      bool
		ticks    string
	}{
		{11.6, 42, true, "0 10 20 30 40 50"},                     // within 10x: linear from 0
		{11.6, 42, false, "0 10 20 30 40 50"},                    //
		{0.3, 0.9, false, "0 0.2 0.4 0.6 0.8 1"},                 //
		{396, 10900, true, "200 500 1000 2000 5000 10000 20000"}, // log, 1-2-5 ticks
		{30.2, 2943, true, "20 50 100 200 500 1000 2000 5000"},   //
		{30, 1e6, true, "10 100 1000 10000 100000 1e+06"},        // > 3 decades: decades
		{5, 5, true, "0 1 2 3 4 5 6"},                            // one value
	} {
		a := valueAxis(tc.min, tc.max, tc.log)
		var ticks []string
		for _, v := range a.ticks {
			ticks = append(ticks, strconv.FormatFloat(v, 'g', 6, 64))
		}
		if got := strings.Join(ticks, " "); got != tc.ticks {
			t.Errorf("valueAxis(%v, %v, %v) ticks %s, want %s", tc.min, tc.max, tc.log, got, tc.ticks)
		}
		if a.ticks[0] > tc.min || a.ticks[len(a.ticks)-1] < tc.max || a.lo != a.ticks[0] || a.hi != a.ticks[len(a.ticks)-1] {
			t.Errorf("valueAxis(%v, %v, %v) = [%v, %v] with ticks %v", tc.min, tc.max, tc.log, a.lo, a.hi, a.ticks)
		}
	}
}

func TestFmtTickNs(t *testing.T) {
	for _, tc := range []struct {
		ns   float64
		want string
	}{{0, "0 ns"}, {200, "200 ns"}, {1000, "1 µs"}, {1200, "1.2 µs"}, {2500, "2.5 µs"}, {20000, "20 µs"}, {1e6, "1 ms"}} {
		if got := fmtTickNs(tc.ns); got != tc.want {
			t.Errorf("fmtTickNs(%v) = %q, want %q", tc.ns, got, tc.want)
		}
	}
}

func TestEscaping(t *testing.T) {
	var c canvas
	c.text(10, 20, 12, "start", `a<b & "c"`, false, false, "")
	_, _, texts, err := parseSVG(c.svg(100, 100, "x & y"))
	if err != nil {
		t.Fatal(err)
	}
	if len(texts) != 1 || texts[0].s != `a<b & "c"` {
		t.Errorf("texts %q", textSet(texts))
	}
}
