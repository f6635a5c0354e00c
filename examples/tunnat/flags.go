package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/examples/internal/cmdline"
	"github.com/hash4/hash4/nat"
)

// Defaults of the flags. The timeouts are the nat package's
// (nat.DefaultTimeouts).
const (
	defaultPorts           = "1024-65535" // as masquerade maps source ports above 1023
	defaultMaxFlows        = 65536
	defaultDemoDuration    = 2 * time.Second
	defaultCompareDuration = 3 * time.Second
)

// defaultQueues is the default of -queues: one queue per processor Go
// runs on.
func defaultQueues() int { return min(runtime.GOMAXPROCS(0), 16) }

// options is the parsed command line.
type options struct {
	nat        natConfig
	demo       bool
	compare    bool
	duration   time.Duration // demo and compare: length of each iperf3 run
	rounds     int           // compare: rounds of both NATs
	cpuprofile string
	queues     int // queues per TUN device, a reading goroutine each way per queue
	nice       int // the process's niceness; its endpoints' is 0
}

// parseFlags parses args (without the program name). Errors describe the
// offending flag; usage goes to out.
func parseFlags(args []string, out io.Writer) (options, error) {
	fs := flag.NewFlagSet("tunnat", flag.ContinueOnError)
	fs.SetOutput(out)
	d := nat.DefaultTimeouts
	var (
		ports        = fs.String("ports", defaultPorts, "external source port (and echo identifier) range `low-high`")
		mapping      = fs.String("mapping", "eim", "mapping behaviour: `eim` (endpoint-independent), adm (address-dependent) or apdm (address-and-port-dependent, as Linux's masquerade)")
		filtering    = fs.String("filtering", "adf", "filtering behaviour: eif (endpoint-independent), `adf` (address-dependent) or apdf (address-and-port-dependent)")
		pool         = fs.Int("pool", 1, "external addresses per family, from 10.48.1.2 and fd48:1::2 up (1 to 8)")
		pooling      = fs.String("pooling", "paired", "`paired` (all of a host's mappings on one external address) or arbitrary")
		preserve     = fs.Bool("port-preservation", false, "keep the inside port when it is free")
		parity       = fs.Bool("parity-preservation", false, "keep the inside port's parity")
		blockSize    = fs.Int("block-size", 0, "ports per inside host's block; 0: no blocks")
		blockRange   = fs.String("blocks", "", "this NAT's blocks, `first+count` (default: all)")
		blockPrefix  = fs.String("block-prefix", "", "deterministic blocks (RFC 7422): the n-th address of this IPv4 `prefix` gets block first+n")
		maxFlows     = fs.Int("max-flows", defaultMaxFlows, "flows at once; past it a new flow evicts the oldest unanswered one, or is dropped")
		maxPerHost   = fs.Int("max-flows-per-host", 0, "flows at once of one inside address; 0: no limit")
		capacity     = fs.Int("capacity", 0, "flows the tables are sized for at start, at most -max-flows; past it they grow by themselves (0: 1024)")
		mtu          = fs.Int("mtu", 0, "largest packet forwarded (1280 to 65535); 0: no limit")
		udpIdle      = fs.Duration("udp-idle", d.UDP, "an answered UDP flow idle this `long` expires")
		udpUnreplied = fs.Duration("udp-unreplied", d.UDPUnreplied, "an unanswered UDP flow idle this `long` expires")
		icmpIdle     = fs.Duration("icmp-idle", d.ICMP, "an ICMP echo flow idle this `long` expires")
		tcpSyn       = fs.Duration("tcp-syn", d.TCPSynSent, "a TCP flow whose SYN is unanswered expires after this `long` idle")
		tcpSynRecv   = fs.Duration("tcp-syn-recv", d.TCPSynRecv, "a TCP flow whose handshake is not complete expires after this `long` idle")
		tcpEst       = fs.Duration("tcp-established", d.TCPEstablished, "an established TCP flow idle this `long` expires")
		tcpFin       = fs.Duration("tcp-fin", d.TCPFinWait, "a TCP flow closed one way expires after this `long` idle")
		tcpCloseWait = fs.Duration("tcp-close-wait", d.TCPCloseWait, "a TCP flow whose first FIN is acknowledged expires after this `long` idle")
		tcpLastAck   = fs.Duration("tcp-last-ack", d.TCPLastAck, "a TCP flow closed both ways, the last FIN unacknowledged, expires after this `long` idle")
		tcpTimeWait  = fs.Duration("tcp-time-wait", d.TCPTimeWait, "a TCP flow closed both ways expires after this `long` idle")
		tcpClose     = fs.Duration("tcp-close", d.TCPClose, "a TCP flow reset by either side expires after this `long` idle")
		demo         = fs.Bool("demo", false, "build the topology, run real servers and clients through the NAT, exit 0 only if all succeed")
		compare      = fs.Bool("compare", false, "measure the NAT against the kernel's (nftables masquerade) on the same topology")
		duration     = fs.Duration("duration", 0, "demo, compare: length of each iperf3 run (default 2s with -demo, 3s with -compare)")
		rounds       = fs.Int("rounds", 1, "compare: `n` rounds (1 to 20), the kernel's NAT and tunnat alternating which goes first; the table gives medians, and the range of the rounds' ratios")
		cpuprofile   = fs.String("cpuprofile", "", "write a CPU profile of the run to `file`")
		queues       = fs.Int("queues", defaultQueues(), "queues per TUN device (1 to 16), each read by a goroutine of its own each way")
		nice         = fs.Int("nice", 0, "the gateway's scheduling niceness (0 to 19); on processors shared with busy endpoints, 19 lets them go first, as the kernel's NAT does; -demo and -compare run their clients and servers at 0")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tunnat [flags]           (a gateway between two namespaces, until Ctrl-C)\n       tunnat -demo [flags]\n       tunnat -compare [flags]\n\nLinux only; needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).\n\nflags:\n")
		fs.PrintDefaults()
	}
	set, err := cmdline.Parse(fs, args)
	if err != nil {
		return options{}, err
	}
	o := options{demo: *demo, compare: *compare, cpuprofile: *cpuprofile, queues: *queues, nice: *nice}
	if o.queues < 1 || o.queues > 16 {
		return o, fmt.Errorf("-queues %d: want 1 to 16", *queues)
	}
	if o.nice < 0 || o.nice > 19 {
		return o, fmt.Errorf("-nice %d: want 0 to 19", *nice)
	}
	if o.demo && o.compare {
		return o, errors.New("-demo and -compare: choose one")
	}
	c := &o.nat
	if c.ports, err = hash4.ParsePortRange(*ports); err != nil {
		return o, fmt.Errorf("-ports %q: %v", *ports, err)
	}
	if c.mapping, err = nat.ParseBehavior(*mapping); err != nil || c.mapping == nat.Default {
		return o, fmt.Errorf("-mapping %q: want eim, adm or apdm", *mapping)
	}
	if c.filtering, err = nat.ParseBehavior(*filtering); err != nil || c.filtering == nat.Default {
		return o, fmt.Errorf("-filtering %q: want eif, adf or apdf", *filtering)
	}
	if c.pool = *pool; c.pool < 1 || c.pool > 8 {
		return o, fmt.Errorf("-pool %d: want 1 to 8", *pool)
	}
	switch *pooling {
	case "paired":
	case "arbitrary":
		c.pooling = nat.Arbitrary
	default:
		return o, fmt.Errorf("-pooling %q: want paired or arbitrary", *pooling)
	}
	c.portPreservation, c.parityPreservation = *preserve, *parity
	c.blocks.Size = *blockSize
	if *blockRange != "" {
		if _, err := fmt.Sscanf(*blockRange, "%d+%d", &c.blocks.First, &c.blocks.Count); err != nil {
			return o, fmt.Errorf("-blocks %q: want first+count", *blockRange)
		}
	}
	if *blockPrefix != "" {
		p, err := netip.ParsePrefix(*blockPrefix)
		if err != nil {
			return o, fmt.Errorf("-block-prefix %q: %v", *blockPrefix, err)
		}
		c.blocks.Deterministic = []netip.Prefix{p}
	}
	if c.maxFlows = *maxFlows; c.maxFlows < 1 {
		return o, fmt.Errorf("-max-flows %d: must be at least 1", *maxFlows)
	}
	if c.maxFlowsPerHost = *maxPerHost; c.maxFlowsPerHost < 0 {
		return o, fmt.Errorf("-max-flows-per-host %d: must not be negative", *maxPerHost)
	}
	if c.capacity = *capacity; c.capacity < 0 || c.capacity > c.maxFlows {
		return o, fmt.Errorf("-capacity %d: want 0 to -max-flows (%d)", *capacity, c.maxFlows)
	}
	c.mtu = *mtu
	c.timeouts = nat.Timeouts{UDP: *udpIdle, UDPUnreplied: *udpUnreplied, ICMP: *icmpIdle,
		TCPSynSent: *tcpSyn, TCPSynRecv: *tcpSynRecv, TCPEstablished: *tcpEst, TCPFinWait: *tcpFin,
		TCPCloseWait: *tcpCloseWait, TCPLastAck: *tcpLastAck, TCPTimeWait: *tcpTimeWait, TCPClose: *tcpClose}
	for name, v := range map[string]time.Duration{"udp-idle": *udpIdle, "udp-unreplied": *udpUnreplied, "icmp-idle": *icmpIdle,
		"tcp-syn": *tcpSyn, "tcp-syn-recv": *tcpSynRecv, "tcp-established": *tcpEst, "tcp-fin": *tcpFin,
		"tcp-close-wait": *tcpCloseWait, "tcp-last-ack": *tcpLastAck, "tcp-time-wait": *tcpTimeWait, "tcp-close": *tcpClose} {
		if v <= 0 {
			return o, fmt.Errorf("-%s %v: must be positive", name, v)
		}
	}
	// The package checks the rest (the behaviours together, the blocks
	// against the range, the MTU), on tables of the default size: New
	// checks the capacity against the memory limit when the gateway
	// starts.
	check := natOf(*c)
	check.Capacity = 0
	if _, err := nat.New(check); err != nil {
		return o, fmt.Errorf("flags: %v", err)
	}
	o.duration, o.rounds = *duration, *rounds
	switch {
	case set["rounds"] && !o.compare:
		return o, errors.New("-rounds works only with -compare")
	case o.rounds < 1 || o.rounds > 20:
		return o, fmt.Errorf("-rounds %d: want 1 to 20", *rounds)
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
