package main

import (
	"bytes"
	"context"
	"strconv"
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

// -compare -rounds 2 runs through on this machine: both NATs twice, a
// table of every row with figures from both, and the rounds in its
// progress.
func TestCompare(t *testing.T) {
	needTopology(t, compareTools...)
	if testing.Short() {
		t.Skip("the comparison takes about 30 seconds")
	}
	o, err := parseFlags([]string{"-compare", "-duration", "1s", "-rounds", "2"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out, prog bytes.Buffer
	if err := runCompare(context.Background(), o, &out, &prog); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("%s", out.String())
	table := out.String()[strings.Index(out.String(), "| 1s per run"):]
	rows := strings.Split(strings.TrimSpace(table), "\n")
	if len(rows) != 11 || !strings.HasPrefix(rows[0], "| 1s per run, medians of 2 rounds |") {
		t.Fatalf("want a header, a rule and 9 rows:\n%s", table)
	}
	for _, r := range rows[2:] {
		cells := strings.Split(strings.Trim(r, "| "), " | ")
		if len(cells) < 3 {
			t.Errorf("row %q: want a name and two figures", r)
			continue
		}
		lost := strings.Contains(cells[0], "lost")
		for _, c := range cells[1:3] {
			if v, err := strconv.ParseFloat(c, 64); err != nil || v < 0 || v == 0 && !lost {
				t.Errorf("row %q: figure %q", r, c)
			}
		}
		if !lost && !strings.Contains(cells[len(cells)-1], "–") {
			t.Errorf("row %q: no range of the rounds' ratios", r)
		}
	}
	for _, want := range []string{"round 1/2, kernel: iperf3 TCP", "round 2/2, tunnat: round trips"} {
		if !strings.Contains(prog.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	assertNoNamespaces(t)
}
