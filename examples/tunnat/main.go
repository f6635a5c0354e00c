// Command tunnat is a user-space NAT44 and NAT66 between two TUN devices,
// built on hash4: real clients in one network namespace reach real servers
// in another through it, and -compare measures it against the kernel's own
// NAT (nftables masquerade) on the same topology.
//
// It needs Linux and root (CAP_NET_ADMIN and CAP_SYS_ADMIN): it builds its
// topology itself, two network namespaces named tunnat-<pid>-<n>-client and
// -server, each with a TUN device whose descriptor the process holds, and
// removes them when it ends, on Ctrl-C or SIGTERM too. At start it removes
// the namespaces left by earlier runs that died.
//
//	client netns                        tunnat                       server netns
//	10.48.0.2/24, fd48::2/64                                          10.48.1.1/24, fd48:1::1/64
//	default -> tun0 ==== fd ==> outbound: SNAT to 10.48.1.2 ==> fd ==== tun0
//	           tun0 <== fd ==== inbound: un-NAT <================ fd ==== tun0 (10.48.1.2 on-link)
//
// Run a gateway until Ctrl-C, then try it from the client namespace, as the
// command prints:
//
//	go build -o /tmp/tunnat ./examples/tunnat && sudo /tmp/tunnat
//
// Run the demo (python3 http.server, socat, iperf3 and ping in the
// namespaces; exit 0 only if all succeed and the servers saw only the
// NAT's external address), or the comparison with the kernel:
//
//	sudo /tmp/tunnat -demo
//	sudo /tmp/tunnat -compare
//
// # How it works
//
// One goroutine reads the client-side TUN device, one the server-side, a
// third reaps idle flows. A packet from a client is parsed (IPv4 without
// fragments, IPv6 without extension headers; TCP, UDP, ICMP echo) and
// looked up by its 4-tuple (the echo identifier for a port) in the inside
// table of its protocol. A new flow gets its external port (or identifier)
// from Table.Connect with a PortAllocator over -ports, which inserts the
// flow in the outside table; then the mapping, which records the outside
// tuple, goes into the inside table. The packet's source address and port
// are rewritten in place with incremental checksum updates (RFC 1624), the
// TTL decremented, and the packet written to the server side. A packet from
// a server is looked up by (external address:port, server address:port) in
// the outside table, its destination rewritten back, and written to the
// client side. Packets of no flow, and packets the parser refuses, are
// dropped and counted by reason. Only a SYN opens a TCP flow.
//
// Expiry follows conntrack: an idle timeout per protocol and, for TCP, per
// state, from the flags seen (SYN answered, FIN one way or both, RST). The
// reaper walks the outside tables with All, removes an expired flow's
// mapping and then its outside entry with CompareAndDelete; the external
// port is free for Connect from then on.
//
// # Flags
//
//	-ports low-high        external ports and echo identifiers (default 1024-65535)
//	-max-flows n           flows at once; packets of further new flows are dropped (default 65536)
//	-udp-idle d            UDP idle timeout (default 30s)
//	-icmp-idle d           ICMP echo idle timeout (default 30s)
//	-tcp-syn d             TCP, handshake not answered (default 2m)
//	-tcp-established d     TCP, established (default 2h4m, RFC 5382)
//	-tcp-fin d             TCP, FIN seen one way (default 2m)
//	-tcp-time-wait d       TCP, FIN seen both ways (default 2m)
//	-tcp-close d           TCP, RST seen (default 10s)
//	-demo                  run the demo
//	-compare               run the comparison with the kernel's NAT
//	-duration d            demo, compare: length of each iperf3 run (default 2s, 3s)
//	-cpuprofile file       write a CPU profile of the run
//
// Invalid flags print a message and exit with status 2.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/hash4/hash4/examples/internal/cmdline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(realMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// realMain runs the command and returns its exit status: 0 on success, 1 on
// failure, 2 for bad flags.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return cmdline.FlagExit(stderr, "tunnat", err)
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "tunnat: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "tunnat: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	switch {
	case o.demo:
		res, err := runDemo(ctx, o, stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "tunnat: %v\n", err)
			return 1
		}
		if !res.ok() {
			return 1
		}
	case o.compare:
		if err := runCompare(ctx, o, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "tunnat: %v\n", err)
			return 1
		}
	default:
		if err := runGateway(ctx, o, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "tunnat: %v\n", err)
			return 1
		}
	}
	return 0
}
