// Command benchreport runs hash4's comparison benchmarks in one go and turns
// them into a Markdown table and SVG charts.
//
// From the repository root:
//
//	go run ./examples/benchreport -quick                  # a first look, under a minute
//	go run ./examples/benchreport                         # the full comparison
//	go run ./examples/benchreport -from docs/data/benchmarks.txt   # redraw from recorded output
//
// It compiles the package's test binary once (go test -c) and runs it once
// for lookup, mixed, churn and batch at every -cpu value, then once per
// other comparison at GOMAXPROCS, each like
//
//	go test -run '^$' -bench '^Benchmark(Lookup|Mixed|Churn|AppendLookups)$/^n=(1K|1M)$' -benchtime 1s -count 3 -cpu 1,2 -benchmem
//
// The benchmarks on the shapes of real traffic (turnover, zipf, natmix,
// uniform, writes and burst, of 1M flows in bench/traffic_test.go) run at GOMAXPROCS with each
// implementation in a process of its own, one implementation after the
// other, so that one's heap and GC do not weigh on the next's:
//
//	go test -run '^$' -bench '^BenchmarkZipf$/^n=1M$/^impl=xsync$' -benchtime 1s -count 1 -benchmem ./bench
//
// The Connect strategies compared are unexported, so the benchmarks, not
// this command, drive them. While they run, a progress bar on stderr (when
// it is a terminal; otherwise a line per finished benchmark) counts the
// result lines. The output, parsed with golang.org/x/perf/benchfmt, becomes:
//
//   - benchmarks.md: per comparison a table of the median ns/op, its ratio to
//     the fastest implementation in the row and allocs/op, with hash4's ratio
//     to its fastest peer as the headline (for AppendLookups, the fastest
//     other map: hash4's own loop of Lookup is no peer);
//   - throughput-<group>-<size>.svg: million ops/s against goroutines, a line
//     per implementation (lookup, mixed, churn, batch);
//   - connect-<policy>.svg: time per Connect against the occupancy of the port
//     range (0 to 99.9%, on a log scale of the share left free), a line per
//     strategy;
//   - sharing.svg: time per delete+insert of 1K and 1M keys in one table shared by
//     the goroutines and in a table per goroutine, which tells whether the
//     processors shared caches while the report ran;
//   - udp.svg: time per UDP socket lookup, hash4 on and off, per case;
//   - turnover.svg, zipf.svg, natmix.svg, uniform.svg, writes.svg,
//     burst.svg: time per op on the shapes of real traffic, a bar per
//     implementation (per mix for burst);
//   - data/benchmarks.txt: the raw output, for benchstat or -from.
//
// # Flags
//
//	-groups list     comparisons to run: lookup, mixed, churn, batch, turnover, zipf,
//	                 natmix, uniform, writes, burst, sharing, connect, udp (default all)
//	-sizes list      table sizes of lookup, mixed, churn and batch (default 1K,1M);
//	                 turnover, zipf, natmix, uniform, writes and burst have 1M flows
//	-benchtime t     run time of each benchmark, a duration or Nx (default 1s)
//	-count n         runs of each benchmark; the report shows the median (default 3)
//	-cpu list        goroutine counts of lookup, mixed, churn and batch (default 1, 2, 4, ...
//	                 up to GOMAXPROCS, and GOMAXPROCS)
//	-policies list   Connect port policies (default all: odd-even, flat)
//	-out dir         output directory, the raw output in its data/ (default docs/
//	                 at the module root)
//	-pkg dir         the one package whose benchmarks run (default: bench/
//	                 of the module root for the comparisons with other maps,
//	                 the module root for the rest)
//	-from file       render from recorded benchmark output; run nothing
//	-quick           sizes 1K, benchtime 100ms, count 1, policy flat, output in
//	                 $TMPDIR/benchreport-quick (not docs/): under a minute on two
//	                 cores; flags given explicitly still apply. It leaves out
//	                 turnover, zipf, natmix, uniform, writes and burst, which fill 1M flows in
//	                 every process, unless -groups names them
//
// Invalid flags print a message and exit with status 2; a failed build or
// benchmark prints its output and exits with status 1.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// realMain runs the command with args (without the program name) and
// returns its exit status.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, runtime.GOMAXPROCS(0), stderr)
	if errors.Is(err, errUsage) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchreport: %v\n", err)
		return 2
	}
	if err := run(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "benchreport: %v\n", err)
		return 1
	}
	return 0
}

// goEnv returns the values of go env names, run in dir.
func goEnv(ctx context.Context, dir string, names ...string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"env"}, names...)...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("go env: %v: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(vals) != len(names) {
		return nil, fmt.Errorf("go env %s: unexpected output %q", strings.Join(names, " "), out)
	}
	return vals, nil
}

// repoRoot returns the directory of the module github.com/hash4/hash4 as
// the go command resolves it from dir (the repository's root: the main
// module there, replaced to ../ in the modules of examples/ and bench/), or
// "".
func repoRoot(ctx context.Context, dir string) string {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/hash4/hash4")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// run runs the benchmarks (or reads -from) and writes the report.
func run(ctx context.Context, o options, stdout, stderr io.Writer) error {
	root := ""
	if o.out == "" || (o.pkg == "" && o.from == "") {
		root = repoRoot(ctx, ".")
	}
	if o.out == "" {
		o.out = filepath.Join(root, "docs") // root "" gives ./docs
	}
	var raw []byte
	source := o.from
	if o.from != "" {
		b, err := os.ReadFile(o.from)
		if err != nil {
			return err
		}
		raw = b
	} else {
		if o.pkg == "" {
			if root == "" {
				return errors.New("not in hash4's repository: give -pkg, the directory of the package to benchmark")
			}
			o.pkg = root
		}
		b, err := runAll(ctx, o, stderr)
		if err != nil {
			return err
		}
		raw, source = b, "benchmark output"
	}
	rep, err := parseReport(bytes.NewReader(raw), source)
	if err != nil {
		return err
	}
	if len(rep.groups) == 0 {
		return fmt.Errorf("no results of %s in %s", strings.Join(benchNames(), ", "), source)
	}
	if o.from == "" {
		for _, g := range o.groups {
			if rep.group(g.name) == nil {
				fmt.Fprintf(stderr, "benchreport: warning: no results for %s (%s)\n", g.name, g.bench)
			}
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	cs := charts(rep)
	written := []string{}
	write := func(name string, data []byte) error {
		p := filepath.Join(o.out, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
		written = append(written, p)
		return nil
	}
	if o.from == "" {
		if err := os.MkdirAll(filepath.Join(o.out, "data"), 0o755); err != nil {
			return err
		}
		if err := write(filepath.Join("data", "benchmarks.txt"), raw); err != nil {
			return err
		}
	}
	for _, c := range cs {
		if err := write(c.name, c.svg); err != nil {
			return err
		}
	}
	if err := write("benchmarks.md", []byte(markdown(rep, cs))); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", strings.Join(written, "\n      "))
	return nil
}

func benchNames() []string {
	var n []string
	for _, g := range groupSpecs {
		n = append(n, g.bench)
	}
	return n
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0 && st.Mode()&os.ModeDevice != 0
}

// runAll compiles the test binary, runs the planned invocations and returns
// their output, preceded by configuration lines naming the command, the
// machine and the settings.
func runAll(ctx context.Context, o options, stderr io.Writer) ([]byte, error) {
	invs := plan(o)
	total := 0
	for _, inv := range invs {
		total += inv.expect * o.count
	}
	env, err := goEnv(ctx, o.pkg, "GOVERSION")
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "benchreport")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	began := time.Now()
	// A test binary per package, in the order the plan first runs them.
	bins := map[string]string{}
	for _, inv := range invs {
		dir := filepath.Join(o.pkg, inv.dir)
		if bins[dir] != "" {
			continue
		}
		fmt.Fprintf(stderr, "benchreport: compiling the test binary of %s\n", dir)
		sub, err := os.MkdirTemp(tmp, "pkg")
		if err != nil {
			return nil, err
		}
		bin, err := compile(ctx, dir, sub)
		if err != nil {
			return nil, err
		}
		bins[dir] = bin
	}
	rounds := ""
	if o.count > 1 {
		rounds = fmt.Sprintf(", in %d rounds of", o.count)
	}
	fmt.Fprintf(stderr, "benchreport: running %d benchmarks%s\n", total, rounds)
	for _, inv := range invs {
		fmt.Fprintf(stderr, "  %s\n", inv.goTestCommand())
	}

	var raw bytes.Buffer
	cmdline := "go run ./examples/benchreport"
	for _, a := range o.args {
		cmdline += " " + shellQuote(a)
	}
	fmt.Fprintf(&raw, "benchreport-command: %s\n", cmdline)
	fmt.Fprintf(&raw, "date: %s\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&raw, "gomaxprocs: %d\n", runtime.GOMAXPROCS(0))
	fmt.Fprintf(&raw, "go-version: %s\n", env[0])
	fmt.Fprintf(&raw, "benchtime: %s\n", o.benchtime)
	fmt.Fprintf(&raw, "count: %d\n", o.count)

	var prog progress
	if isTerminal(stderr) {
		prog = newBarProgress(stderr, total)
	} else {
		prog = &lineProgress{w: stderr, total: total}
	}
	for range o.count {
		for _, inv := range invs {
			dir := filepath.Join(o.pkg, inv.dir)
			if err := runBinary(ctx, bins[dir], dir, inv, &raw, prog); err != nil {
				prog.close()
				return nil, err
			}
		}
	}
	prog.close()
	fmt.Fprintf(stderr, "benchreport: benchmarks took %s\n", time.Since(began).Round(time.Second))
	return raw.Bytes(), nil
}
