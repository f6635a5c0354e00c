package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
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

// runCompare measures the kernel's NAT, then tunnat, on the same
// topology and clients, and prints a table of both.
func runCompare(ctx context.Context, o options, out, progressW io.Writer) error {
	if err := checkEnv(compareTools...); err != nil {
		return err
	}
	if err := setNice(o.nice); err != nil {
		return err
	}
	say := func(who string) func(string) {
		return func(step string) { fmt.Fprintf(progressW, "%s: %s\n", who, step) }
	}

	kt, err := newKernelTopology()
	if err != nil {
		return errors.Join(err, kt.close())
	}
	kernel, err := measure(ctx, kt, o.duration, say("kernel"))
	if err = errors.Join(err, kt.close()); err != nil {
		return fmt.Errorf("kernel NAT: %w", err)
	}

	t, err := newTUNTopology(o.queues)
	defer func() { t.close() }()
	if err != nil {
		return err
	}
	cfg := o.nat
	g, err := startGateway(cfg, t)
	if err != nil {
		return err
	}
	stopProgress := progress(progressW, g, nil)
	user, err := measure(ctx, t, o.duration, say("tunnat"))
	stopProgress()
	g.close()
	if err != nil {
		return fmt.Errorf("tunnat: %w", err)
	}
	fmt.Fprintf(out, "tunnat: %v\n\n", g.stats())
	if err := t.close(); err != nil {
		return err
	}
	printComparison(out, o.duration, kernel, user)
	return nil
}

// printComparison writes the table, as Markdown, with tunnat's share of the
// kernel's figure (for times, the kernel's share of tunnat's: above 1 is
// always better for tunnat).
func printComparison(w io.Writer, d time.Duration, k, u measurement) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	fmt.Fprintf(w, "| %s | kernel (veth, nftables masquerade) | tunnat (TUN) | tunnat / kernel |\n| --- | ---: | ---: | ---: |\n",
		fmt.Sprintf("%v per run", d))
	row := func(name string, kv, uv float64, format string, inverse bool) {
		ratio := uv / kv
		if inverse {
			ratio = kv / uv
		}
		fmt.Fprintf(w, "| %s | "+format+" | "+format+" | %.2f |\n", name, kv, uv, ratio)
	}
	row("TCP throughput, 1 stream (iperf3, Mbit/s)", k.tcpMbps, u.tcpMbps, "%.0f", false)
	row("TCP throughput, 4 streams (iperf3 -P 4, Mbit/s)", k.tcp4Mbps, u.tcp4Mbps, "%.0f", false)
	row("UDP 64-byte datagrams received per second (iperf3 -b 0)", k.udpPPS, u.udpPPS, "%.0f", false)
	fmt.Fprintf(w, "| UDP datagrams lost (%%) | %.1f | %.1f | |\n", k.udpLoss, u.udpLoss)
	row(fmt.Sprintf("UDP 64-byte datagrams received per second, %d offered", fixedRate), k.fixedPPS, u.fixedPPS, "%.0f", false)
	fmt.Fprintf(w, "| UDP datagrams lost at %d offered (%%) | %.2f | %.2f | |\n", fixedRate, k.fixedLoss, u.fixedLoss)
	row(fmt.Sprintf("TCP connections per second (%d clients, connect, 1 byte, close)", k.connWorkers), k.connPerSec, u.connPerSec, "%.0f", false)
	row(fmt.Sprintf("UDP round trip, median of %d (µs)", k.roundTrips), us(k.rttP50), us(u.rttP50), "%.0f", true)
	row("UDP round trip, 99th percentile (µs)", us(k.p99), us(u.p99), "%.0f", true)
}
