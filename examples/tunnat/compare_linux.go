package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// This file holds -compare: the same clients and servers through the
// kernel's NAT (veth pairs, nftables masquerade in a gateway namespace) and
// through tunnat, and a table of both.

// comparePort is the port of -compare's Go servers (connections, UDP echo).
const comparePort = 9000

// compareTools are the programs -compare runs.
var compareTools = []string{"iperf3", "nft", "ss", "sysctl"}

// fixedRate is the offered rate of -compare's UDP run at a fixed rate,
// in 64-byte datagrams per second: one the kernel's NAT carries with no
// more than 1% lost on a 2-core machine.
const fixedRate = 50000

// measurement is what -compare measures of one NAT.
type measurement struct {
	tcpMbps     float64       // iperf3 TCP, one stream, receiver's rate
	tcp4Mbps    float64       // iperf3 TCP, four streams
	udpPPS      float64       // iperf3 UDP, 64-byte payloads, unlimited rate: datagrams received per second
	udpLoss     float64       // and the percentage lost
	fixedPPS    float64       // the same at fixedRate offered
	fixedLoss   float64       // and the percentage lost
	connPerSec  float64       // TCP connections set up and torn down per second
	rttP50, p99 time.Duration // UDP round trips, one at a time
	connWorkers int
	roundTrips  int
}

// udpRun runs iperf3 UDP with 64-byte datagrams at rate (bits per
// second, "0" for unlimited) and returns the datagrams received per
// second and the percentage lost.
func udpRun(ctx context.Context, t *topology, d time.Duration, rate string) (pps, loss float64, err error) {
	c, _, err := iperf(ctx, t, d, "-u", "-b", rate, "-l", "64")
	if err != nil {
		return 0, 0, err
	}
	if c.End.Sum.Seconds > 0 {
		pps = float64(c.End.Sum.Packets-c.End.Sum.LostPackets) / c.End.Sum.Seconds
	}
	return pps, c.End.Sum.LostPercent, nil
}

// measure runs the measurements over topology t.
func measure(ctx context.Context, t *topology, d time.Duration, progress func(string)) (m measurement, err error) {
	m.connWorkers, m.roundTrips = 4, 2000
	progress("iperf3 TCP")
	c, _, err := iperf(ctx, t, d)
	if err != nil {
		return m, err
	}
	m.tcpMbps = c.End.SumReceived.BitsPerSecond / 1e6
	progress("iperf3 TCP, 4 streams")
	if c, _, err = iperf(ctx, t, d, "-P", "4"); err != nil {
		return m, err
	}
	m.tcp4Mbps = c.End.SumReceived.BitsPerSecond / 1e6
	progress("iperf3 UDP")
	if m.udpPPS, m.udpLoss, err = udpRun(ctx, t, d, "0"); err != nil {
		return m, err
	}
	progress(fmt.Sprintf("iperf3 UDP at %d datagrams/s", fixedRate))
	if m.fixedPPS, m.fixedLoss, err = udpRun(ctx, t, d, strconv.Itoa(fixedRate*64*8)); err != nil {
		return m, err
	}
	stop, err := goListen(t.server, netip.AddrPortFrom(serverAddr4, comparePort))
	if err != nil {
		return m, err
	}
	defer stop()
	progress("connections")
	if m.connPerSec, err = connRate(t.client, netip.AddrPortFrom(serverAddr4, comparePort), m.connWorkers, d); err != nil {
		return m, fmt.Errorf("connections: %w", err)
	}
	progress("round trips")
	if m.rttP50, m.p99, err = udpRTT(t.client, netip.AddrPortFrom(serverAddr4, comparePort), m.roundTrips); err != nil {
		return m, fmt.Errorf("UDP round trips: %w", err)
	}
	return m, ctx.Err()
}

// runCompare measures the kernel's NAT and tunnat on the same topology
// and clients, o.rounds times, the first of each round alternating (so
// that a drift of the machine's load falls on both), and prints a table
// of both.
func runCompare(ctx context.Context, o options, out, progressW io.Writer) error {
	if err := checkEnv(compareTools...); err != nil {
		return err
	}
	if err := setNice(o.nice); err != nil {
		return err
	}
	// The steps and tunnat's progress lines come from two goroutines.
	progressW = &lockedWriter{w: progressW}
	var kernel, user []measurement
	for r := range o.rounds {
		label := func(who string) func(string) {
			if o.rounds > 1 {
				who = fmt.Sprintf("round %d/%d, %s", r+1, o.rounds, who)
			}
			return func(step string) { fmt.Fprintf(progressW, "%s: %s\n", who, step) }
		}
		for i := range 2 {
			if (r+i)%2 == 0 {
				m, err := measureKernel(ctx, o, label("kernel"))
				if err != nil {
					return err
				}
				kernel = append(kernel, m)
				continue
			}
			m, err := measureTunnat(ctx, o, out, progressW, label("tunnat"))
			if err != nil {
				return err
			}
			user = append(user, m)
		}
	}
	printComparison(out, o.duration, kernel, user)
	return nil
}

// measureKernel measures the kernel's NAT on a topology of its own.
func measureKernel(ctx context.Context, o options, progress func(string)) (measurement, error) {
	kt, err := newKernelTopology()
	if err != nil {
		return measurement{}, errors.Join(err, kt.close())
	}
	m, err := measure(ctx, kt, o.duration, progress)
	if err = errors.Join(err, kt.close()); err != nil {
		return m, fmt.Errorf("kernel NAT: %w", err)
	}
	return m, nil
}

// measureTunnat measures tunnat, configured by o, on a topology of its
// own, and writes its counters to out.
func measureTunnat(ctx context.Context, o options, out, progressW io.Writer, progressStep func(string)) (m measurement, err error) {
	t, err := newTUNTopology(o.queues)
	defer func() { t.close() }()
	if err != nil {
		return m, err
	}
	g, err := startGateway(o.nat, t)
	if err != nil {
		return m, err
	}
	stopProgress := progress(progressW, g, nil)
	m, err = measure(ctx, t, o.duration, progressStep)
	stopProgress()
	g.close()
	if err != nil {
		return m, fmt.Errorf("tunnat: %w", err)
	}
	fmt.Fprintf(out, "tunnat: %v\n\n", g.stats())
	return m, t.close()
}

// printComparison writes the table of rounds k (the kernel's NAT) and u
// (tunnat), as Markdown: each one's median and tunnat's share of the
// kernel's figure (for times, the kernel's share of tunnat's: above 1 is
// always better for tunnat), the median of the rounds' shares and, past
// one round, their range.
func printComparison(w io.Writer, d time.Duration, k, u []measurement) {
	title := fmt.Sprintf("%v per run", d)
	if len(k) > 1 {
		title = fmt.Sprintf("%v per run, medians of %d rounds", d, len(k))
	}
	fmt.Fprintf(w, "| %s | kernel (veth, nftables masquerade) | tunnat (TUN) | tunnat / kernel |\n| --- | ---: | ---: | ---: |\n", title)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	// figures returns f of each round of k and of u.
	figures := func(f func(m measurement) float64) (kv, uv []float64) {
		for _, m := range k {
			kv = append(kv, f(m))
		}
		for _, m := range u {
			uv = append(uv, f(m))
		}
		return kv, uv
	}
	row := func(name, format string, inverse bool, f func(m measurement) float64) {
		kv, uv := figures(f)
		ratios := make([]float64, min(len(kv), len(uv)))
		for i := range ratios {
			if ratios[i] = uv[i] / kv[i]; inverse {
				ratios[i] = kv[i] / uv[i]
			}
		}
		share := fmt.Sprintf("%.2f", median(ratios))
		if len(ratios) > 1 {
			share += fmt.Sprintf(" (%.2f–%.2f)", slices.Min(ratios), slices.Max(ratios))
		}
		fmt.Fprintf(w, "| %s | "+format+" | "+format+" | %s |\n", name, median(kv), median(uv), share)
	}
	row("TCP throughput, 1 stream (iperf3, Mbit/s)", "%.0f", false, func(m measurement) float64 { return m.tcpMbps })
	row("TCP throughput, 4 streams (iperf3 -P 4, Mbit/s)", "%.0f", false, func(m measurement) float64 { return m.tcp4Mbps })
	row("UDP 64-byte datagrams received per second (iperf3 -b 0)", "%.0f", false, func(m measurement) float64 { return m.udpPPS })
	lost := func(name, format string, f func(m measurement) float64) {
		kv, uv := figures(f)
		fmt.Fprintf(w, "| %s | "+format+" | "+format+" | |\n", name, median(kv), median(uv))
	}
	lost("UDP datagrams lost (%)", "%.1f", func(m measurement) float64 { return m.udpLoss })
	row(fmt.Sprintf("UDP 64-byte datagrams received per second, %d offered", fixedRate), "%.0f", false, func(m measurement) float64 { return m.fixedPPS })
	lost(fmt.Sprintf("UDP datagrams lost at %d offered (%%)", fixedRate), "%.2f", func(m measurement) float64 { return m.fixedLoss })
	row(fmt.Sprintf("TCP connections per second (%d clients, connect, 1 byte, close)", k[0].connWorkers), "%.0f", false, func(m measurement) float64 { return m.connPerSec })
	row(fmt.Sprintf("UDP round trip, median of %d (µs)", k[0].roundTrips), "%.0f", true, func(m measurement) float64 { return us(m.rttP50) })
	row("UDP round trip, 99th percentile (µs)", "%.0f", true, func(m measurement) float64 { return us(m.p99) })
}

// median returns the median of v (the mean of the middle two for an even
// count), without changing v; 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
