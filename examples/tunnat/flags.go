package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/examples/internal/cmdline"
)

// Defaults of the flags. The timeouts are conntrack's (nf_conntrack_*),
// but for established TCP, where RFC 5382's 2h4m replaces conntrack's 5
// days.
const (
	defaultPorts           = "1024-65535" // as masquerade maps source ports above 1023
	defaultMaxFlows        = 65536
	defaultUDPIdle         = 30 * time.Second
	defaultICMPIdle        = 30 * time.Second
	defaultTCPSyn          = 2 * time.Minute
	defaultTCPEstablished  = 2*time.Hour + 4*time.Minute
	defaultTCPFin          = 2 * time.Minute
	defaultTCPTimeWait     = 2 * time.Minute
	defaultTCPClose        = 10 * time.Second
	defaultDemoDuration    = 2 * time.Second
	defaultCompareDuration = 3 * time.Second
)

// options is the parsed command line.
type options struct {
	nat        natConfig
	demo       bool
	compare    bool
	duration   time.Duration // demo and compare: length of each iperf3 run
	cpuprofile string
}

// parseFlags parses args (without the program name). Errors describe the
// offending flag; usage goes to out.
func parseFlags(args []string, out io.Writer) (options, error) {
	fs := flag.NewFlagSet("tunnat", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		ports          = fs.String("ports", defaultPorts, "external source port (and echo identifier) range `low-high`")
		maxFlows       = fs.Int("max-flows", defaultMaxFlows, "flows allowed at once; packets of further new flows are dropped")
		udpIdle        = fs.Duration("udp-idle", defaultUDPIdle, "a UDP flow idle this `long` expires")
		icmpIdle       = fs.Duration("icmp-idle", defaultICMPIdle, "an ICMP echo flow idle this `long` expires")
		tcpSyn         = fs.Duration("tcp-syn", defaultTCPSyn, "a TCP flow whose SYN the server has not answered expires after this `long` idle")
		tcpEstablished = fs.Duration("tcp-established", defaultTCPEstablished, "an established TCP flow idle this `long` expires")
		tcpFin         = fs.Duration("tcp-fin", defaultTCPFin, "a TCP flow closed one way expires after this `long` idle")
		tcpTimeWait    = fs.Duration("tcp-time-wait", defaultTCPTimeWait, "a TCP flow closed both ways expires after this `long` idle")
		tcpClose       = fs.Duration("tcp-close", defaultTCPClose, "a TCP flow reset by either side expires after this `long` idle")
		demo           = fs.Bool("demo", false, "build the topology, run real servers and clients through the NAT, exit 0 only if all succeed")
		compare        = fs.Bool("compare", false, "measure the NAT against the kernel's (nftables masquerade) on the same topology")
		duration       = fs.Duration("duration", 0, "demo, compare: length of each iperf3 run (default 2s with -demo, 3s with -compare)")
		cpuprofile     = fs.String("cpuprofile", "", "write a CPU profile of the run to `file`")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tunnat [flags]           (a gateway between two namespaces, until Ctrl-C)\n       tunnat -demo [flags]\n       tunnat -compare [flags]\n\nLinux only; needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).\n\nflags:\n")
		fs.PrintDefaults()
	}
	set, err := cmdline.Parse(fs, args)
	if err != nil {
		return options{}, err
	}
	o := options{demo: *demo, compare: *compare, cpuprofile: *cpuprofile}
	if o.demo && o.compare {
		return o, errors.New("-demo and -compare: choose one")
	}
	if o.nat.ports, err = hash4.ParsePortRange(*ports); err != nil {
		return o, fmt.Errorf("-ports %q: %v", *ports, err)
	}
	if o.nat.maxFlows = *maxFlows; o.nat.maxFlows < 1 {
		return o, fmt.Errorf("-max-flows %d: must be at least 1", *maxFlows)
	}
	o.nat.timeouts = timeouts{udp: *udpIdle, icmp: *icmpIdle, tcpSyn: *tcpSyn, tcpEstablished: *tcpEstablished,
		tcpFin: *tcpFin, tcpTimeWait: *tcpTimeWait, tcpClose: *tcpClose}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"udp-idle", *udpIdle}, {"icmp-idle", *icmpIdle}, {"tcp-syn", *tcpSyn}, {"tcp-established", *tcpEstablished},
		{"tcp-fin", *tcpFin}, {"tcp-time-wait", *tcpTimeWait}, {"tcp-close", *tcpClose}} {
		if d.v <= 0 {
			return o, fmt.Errorf("-%s %v: must be positive", d.name, d.v)
		}
	}
	o.duration = *duration
	switch {
	case set["duration"] && !o.demo && !o.compare:
		return o, errors.New("-duration works only with -demo or -compare")
	case set["duration"] && (o.duration < time.Second || o.duration > time.Minute):
		return o, fmt.Errorf("-duration %v: must be 1s to 1m (iperf3 runs whole seconds)", o.duration)
	case o.demo && !set["duration"]:
		o.duration = defaultDemoDuration
	case o.compare && !set["duration"]:
		o.duration = defaultCompareDuration
	}
	return o, nil
}
