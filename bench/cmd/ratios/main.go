// Command ratios measures hash4 against its peers on the traffic
// benchmarks of package bench (bench/traffic_test.go) the way a noisy
// machine allows: it builds the package's test binary once, then, for each
// of -rounds rounds, runs every implementation in a process of its own, in
// an order that turns by one place every round, and reports per workload
// hash4's ratio to the fastest peer in each round, the median of those
// ratios and their range, and each implementation's median ns/op and
// allocs/op. Ratios taken within a round, where all ran within minutes of
// each other, hold where medians across rounds do not.
//
// From the repository's root:
//
//	go run ./bench/cmd/ratios                        # 6 rounds, every workload and peer
//	go run ./bench/cmd/ratios -rounds 3 -work Zipf,Turnover -impls hash4,xsync,rwmutex
//	go run ./bench/cmd/ratios -base ../hash4-old     # this hash4 against another checkout's
//	go run ./bench/cmd/ratios -variant line=-traffic.keys=line
//
// -base builds the same benchmarks a second time against the library of
// another checkout (a go.work that uses it and this bench module), runs its
// hash4 in every round beside this one's, and reports this hash4's time
// over the other's per round. -variant name=flags, repeatable, runs every
// implementation once more per round with the test flags given (the
// -traffic.* flags of bench/traffic_test.go) and reports its ratios beside
// the default's, and per round its ratio over the default's. -o writes every
// process's output, with round:, setup: and impl: lines that benchstat
// reads as configuration, and -from reports on such a file again.
//
// On a machine that other work shares, the benchmarks report the share of
// the processors other work kept busy during each timed run
// (others-share). Before each process the runner waits (up to -wait) for
// other work to keep less than -quiet of them busy, and runs a process
// whose runs saw more again, up to -retries times, keeping the least
// disturbed; the report says how disturbed the runs it counts were, and
// gives the ratios by CPU time per op too, which time-slicing with other
// work moves less than it moves wall time (but which does not count the
// time a goroutine spends blocked on a lock).
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hash4/hash4/bench/internal/machine"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ratios:", err)
		os.Exit(1)
	}
}

// variantFlag is -variant, repeatable: name=test flags.
type variantFlag []setup

func (v *variantFlag) String() string { return "" }

func (v *variantFlag) Set(s string) error {
	name, args, ok := strings.Cut(s, "=")
	if !ok || !setupName.MatchString(name) || name == defaultSetup || name == baseSetup {
		return fmt.Errorf("want name=flags, name a word other than %q and %q", defaultSetup, baseSetup)
	}
	*v = append(*v, setup{name: name, args: strings.Fields(args)})
	return nil
}

var setupName = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// The names of the setups every run has, and -base adds.
const (
	defaultSetup = "default"
	baseSetup    = "base"
)

// setup is a test binary and the flags its processes run with.
type setup struct {
	name string
	bin  string
	args []string
	// impls, if set, are the only implementations it runs (-base runs
	// hash4 only).
	impls []string
}

// config is the command line.
type config struct {
	rounds    int
	impls     []string
	work      []string
	benchtime string
	base      string
	variants  []setup
	out       string
	pkg       string
	from      string
	quiet     float64
	maxOthers float64
	wait      time.Duration
	retries   int
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("ratios", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	var impls, work string
	var variants variantFlag
	fs.IntVar(&c.rounds, "rounds", 6, "rounds of one process per implementation (and setup)")
	fs.StringVar(&impls, "impls", "hash4,xsync,rwmutex,shard256,syncmap", "implementations, hash4 first, its peers after")
	fs.StringVar(&work, "work", strings.Join(workloads, ","), "benchmarks to run, without their Benchmark prefix")
	fs.StringVar(&c.benchtime, "benchtime", "1s", "-test.benchtime of every run")
	fs.StringVar(&c.base, "base", "", "a checkout of hash4 whose library the benchmarks are built against a second time, for its hash4")
	fs.Var(&variants, "variant", "name=test flags: run every implementation also with these flags, as a setup of its own (repeatable)")
	fs.StringVar(&c.out, "o", "", "file to write every process's output to")
	fs.StringVar(&c.pkg, "pkg", "github.com/hash4/hash4/bench", "the package of the benchmarks")
	fs.Float64Var(&c.quiet, "quiet", 0.25, "the share of the machine's processors other work may keep busy: before each process the runner waits for less "+
		"(up to -wait), and a process whose timed runs saw more runs again (up to -retries times); 1 turns both off")
	fs.DurationVar(&c.wait, "wait", 5*time.Minute, "the longest wait for a quiet machine before a process")
	fs.IntVar(&c.retries, "retries", 2, "the most times a disturbed process runs again")
	fs.Float64Var(&c.maxOthers, "maxothers", 1, "leave out of the report the results whose runs other work kept more than this share of the processors busy")
	fs.StringVar(&c.from, "from", "", "report on a file that -o wrote (complete or not) rather than run anything")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.impls = strings.Split(impls, ",")
	c.work = strings.Split(work, ",")
	c.variants = variants
	if c.rounds < 1 {
		return nil, errors.New("-rounds: want at least 1")
	}
	if c.impls[0] != "hash4" || len(c.impls) < 2 {
		return nil, errors.New("-impls: want hash4 first, then at least one peer")
	}
	for _, w := range c.work {
		if !slices.Contains(workloads, w) {
			return nil, fmt.Errorf("-work: no workload %q; there are %q", w, workloads)
		}
	}
	return c, nil
}

// workloads are the traffic benchmarks, without their Benchmark prefix.
var workloads = []string{"Zipf", "Turnover", "NATMix", "Uniform", "UniformWrites", "Burst"}

// benchPattern returns the -test.bench pattern that runs impl in the
// benchmark work: for hash4 in Burst, both its AppendLookups (hash4-batch)
// and its loop of Lookup.
func benchPattern(work, impl string) string {
	q := regexp.QuoteMeta(impl)
	if work == "Burst" {
		return fmt.Sprintf("^BenchmarkBurst$/^n=1M$/^mix=/^impl=%s(-batch)?$", q)
	}
	return fmt.Sprintf("^Benchmark%s$/^n=1M$/^impl=%s$", work, q)
}

func run(args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if c.from != "" {
		f, err := os.Open(c.from)
		if err != nil {
			return err
		}
		defer f.Close()
		results, setups, loads, rounds, err := parseRaw(f)
		if err != nil {
			return err
		}
		writeReport(stdout, results, setups, loads, rounds, "", c.maxOthers)
		return nil
	}
	tmp, err := os.MkdirTemp("", "ratios")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir, err := goOutput("", nil, "list", "-f", "{{.Dir}}", c.pkg)
	if err != nil {
		return err
	}
	setups := []setup{{name: defaultSetup, bin: filepath.Join(tmp, "bench.test")}}
	fmt.Fprintf(stderr, "building %s\n", c.pkg)
	if _, err := goOutput(dir, nil, "test", "-c", "-o", setups[0].bin, "."); err != nil {
		return err
	}
	for _, v := range c.variants {
		v.bin = setups[0].bin
		setups = append(setups, v)
	}
	if c.base != "" {
		bin, err := buildBase(c.base, dir, tmp)
		if err != nil {
			return err
		}
		setups = append(setups, setup{name: baseSetup, bin: bin, impls: []string{"hash4"}})
	}
	var raw io.Writer = io.Discard
	if c.out != "" {
		f, err := os.Create(c.out)
		if err != nil {
			return err
		}
		defer f.Close()
		raw = f
	}
	// A round runs each workload in turn, and for each every setup's
	// implementations one after the other, in an order that turns by one
	// place every round.
	var jobs []job
	for _, s := range setups {
		for _, impl := range c.impls {
			if s.impls == nil || slices.Contains(s.impls, impl) {
				jobs = append(jobs, job{s, impl})
			}
		}
	}
	var results []result
	var loads []string
	for r := range c.rounds {
		loads = append(loads, loadAvg())
		fmt.Fprintf(raw, "load: %s\n", loads[r])
		for _, w := range c.work {
			for i := range jobs {
				j := jobs[(i+r)%len(jobs)]
				fmt.Fprintf(stderr, "round %d/%d: %s, %s %s\n", r+1, c.rounds, w, j.s.name, j.impl)
				// A run that other work disturbed runs again, after a
				// wait for the machine to be quiet, and the least
				// disturbed of the tries counts.
				var out []byte
				var rs []result
				tries := 0
				for tries <= c.retries && (tries == 0 || disturbance(rs) > c.quiet) {
					if c.quiet < 1 {
						if d := waitQuiet(c.quiet, c.wait); d >= c.wait {
							fmt.Fprintf(stderr, "  the machine was not quiet after %v; running anyway\n", d.Round(time.Second))
						}
					}
					o, r1, err := runJob(j, w, c.benchtime, dir, r)
					if err != nil {
						return err
					}
					if tries++; tries == 1 || disturbance(r1) < disturbance(rs) {
						out, rs = o, r1
					}
					if d := disturbance(r1); d > c.quiet {
						fmt.Fprintf(stderr, "  disturbed: other work kept %.0f%% of the processors busy\n", 100*d)
					}
				}
				fmt.Fprintf(raw, "round: %d\nsetup: %s\nargs: %s\nimpl: %s\ntries: %d\n%s\n",
					r+1, j.s.name, strings.Join(j.s.args, " "), j.impl, tries, out)
				results = append(results, rs...)
			}
		}
	}
	loads = append(loads, loadAvg())
	fmt.Fprintf(raw, "load: %s\n", loads[len(loads)-1])
	writeReport(stdout, results, setups, loads, c.rounds, ", -benchtime "+c.benchtime, c.maxOthers)
	return nil
}

// writeReport writes the report with its heading, of the results whose
// runs other work kept no more than maxOthers of the processors busy.
func writeReport(w io.Writer, results []result, setups []setup, loads []string, rounds int, how string, maxOthers float64) {
	fmt.Fprintf(w, "%d rounds%s; load average (1, 5, 15 min) at each round's start and at the end: %s\n\n",
		rounds, how, strings.Join(loads, "; "))
	var kept []result
	for _, r := range results {
		if !(r.others > maxOthers) {
			kept = append(kept, r)
		}
	}
	if len(kept) < len(results) {
		fmt.Fprintf(w, "Left out: %d results of %d, whose runs other work kept more than %s of the processors busy.\n\n",
			len(results)-len(kept), len(results), fmtRatio(maxOthers))
	}
	report(w, kept, rounds, setups)
}

// parseRaw reads what -o wrote: the results, the setups in the order they
// first appear, the load averages and the number of rounds begun.
func parseRaw(r io.Reader) ([]result, []setup, []string, int, error) {
	var (
		results []result
		setups  []setup
		loads   []string
		round   int
		cur     string
		out     bytes.Buffer
	)
	tries := 1
	flush := func() {
		for _, r := range parseResults(out.Bytes(), round-1, cur) {
			r.tries = tries
			results = append(results, r)
		}
		out.Reset()
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		key, val, _ := strings.Cut(line, ": ")
		switch key {
		case "round":
			flush()
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return nil, nil, nil, 0, fmt.Errorf("bad line %q", line)
			}
			round, tries = n, 1
		case "setup":
			cur = val
			if !slices.ContainsFunc(setups, func(s setup) bool { return s.name == val }) {
				setups = append(setups, setup{name: val})
			}
		case "args":
			i := slices.IndexFunc(setups, func(s setup) bool { return s.name == cur })
			if i >= 0 && setups[i].args == nil {
				setups[i].args = strings.Fields(val)
			}
		case "load":
			loads = append(loads, val)
		case "tries":
			tries, _ = strconv.Atoi(val)
		default:
			out.WriteString(line + "\n")
		}
	}
	flush()
	if len(setups) == 0 || setups[0].name != defaultSetup {
		return nil, nil, nil, 0, errors.New("no results of the default setup first")
	}
	return results, setups, loads, round, sc.Err()
}

// job is one process of a round.
type job struct {
	s    setup
	impl string
}

// runJob runs benchmark work of job j in a process and returns its output
// and results.
func runJob(j job, work, benchtime, dir string, round int) ([]byte, []result, error) {
	args := append([]string{"-test.run", "^$", "-test.bench", benchPattern(work, j.impl),
		"-test.benchmem", "-test.count", "1", "-test.benchtime", benchtime}, j.s.args...)
	cmd := exec.Command(j.s.bin, args...)
	cmd.Dir = dir
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("%s %q: %v\n%s%s", j.s.bin, args, err, out, errb.Bytes())
	}
	rs := parseResults(out, round, j.s.name)
	if len(rs) == 0 {
		return nil, nil, fmt.Errorf("%s %q ran no benchmark:\n%s", j.s.bin, args, out)
	}
	return out, rs, nil
}

// disturbance returns the greatest share of the machine's processors that
// other work kept busy during the timed runs of rs, 0 if none says.
func disturbance(rs []result) float64 {
	d := 0.0
	for _, r := range rs {
		if r.others == r.others {
			d = max(d, r.others)
		}
	}
	return d
}

// waitQuiet waits until other work keeps busy less than share of the
// machine's processors over a second, or until wait has passed; it
// returns how long it waited.
func waitQuiet(share float64, wait time.Duration) time.Duration {
	start := time.Now()
	for prev := machine.Busy(); ; {
		time.Sleep(time.Second)
		cur := machine.Busy()
		if prev < 0 || cur < 0 || float64(cur-prev)/float64(time.Second)/float64(runtime.NumCPU()) < share ||
			time.Since(start) >= wait {
			return time.Since(start)
		}
		prev = cur
	}
}

// buildBase builds the benchmarks of bench directory dir against the
// library checked out in base, and returns the binary's path.
func buildBase(base, dir, tmp string) (string, error) {
	base, err := filepath.Abs(base)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(base, "go.mod")); err != nil {
		return "", fmt.Errorf("-base: %v", err)
	}
	// The go directive of the workspace this package is built in.
	gover, err := goOutput(dir, nil, "env", "GOVERSION")
	if err != nil {
		return "", err
	}
	work := filepath.Join(tmp, "go.work")
	text := fmt.Sprintf("go %s\n\nuse (\n\t%s\n\t%s\n)\n", strings.TrimPrefix(gover, "go"), base, dir)
	if err := os.WriteFile(work, []byte(text), 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(tmp, "base.test")
	fmt.Fprintf(os.Stderr, "building the benchmarks against %s\n", base)
	_, err = goOutput(dir, []string{"GOWORK=" + work}, "test", "-c", "-o", bin, ".")
	return bin, err
}

// goOutput runs the go command in dir with env added, and returns its
// output, trimmed.
func goOutput(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, errb.Bytes())
	}
	return strings.TrimSpace(string(out)), nil
}

// loadAvg returns the machine's load averages, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// result is one benchmark's line.
type result struct {
	round    int
	setup    string
	workload string // the benchmark's name without Benchmark, n=1M and impl=
	impl     string
	ns       float64
	allocs   float64 // NaN if not reported, as the next
	cpu      float64 // CPU time per op, all threads
	others   float64 // the share of the machine's processors other work kept busy
	procs    int     // GOMAXPROCS
	tries    int     // the runs of its process, the disturbed ones included
}

// parseResults returns the results in a test binary's output.
func parseResults(out []byte, round int, setup string) []result {
	var rs []result
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || f[3] != "ns/op" {
			continue
		}
		name, procs := f[0], 1
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if p, err := strconv.Atoi(name[i+1:]); err == nil {
				name, procs = name[:i], p // the GOMAXPROCS suffix
			}
		}
		i := strings.LastIndex(name, "/impl=")
		if i < 0 {
			continue
		}
		ns, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			continue
		}
		wl := strings.Replace(strings.TrimPrefix(name[:i], "Benchmark"), "/n=1M", "", 1)
		r := result{round: round, setup: setup, workload: wl, impl: name[i+len("/impl="):], ns: ns, allocs: nan, cpu: nan, others: nan, procs: procs, tries: 1}
		for k := 4; k+1 < len(f); k += 2 {
			v, err := strconv.ParseFloat(f[k], 64)
			if err != nil {
				continue
			}
			switch f[k+1] {
			case "allocs/op":
				r.allocs = v
			case "cpu-ns/op":
				r.cpu = v
			case "others-share":
				r.others = v
			}
		}
		rs = append(rs, r)
	}
	return rs
}

// isHash4 reports whether impl is a form of hash4 rather than a peer.
func isHash4(impl string) bool { return strings.HasPrefix(impl, "hash4") }

// The metrics of a table.
const (
	mNs     = "ns"
	mAllocs = "allocs"
	mCPU    = "cpu"
	mShare  = "share" // cpu over ns times GOMAXPROCS
	mOthers = "others"
	mTries  = "tries"
)

// table is one setup's results: per workload, implementation and metric,
// a value per round, NaN where a run is missing.
type table struct {
	workloads []string
	impls     map[string][]string // per workload, in order of appearance
	vals      map[[3]string][]float64
}

// get returns the values of metric m of impl in workload w, per round.
func (t *table) get(w, impl, m string) []float64 { return t.vals[[3]string{w, impl, m}] }

func collect(results []result, rounds int, setup string) *table {
	t := &table{impls: map[string][]string{}, vals: map[[3]string][]float64{}}
	for _, r := range results {
		if r.setup != setup || r.round >= rounds {
			continue
		}
		if t.impls[r.workload] == nil {
			t.workloads = append(t.workloads, r.workload)
		}
		if !slices.Contains(t.impls[r.workload], r.impl) {
			t.impls[r.workload] = append(t.impls[r.workload], r.impl)
		}
		for m, v := range map[string]float64{mNs: r.ns, mAllocs: r.allocs, mCPU: r.cpu, mShare: r.cpu / (r.ns * float64(r.procs)),
			mOthers: r.others, mTries: float64(r.tries)} {
			k := [3]string{r.workload, r.impl, m}
			if t.vals[k] == nil {
				t.vals[k] = nans(rounds)
			}
			t.vals[k][r.round] = v
		}
	}
	return t
}

// headline returns the form of hash4 that a workload's ratio is of:
// AppendLookups in bursts, Lookup elsewhere.
func (t *table) headline(w string) string {
	if slices.Contains(t.impls[w], "hash4-batch") {
		return "hash4-batch"
	}
	return "hash4"
}

// ratios returns per round the headline's value of metric m over the
// fastest peer's, and that peer's name, NaN and "" where a round lacks a
// run.
func (t *table) ratios(w, m string) ([]float64, []string) {
	h := t.get(w, t.headline(w), m)
	rs, who := nans(len(h)), make([]string, len(h))
	for r := range h {
		best := nan
		for _, impl := range t.impls[w] {
			if v := at(t.get(w, impl, m), r); !isHash4(impl) && v == v && !(best <= v) {
				best, who[r] = v, impl
			}
		}
		rs[r] = h[r] / best
	}
	return rs, who
}

var nan = func() float64 { var z float64; return z / z }()

func nans(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = nan
	}
	return s
}

// stats returns the median, least and greatest of the numbers of xs, NaN
// if none is.
func stats(xs []float64) (med, lo, hi float64) {
	var s []float64
	for _, x := range xs {
		if x == x {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return nan, nan, nan
	}
	slices.Sort(s)
	m := len(s) / 2
	med = s[m]
	if len(s)%2 == 0 {
		med = (s[m-1] + s[m]) / 2
	}
	return med, s[0], s[len(s)-1]
}

// most returns the most frequent nonempty string of ss.
func most(ss []string) string {
	best, n := "", 0
	for _, s := range ss {
		if c := countOf(ss, s); s != "" && c > n {
			best, n = s, c
		}
	}
	return best
}

func countOf(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

func fmtRatio(x float64) string {
	if x != x {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

func fmtRange(med, lo, hi float64) string {
	if med != med {
		return "-"
	}
	return fmt.Sprintf("%s (%s–%s)", fmtRatio(med), fmtRatio(lo), fmtRatio(hi))
}

func fmtNs(x float64) string {
	switch {
	case x != x:
		return "-"
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	default:
		return fmt.Sprintf("%.1f", x)
	}
}

// report writes, per setup, the ratio table, and the ratios of the setups
// to the default one's.
func report(w io.Writer, results []result, rounds int, setups []setup) {
	tables := map[string]*table{}
	for _, s := range setups {
		tables[s.name] = collect(results, rounds, s.name)
	}
	def := tables[defaultSetup]
	for _, s := range setups {
		if s.name == baseSetup {
			continue
		}
		t := tables[s.name]
		title := "default"
		if s.name != defaultSetup {
			title = fmt.Sprintf("%s (%s)", s.name, strings.Join(s.args, " "))
		}
		fmt.Fprintf(w, "### %s\n\n", title)
		writeTable(w, t)
		writeNoise(w, t)
	}
	if len(setups) > 1 {
		fmt.Fprintf(w, "### Setups against the default, per round\n\n")
		fmt.Fprintf(w, "| workload | setup | hash4 / fastest peer | its ratio to the default's, per round | median (range) |\n| --- | --- | ---: | --- | ---: |\n")
		for _, wl := range def.workloads {
			for _, s := range setups[1:] {
				t := tables[s.name]
				per := nans(rounds)
				var mine string
				if s.name == baseSetup {
					// This hash4's time over the base's.
					h := def.headline(wl)
					for r := range per {
						per[r] = at(def.get(wl, h, mNs), r) / at(t.get(wl, h, mNs), r)
					}
					mine = "(" + h + " of this build / of the base)"
				} else {
					mr, _ := t.ratios(wl, mNs)
					dr, _ := def.ratios(wl, mNs)
					for r := range per {
						per[r] = at(mr, r) / at(dr, r)
					}
					mine = fmtRange(stats(mr))
				}
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", wl, s.name, mine, joinRatios(per), fmtRange(stats(per)))
			}
		}
		fmt.Fprintln(w)
	}
}

// writeNoise writes how noisy a setup's runs were: the spread of each
// implementation's ns/op across rounds, and the share of the processors
// the runs had.
func writeNoise(w io.Writer, t *table) {
	var spreads []string
	var shares, others []float64
	runs, again := 0, 0
	for _, wl := range t.workloads {
		var parts []string
		for _, impl := range t.impls[wl] {
			_, lo, hi := stats(t.get(wl, impl, mNs))
			parts = append(parts, fmt.Sprintf("%s %s", impl, fmtRatio(hi/lo)))
			shares = append(shares, t.get(wl, impl, mShare)...)
			others = append(others, t.get(wl, impl, mOthers)...)
			for _, n := range t.get(wl, impl, mTries) {
				if n == n {
					runs++
					if n > 1 {
						again++
					}
				}
			}
		}
		spreads = append(spreads, fmt.Sprintf("%s: %s", wl, strings.Join(parts, ", ")))
	}
	fmt.Fprintf(w, "\nSpread of ns/op across rounds (slowest / fastest): %s.\n", strings.Join(spreads, "; "))
	if med, lo, _ := stats(shares); med == med {
		fmt.Fprintf(w, "Share of the processors the timed runs had (CPU time over GOMAXPROCS times the time): median %s, least %s.\n",
			fmtRatio(med), fmtRatio(lo))
	}
	if med, _, hi := stats(others); med == med {
		fmt.Fprintf(w, "Share of the machine's processors other work kept busy during them: median %s, greatest %s; "+
			"%d results of %d came from a process run again for being disturbed.\n", fmtRatio(med), fmtRatio(hi), again, runs)
	}
	fmt.Fprintln(w)
}

// at returns xs[i], or NaN if xs is too short.
func at(xs []float64, i int) float64 {
	if i < len(xs) {
		return xs[i]
	}
	return nan
}

func joinRatios(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmtRatio(x)
	}
	return strings.Join(s, " ")
}

// writeTable writes one setup's table: per workload hash4's ratio to the
// fastest peer per round, their median and range, the peer fastest most
// often, the ratio by CPU time, and every implementation's median ns/op
// and allocs/op.
func writeTable(w io.Writer, t *table) {
	var impls []string
	for _, wl := range t.workloads {
		for _, impl := range t.impls[wl] {
			if !slices.Contains(impls, impl) {
				impls = append(impls, impl)
			}
		}
	}
	slices.SortStableFunc(impls, func(a, b string) int {
		// hash4's forms first, as they appeared.
		switch {
		case isHash4(a) && !isHash4(b):
			return -1
		case isHash4(b) && !isHash4(a):
			return 1
		}
		return 0
	})
	fmt.Fprintf(w, "| workload | hash4 / fastest peer, median (range) | per round | fastest peer | by CPU time |")
	for _, impl := range impls {
		fmt.Fprintf(w, " %s ns/op, allocs |", impl)
	}
	fmt.Fprintf(w, "\n| --- | ---: | --- | --- | ---: |%s\n", strings.Repeat(" ---: |", len(impls)))
	for _, wl := range t.workloads {
		rs, who := t.ratios(wl, mNs)
		cpu, _ := t.ratios(wl, mCPU)
		name := wl
		if h := t.headline(wl); h != "hash4" {
			name += " (" + h + ")"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |", name, fmtRange(stats(rs)), joinRatios(rs), most(who), fmtRange(stats(cpu)))
		for _, impl := range impls {
			ns := t.get(wl, impl, mNs)
			if ns == nil {
				fmt.Fprintf(w, " |")
				continue
			}
			m, _, _ := stats(ns)
			cell := fmtNs(m)
			if a, _, _ := stats(t.get(wl, impl, mAllocs)); a == a {
				cell += ", " + strconv.FormatFloat(a, 'f', -1, 64)
			}
			fmt.Fprintf(w, " %s |", cell)
		}
		fmt.Fprintln(w)
	}
}
