//go:build !linux

package main

import (
	"context"
	"errors"
	"io"
)

// errNotLinux is what every mode returns off Linux: TUN devices and
// network namespaces are Linux's.
var errNotLinux = errors.New("tunnat needs Linux (TUN devices in network namespaces)")

// demoResult is the demo's outcome; off Linux there is none.
type demoResult struct{}

func (demoResult) ok() bool { return false }

func runDemo(context.Context, options, io.Writer, io.Writer) (demoResult, error) {
	return demoResult{}, errNotLinux
}

func runCompare(context.Context, options, io.Writer, io.Writer) error { return errNotLinux }

func runGateway(context.Context, options, io.Writer, io.Writer) error { return errNotLinux }
