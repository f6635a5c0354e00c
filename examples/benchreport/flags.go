package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// options is the parsed command line.
type options struct {
	groups    []*groupSpec // in the order of groupSpecs
	sizes     []string     // sized groups: values of n=, e.g. 1K
	benchtime string       // -test.benchtime: a duration or Nx
	count     int          // rounds: runs of each benchmark, each round in processes of its own
	cpus      []int        // -test.cpu of the sized groups, ascending
	policies  []string     // Connect policies; nil: all
	out       string       // output directory; "" until resolved
	pkg       string       // package directory; "" until resolved
	// single: -pkg named the one package whose benchmarks run. Otherwise
	// pkg is the root of the hash4 repository, and each group runs in its
	// own package below it (groupSpec.dir).
	single bool
	from   string // render from this file instead of running
	quick  bool
	args   []string // the command line, for the report
}

// Defaults of the flags, and what -quick changes.
const (
	defaultBenchtime = "1s"
	defaultCount     = 3
	quickBenchtime   = "100ms"
	quickCount       = 1
	quickSize        = "1K"
	quickPolicy      = "flat"
)

var defaultSizes = []string{"1K", "1M"}

// quickOut is the default output directory of -quick.
func quickOut() string { return filepath.Join(os.TempDir(), "benchreport-quick") }

// errUsage is returned for -h: print usage, exit 0.
var errUsage = errors.New("usage requested")

var (
	sizeRE   = regexp.MustCompile(`^[0-9]+[KMG]?$`)
	policyRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	countXRE = regexp.MustCompile(`^[1-9][0-9]*x$`)
)

// defaultCPUs returns 1, 2, 4, ... up to gomaxprocs, and gomaxprocs: every
// count on a small machine, a doubling series on a large one.
func defaultCPUs(gomaxprocs int) []int {
	var cpus []int
	for n := 1; n < gomaxprocs; n *= 2 {
		cpus = append(cpus, n)
	}
	return append(cpus, gomaxprocs)
}

// parseFlags parses args (without the program name); gomaxprocs is the
// default top of -cpu. Errors name the offending flag; usage goes to out.
func parseFlags(args []string, gomaxprocs int, out io.Writer) (options, error) {
	o := options{args: args}
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.SetOutput(out)
	var groups, sizes, cpus, policies string
	names := make([]string, len(groupSpecs))
	var quickNames, slowNames []string
	for i, g := range groupSpecs {
		names[i] = g.name
		if g.slow {
			slowNames = append(slowNames, g.name)
		} else {
			quickNames = append(quickNames, g.name)
		}
	}
	fs.StringVar(&groups, "groups", strings.Join(names, ","), "comma-separated comparisons to run: "+strings.Join(names, ", ")+
		" (-quick leaves out "+strings.Join(slowNames, ", ")+" unless named here)")
	fs.StringVar(&sizes, "sizes", strings.Join(defaultSizes, ","), "comma-separated table sizes of lookup, mixed, churn and batch (the n= of their sub-benchmarks; turnover, zipf, natmix, uniform, writes and burst have 1M flows)")
	fs.StringVar(&o.benchtime, "benchtime", defaultBenchtime, "run time of each benchmark: a duration (300ms) or an iteration count (2000x)")
	fs.IntVar(&o.count, "count", defaultCount, "runs of each benchmark, in as many rounds of the whole plan; the report shows the median")
	fs.StringVar(&cpus, "cpu", joinInts(defaultCPUs(gomaxprocs)), "comma-separated goroutine counts (GOMAXPROCS) of lookup, mixed, churn and batch; the others run at GOMAXPROCS")
	fs.StringVar(&policies, "policies", "", "comma-separated port policies of connect (the policy= of its sub-benchmarks: odd-even, flat; default all)")
	fs.StringVar(&o.out, "out", "", "output directory, the raw output in its data/ (default docs/ at the module root)")
	fs.StringVar(&o.pkg, "pkg", "", "directory of the one package whose benchmarks run (default: each in its package of the repository: bench/ for the comparisons with other maps, the root for the rest)")
	fs.StringVar(&o.from, "from", "", "render the report from this recorded benchmark output instead of running")
	fs.BoolVar(&o.quick, "quick", false, "a first look in under a minute: sizes "+quickSize+", benchtime "+quickBenchtime+
		", count 1, connect policy "+quickPolicy+", output in "+quickOut()+"; leaves out "+strings.Join(slowNames, ", ")+
		" (flags given explicitly still apply)")
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: benchreport [flags]\n\nRuns hash4's comparison benchmarks and writes benchmarks.md and SVG charts.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, errUsage
		}
		return o, err // the flag package has printed the message and usage
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		if !set["sizes"] {
			sizes = quickSize
		}
		if !set["benchtime"] {
			o.benchtime = quickBenchtime
		}
		if !set["count"] {
			o.count = quickCount
		}
		if !set["policies"] {
			policies = quickPolicy
		}
		if !set["groups"] {
			// The traffic groups fill 1M flows in every process,
			// whatever -sizes says.
			groups = strings.Join(quickNames, ",")
		}
		if !set["out"] {
			// Not docs/: a first look must not overwrite the report.
			o.out = quickOut()
		}
	}

	seen := map[string]bool{}
	for _, name := range splitList(groups) {
		g := groupByName(name)
		if g == nil {
			return o, fmt.Errorf("-groups: unknown group %q (want some of %s)", name, strings.Join(names, ", "))
		}
		seen[name] = true
	}
	for _, g := range groupSpecs {
		if seen[g.name] {
			o.groups = append(o.groups, g)
		}
	}
	if len(o.groups) == 0 {
		return o, fmt.Errorf("-groups: empty (want some of %s)", strings.Join(names, ", "))
	}

	for _, s := range splitList(sizes) {
		s = strings.ToUpper(s)
		if !sizeRE.MatchString(s) {
			return o, fmt.Errorf("-sizes: bad size %q (want a number with an optional K, M or G, like 1K)", s)
		}
		if !slices.Contains(o.sizes, s) {
			o.sizes = append(o.sizes, s)
		}
	}
	if len(o.sizes) == 0 {
		return o, errors.New("-sizes: empty")
	}

	if countXRE.MatchString(o.benchtime) {
		// An iteration count.
	} else if d, err := time.ParseDuration(o.benchtime); err != nil || d <= 0 {
		return o, fmt.Errorf("-benchtime: bad value %q (want a positive duration like 300ms, or an iteration count like 2000x)", o.benchtime)
	}
	if o.count < 1 {
		return o, fmt.Errorf("-count: %d, want at least 1", o.count)
	}

	for _, s := range splitList(cpus) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return o, fmt.Errorf("-cpu: bad goroutine count %q (want positive integers like 1,2,4)", s)
		}
		if !slices.Contains(o.cpus, n) {
			o.cpus = append(o.cpus, n)
		}
	}
	if len(o.cpus) == 0 {
		return o, errors.New("-cpu: empty")
	}
	slices.Sort(o.cpus)

	for _, p := range splitList(policies) {
		if !policyRE.MatchString(p) {
			return o, fmt.Errorf("-policies: bad policy %q (want names like flat or odd-even)", p)
		}
		if !slices.Contains(o.policies, p) {
			o.policies = append(o.policies, p)
		}
	}
	if set["policies"] && len(o.policies) == 0 {
		return o, errors.New("-policies: empty")
	}

	if o.from != "" {
		if _, err := os.Stat(o.from); err != nil {
			return o, fmt.Errorf("-from: %v", err)
		}
	}
	o.single = set["pkg"]
	if set["pkg"] {
		if st, err := os.Stat(o.pkg); err != nil {
			return o, fmt.Errorf("-pkg: %v", err)
		} else if !st.IsDir() {
			return o, fmt.Errorf("-pkg: %s is not a directory", o.pkg)
		}
	}
	if set["out"] && o.out == "" {
		return o, errors.New("-out: empty")
	}
	if o.out != "" {
		if st, err := os.Stat(o.out); err == nil && !st.IsDir() {
			return o, fmt.Errorf("-out: %s is not a directory", o.out)
		}
	}
	return o, nil
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var l []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			l = append(l, f)
		}
	}
	return l
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
