// Command natgw is a user-space UDP NAT gateway built on hash4: it forwards
// real datagrams between clients and one upstream, giving each client flow
// its own outside source port.
//
// Run the self-contained demo (loopback only; exits 0 only if every datagram
// came back to the client that sent it):
//
//	go run ./examples/natgw -demo
//
// Run a gateway (stop it with Ctrl-C or SIGTERM; it prints its counts):
//
//	go run ./examples/natgw -inside 127.0.0.1:5300 -upstream 127.0.0.1:53
//
// # How it works
//
// A client sends to the inside address. Its first datagram creates a flow:
// Table.ConnectFunc with a PortAllocator picks an outside port so that the
// 4-tuple (outside IP:port, upstream) is unique, and in its function the
// gateway binds a UDP socket to exactly that port; the flow enters the
// outside table with its socket, and then the inside table under (inside
// address, client). If the OS refuses the port (another process holds it),
// the gateway holds the port in the allocator so that later flows skip it,
// counts it and refuses it (ErrPortRefused), and ConnectFunc picks again;
// it tries the port again after one idle timeout. Datagrams arriving on an
// outside socket are looked up in the outside table by (outside IP:port,
// sender): only the upstream's replies match, and they go back to the flow's
// client. A janitor sweeps the inside table with DeleteFunc and closes flows
// idle (no datagram either way) for -idle, which frees their ports for new
// flows.
//
// Bad traffic is counted and dropped: datagrams over -max-datagram either
// way, datagrams of new flows past -max-flows or when no port is free, and
// datagrams on an outside socket from anyone but the upstream. A client that
// vanishes just stops refreshing its flow, which expires.
//
// # Flags
//
//	-inside addr:port   address clients send to (default 127.0.0.1:0 with -demo,
//	                    required otherwise; must be a concrete IP, port 0 lets the OS choose)
//	-outside IP         IP the outside sockets bind to (default 127.0.0.1)
//	-upstream addr:port where every flow is forwarded (required; not with -demo)
//	-ports low-high     outside source port range (default 20000-20999, clear of
//	                    the Linux and IANA ephemeral ranges)
//	-idle duration      a flow with no datagram either way for this long expires
//	                    and frees its port (default 30s; 1s with -demo)
//	-max-flows n        flows allowed at once; datagrams of further new flows
//	                    are dropped (default 1000)
//	-max-datagram n     largest datagram forwarded, in bytes (default 1472)
//	-demo               run the self-contained demo on loopback
//	-clients n          demo: number of clients (default 64)
//	-duration d         demo: how long the clients send (default 5s)
//	-rate r             demo: datagrams per second per client (default 50)
//
// Invalid flags print a message and exit with status 2.
//
// # Demo output
//
// While it runs the demo prints a progress line on stderr (in place four
// times a second on a terminal, otherwise once a second): elapsed time, live
// flows (created and expired so far), outside ports in use, datagrams
// forwarded per second (both directions), datagrams sent and echoes received.
// Halfway through, each client moves to a new source port, so its first flow
// goes idle and expires. The summary on stdout gives datagrams sent, echoed
// back, delivered to the wrong client (must be 0) and lost (must be 0);
// flows created and expired; ports reused and refused by the OS; drops by
// cause (the demo sends a few oversize datagrams on purpose); and the
// gateway's forwarding counts. The exit status is 0 only on PASS.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
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
		return cmdline.FlagExit(stderr, "natgw", err)
	}
	if o.demo {
		res, err := runDemo(ctx, o.gw, o.dc, stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "natgw: %v\n", err)
			return 1
		}
		if !res.ok() {
			return 1
		}
		return 0
	}

	gw, err := newGateway(o.gw)
	if err != nil {
		fmt.Fprintf(stderr, "natgw: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "natgw: inside %v, outside %v ports %d-%d -> upstream %v; idle %v, max %d flows, max datagram %d bytes\n",
		gw.addr(), o.gw.outside, o.gw.ports.Low, o.gw.ports.High, o.gw.upstream, o.gw.idle, o.gw.maxFlows, o.gw.maxDatagram)
	gw.run(ctx) // until SIGINT or SIGTERM; closes every socket
	s := gw.stats()
	fmt.Fprintf(stdout, "natgw: stopped. flows created %d, expired %d; forwarded %d to upstream, %d to clients; ports reused %d, refused by the OS %d; dropped: oversize %d, flow limit %d, no free port %d, unmatched %d; errors: send %d, read %d, socket %d\n",
		s.FlowsCreated, s.FlowsExpired, s.ToUpstream, s.ToClients, s.PortsReused, s.PortsRefused,
		s.OversizeIn+s.OversizeOut, s.FlowLimitDrops, s.NoPortDrops, s.Unmatched, s.SendErrors, s.ReadErrors, s.SocketErrors)
	return 0
}
