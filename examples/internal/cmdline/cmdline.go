// Package cmdline parses the command lines of the example commands.
package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage is returned by Parse for -h or -help: the usage has been
// printed, and the command should exit 0.
var ErrUsage = errors.New("usage requested")

// Parse parses args (without the program name) with fs, whose error
// handling must be flag.ContinueOnError, and returns the names of the flags
// given. For -h it prints fs's usage to fs's output and returns ErrUsage.
// For a bad flag it prints nothing and returns fs's error, which the
// command prints once, in its own words (the flag package would print the
// error and the whole usage too). For an argument left after the flags it
// returns an error naming the first.
func Parse(fs *flag.FlagSet, args []string) (set map[string]bool, err error) {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err = fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if usage != nil {
				usage()
			} else {
				fs.PrintDefaults()
			}
			return nil, ErrUsage
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set, nil
}

// FlagExit returns the exit code of command name for err, an error from
// Parse or from the command's own checks of its flags: 0 for ErrUsage,
// whose usage Parse has printed, and 2 for any other, after printing it to
// stderr on one line with a pointer to -h on the next.
func FlagExit(stderr io.Writer, name string, err error) int {
	if errors.Is(err, ErrUsage) {
		return 0
	}
	fmt.Fprintf(stderr, "%s: %v\nRun %s -h for the flags.\n", name, err, name)
	return 2
}
