// Package cmdline parses the command lines of the example commands.
package cmdline

import (
	"errors"
	"flag"
	"fmt"
)

// ErrUsage is returned by Parse for -h or -help: the usage has been
// printed, and the command should exit 0.
var ErrUsage = errors.New("usage requested")

// Parse parses args (without the program name) with fs, whose error
// handling must be flag.ContinueOnError, and returns the names of the flags
// given. It returns ErrUsage for -h, fs's error for a bad flag, and an
// error naming the first argument left after the flags, if any.
func Parse(fs *flag.FlagSet, args []string) (set map[string]bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
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
