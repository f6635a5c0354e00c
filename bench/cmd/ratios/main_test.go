package main

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"
)

// The output of one process of the hash4 implementation in the Burst
// benchmark.
const burstOutput = `goos: linux
goarch: amd64
pkg: github.com/hash4/hash4/bench
cpu: Oxide Virtual Turin-like Processor
BenchmarkBurst/n=1M/mix=uniform/impl=hash4-batch-2         	 8000000	       145.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkBurst/n=1M/mix=uniform/impl=hash4-2               	 3000000	       491.5 ns/op	       0 B/op	       0 allocs/op
BenchmarkBurst/n=1M/mix=nat/impl=hash4-batch-2             	 6000000	       194 ns/op	       388 cpu-ns/op	         0.125 others-share	       2 B/op	       1 allocs/op
PASS
`

func TestParseResults(t *testing.T) {
	rs := parseResults([]byte(burstOutput), 2, "default")
	want := []result{
		{round: 2, setup: "default", workload: "Burst/mix=uniform", impl: "hash4-batch", ns: 145, allocs: 0, cpu: nan, others: nan},
		{round: 2, setup: "default", workload: "Burst/mix=uniform", impl: "hash4", ns: 491.5, allocs: 0, cpu: nan, others: nan},
		{round: 2, setup: "default", workload: "Burst/mix=nat", impl: "hash4-batch", ns: 194, allocs: 1, cpu: 388, others: 0.125},
	}
	if len(rs) != len(want) {
		t.Fatalf("got %d results, want %d: %+v", len(rs), len(want), rs)
	}
	for i := range want {
		got, w := rs[i], want[i]
		w.procs, w.tries = 2, 1
		if !sameFloat(got.cpu, w.cpu) || !sameFloat(got.others, w.others) {
			t.Errorf("result %d: cpu %v others %v, want %v %v", i, got.cpu, got.others, w.cpu, w.others)
		} else if got.cpu, got.others, w.cpu, w.others = 0, 0, 0, 0; got != w {
			t.Errorf("result %d: got %+v, want %+v", i, rs[i], want[i])
		}
	}
}

// TestBenchPattern matches the patterns level by level, as go test does,
// against the names of the benchmarks they are for and against others.
func TestBenchPattern(t *testing.T) {
	match := func(pattern, name string) bool {
		pl, nl := strings.Split(pattern, "/"), strings.Split(name, "/")
		if len(nl) != len(pl) {
			return false
		}
		for i := range pl {
			if !regexp.MustCompile(pl[i]).MatchString(nl[i]) {
				return false
			}
		}
		return true
	}
	for _, c := range []struct {
		work, impl, name string
		want             bool
	}{
		{"Zipf", "hash4", "BenchmarkZipf/n=1M/impl=hash4", true},
		{"Zipf", "hash4", "BenchmarkZipf/n=1M/impl=hash4-batch", false},
		{"Zipf", "xsync", "BenchmarkZipf/n=1M/impl=hash4", false},
		{"Uniform", "xsync", "BenchmarkUniformWrites/n=1M/impl=xsync", false},
		{"UniformWrites", "xsync", "BenchmarkUniformWrites/n=1M/impl=xsync", true},
		{"Burst", "hash4", "BenchmarkBurst/n=1M/mix=nat/impl=hash4-batch", true},
		{"Burst", "hash4", "BenchmarkBurst/n=1M/mix=uniform/impl=hash4", true},
		{"Burst", "xsync", "BenchmarkBurst/n=1M/mix=uniform/impl=xsync-batch", true},
		{"Burst", "xsync", "BenchmarkBurst/n=1M/mix=uniform/impl=hash4", false},
	} {
		if got := match(benchPattern(c.work, c.impl), c.name); got != c.want {
			t.Errorf("%s %s against %s: got %v, want %v", c.work, c.impl, c.name, got, c.want)
		}
	}
}

// TestReport checks the ratios of a report: per round against the
// fastest peer of that round, the median of the rounds', and the base's.
func TestReport(t *testing.T) {
	var rs []result
	add := func(round int, setup, w, impl string, ns float64) {
		rs = append(rs, result{round: round, setup: setup, workload: w, impl: impl, ns: ns, cpu: ns, others: 0.1, procs: 2, tries: 1 + round%2})
	}
	// Round 0: xsync fastest (100), hash4 80: 0.80. Round 1: rwmutex
	// fastest (200), hash4 220: 1.10. Round 2: xsync 50, hash4 45: 0.90.
	for r, ns := range [][3]float64{{80, 100, 120}, {220, 250, 200}, {45, 50, 60}} {
		add(r, defaultSetup, "Zipf", "hash4", ns[0])
		add(r, defaultSetup, "Zipf", "xsync", ns[1])
		add(r, defaultSetup, "Zipf", "rwmutex", ns[2])
		add(r, baseSetup, "Zipf", "hash4", 2*ns[0])
		add(r, "line", "Zipf", "hash4", ns[0])
		add(r, "line", "Zipf", "xsync", ns[1]/2)
		add(r, "line", "Zipf", "rwmutex", ns[2])
	}
	tb := collect(rs, 3, defaultSetup)
	ratios, who := tb.ratios("Zipf", mNs)
	if got := joinRatios(ratios); got != "0.80 1.10 0.90" {
		t.Errorf("ratios %s, want 0.80 1.10 0.90", got)
	}
	if most(who) != "xsync" {
		t.Errorf("fastest peer %q (%q), want xsync", most(who), who)
	}
	var out bytes.Buffer
	report(&out, rs, 3, []setup{{name: defaultSetup}, {name: "line", args: []string{"-traffic.keys=line"}}, {name: baseSetup}})
	for _, want := range []string{
		"| Zipf | 0.90 (0.80–1.10) | 0.80 1.10 0.90 | xsync | 0.90 (0.80–1.10) | 80.0, 0 | 100, 0 | 120, 0 |",
		"### line (-traffic.keys=line)",
		"| Zipf | 1.76 (1.60–1.80) | 1.60 1.76 1.80 | xsync | 1.76 (1.60–1.80) | 80.0, 0 | 50.0, 0 | 120, 0 |",
		"| Zipf | line | 1.76 (1.60–1.80) | 2.00 1.60 2.00 | 2.00 (1.60–2.00) |",
		"| Zipf | base | (hash4 of this build / of the base) | 0.50 0.50 0.50 | 0.50 (0.50–0.50) |",
		"Zipf: hash4 4.89, xsync 5.00, rwmutex 3.33",
		"had (CPU time over GOMAXPROCS times the time): median 0.50, least 0.50",
		"other work kept busy during them: median 0.10, greatest 0.10; 3 results of 9 came from a process run again",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// sameFloat reports whether a and b are equal or both NaN.
func sameFloat(a, b float64) bool { return a == b || a != a && b != b }

// TestParseRaw reads what -o writes back: a process run twice counts its
// tries, and results keep their round and setup.
func TestParseRaw(t *testing.T) {
	raw := "load: 1.0 0.9 0.8\nround: 1\nsetup: default\nargs: \nimpl: hash4\ntries: 2\n" + burstOutput +
		"\nround: 1\nsetup: line\nargs: -traffic.keys=line\nimpl: xsync\ntries: 1\n" +
		"BenchmarkZipf/n=1M/impl=xsync-2 \t 100\t 90.5 ns/op\n" +
		"\nround: 2\nsetup: default\nargs: \nimpl: hash4\n" + burstOutput + "load: 2.0 1.9 1.8\n"
	rs, setups, loads, rounds, err := parseRaw(strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if rounds != 2 || len(loads) != 2 || len(setups) != 2 || setups[1].name != "line" || setups[1].args[0] != "-traffic.keys=line" {
		t.Fatalf("rounds %d, loads %q, setups %+v", rounds, loads, setups)
	}
	if len(rs) != 7 || rs[0].tries != 2 || rs[0].round != 0 || rs[3].setup != "line" || rs[3].ns != 90.5 || rs[4].tries != 1 || rs[4].round != 1 {
		t.Errorf("results %+v", rs)
	}
}

// TestWriteReportLeavesOut checks that -maxothers leaves out the results
// of disturbed runs: here the one round where hash4 looked slow.
func TestWriteReportLeavesOut(t *testing.T) {
	var rs []result
	for r, ns := range [][2]float64{{80, 100}, {300, 100}, {90, 100}} {
		others := 0.1
		if r == 1 {
			others = 0.6
		}
		rs = append(rs, result{round: r, setup: defaultSetup, workload: "Zipf", impl: "hash4", ns: ns[0], cpu: nan, others: others, procs: 2, tries: 1},
			result{round: r, setup: defaultSetup, workload: "Zipf", impl: "xsync", ns: ns[1], cpu: nan, others: 0.1, procs: 2, tries: 1})
	}
	var out bytes.Buffer
	writeReport(&out, rs, []setup{{name: defaultSetup}}, nil, 3, "", 0.5)
	for _, want := range []string{"Left out: 1 results of 6", "| Zipf | 0.85 (0.80–0.90) | 0.80 - 0.90 | xsync |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-rounds", "2", "-variant", "line=-traffic.keys=line -traffic.hot=last"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.rounds != 2 || len(c.variants) != 1 || c.variants[0].name != "line" || len(c.variants[0].args) != 2 {
		t.Errorf("got %+v", c)
	}
	for _, bad := range [][]string{
		{"-rounds", "0"},
		{"-impls", "xsync,hash4"},
		{"-impls", "hash4"},
		{"-work", "Lookup"},
		{"-variant", "default=-traffic.keys=line"},
		{"-variant", "-traffic.keys=line"},
		{"extra"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
