package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// report is every result of a benchmark output, by comparison.
type report struct {
	config  map[string]string // file configuration: goos, cpu, pkg and benchreport's own keys
	groups  []*groupData      // in the order of groupSpecs, only those with results
	ignored []string          // benchmark functions not in any comparison
}

// groupData is the results of one comparison.
type groupData struct {
	spec  *groupSpec
	impls []string // columns: spec.impls found, then others in first-seen order
	rows  []*row   // in first-seen order
}

// row is one benchmark configuration (one row of a table): everything in the
// name but the implementation.
type row struct {
	params []param // sub-name parts other than the implementation, in name order
	procs  int     // GOMAXPROCS: goroutines of a RunParallel benchmark
	cells  map[string]*cell
}

// param is one sub-name part: key=value, or a bare name with key "case".
type param struct{ key, value string }

// cell is the samples of one implementation in one row.
type cell struct {
	ns, allocs, bytes []float64 // per run; allocs and bytes empty without -benchmem
}

// parseReport reads benchmark output in the standard Go format.
func parseReport(r io.Reader, fileName string) (*report, error) {
	rep := &report{config: map[string]string{}}
	byGroup := map[*groupSpec]*groupData{}
	rowIndex := map[string]*row{}
	br := benchfmt.NewReader(r, fileName)
	for br.Scan() {
		switch rec := br.Result().(type) {
		case *benchfmt.SyntaxError:
			return nil, rec
		case *benchfmt.Result:
			for _, c := range rec.Config {
				if c.File {
					rep.config[c.Key] = strings.TrimSpace(string(c.Value))
				}
			}
			base, parts := rec.Name.Parts()
			g := groupByBench("Benchmark" + string(base))
			if g == nil {
				name := "Benchmark" + string(base)
				if !slices.Contains(rep.ignored, name) {
					rep.ignored = append(rep.ignored, name)
				}
				continue
			}
			sec, ok := rec.Value("sec/op")
			if !ok {
				file, line := rec.Pos()
				return nil, fmt.Errorf("%s:%d: %s has no ns/op", file, line, rec.Name)
			}
			rw := &row{procs: 1}
			impl := ""
			for _, p := range parts {
				s := string(p)
				if strings.HasPrefix(s, "-") {
					n, err := strconv.Atoi(s[1:])
					if err != nil {
						return nil, fmt.Errorf("%s: bad GOMAXPROCS suffix %q", rec.Name, s)
					}
					rw.procs = n
					continue
				}
				s = strings.TrimPrefix(s, "/")
				k, v, found := strings.Cut(s, "=")
				if !found {
					k, v = "case", s
				}
				if k == g.implKey {
					impl = v
					if k != "impl" {
						impl = k + "=" + v
					}
					continue
				}
				rw.params = append(rw.params, param{k, v})
			}
			if impl == "" {
				file, line := rec.Pos()
				return nil, fmt.Errorf("%s:%d: %s names no %s=", file, line, rec.Name, g.implKey)
			}
			gd := byGroup[g]
			if gd == nil {
				gd = &groupData{spec: g}
				byGroup[g] = gd
			}
			key := g.name + "\x00" + rw.key()
			if old := rowIndex[key]; old != nil {
				rw = old
			} else {
				rw.cells = map[string]*cell{}
				rowIndex[key] = rw
				gd.rows = append(gd.rows, rw)
			}
			c := rw.cells[impl]
			if c == nil {
				c = &cell{}
				rw.cells[impl] = c
				if !slices.Contains(gd.impls, impl) {
					gd.impls = append(gd.impls, impl)
				}
			}
			c.ns = append(c.ns, sec*1e9)
			if a, ok := rec.Value("allocs/op"); ok {
				c.allocs = append(c.allocs, a)
			}
			if b, ok := rec.Value("B/op"); ok {
				c.bytes = append(c.bytes, b)
			}
		}
	}
	if err := br.Err(); err != nil {
		return nil, err
	}
	for _, g := range groupSpecs {
		gd := byGroup[g]
		if gd == nil {
			continue
		}
		// Known implementations first, in the spec's order.
		var impls []string
		for _, i := range g.impls {
			if slices.Contains(gd.impls, i) {
				impls = append(impls, i)
			}
		}
		for _, i := range gd.impls {
			if !slices.Contains(impls, i) {
				impls = append(impls, i)
			}
		}
		gd.impls = impls
		rep.groups = append(rep.groups, gd)
	}
	return rep, nil
}

// key identifies a row within its group.
func (r *row) key() string {
	var b strings.Builder
	for _, p := range r.params {
		b.WriteString(p.key + "=" + p.value + "/")
	}
	b.WriteString(strconv.Itoa(r.procs))
	return b.String()
}

// param returns the value of the parameter key, or "".
func (r *row) param(key string) string {
	for _, p := range r.params {
		if p.key == key {
			return p.value
		}
	}
	return ""
}

// group returns the data of the comparison named name, or nil.
func (rep *report) group(name string) *groupData {
	for _, g := range rep.groups {
		if g.spec.name == name {
			return g
		}
	}
	return nil
}

// median returns the median of v, which must not be empty.
func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// nsPerOp is the median ns/op of the cell.
func (c *cell) nsPerOp() float64 { return median(c.ns) }

// allocsPerOp is the median allocs/op of the cell, if recorded.
func (c *cell) allocsPerOp() (float64, bool) {
	if len(c.allocs) == 0 {
		return 0, false
	}
	return median(c.allocs), true
}

// fastest returns the implementation of the row with the lowest median
// ns/op among impls (all of the row's if impls is nil) other than except,
// and that ns/op; "" if there is none.
func (r *row) fastest(impls []string, except string) (string, float64) {
	best, bestNs := "", 0.0
	for _, i := range impls {
		c := r.cells[i]
		if c == nil || i == except {
			continue
		}
		if ns := c.nsPerOp(); best == "" || ns < bestNs {
			best, bestNs = i, ns
		}
	}
	return best, bestNs
}

// headline returns the ratio of the headline implementation's ns/op to that
// of its fastest peer in the row (below 1: the headline is faster), and the
// peer; ok is false if either is missing. The headline's own variants are
// not its peers.
func (gd *groupData) headline(r *row) (ratio float64, peer string, ok bool) {
	h := r.cells[gd.spec.headline()]
	if h == nil {
		return 0, "", false
	}
	others := slices.DeleteFunc(slices.Clone(gd.impls), func(i string) bool { return slices.Contains(gd.spec.variants, i) })
	peer, peerNs := r.fastest(others, gd.spec.headline())
	if peer == "" || peerNs == 0 {
		return 0, "", false
	}
	return h.nsPerOp() / peerNs, peer, true
}

// machine describes the machine the results were taken on, from the
// benchmark header and benchreport's own configuration lines.
func (rep *report) machine() string {
	var parts []string
	if cpu := rep.config["cpu"]; cpu != "" {
		parts = append(parts, cpu)
	}
	if goos, goarch := rep.config["goos"], rep.config["goarch"]; goos != "" && goarch != "" {
		parts = append(parts, goos+"/"+goarch)
	}
	procs := rep.config["gomaxprocs"]
	if procs == "" {
		// Not recorded: the largest GOMAXPROCS of a result.
		most := 0
		for _, g := range rep.groups {
			for _, r := range g.rows {
				most = max(most, r.procs)
			}
		}
		if most > 0 {
			procs = strconv.Itoa(most)
		}
	}
	if procs != "" {
		parts = append(parts, "GOMAXPROCS "+procs)
	}
	if v := rep.config["go-version"]; v != "" {
		parts = append(parts, v)
	}
	if len(parts) == 0 {
		return "unknown machine"
	}
	return strings.Join(parts, ", ")
}

// runs is the number of runs of each benchmark: the most samples of a cell.
func (rep *report) runs() int {
	n := 0
	for _, g := range rep.groups {
		for _, r := range g.rows {
			for _, c := range r.cells {
				n = max(n, len(c.ns))
			}
		}
	}
	return n
}
