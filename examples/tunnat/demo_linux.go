package main

import (
	"context"
	"io"
)

type demoResult struct{}

func (demoResult) ok() bool { return false }

func runDemo(context.Context, options, io.Writer, io.Writer) (demoResult, error) {
	return demoResult{}, nil
}

func runCompare(context.Context, options, io.Writer, io.Writer) error { return nil }
