package main

import (
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// chartFile is one rendered chart.
type chartFile struct {
	group string // the comparison charted
	name  string // file name in the output directory
	alt   string // alternative text: the chart's title
	svg   []byte
}

var unsafeFileRE = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// fileSafe makes s usable in a file name.
func fileSafe(s string) string { return unsafeFileRE.ReplaceAllString(s, "_") }

// subtitle is the line under a chart's title: how many runs, and where.
func (rep *report) subtitle(extra string) string {
	parts := []string{}
	if extra != "" {
		parts = append(parts, extra)
	}
	if n := rep.runs(); n > 1 {
		parts = append(parts, "median of "+strconv.Itoa(n)+" runs")
	}
	parts = append(parts, rep.machine())
	return strings.Join(parts, " · ")
}

// charts renders every chart of the report: throughput against goroutines
// per size of each sized comparison, Connect time against occupancy per
// policy, and the other comparisons as bars per case.
func charts(rep *report) []chartFile {
	var out []chartFile
	for _, gd := range rep.groups {
		switch {
		case gd.spec.sized:
			out = append(out, throughputCharts(rep, gd)...)
		case gd.spec.xKey != "":
			out = append(out, xKeyCharts(rep, gd)...)
		default:
			out = append(out, barCharts(rep, gd)...)
		}
	}
	return out
}

// restKey joins the row's parameters other than skip, as key=value pairs
// separated by sep.
func restKey(r *row, skip, sep string) string {
	var parts []string
	for _, p := range r.params {
		if p.key != skip {
			parts = append(parts, p.key+"="+p.value)
		}
	}
	return strings.Join(parts, sep)
}

// throughputCharts charts a sized comparison: one chart per size (and per
// other parameter, if any), x = goroutines, y = million ops/s, a line per
// implementation.
func throughputCharts(rep *report, gd *groupData) []chartFile {
	var keys []string
	byKey := map[string][]*row{}
	for _, r := range gd.rows {
		k := restKey(r, "", "/")
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], r)
	}
	var out []chartFile
	for _, k := range keys {
		rows := byKey[k]
		slices.SortFunc(rows, func(a, b *row) int { return a.procs - b.procs })
		lc := &lineChart{
			xLabel:   "goroutines (GOMAXPROCS)",
			yLabel:   "throughput (million ops/s)",
			xFmt:     func(v float64) string { return strconv.Itoa(int(v)) },
			yFmt:     trimFloat,
			allowLog: false,
		}
		what, file := k, strings.ReplaceAll(k, "/", "-")
		if n := rows[0].param("n"); n != "" && len(rows[0].params) == 1 {
			what, file = n+" entries", n
		}
		lc.title = gd.spec.title + ", " + what
		lc.subtitle = rep.subtitle("ops/s summed over all goroutines")
		for _, r := range rows {
			if !slices.Contains(lc.xTicks, float64(r.procs)) {
				lc.xTicks = append(lc.xTicks, float64(r.procs))
			}
		}
		for _, impl := range gd.impls {
			s := series{name: impl}
			for _, r := range rows {
				if c := r.cells[impl]; c != nil {
					s.xs = append(s.xs, float64(r.procs))
					s.ys = append(s.ys, 1e3/c.nsPerOp()) // million ops/s
				}
			}
			lc.series = append(lc.series, s)
		}
		out = append(out, chartFile{
			group: gd.spec.name,
			name:  "throughput-" + gd.spec.name + "-" + fileSafe(file) + ".svg",
			alt:   lc.title,
			svg:   lc.render(),
		})
	}
	return out
}

// xKeyCharts charts a comparison against its x parameter (Connect's
// occupancy): one chart per value of the other parameters (the policy),
// y = time per op, a line per implementation. Rows at other than the
// highest GOMAXPROCS are left out.
func xKeyCharts(rep *report, gd *groupData) []chartFile {
	procs := 0
	for _, r := range gd.rows {
		procs = max(procs, r.procs)
	}
	var keys []string
	byKey := map[string][]*row{}
	for _, r := range gd.rows {
		if r.procs != procs {
			continue
		}
		k := restKey(r, gd.spec.xKey, ", ")
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], r)
	}
	var out []chartFile
	for _, k := range keys {
		type point struct {
			x float64
			r *row
		}
		var pts []point
		for _, r := range byKey[k] {
			x, err := strconv.ParseFloat(strings.TrimSuffix(r.param(gd.spec.xKey), "%"), 64)
			if err == nil {
				pts = append(pts, point{x, r})
			}
		}
		if len(pts) == 0 {
			continue
		}
		slices.SortFunc(pts, func(a, b point) int {
			if a.x < b.x {
				return -1
			} else if a.x > b.x {
				return 1
			}
			return 0
		})
		unit := ""
		if strings.HasSuffix(pts[0].r.param(gd.spec.xKey), "%") {
			unit = "%"
		}
		lc := &lineChart{
			xLabel:   gd.spec.xKey + " of the port range (" + unit + ")",
			yLabel:   "time per op (Connect + Delete)",
			xFmt:     func(v float64) string { return trimFloat(v) + unit },
			yFmt:     fmtTickNs,
			allowLog: true,
		}
		if unit == "" {
			lc.xLabel = gd.spec.xKey
		} else if pts[len(pts)-1].x < 100 && pts[0].x >= 0 {
			// Percentages below 100: on a log scale of the share left
			// free (a port in 10, 100 or 1000 at 90, 99 and 99.9%), so
			// that the occupancies near full stand apart.
			lc.xFree = true
			lc.xLabel = gd.spec.xKey + " of the port range (log scale of the share left free)"
		}
		lc.title = gd.spec.title
		file := gd.spec.name
		if k != "" {
			lc.title += " (" + k + ")"
			var vals []string
			for _, p := range pts[0].r.params {
				if p.key != gd.spec.xKey {
					vals = append(vals, p.value)
				}
			}
			file += "-" + fileSafe(strings.Join(vals, "-"))
		}
		lc.subtitle = rep.subtitle("one goroutine")
		for _, p := range pts {
			if !slices.Contains(lc.xTicks, p.x) {
				lc.xTicks = append(lc.xTicks, p.x)
			}
		}
		for _, impl := range gd.impls {
			s := series{name: impl}
			for _, p := range pts {
				if c := p.r.cells[impl]; c != nil {
					s.xs = append(s.xs, p.x)
					s.ys = append(s.ys, c.nsPerOp())
				}
			}
			lc.series = append(lc.series, s)
		}
		out = append(out, chartFile{group: gd.spec.name, name: file + ".svg", alt: lc.title, svg: lc.render()})
	}
	return out
}

// barCharts charts a comparison without sizes or an x parameter (UDP,
// sharing, the traffic benchmarks) as bars: a group per case, a bar per
// implementation, y = time per op.
func barCharts(rep *report, gd *groupData) []chartFile {
	procs := 0
	for _, r := range gd.rows {
		procs = max(procs, r.procs)
	}
	bc := &barChart{
		title:    gd.spec.title,
		subtitle: rep.subtitle("one goroutine"),
		xLabel:   "kind of packet (see the table)",
		yLabel:   "time per op",
		yFmt:     fmtTickNs,
		valueFmt: fmtNs,
		allowLog: true,
	}
	switch gd.spec.name {
	case "udp":
		bc.xLabel = "kind of packet"
		bc.yLabel = "time per lookup"
	case "sharing":
		bc.subtitle = rep.subtitle(strconv.Itoa(procs) + " goroutines")
		bc.xLabel = "entries, implementation"
		bc.yLabel = "time per delete+insert"
	case "turnover", "zipf", "natmix", "uniform", "writes", "burst":
		bc.subtitle = rep.subtitle(strconv.Itoa(procs) + " goroutines")
		var heads []string
		for _, k := range gd.paramKeys() {
			heads = append(heads, paramHeader(k))
		}
		bc.xLabel = strings.Join(heads, ", ")
	}
	var rows []*row
	for _, r := range gd.rows {
		if r.procs == procs {
			rows = append(rows, r)
			vals := make([]string, len(r.params))
			for i, p := range r.params {
				vals[i] = p.value
			}
			bc.categories = append(bc.categories, strings.Join(vals, ", "))
		}
	}
	if len(rows) == 0 {
		return nil
	}
	for _, impl := range gd.impls {
		s := series{name: impl}
		for _, r := range rows {
			v := math.NaN()
			if c := r.cells[impl]; c != nil {
				v = c.nsPerOp()
			}
			s.ys = append(s.ys, v)
		}
		bc.series = append(bc.series, s)
	}
	return []chartFile{{group: gd.spec.name, name: gd.spec.name + ".svg", alt: bc.title, svg: bc.render()}}
}
