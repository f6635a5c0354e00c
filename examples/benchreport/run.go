package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// invocation is one run of the test binary.
type invocation struct {
	args   []string // flags of the test binary
	expect int      // result lines it prints
	dir    string   // the package, relative to options.pkg ("" for pkg itself)
}

// goTestCommand is the go test command equivalent to the invocation, run in
// the directory of options.pkg.
func (inv invocation) goTestCommand() string {
	parts := []string{"go", "test"}
	for _, a := range inv.args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "-test."), "=")
		if v == "" {
			parts = append(parts, "-"+k)
		} else {
			parts = append(parts, "-"+k, shellQuote(v))
		}
	}
	dir := "."
	if inv.dir != "" {
		dir = "./" + filepath.ToSlash(inv.dir)
	}
	return strings.Join(append(parts, dir), " ")
}

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,/=:") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// plan returns one round of the runs of the test binary that the options
// ask for, each benchmark once: the sized comparisons in one run at every
// -cpu value, then each other comparison in a run of its own at
// GOMAXPROCS, or, for a processPerImpl group, a run per implementation,
// one after the other. The report runs -count rounds, one after another,
// rather than -test.count repetitions in one process: the processors of a
// VM move between cores from time to time, and a move then changes one
// round of every implementation, not several runs of one.
func plan(o options) []invocation {
	common := []string{"-test.run=^$", "-test.benchtime=" + o.benchtime, "-test.count=1", "-test.benchmem"}
	var invs []invocation
	var sized []string
	perSize := 0
	for _, g := range o.groups {
		if g.sized {
			sized = append(sized, strings.TrimPrefix(g.bench, "Benchmark"))
			perSize += g.perRow
		}
	}
	if len(sized) > 0 {
		re := "^Benchmark(" + strings.Join(sized, "|") + ")$/^n=(" + strings.Join(o.sizes, "|") + ")$"
		args := append(common[:len(common):len(common)], "-test.bench="+re, "-test.cpu="+joinInts(o.cpus))
		invs = append(invs, invocation{args: args, expect: perSize * len(o.sizes) * len(o.cpus), dir: o.dirOf(peersDir)})
	}
	for _, g := range o.groups {
		if g.sized {
			continue
		}
		if g.processPerImpl {
			// The sub-names of these groups end in impl=.
			for _, impl := range g.impls {
				re := "^" + g.bench + "$/" + g.levels + "/^impl=" + impl + "$"
				args := append(common[:len(common):len(common)], "-test.bench="+re)
				invs = append(invs, invocation{args: args, expect: g.perRow / len(g.impls), dir: o.dirOf(g.dir)})
			}
			continue
		}
		re := "^" + g.bench + "$"
		n := g.perRow
		if g.name == "connect" {
			if o.policies != nil {
				// Also matches every occupancy in case the benchmark has no
				// policy level.
				re += "/^(policy=(" + strings.Join(o.policies, "|") + ")|occupancy=.*)$"
				n *= len(o.policies)
			} else {
				n *= len(connectPolicies)
			}
		}
		if g.name == "connect" && !o.single {
			// Connect and its map baseline are in bench/, Connect's
			// predecessors in the root package (its own impl=hash4 left
			// out there, as bench/ runs it).
			policy := "."
			if o.policies != nil {
				policy = "^policy=(" + strings.Join(o.policies, "|") + ")$"
			}
			root := n / len(g.impls) * len(connectRootImpls)
			args := append(common[:len(common):len(common)], "-test.bench="+re)
			invs = append(invs, invocation{args: args, expect: n - root, dir: peersDir})
			re = "^" + g.bench + "$/" + policy + "/./^impl=(" + strings.Join(connectRootImpls, "|") + ")$"
			args = append(common[:len(common):len(common)], "-test.bench="+re)
			invs = append(invs, invocation{args: args, expect: root})
			continue
		}
		args := append(common[:len(common):len(common)], "-test.bench="+re)
		invs = append(invs, invocation{args: args, expect: n, dir: o.dirOf(g.dir)})
	}
	return invs
}

// peersDir is the package of the comparisons with other maps, relative to
// the repository's root.
const peersDir = "bench"

// dirOf returns the directory, relative to o.pkg, of a group whose package
// is dir relative to the repository's root: dir, or o.pkg itself when
// -pkg named the one package.
func (o options) dirOf(dir string) string {
	if o.single {
		return ""
	}
	return dir
}

// childError is a failed child process: its command, exit error and output.
type childError struct {
	cmd    string
	err    error
	output string // the tail of stdout and stderr
}

func (e *childError) Error() string {
	return fmt.Sprintf("%s: %v\n%s", e.cmd, e.err, e.output)
}

// compile builds the test binary of the package in dir into tmp.
func compile(ctx context.Context, dir, tmp string) (string, error) {
	bin := filepath.Join(tmp, "bench.test")
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, ".")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", &childError{cmd: "go test -c (in " + dir + ")", err: err, output: string(out)}
	}
	if _, err := os.Stat(bin); err != nil {
		return "", &childError{cmd: "go test -c (in " + dir + ")", err: errors.New("no test binary built"), output: string(out)}
	}
	return bin, nil
}

// runBinary runs one invocation of the test binary bin in dir, appending
// its standard output to raw and reporting each benchmark to prog as it
// starts and finishes.
func runBinary(ctx context.Context, bin, dir string, inv invocation, raw *bytes.Buffer, prog progress) error {
	cmd := exec.CommandContext(ctx, bin, inv.args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	start := raw.Len()
	tap := &lineTap{r: io.TeeReader(stdout, raw), onStart: prog.start}
	br := benchfmt.NewReader(tap, "stdout")
	for br.Scan() {
		if res, ok := br.Result().(*benchfmt.Result); ok {
			sec, _ := res.Value("sec/op")
			prog.done("Benchmark"+res.Name.String(), sec*1e9)
		}
	}
	_, _ = io.Copy(io.Discard, tap) // if the reader stopped early, let the child finish
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		out := tail(raw.String()[start:], 40)
		if stderr.Len() > 0 {
			out += "\nstderr:\n" + tail(stderr.String(), 40)
		}
		return &childError{cmd: inv.goTestCommand(), err: err, output: out}
	}
	return nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// lineTap passes a reader through, calling onStart with the name of each
// benchmark as soon as the testing package prints it (the name, then a tab,
// then the results when it finishes).
type lineTap struct {
	r       io.Reader
	line    []byte // the current line up to its first tab
	tabbed  bool   // the current line has had its tab
	onStart func(name string)
}

func (t *lineTap) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	for _, c := range p[:n] {
		switch {
		case c == '\n':
			t.line, t.tabbed = t.line[:0], false
		case t.tabbed:
		case c == '\t':
			t.tabbed = true
			if bytes.HasPrefix(t.line, []byte("Benchmark")) {
				t.onStart(string(bytes.TrimSpace(t.line)))
			}
		case len(t.line) < 1024:
			t.line = append(t.line, c)
		}
	}
	return n, err
}
