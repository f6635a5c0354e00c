package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress follows the benchmarks as they run.
type progress interface {
	start(name string)                 // a benchmark started
	done(name string, nsPerOp float64) // a result line was printed
	close()
}

// lineProgress prints a line per finished benchmark: for logs and CI.
type lineProgress struct {
	w        io.Writer
	n, total int
}

func (p *lineProgress) start(string) {}

func (p *lineProgress) done(name string, ns float64) {
	p.n++
	fmt.Fprintf(p.w, "[%d/%d] %s %s/op\n", p.n, max(p.total, p.n), name, fmtNs(ns))
}

func (p *lineProgress) close() {}

// barProgress draws a progress bar on a terminal, redrawn every second so
// that the elapsed time moves during long benchmarks.
type barProgress struct {
	mu   sync.Mutex
	bar  *progressbar.ProgressBar
	n    int
	stop chan struct{}
	wg   sync.WaitGroup
}

func newBarProgress(w io.Writer, total int) *barProgress {
	p := &barProgress{stop: make(chan struct{})}
	p.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("starting"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionSetWidth(20),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.mu.Lock()
				_ = p.bar.Add(0)
				p.mu.Unlock()
			}
		}
	}()
	return p
}

// shortName drops the Benchmark prefix and keeps the end of a long name, so
// that the bar fits in 80 columns.
func shortName(name string) string {
	const w = 36
	name = strings.TrimPrefix(name, "Benchmark")
	if r := []rune(name); len(r) > w {
		return "…" + string(r[len(r)-w+1:])
	}
	return name
}

func (p *barProgress) start(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bar.Describe(shortName(name))
}

func (p *barProgress) done(string, float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	_ = p.bar.Add(1) // beyond the planned total (the benchmarks changed), the bar stays full
}

func (p *barProgress) close() {
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.bar.IsFinished() {
		p.bar.Describe("done")
		_ = p.bar.Finish()
	}
}
