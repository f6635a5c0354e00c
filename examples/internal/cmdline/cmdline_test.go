package cmdline

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"testing"
)

func TestParse(t *testing.T) {
	var out bytes.Buffer
	newSet := func() (*flag.FlagSet, *int) {
		out.Reset()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(&out)
		fs.Usage = func() { out.WriteString("usage: test") }
		return fs, fs.Int("n", 1, "")
	}
	fs, n := newSet()
	set, err := Parse(fs, []string{"-n", "5"})
	if err != nil || *n != 5 || !set["n"] || len(set) != 1 || out.Len() != 0 {
		t.Errorf("-n 5: set %v, n %d, err %v, output %q", set, *n, err, out.String())
	}
	fs, _ = newSet()
	if set, err := Parse(fs, nil); err != nil || len(set) != 0 {
		t.Errorf("no flags: set %v, err %v", set, err)
	}
	fs, _ = newSet()
	if _, err := Parse(fs, []string{"-h"}); !errors.Is(err, ErrUsage) || out.String() != "usage: test" {
		t.Errorf("-h: err %v, output %q; want ErrUsage and the usage once", err, out.String())
	}
	for _, args := range [][]string{{"-x"}, {"-n", "x"}} {
		fs, _ = newSet()
		if _, err := Parse(fs, args); err == nil || errors.Is(err, ErrUsage) || out.Len() != 0 {
			t.Errorf("%q: err %v, output %q; want a flag error and no output", args, err, out.String())
		}
		if fs.Output() != &out {
			t.Errorf("%q: the flag set's output was not restored", args)
		}
	}
	fs, _ = newSet()
	if _, err := Parse(fs, []string{"-n", "2", "extra"}); err == nil || err.Error() != `unexpected argument "extra"` {
		t.Errorf("extra argument: err %v", err)
	}
	// Without a Usage function of its own, -h prints the flag defaults.
	fs, _ = newSet()
	fs.Usage = nil
	if _, err := Parse(fs, []string{"-h"}); !errors.Is(err, ErrUsage) || !bytes.Contains(out.Bytes(), []byte("-n int")) {
		t.Errorf("-h without Usage: err %v, output %q", err, out.String())
	}
}

func TestFlagExit(t *testing.T) {
	var out bytes.Buffer
	if code := FlagExit(&out, "cmd", ErrUsage); code != 0 || out.Len() != 0 {
		t.Errorf("ErrUsage: code %d, output %q; want 0 and nothing printed", code, out.String())
	}
	err := fmt.Errorf("-n %q: want a number", "x")
	if code := FlagExit(&out, "cmd", err); code != 2 || out.String() != "cmd: -n \"x\": want a number\nRun cmd -h for the flags.\n" {
		t.Errorf("flag error: code %d, output %q", code, out.String())
	}
}
