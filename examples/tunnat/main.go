// Command tunnat is a user-space NAT44 and NAT66 between two TUN devices,
// built on hash4's nat package: real clients in two inside network
// namespaces reach real servers through it, and -compare measures it
// against the kernel's own NAT (nftables masquerade) on the same topology.
//
// It needs Linux and root (CAP_NET_ADMIN and CAP_SYS_ADMIN): it builds its
// topology itself, network namespaces named tunnat-<pid>-<n>-client,
// -client2 (a second inside host, routed by the client namespace), -server
// and -far (a host the server namespace routes to over a 1280-byte MTU),
// the client and server ones each with a TUN device whose descriptor the
// process holds, and removes them when it ends, on Ctrl-C or SIGTERM too.
// At start it removes the namespaces left by earlier runs that died.
//
//	client2 ---- client netns                 tunnat                     server netns ---- far
//	10.48.2.2    10.48.0.2/24, fd48::2/64                                 10.48.1.1/24     10.48.3.2
//	             default -> tun0 == fd ==> Outbound (nat package) == fd ==> tun0
//	                        tun0 <== fd == Inbound <================== fd == tun0 (10.48.1.2 on-link)
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
// The devices carry a virtio-net header with each packet (IFF_VNET_HDR,
// TUNSETOFFLOAD): the namespaces hand tunnat TCP and UDP GSO super-packets
// of up to 64 KiB with partial checksums, which it translates once and
// writes to the other device whole, with the same header (see
// offload_linux.go). Per queue of the devices (-queues), one goroutine
// reads batches from the client-side queue and gives each batch to the
// NAT's OutboundBatch, one reads the server side and gives them to
// InboundBatch; each writes what the NAT emits to the device of its side
// (hairpinned packets and the NAT's own ICMP errors go back to the device
// they came from), runs of UDP datagrams of one flow coalesced into one
// super-packet. The kernel hands a flow's packets to one queue, so they
// stay in order. One more goroutine runs the NAT's expiry. The nat package
// does the rest: mappings and flows, the behaviours, pool, blocks and
// limits of the flags, TCP tracking, ICMP errors, fragments, drops counted
// by reason.
//
// # Flags
//
//	-ports low-high           external ports and echo identifiers (default 1024-65535)
//	-mapping eim|adm|apdm     mapping behaviour (default eim)
//	-filtering eif|adf|apdf   filtering behaviour (default adf)
//	-pool n                   external addresses per family (default 1)
//	-pooling paired|arbitrary address pooling (default paired)
//	-port-preservation        keep the inside port when free
//	-parity-preservation      keep the inside port's parity
//	-block-size n             ports per host's block (default 0, none)
//	-blocks first+count       this NAT's blocks (default all)
//	-block-prefix prefix      deterministic blocks (RFC 7422)
//	-max-flows n              flows at once, with early drop past it (default 65536)
//	-max-flows-per-host n     flows at once per inside address (default 0, none)
//	-capacity n               flows the tables are sized for at start (default 0: 1024)
//	-mtu n                    largest packet forwarded (default 0, none)
//	-udp-idle d, -udp-unreplied d, -icmp-idle d, -tcp-syn d, -tcp-syn-recv d,
//	-tcp-established d, -tcp-fin d, -tcp-close-wait d, -tcp-last-ack d,
//	-tcp-time-wait d, -tcp-close d
//	                          idle timeouts (default the nat package's)
//	-demo                     run the demo
//	-compare                  run the comparison with the kernel's NAT
//	-duration d               demo, compare: length of each iperf3 run (default 2s, 3s)
//	-rounds n                 compare: rounds, the kernel's NAT and tunnat alternating; medians and ranges (default 1)
//	-queues n                 queues per TUN device, a goroutine each way per queue (default GOMAXPROCS)
//	-nice n                   the gateway's niceness, 0 to 19, its endpoints' staying 0 (default 0)
//	-cpuprofile file          write a CPU profile of the run
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
