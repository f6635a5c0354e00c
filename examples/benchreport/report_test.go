package main

import (
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/bench.golden.md")

// recorded is testdata/bench.txt, the output of
//
//	go test -run '^$' -bench '^Benchmark(Lookup|Mixed|Churn)$/^n=(1K|1M)$' -benchtime 50ms -count 2 -cpu 1,2 -benchmem
//
// and of Connect (policy flat, and odd-even at 0 and 50%; hash4 and xsync
// from bench/, scan, rehash and locked from the root package) and
// UDPLookup with the same flags but -cpu, on a 2-core machine.
func recorded(t *testing.T) *report { return parseTestdata(t, "bench.txt") }

// recordedTraffic is testdata/traffic.txt, written by hand in the format of
// the output of
//
//	go run ./examples/benchreport -groups turnover,zipf,natmix,uniform,writes,burst -count 2
//
// on a 2-core machine: a process per implementation, in two rounds. Its
// numbers are made up.
func recordedTraffic(t *testing.T) *report { return parseTestdata(t, "traffic.txt") }

// parseTestdata parses the benchmark output testdata/name.
func parseTestdata(t *testing.T, name string) *report {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := parseReport(f, name)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

// findRow returns the row of gd with the given parameters and procs.
func findRow(t *testing.T, gd *groupData, procs int, params ...string) *row {
	t.Helper()
next:
	for _, r := range gd.rows {
		if r.procs != procs || len(r.params) != len(params) {
			continue
		}
		for i, p := range params {
			if r.params[i].key+"="+r.params[i].value != p {
				continue next
			}
		}
		return r
	}
	t.Fatalf("%s: no row %v at %d procs", gd.spec.name, params, procs)
	return nil
}

// reportGroups joins the names of the groups of rep with commas.
func reportGroups(rep *report) string {
	var names []string
	for _, gd := range rep.groups {
		names = append(names, gd.spec.name)
	}
	return strings.Join(names, ",")
}

func TestParseRecorded(t *testing.T) {
	rep := recorded(t)
	if got := reportGroups(rep); got != "lookup,mixed,churn,batch,sharing,connect,udp" {
		t.Fatalf("groups %s", got)
	}
	if len(rep.ignored) != 0 {
		t.Errorf("ignored %v", rep.ignored)
	}
	if got := rep.machine(); got != "Oxide Virtual Turin-like Processor, linux/amd64, GOMAXPROCS 2" {
		t.Errorf("machine %q", got)
	}
	if got := rep.runs(); got != 2 {
		t.Errorf("runs %d, want 2", got)
	}

	lookup := rep.group("lookup")
	if got := strings.Join(lookup.impls, ","); got != "hash4,syncmap,xsync,rwmutex" {
		t.Errorf("lookup impls %s", got)
	}
	if len(lookup.rows) != 4 { // 2 sizes x 2 cpus
		t.Errorf("lookup has %d rows, want 4", len(lookup.rows))
	}
	r := findRow(t, lookup, 2, "n=1K")
	// BenchmarkLookup/n=1K/impl=hash4-2: 43.99 and 43.98 ns/op.
	if c := r.cells["hash4"]; len(c.ns) != 2 || !near(c.nsPerOp(), (43.99+43.98)/2) {
		t.Errorf("lookup 1K/2 hash4 samples %v", c.ns)
	}
	// xsync: 24.00 and 23.63, the fastest of the row.
	if impl, ns := r.fastest(lookup.impls, ""); impl != "xsync" || !near(ns, (24.00+23.63)/2) {
		t.Errorf("fastest %s %v", impl, ns)
	}
	ratio, peer, ok := lookup.headline(r)
	if !ok || peer != "xsync" || !near(ratio, ((43.99+43.98)/2)/((24.00+23.63)/2)) {
		t.Errorf("headline %v %s %v", ratio, peer, ok)
	}
	r1 := findRow(t, lookup, 1, "n=1M")
	if r1.cells["hash4"] == nil || r1.procs != 1 {
		t.Errorf("a name without -N is GOMAXPROCS 1")
	}

	// BenchmarkChurn/n=1M/impl=syncmap (GOMAXPROCS 1): 1206 and 1357 ns/op,
	// 2 allocs/op.
	c := findRow(t, rep.group("churn"), 1, "n=1M").cells["syncmap"]
	if !near(c.nsPerOp(), (1206+1357)/2.0) {
		t.Errorf("churn 1M syncmap %v", c.ns)
	}
	if a, ok := c.allocsPerOp(); !ok || a != 2 {
		t.Errorf("churn 1M syncmap allocs %v %v", a, ok)
	}

	connect := rep.group("connect")
	if got := strings.Join(connect.impls, ","); got != "hash4,scan,rehash,locked,xsync" {
		t.Errorf("connect impls %s", got)
	}
	if len(connect.rows) != 7 { // flat x 5 occupancies, odd-even x 2
		t.Errorf("connect has %d rows, want 7", len(connect.rows))
	}
	findRow(t, connect, 2, "policy=odd-even", "occupancy=50%")
	// Both packages' results in one row: hash4 from bench/, scan from
	// the root.
	if r := findRow(t, connect, 2, "policy=flat", "occupancy=99.9%"); r.cells["hash4"] == nil || r.cells["scan"] == nil {
		t.Errorf("connect flat 99.9%% cells %v", r.cells)
	}

	sharing := rep.group("sharing")
	if got := strings.Join(sharing.impls, ","); got != "tables=shared,tables=own" {
		t.Errorf("sharing impls %s", got)
	}
	// hash4 shared: 211.0, 211.6; own: 58.94, 58.53.
	s := findRow(t, sharing, 2, "n=1K", "impl=hash4")
	ratio, peer, ok = sharing.headline(s)
	if !ok || peer != "tables=own" || !near(ratio, ((211.0+211.6)/2)/((58.94+58.53)/2)) {
		t.Errorf("sharing headline %v %s %v", ratio, peer, ok)
	}

	udp := rep.group("udp")
	if got := strings.Join(udp.impls, ","); got != "hash4=on,hash4=off" {
		t.Errorf("udp impls %s", got)
	}
	u := findRow(t, udp, 2, "case=connected")
	// on: 54.06, 57.27; off: 2998, 2889.
	ratio, peer, ok = udp.headline(u)
	if !ok || peer != "hash4=off" || !near(ratio, ((54.06+57.27)/2)/((2998+2889)/2.0)) {
		t.Errorf("udp headline %v %s %v", ratio, peer, ok)
	}
}

func TestMarkdownRecorded(t *testing.T) {
	rep := recorded(t)
	md := markdown(rep, charts(rep))
	golden := filepath.Join("testdata", "bench.golden.md")
	if *update {
		if err := os.WriteFile(golden, []byte(md), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if md != string(want) {
		t.Errorf("markdown differs from %s (go test -update to accept):\n%s", golden, md)
	}

	// Targeted checks, independent of the golden file.
	for _, s := range []string{
		"- **Machine:** Oxide Virtual Turin-like Processor, linux/amd64, GOMAXPROCS 2\n",
		"the median of 2 runs",
		"| entries | goroutines | hash4 | syncmap | xsync | rwmutex | hash4 vs fastest peer |\n",
		// Lookup 1K at 2 goroutines: hash4 44.0 ns, xsync 23.8 ns is the
		// fastest; 43.985/23.815 = 1.85.
		"| 1K | 2 | 44.0 ns (1.85×, 0 allocs) | 34.9 ns (1.47×, 0 allocs) | **23.8 ns** (1.00×, 0 allocs) | 45.8 ns (1.92×, 0 allocs) | 1.85× slower than xsync |\n",
		"| policy | occupancy | hash4 | scan | rehash | locked | xsync | hash4 vs fastest peer |\n",
		// UDP connected: 55.665 vs 2943.5 ns, 52.9x.
		"| connected | **55.7 ns** (1.00×, 0 allocs) | 2.94 µs (52.9×, 0 allocs) | **52.9× faster** than hash4=off |\n",
		"![Connect: pick a free source port (policy=flat)](connect-flat.svg)\n",
		"![Lookup hits, 1M entries](throughput-lookup-1M.svg)\n",
		"(1.32×, 1 alloc)",
		// Sharing, hash4: 211.3 against 58.735 ns, 3.60x.
		"| 1K | hash4 | 211 ns (3.60×, 0 allocs) | **58.7 ns** (1.00×, 0 allocs) | 3.60× slower than tables=own |\n",
		"![Churn: one shared table or one per goroutine](sharing.svg)\n",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
	for _, g := range groupSpecs {
		if g.slow {
			continue // in testdata/traffic.txt: TestMarkdownTraffic
		}
		if !strings.Contains(md, "\n## "+g.title+"\n") || !strings.Contains(md, g.meaning) {
			t.Errorf("markdown lacks the section of %s", g.name)
		}
	}
}

func TestParseTraffic(t *testing.T) {
	rep := recordedTraffic(t)
	if got := reportGroups(rep); got != "turnover,zipf,natmix,uniform,writes,burst" {
		t.Fatalf("groups %s", got)
	}

	zipf := rep.group("zipf")
	if got := strings.Join(zipf.impls, ","); got != "hash4,syncmap,xsync,rwmutex" {
		t.Errorf("zipf impls %s", got)
	}
	if len(zipf.rows) != 1 {
		t.Errorf("zipf has %d rows, want 1", len(zipf.rows))
	}
	// The runs of one implementation, from processes of different
	// rounds, in one cell: hash4 61.27 and 59.83, xsync 70.15 and 68.91.
	z := findRow(t, zipf, 2, "n=1M")
	if c := z.cells["hash4"]; len(c.ns) != 2 || !near(c.nsPerOp(), (61.27+59.83)/2) {
		t.Errorf("zipf hash4 samples %v", c.ns)
	}
	ratio, peer, ok := zipf.headline(z)
	if !ok || peer != "xsync" || !near(ratio, ((61.27+59.83)/2)/((70.15+68.91)/2)) {
		t.Errorf("zipf headline %v %s %v", ratio, peer, ok)
	}

	// Turnover allocates in the peers: syncmap 2 allocs/op.
	if a, ok := findRow(t, rep.group("turnover"), 2, "n=1M").cells["syncmap"].allocsPerOp(); !ok || a != 2 {
		t.Errorf("turnover syncmap allocs %v %v", a, ok)
	}

	burst := rep.group("burst")
	if got := strings.Join(burst.impls, ","); got != "hash4-batch,hash4,syncmap,xsync,rwmutex" {
		t.Errorf("burst impls %s", got)
	}
	if len(burst.rows) != 2 {
		t.Errorf("burst has %d rows, want 2", len(burst.rows))
	}
	findRow(t, burst, 2, "n=1M", "mix=nat")
	// mix=uniform: hash4-batch 44.87 and 45.31; hash4's loop of Lookup
	// (89.48, 90.12) is faster than every peer but is none; rwmutex
	// (100.3, 99.7) is the fastest peer.
	u := findRow(t, burst, 2, "n=1M", "mix=uniform")
	if impl, _ := u.fastest(burst.impls, "hash4-batch"); impl != "hash4" {
		t.Fatalf("fastest but hash4-batch is %s, want hash4: the case below tests nothing", impl)
	}
	ratio, peer, ok = burst.headline(u)
	if !ok || peer != "rwmutex" || !near(ratio, ((44.87+45.31)/2)/((100.3+99.7)/2)) {
		t.Errorf("burst uniform headline %v %s %v, want against rwmutex", ratio, peer, ok)
	}
}

// AppendLookups too is compared with the other maps, not with hash4's own
// loop of Lookup.
func TestHeadlinePeersOnly(t *testing.T) {
	batch := recorded(t).group("batch")
	// 1M at 1 goroutine: hash4-batch 119.3 and 121.2, hash4 237.9 and
	// 237.2, xsync 370.7 and 414.2.
	r := findRow(t, batch, 1, "n=1M")
	ratio, peer, ok := batch.headline(r)
	if !ok || peer != "xsync" || !near(ratio, ((119.3+121.2)/2)/((370.7+414.2)/2)) {
		t.Errorf("batch headline %v %s %v, want against xsync", ratio, peer, ok)
	}
	// Without variants, hash4 is a peer like any other.
	spec := *batch.spec
	spec.variants = nil
	gd := *batch
	gd.spec = &spec
	if _, peer, _ := gd.headline(r); peer != "hash4" {
		t.Errorf("without variants, headline against %s, want hash4", peer)
	}
}

func TestMarkdownTraffic(t *testing.T) {
	rep := recordedTraffic(t)
	md := markdown(rep, charts(rep))
	for _, s := range []string{
		"- **Command:** `go run ./examples/benchreport -groups turnover,zipf,natmix,uniform,writes,burst -count 2` (2026-03-02)\n",
		"- **Machine:** Oxide Virtual Turin-like Processor, linux/amd64, GOMAXPROCS 2, go1.26.8\n",
		"the median of 2 runs of 1s",
		// No goroutines column: these run at GOMAXPROCS only.
		"| entries | hash4 | syncmap | xsync | rwmutex | hash4 vs fastest peer |\n| --- | ---: | ---: | ---: | ---: | --- |\n",
		// Turnover: hash4 356.7, syncmap 898.5 (2 allocs), xsync 504.4
		// (1 alloc), rwmutex 717.2 ns.
		"| 1M | **357 ns** (1.00×, 0 allocs) | 898 ns (2.52×, 2 allocs) | 504 ns (1.41×, 1 alloc) | 717 ns (2.01×, 0 allocs) | **1.41× faster** than xsync |\n",
		// NAT mix: hash4 83.2 against xsync 77.96 ns.
		"| 1M | 83.2 ns (1.07×, 0 allocs) | 130 ns (1.66×, 0 allocs) | **78.0 ns** (1.00×, 0 allocs) | 259 ns (3.32×, 0 allocs) | 1.07× slower than xsync |\n",
		"| entries | mix | hash4-batch | hash4 | syncmap | xsync | rwmutex | hash4-batch vs fastest peer |\n",
		// Burst uniform: hash4-batch 45.09 against rwmutex 100.0 ns, not
		// hash4's 89.8.
		"| 1M | uniform | **45.1 ns** (1.00×, 0 allocs) | 89.8 ns (1.99×, 0 allocs) | 200 ns (4.43×, 0 allocs) | 130 ns (2.89×, 0 allocs) | 100 ns (2.22×, 0 allocs) | **2.22× faster** than rwmutex |\n",
		"| 1M | nat | **29.9 ns** (1.00×, 0 allocs) |",
		"![Bursts of 16 among 1M flows](burst.svg)\n",
		"![Zipf lookups among 1M flows](zipf.svg)\n",
	} {
		requireContains(t, md, s)
	}
	for _, g := range groupSpecs {
		if g.slow && (!strings.Contains(md, "\n## "+g.title+"\n") || !strings.Contains(md, g.meaning)) {
			t.Errorf("markdown lacks the section of %s", g.name)
		}
	}
}

// A file written by benchreport carries its command and settings.
func TestParseBenchreportHeader(t *testing.T) {
	in := `benchreport-command: go run ./examples/benchreport -quick
date: 2026-01-02
gomaxprocs: 8
go-version: go1.26.8
benchtime: 100ms
count: 1
goos: linux
goarch: arm64
pkg: github.com/hash4/hash4
cpu: Some CPU
BenchmarkUDPLookup/connected/hash4=on-8   	1000	 10.0 ns/op
BenchmarkUDPLookup/connected/hash4=off-8  	1000	 30.0 ns/op
BenchmarkHashTuple/family=ipv4/hasher=linux-8 	1000	 3.0 ns/op
PASS
`
	rep, err := parseReport(strings.NewReader(in), "x")
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.machine(); got != "Some CPU, linux/arm64, GOMAXPROCS 8, go1.26.8" {
		t.Errorf("machine %q", got)
	}
	if len(rep.ignored) != 1 || rep.ignored[0] != "BenchmarkHashTuple" {
		t.Errorf("ignored %v", rep.ignored)
	}
	md := markdown(rep, nil)
	for _, s := range []string{
		"- **Command:** `go run ./examples/benchreport -quick` (2026-01-02)\n",
		"time per op (one run of 100ms)",
		"| connected | **10.0 ns** (1.00×) | 30.0 ns (3.00×) | **3.00× faster** than hash4=off |\n",
		"Not shown (not a comparison): BenchmarkHashTuple.",
	} {
		requireContains(t, md, s)
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"BenchmarkLookup/n=1K-2 \t 10 \t 5 ns/op\n",            // no impl=
		"BenchmarkLookup/n=1K/impl=hash4-2 \t 10 \t 5 B/op\n",  // no ns/op
		"BenchmarkLookup/n=1K/impl=hash4-2 \t 10 \t x ns/op\n", // bad value
	} {
		if _, err := parseReport(strings.NewReader(in), "x"); err == nil {
			t.Errorf("no error for %q", in)
		}
	}
}

func TestHeadlineText(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		want  string
	}{
		{0.5, "**2.00× faster** than xsync"},
		{2, "2.00× slower than xsync"},
		{1.002, "as fast as xsync"},
		{1.0 / 40, "**40.0× faster** than xsync"},
		{250, "250× slower than xsync"},
	} {
		if got := headlineText(tc.ratio, "xsync"); got != tc.want {
			t.Errorf("headlineText(%v) = %q, want %q", tc.ratio, got, tc.want)
		}
	}
}

func TestFmtNs(t *testing.T) {
	for _, tc := range []struct {
		ns   float64
		want string
	}{
		{3.456, "3.46 ns"}, {43.985, "44.0 ns"}, {607.2, "607 ns"}, {999.7, "1.00 µs"}, {999.4, "999 ns"}, {999.6e3, "1.00 ms"},
		{1473, "1.47 µs"}, {10900, "10.9 µs"}, {648225, "648 µs"}, {1056246, "1.06 ms"},
	} {
		if got := fmtNs(tc.ns); got != tc.want {
			t.Errorf("fmtNs(%v) = %q, want %q", tc.ns, got, tc.want)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1}, 3}, {[]float64{9, 1, 5}, 5}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// requireContains reports an error unless the markdown md contains s.
func requireContains(t *testing.T, md, s string) {
	t.Helper()
	if !strings.Contains(md, s) {
		t.Errorf("markdown lacks %q:\n%s", s, md)
	}
}
