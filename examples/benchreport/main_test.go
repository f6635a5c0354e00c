package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// Bad flags: a clear message naming the flag, exit 2, no panic.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-groups", "lookup,bogus"}, `-groups: unknown group "bogus"`},
		{[]string{"-groups", ","}, "-groups: empty"},
		{[]string{"-quick", "-groups", "zipf,bogus"}, "(want some of lookup, mixed, churn, batch, turnover, zipf, natmix, uniform, writes, burst, sharing, connect, udp)"},
		{[]string{"-sizes", "1Q"}, `-sizes: bad size "1Q"`},
		{[]string{"-sizes", ""}, "-sizes: empty"},
		{[]string{"-benchtime", "0s"}, `-benchtime: bad value "0s"`},
		{[]string{"-benchtime", "fast"}, `-benchtime: bad value "fast"`},
		{[]string{"-benchtime", "0x"}, `-benchtime: bad value "0x"`},
		{[]string{"-count", "0"}, "-count: 0, want at least 1"},
		{[]string{"-count", "many"}, `invalid value "many" for flag -count`},
		{[]string{"-cpu", "1,0"}, `-cpu: bad goroutine count "0"`},
		{[]string{"-cpu", "one"}, `-cpu: bad goroutine count "one"`},
		{[]string{"-policies", "Flat!"}, `-policies: bad policy "Flat!"`},
		{[]string{"-policies", ""}, "-policies: empty"},
		{[]string{"-from", filepath.Join(t.TempDir(), "missing.txt")}, "-from: "},
		{[]string{"-pkg", filepath.Join(t.TempDir(), "missing")}, "-pkg: "},
		{[]string{"-pkg", "main.go"}, "-pkg: main.go is not a directory"},
		{[]string{"-out", ""}, "-out: empty"},
		{[]string{"-out", "main.go"}, "-out: main.go is not a directory"},
		{[]string{"-quick", "extra"}, `unexpected argument "extra"`},
		{[]string{"-nosuchflag"}, "flag provided but not defined: -nosuchflag"},
	} {
		var stdout, stderr bytes.Buffer
		code := realMain(context.Background(), tc.args, &stdout, &stderr)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2", tc.args, code)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: stderr %q lacks %q", tc.args, stderr.String(), tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: wrote to stdout: %q", tc.args, stdout.String())
		}
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := realMain(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	for _, s := range []string{"-quick", "-groups", "-from", "-benchtime", "-quick leaves out turnover, zipf, natmix, uniform, writes, burst unless named"} {
		if !strings.Contains(stderr.String(), s) {
			t.Errorf("usage lacks %s:\n%s", s, stderr.String())
		}
	}
}

func TestFlagsQuick(t *testing.T) {
	o, err := parseFlags([]string{"-quick"}, 2, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	// Not the traffic groups, which fill 1M flows in every process.
	if groupNames(o.groups) != "lookup,mixed,churn,batch,sharing,connect,udp" || !slices.Equal(o.sizes, []string{"1K"}) || o.benchtime != "100ms" ||
		o.count != 1 || !slices.Equal(o.cpus, []int{1, 2}) || !slices.Equal(o.policies, []string{"flat"}) ||
		o.out != filepath.Join(os.TempDir(), "benchreport-quick") {
		t.Errorf("-quick: %+v", o)
	}
	// Explicit flags win over -quick.
	o, err = parseFlags([]string{"-quick", "-count", "2", "-sizes", "1k,1M,1K", "-cpu", "4,1", "-groups", "udp,lookup"}, 2, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.count != 2 || !slices.Equal(o.sizes, []string{"1K", "1M"}) || !slices.Equal(o.cpus, []int{1, 4}) ||
		len(o.groups) != 2 || o.groups[0].name != "lookup" || o.groups[1].name != "udp" {
		t.Errorf("-quick with flags: %+v", o)
	}
	// Named, they run with -quick too.
	o, err = parseFlags([]string{"-quick", "-groups", "burst,lookup"}, 2, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if groupNames(o.groups) != "lookup,burst" {
		t.Errorf("-quick -groups burst,lookup: groups %s", groupNames(o.groups))
	}
	// Defaults.
	o, err = parseFlags(nil, 12, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if groupNames(o.groups) != "lookup,mixed,churn,batch,turnover,zipf,natmix,uniform,writes,burst,sharing,connect,udp" {
		t.Errorf("default groups %s", groupNames(o.groups))
	}
	if o.benchtime != "1s" || o.count != 3 || !slices.Equal(o.sizes, []string{"1K", "1M"}) ||
		!slices.Equal(o.cpus, []int{1, 2, 4, 8, 12}) || o.policies != nil || o.out != "" {
		t.Errorf("defaults: %+v", o)
	}
	if got := defaultCPUs(1); !slices.Equal(got, []int{1}) {
		t.Errorf("defaultCPUs(1) = %v", got)
	}
	if got := defaultCPUs(8); !slices.Equal(got, []int{1, 2, 4, 8}) {
		t.Errorf("defaultCPUs(8) = %v", got)
	}
}

// planCommands returns the go test commands of the plan of o, and the
// number of results they print.
func planCommands(o options) ([]string, int) {
	var cmds []string
	total := 0
	for _, inv := range plan(o) {
		cmds = append(cmds, inv.goTestCommand())
		total += inv.expect
	}
	return cmds, total
}

func TestPlan(t *testing.T) {
	o, err := parseFlags([]string{"-quick"}, 2, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	got, total := planCommands(o)
	want := []string{
		`go test -run '^$' -benchtime 100ms -count 1 -benchmem -bench '^Benchmark(Lookup|Mixed|Churn|AppendLookups)$/^n=(1K)$' -cpu 1,2 ./bench`,
		`go test -run '^$' -benchtime 100ms -count 1 -benchmem -bench '^BenchmarkChurnSharing$' ./bench`,
		`go test -run '^$' -benchtime 100ms -count 1 -benchmem -bench '^BenchmarkConnect$/^(policy=(flat)|occupancy=.*)$' ./bench`,
		`go test -run '^$' -benchtime 100ms -count 1 -benchmem -bench '^BenchmarkConnect$/^policy=(flat)$/./^impl=(scan|rehash|locked)$' .`,
		`go test -run '^$' -benchtime 100ms -count 1 -benchmem -bench '^BenchmarkUDPLookup$' .`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// 3 groups x 1 size x 2 cpus x 5 impls + 1 size x 2 cpus x 3 batch
	// impls + 2 impls x 2 kinds of tables + 1 policy x 5 occupancies x 5
	// impls + 5 cases x 2.
	if total != 30+6+4+25+10 {
		t.Errorf("expect %d results, want 75", total)
	}

	o, err = parseFlags([]string{"-groups", "churn,connect", "-count", "3", "-cpu", "1,2,4"}, 4, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	// One round: each benchmark once per invocation, whatever -count.
	invs := plan(o)
	// Connect runs in two packages: bench/ (hash4, xsync) and the root
	// (scan, rehash, locked), each at 2 policies x 5 occupancies.
	if len(invs) != 3 || invs[0].expect != 2*3*5 || invs[1].expect != 2*5*2 || invs[2].expect != 2*5*3 ||
		invs[0].dir != "bench" || invs[1].dir != "bench" || invs[2].dir != "" ||
		!slices.Contains(invs[1].args, "-test.bench=^BenchmarkConnect$") ||
		!slices.Contains(invs[2].args, "-test.bench=^BenchmarkConnect$/././^impl=(scan|rehash|locked)$") ||
		!slices.Contains(invs[0].args, "-test.count=1") || !slices.Contains(invs[1].args, "-test.count=1") {
		t.Errorf("plan %+v", invs)
	}
}

// groupNames joins the names of gs with commas.
func groupNames(gs []*groupSpec) string {
	var names []string
	for _, g := range gs {
		names = append(names, g.name)
	}
	return strings.Join(names, ",")
}

// The traffic groups run a process per implementation, the
// implementations one after the other.
func TestPlanProcessPerImpl(t *testing.T) {
	o, err := parseFlags([]string{"-groups", "udp,burst,turnover", "-benchtime", "1x", "-cpu", "1,2"}, 2, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	got, total := planCommands(o)
	const flags = `go test -run '^$' -benchtime 1x -count 1 -benchmem -bench `
	want := []string{
		flags + `'^BenchmarkTurnover$/^n=1M$/^impl=hash4$' ./bench`,
		flags + `'^BenchmarkTurnover$/^n=1M$/^impl=syncmap$' ./bench`,
		flags + `'^BenchmarkTurnover$/^n=1M$/^impl=xsync$' ./bench`,
		flags + `'^BenchmarkTurnover$/^n=1M$/^impl=rwmutex$' ./bench`,
		flags + `'^BenchmarkTurnover$/^n=1M$/^impl=shard256$' ./bench`,
		flags + `'^BenchmarkBurst$/^n=1M$/./^impl=hash4-batch$' ./bench`,
		flags + `'^BenchmarkBurst$/^n=1M$/./^impl=hash4$' ./bench`,
		flags + `'^BenchmarkBurst$/^n=1M$/./^impl=syncmap$' ./bench`,
		flags + `'^BenchmarkBurst$/^n=1M$/./^impl=xsync$' ./bench`,
		flags + `'^BenchmarkBurst$/^n=1M$/./^impl=rwmutex$' ./bench`,
		flags + `'^BenchmarkBurst$/^n=1M$/./^impl=shard256$' ./bench`,
		flags + `'^BenchmarkUDPLookup$' .`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Turnover: a result per process; burst: one per mix; UDP: 5 cases x
	// on and off.
	if total != 5*1+6*2+10 {
		t.Errorf("expect %d results, want 27", total)
	}

	// With -pkg, in that one package.
	o, err = parseFlags([]string{"-groups", "zipf", "-pkg", "."}, 2, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	invs := plan(o)
	if len(invs) != 5 || invs[0].dir != "" || invs[0].expect != 1 ||
		!slices.Contains(invs[3].args, "-test.bench=^BenchmarkZipf$/^n=1M$/^impl=rwmutex$") {
		t.Errorf("plan %+v", invs)
	}
}

// lineTap reports each benchmark when its name is printed, however the
// output is split into reads.
func TestLineTap(t *testing.T) {
	out := "goos: linux\nBenchmarkA/n=1K-2   \t 100\t 5 ns/op\nsome log\twith a tab\nBenchmarkB \t 1\t 2 ns/op\n"
	for _, chunk := range []int{1, 3, 7, len(out)} {
		var started []string
		tap := &lineTap{r: &chunkReader{s: out, n: chunk}, onStart: func(n string) { started = append(started, n) }}
		var got bytes.Buffer
		if _, err := got.ReadFrom(tap); err != nil {
			t.Fatal(err)
		}
		if got.String() != out {
			t.Errorf("chunk %d: passed %q", chunk, got.String())
		}
		if !slices.Equal(started, []string{"BenchmarkA/n=1K-2", "BenchmarkB"}) {
			t.Errorf("chunk %d: started %q", chunk, started)
		}
	}
}

type chunkReader struct {
	s string
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.n)], r.s)
	r.s = r.s[n:]
	return n, nil
}

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	p := &lineProgress{w: &b, total: 2}
	p.start("BenchmarkA")
	p.done("BenchmarkA-2", 43.98)
	p.done("BenchmarkB-2", 1473)
	p.done("BenchmarkC-2", 5)
	p.close()
	want := "[1/2] BenchmarkA-2 44.0 ns/op\n[2/2] BenchmarkB-2 1.47 µs/op\n[3/3] BenchmarkC-2 5.00 ns/op\n"
	if b.String() != want {
		t.Errorf("line progress %q, want %q", b.String(), want)
	}

	var bb bytes.Buffer
	bar := newBarProgress(&bb, 2)
	bar.start("BenchmarkLookup/n=1K/impl=hash4-2")
	bar.done("", 1)
	bar.done("", 1)
	bar.done("", 1) // more results than planned: the bar stays full
	bar.close()
	if got := shortName("BenchmarkConnect/policy=odd-even/occupancy=99%/impl=xsync-2"); got != "…odd-even/occupancy=99%/impl=xsync-2" {
		t.Errorf("shortName = %q", got)
	}
	if !strings.Contains(bb.String(), "100% |") || !strings.Contains(bb.String(), "Lookup/n=1K/impl=hash4-2") ||
		!strings.HasSuffix(bb.String(), "\n") {
		t.Errorf("bar output %q", bb.String())
	}
}

// -from renders a recorded output without running anything.
func TestCommandFrom(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), []string{"-from", filepath.Join("testdata", "bench.txt"), "-out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	for _, f := range []string{"benchmarks.md", "throughput-lookup-1K.svg", "connect-flat.svg", "udp.svg"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "data", "benchmarks.txt")); err == nil {
		t.Error("-from wrote data/benchmarks.txt")
	}
	md, _ := os.ReadFile(filepath.Join(out, "benchmarks.md"))
	golden, _ := os.ReadFile(filepath.Join("testdata", "bench.golden.md"))
	if !bytes.Equal(md, golden) {
		t.Error("benchmarks.md differs from testdata/bench.golden.md")
	}

	// A file with no comparison in it is an error.
	empty := filepath.Join(t.TempDir(), "empty.txt")
	if err := os.WriteFile(empty, []byte("BenchmarkOther-2 \t 10 \t 5 ns/op\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := realMain(context.Background(), []string{"-from", empty, "-out", out}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "no results of BenchmarkLookup") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// A benchmark that fails: its output is reported and the exit status is 1.
// writeFiles writes files, name to contents, into dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCommandChildFails(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/failing\n\ngo 1.26\n",
		"failing_test.go": `package failing

import "testing"

func BenchmarkUDPLookup(b *testing.B) {
	b.Run("connected/hash4=on", func(b *testing.B) { b.Fatal("the table is broken") })
}
`,
	}
	writeFiles(t, dir, files)
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), []string{"-pkg", dir, "-groups", "udp", "-out", t.TempDir(), "-benchtime", "1x"}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "the table is broken") || !strings.Contains(stderr.String(), "exit status 1") {
		t.Errorf("stderr lacks the failure:\n%s", stderr.String())
	}

	// A package that does not compile.
	if err := os.WriteFile(filepath.Join(dir, "failing_test.go"), []byte("package failing\n\nfunc x() { undefined() }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	code = realMain(context.Background(), []string{"-pkg", dir, "-groups", "udp", "-out", t.TempDir()}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "undefined") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr.String())
	}
}

// runRounds runs the command on a package made of files, for groups, in 2
// rounds of one iteration of each benchmark. It checks that the progress
// counted results results, no more, and returns the output directory and
// its data/benchmarks.txt.
func runRounds(t *testing.T, files map[string]string, groups string, results int) (string, []byte) {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, files)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), []string{"-pkg", dir, "-groups", groups, "-count", "2",
		"-benchtime", "1x", "-out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), fmt.Sprintf("running %d benchmarks, in 2 rounds of", results)) ||
		!strings.Contains(stderr.String(), fmt.Sprintf("[%d/%d]", results, results)) ||
		strings.Contains(stderr.String(), fmt.Sprintf("[%d/", results+1)) {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	raw, err := os.ReadFile(filepath.Join(out, "data", "benchmarks.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return out, raw
}

// With -count 2 the plan runs twice, a round after the other, each
// benchmark once per round.
func TestCommandRounds(t *testing.T) {
	files := map[string]string{
		"go.mod": "module example.com/rounds\n\ngo 1.26\n",
		"rounds_test.go": `package rounds

import "testing"

func BenchmarkChurnSharing(b *testing.B) {
	for _, name := range []string{"n=1K/impl=hash4/tables=shared", "n=1K/impl=hash4/tables=own",
		"n=1K/impl=xsync/tables=shared", "n=1K/impl=xsync/tables=own"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
			}
		})
	}
}

func BenchmarkUDPLookup(b *testing.B) {
	for _, kind := range []string{"connected", "unconnected-exact", "unconnected-wildcard", "reuseport=64", "reuseport=64-connected-neighbour"} {
		for _, on := range []string{"on", "off"} {
			b.Run(kind+"/hash4="+on, func(b *testing.B) {
				for b.Loop() {
				}
			})
		}
	}
}
`,
	}
	out, raw := runRounds(t, files, "sharing,udp", 28)
	// The top-level benchmark of each result line, runs of one merged.
	var order []string
	for _, line := range strings.Split(string(raw), "\n") {
		name, _, ok := strings.Cut(line, "/")
		if !ok || !strings.HasPrefix(name, "Benchmark") {
			continue
		}
		if len(order) == 0 || order[len(order)-1] != name {
			order = append(order, name)
		}
	}
	want := []string{"BenchmarkChurnSharing", "BenchmarkUDPLookup", "BenchmarkChurnSharing", "BenchmarkUDPLookup"}
	if !slices.Equal(order, want) {
		t.Errorf("benchmarks ran in the order %v, want %v", order, want)
	}
	md, _ := os.ReadFile(filepath.Join(out, "benchmarks.md"))
	if !strings.Contains(string(md), "the median of 2 runs") {
		t.Errorf("benchmarks.md does not say the median of 2 runs:\n%s", md)
	}
}

// The patterns of a process per implementation select it alone, and the
// rounds alternate the implementations: a package with the sub-benchmarks
// of the traffic benchmarks fails when two run in one process.
func TestCommandProcessPerImpl(t *testing.T) {
	files := map[string]string{
		"go.mod": "module example.com/traffic\n\ngo 1.26\n",
		"traffic_test.go": `package traffic

import "testing"

var ran string // the implementation this process runs

func each(b *testing.B, prefix string, impls ...string) {
	for _, impl := range impls {
		b.Run("n=1M/"+prefix+"impl="+impl, func(b *testing.B) {
			if ran != "" && ran != impl {
				b.Fatalf("impl=%s ran in the process of impl=%s", impl, ran)
			}
			ran = impl
			for b.Loop() {
			}
		})
	}
}

func BenchmarkZipf(b *testing.B) { each(b, "", "hash4", "xsync", "rwmutex", "shard256", "syncmap") }

func BenchmarkBurst(b *testing.B) {
	for _, mix := range []string{"mix=uniform/", "mix=nat/"} {
		each(b, mix, "hash4", "hash4-batch", "xsync", "rwmutex", "shard256", "syncmap")
	}
}
`,
	}
	// (5 zipf + 6 burst x 2 mixes) x 2 rounds.
	out, raw := runRounds(t, files, "zipf,burst", 34)
	// The benchmark and implementation of each result line, runs of one
	// merged.
	var order []string
	procs := fmt.Sprintf("-%d", runtime.GOMAXPROCS(0))
	for _, line := range strings.Split(string(raw), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), "\t")
		bench, _, _ := strings.Cut(name, "/")
		_, impl, ok := strings.Cut(strings.TrimSpace(name), "/impl=")
		if !ok {
			continue
		}
		if s := bench + " " + strings.TrimSuffix(impl, procs); len(order) == 0 || order[len(order)-1] != s {
			order = append(order, s)
		}
	}
	round := []string{
		"BenchmarkZipf hash4", "BenchmarkZipf syncmap", "BenchmarkZipf xsync", "BenchmarkZipf rwmutex", "BenchmarkZipf shard256",
		"BenchmarkBurst hash4-batch", "BenchmarkBurst hash4", "BenchmarkBurst syncmap", "BenchmarkBurst xsync", "BenchmarkBurst rwmutex",
		"BenchmarkBurst shard256",
	}
	if want := append(slices.Clone(round), round...); !slices.Equal(order, want) {
		t.Errorf("ran in the order\n%s\nwant\n%s", strings.Join(order, "\n"), strings.Join(want, "\n"))
	}
	if n := strings.Count(string(raw), "\nPASS\n"); n != 2*11 {
		t.Errorf("%d processes, want 22", n)
	}

	// -from renders what they wrote.
	md, _ := os.ReadFile(filepath.Join(out, "benchmarks.md"))
	from := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := realMain(context.Background(), []string{"-from", filepath.Join(out, "data", "benchmarks.txt"), "-out", from}, &stdout, &stderr); code != 0 {
		t.Fatalf("-from: exit %d\nstderr:\n%s", code, stderr.String())
	}
	mdFrom, _ := os.ReadFile(filepath.Join(from, "benchmarks.md"))
	if !bytes.Equal(md, mdFrom) || !strings.Contains(string(md), "| entries | mix | hash4-batch | hash4 | syncmap | xsync | rwmutex | shard256 | hash4-batch vs fastest peer |\n") {
		t.Errorf("benchmarks.md\n%s\nfrom its data/benchmarks.txt\n%s", md, mdFrom)
	}
	for _, f := range []string{"zipf.svg", "burst.svg"} {
		if _, err := os.Stat(filepath.Join(from, f)); err != nil {
			t.Error(err)
		}
	}
}

// The CI run of -quick: the real benchmarks of the module, end to end.
func TestCommandQuick(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	began := time.Now()
	code := realMain(context.Background(), []string{"-quick", "-out", out}, &stdout, &stderr)
	took := time.Since(began)
	t.Logf("-quick took %v", took.Round(time.Second))
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr.String())
	}
	for _, f := range []string{
		"benchmarks.md", "data/benchmarks.txt", "throughput-lookup-1K.svg", "throughput-mixed-1K.svg",
		"throughput-churn-1K.svg", "sharing.svg", "connect-flat.svg", "udp.svg",
	} {
		data, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Error(err)
			continue
		}
		if strings.HasSuffix(f, ".svg") {
			w, h, texts, err := parseSVG(data)
			if err != nil {
				t.Errorf("%s: %v", f, err)
			}
			for _, o := range overlaps(w, h, texts) {
				t.Errorf("%s: %s", f, o)
			}
		}
	}
	// A line per finished benchmark (stderr is not a terminal here), the
	// last one at the planned total.
	if !regexp.MustCompile(`\[75/75\] BenchmarkUDPLookup/`).MatchString(stderr.String()) {
		t.Errorf("progress lacks [75/75]:\n%s", stderr.String())
	}
	md, _ := os.ReadFile(filepath.Join(out, "benchmarks.md"))
	for _, s := range []string{"`go run ./examples/benchreport -quick -out ", "## Lookup hits", "## UDP socket lookup", "GOMAXPROCS"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("benchmarks.md lacks %q", s)
		}
	}
	if took > 3*time.Minute {
		t.Errorf("-quick took %v; it is meant to take under a minute", took)
	}
}
