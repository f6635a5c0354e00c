package cmdline

import (
	"errors"
	"flag"
	"io"
	"testing"
)

func TestParse(t *testing.T) {
	newSet := func() (*flag.FlagSet, *int) {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return fs, fs.Int("n", 1, "")
	}
	fs, n := newSet()
	set, err := Parse(fs, []string{"-n", "5"})
	if err != nil || *n != 5 || !set["n"] || len(set) != 1 {
		t.Errorf("-n 5: set %v, n %d, err %v", set, *n, err)
	}
	fs, _ = newSet()
	if set, err := Parse(fs, nil); err != nil || len(set) != 0 {
		t.Errorf("no flags: set %v, err %v", set, err)
	}
	fs, _ = newSet()
	if _, err := Parse(fs, []string{"-h"}); !errors.Is(err, ErrUsage) {
		t.Errorf("-h: err %v, want ErrUsage", err)
	}
	fs, _ = newSet()
	if _, err := Parse(fs, []string{"-x"}); err == nil || errors.Is(err, ErrUsage) {
		t.Errorf("-x: err %v, want a flag error", err)
	}
	fs, _ = newSet()
	if _, err := Parse(fs, []string{"-n", "2", "extra"}); err == nil || err.Error() != `unexpected argument "extra"` {
		t.Errorf("extra argument: err %v", err)
	}
}
