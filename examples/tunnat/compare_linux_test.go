package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		v := append([]float64(nil), c.v...)
		if got := median(v); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.v, got, c.want)
		}
		for i := range v {
			if v[i] != c.v[i] {
				t.Errorf("median(%v) changed its argument to %v", c.v, v)
			}
		}
	}
}

// The table of several rounds gives each side's median, and the median
// and range of the rounds' ratios, not the ratio of the medians; times are
// inverted, so that above 1 is better for tunnat.
func TestPrintComparisonRounds(t *testing.T) {
	m := func(udp float64, rtt time.Duration) measurement {
		return measurement{tcpMbps: 100, tcp4Mbps: 200, udpPPS: udp, udpLoss: 1, fixedPPS: 50000, connPerSec: 1000,
			rttP50: rtt, p99: 2 * rtt, connWorkers: 4, roundTrips: 2000}
	}
	k := []measurement{m(100000, 50*time.Microsecond), m(200000, 50*time.Microsecond), m(150000, 50*time.Microsecond)}
	u := []measurement{m(90000, 100*time.Microsecond), m(100000, 50*time.Microsecond), m(150000, 25*time.Microsecond)}
	var b bytes.Buffer
	printComparison(&b, 3*time.Second, k, u)
	out := b.String()
	for _, want := range []string{
		"| 3s per run, medians of 3 rounds |",
		// Ratios 0.90, 0.50, 1.00: median 0.90, though the medians'
		// ratio is 100,000 / 150,000.
		"| UDP 64-byte datagrams received per second (iperf3 -b 0) | 150000 | 100000 | 0.90 (0.50–1.00) |",
		"| UDP round trip, median of 2000 (µs) | 50 | 50 | 1.00 (0.50–2.00) |",
		"| TCP throughput, 1 stream (iperf3, Mbit/s) | 100 | 100 | 1.00 (1.00–1.00) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	printComparison(&b, time.Second, k[:1], u[:1])
	if out := b.String(); !strings.Contains(out, "| 1s per run |") || !strings.Contains(out, "| 100000 | 90000 | 0.90 |") {
		t.Errorf("one round:\n%s", out)
	}
}
