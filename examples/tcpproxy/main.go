// Command tcpproxy is a TCP proxy built on hash4: it forwards client
// connections to upstreams in turn, and picks the source port of each
// upstream connection itself with Table.ConnectFunc, so that one source port
// carries a connection to every upstream at once, as the kernel's connect()
// does, and a few ports carry many connections.
//
// Run the self-contained demo (loopback only; exits 0 only on PASS):
//
//	go run ./examples/tcpproxy -demo
//
// Run a proxy (stop it with Ctrl-C or SIGTERM: it stops accepting, gives
// the connections it forwards -drain to finish, and prints its counts):
//
//	go run ./examples/tcpproxy -listen 127.0.0.1:8080 -upstream 127.0.0.1:8081,127.0.0.1:8082
//
// # How it works
//
// For each client connection the proxy takes the next upstream, and
// Table.ConnectFunc picks a source port of -ports whose 4-tuple (source IP
// and port, upstream) is free in the proxy's table and holds it. In
// ConnectFunc's function the proxy binds a socket to that address and port
// with SO_REUSEADDR, which lets sockets toward other upstreams share the
// port, and connects; the kernel checks the 4-tuple again at connect(). The
// flow enters the table once connected. Then it copies both ways, passing
// each side's end of data on to the other.
//
// The table mirrors the kernel's established table, TIME_WAIT included. A
// connection whose end the proxy passed on to the upstream before the
// upstream's came (an active close) leaves the kernel's socket in TIME_WAIT
// for 60 seconds; so the proxy keeps such a tuple in the table for
// -timewait, and a reaper sweeps the table with DeleteFunc to free the
// tuples whose time is up. Meanwhile the kernel lets a connect() from the
// bound port take the TIME_WAIT socket over if the old connection used TCP
// timestamps, whatever net.ipv4.tcp_tw_reuse says (that sysctl rules
// connect() with an ephemeral port); without them the connect() fails with
// EADDRNOTAVAIL. So the proxy marks a held tuple whose connection used
// timestamps with Table.TimeWait, and ConnectFunc, given
// WithTimeWaitReuse(TCPTimeWaitReuse(false, -tw-reuse-delay)), may take it
// over once it has been held that long: the new flow replaces the held one
// in place. With -tw-reuse-delay 0, ConnectFunc passes held tuples over
// until they are freed. A tuple the kernel refuses anyway (a socket of an
// earlier run or of another program on it) is held the same way, unmarked,
// and a port on which bind() fails (a listener on it) is held in the
// allocator with Bind; the function refuses the port (ErrPortRefused) and
// ConnectFunc offers another tuple, up to 8 in all. A client for whose
// upstream no tuple is free is refused: the proxy closes its connection.
//
// # Flags
//
//	-listen addr:port    where clients connect (required; with -demo, -source port 0)
//	-upstream list       comma-separated addr:port of the upstreams (required; not with -demo)
//	-source IP           address the upstream connections come from (default 127.0.0.1)
//	-ports low-high      their source ports (default 20000-20999; 20000-20003 with -demo)
//	-timewait d          how long a 4-tuple stays taken after an active close (default 60s,
//	                     the kernel's TIME_WAIT)
//	-tw-reuse-delay d    how long after an active close a new connection may take the 4-tuple
//	                     over, if its connection used TCP timestamps (default 1s, as Linux's
//	                     net.ipv4.tcp_tw_reuse_delay; 0: never, the tuple stays taken for -timewait)
//	-drain d             once one side has ended its data, how long the other may go on;
//	                     and at shutdown, how long open connections may go on (default 30s)
//	-dial-timeout d      how long a connect to an upstream may take (default 10s)
//	-demo                run the self-contained demo on loopback
//	-size n              demo: bytes each client sends (default 262144)
//
// Invalid flags print a message and exit with status 2.
//
// # The demo
//
// The demo starts two echo servers as upstreams and a proxy with four
// source ports, all on the -source address (127.0.0.1, or ::1 for IPv6),
// then connects eight clients, one per port and upstream, and keeps all
// eight open at once: the proxy's table then holds eight 4-tuples over the
// four ports. Each client sends -size bytes and checks the echo.
// When the clients end their data, the proxy passes that on first, so it
// holds all eight tuples for TIME_WAIT, and a ninth client is refused.
// Then the demo asks the kernel to connect() on one held tuple, and prints
// what it says: connected, as the kernel takes the TIME_WAIT socket over
// when the old connection used TCP timestamps, else EADDRNOTAVAIL. Last,
// once -tw-reuse-delay has passed, a tenth client is forwarded on a held
// tuple that the proxy takes over (unless -tw-reuse-delay is 0, or the
// connections did not use timestamps). The exit status is 0 only on PASS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/examples/internal/cmdline"
)

// Defaults of the flags.
const (
	defaultPorts       = "20000-20999" // below Linux's 32768-60999 and the IANA 49152-65535 ephemeral ranges
	defaultDemoPorts   = "20000-20003"
	defaultTimeWait    = 60 * time.Second // the kernel's TCP_TIMEWAIT_LEN
	defaultReuseDelay  = time.Second      // the kernel's default net.ipv4.tcp_tw_reuse_delay
	defaultDrain       = 30 * time.Second
	defaultDialTimeout = 10 * time.Second
	defaultDemoSize    = 256 << 10
	maxDemoSize        = 64 << 20 // bytes all the demo's clients send
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one ends the process at once,
		// even while open connections drain.
		<-ctx.Done()
		stop()
	}()
	os.Exit(realMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options is the parsed command line.
type options struct {
	cfg      config
	listen   netip.AddrPort
	demo     bool
	demoSize int
}

// realMain runs the command and returns its exit status: 0 on success, 1 on
// failure, 2 for bad flags.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return cmdline.FlagExit(stderr, "tcpproxy", err)
	}
	if o.demo {
		res, err := runDemo(o.cfg, o.demoSize, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "tcpproxy: %v\n", err)
			return 1
		}
		if !res.ok(o.cfg.ports.Size()) {
			return 1
		}
		return 0
	}

	p, err := newProxy(o.cfg)
	if err != nil {
		fmt.Fprintf(stderr, "tcpproxy: %v\n", err)
		return 1
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(o.listen))
	if err != nil {
		fmt.Fprintf(stderr, "tcpproxy: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "tcpproxy: %v -> %v from %v ports %d-%d; TIME_WAIT %v, %s\n",
		ln.Addr(), o.cfg.upstreams, o.cfg.source, o.cfg.ports.Low, o.cfg.ports.High, o.cfg.timeWait, reuseText(o.cfg.reuse))
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	p.serve(ln) // until SIGINT or SIGTERM
	// The connections being forwarded get -drain to finish; those still
	// open then end with the process, when main returns.
	if !p.waitFor(o.cfg.drain) {
		fmt.Fprintf(stdout, "tcpproxy: connections still open after %v: %d, left to end with the process\n", o.cfg.drain, p.stats().Active)
	}
	s := p.stats()
	fmt.Fprintf(stdout, "tcpproxy: stopped. accepted %d, forwarded %d, refused: no free 4-tuple %d, dial errors %d; kernel refusals %d, 4-tuples held %d, taken over %d; %d bytes up, %d down\n",
		s.Accepted, s.Forwarded, s.NoPorts, s.DialErrors, s.KernelRefused, s.TimeWait, s.Reused, s.BytesUp, s.BytesDown)
	return 0
}

// parseFlags parses args (without the program name). Errors name the
// offending flag; usage goes to out.
func parseFlags(args []string, out io.Writer) (options, error) {
	fs := flag.NewFlagSet("tcpproxy", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		listen      = fs.String("listen", "", "`addr:port` clients connect to (required; with -demo, -source port 0)")
		upstream    = fs.String("upstream", "", "comma-separated `addr:port` list of upstreams (required; not with -demo, which runs its own)")
		source      = fs.String("source", "127.0.0.1", "`IP` the upstream connections come from")
		ports       = fs.String("ports", defaultPorts, "source port range `low-high` of the upstream connections; "+defaultDemoPorts+" with -demo")
		timeWait    = fs.Duration("timewait", defaultTimeWait, "the `duration` a 4-tuple stays taken after the proxy ended its connection first")
		reuseDelay  = fs.Duration("tw-reuse-delay", defaultReuseDelay, "the `duration` after which a new connection may take over a 4-tuple taken after an active close, if its connection used TCP timestamps; 0: never")
		drain       = fs.Duration("drain", defaultDrain, "the `duration` one side may go on sending after the other has ended; at shutdown, open connections too")
		dialTimeout = fs.Duration("dial-timeout", defaultDialTimeout, "the `duration` a connect to an upstream may take")
		demo        = fs.Bool("demo", false, "run a self-contained demo on loopback: two echo upstreams, clients, proxy; exit 0 only on PASS")
		size        = fs.Int("size", defaultDemoSize, "demo: `bytes` each client sends")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tcpproxy -listen addr:port -upstream addr:port[,addr:port...] [flags]\n       tcpproxy -demo [flags]\n\nflags:\n")
		fs.PrintDefaults()
	}
	set, err := cmdline.Parse(fs, args)
	if err != nil {
		return options{}, err
	}

	o := options{demo: *demo, demoSize: *size}
	if o.cfg.source, err = netip.ParseAddr(*source); err != nil || o.cfg.source.Unmap().IsUnspecified() || o.cfg.source.Zone() != "" {
		return o, fmt.Errorf("-source %q: want a concrete IP address, such as 127.0.0.1", *source)
	}
	if o.demo && !set["ports"] {
		*ports = defaultDemoPorts
	}
	if o.cfg.ports, err = hash4.ParsePortRange(*ports); err != nil {
		return o, fmt.Errorf("-ports: %v", err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"timewait", *timeWait}, {"drain", *drain}, {"dial-timeout", *dialTimeout}} {
		if d.v <= 0 {
			return o, fmt.Errorf("-%s %v: must be positive", d.name, d.v)
		}
	}
	o.cfg.timeWait, o.cfg.drain, o.cfg.dialWait = *timeWait, *drain, *dialTimeout
	if *reuseDelay < 0 {
		return o, fmt.Errorf("-tw-reuse-delay %v: must be 0 (no reuse) or positive", *reuseDelay)
	}
	o.cfg.reuse = *reuseDelay

	if o.demo {
		switch {
		case set["listen"] || set["upstream"]:
			return o, errors.New("-listen and -upstream cannot be used with -demo: the demo runs its own proxy and upstreams on loopback")
		case !o.cfg.source.Unmap().IsLoopback():
			return o, fmt.Errorf("-source %v: the demo runs on loopback, so -source must be a loopback address, such as 127.0.0.1 or ::1", o.cfg.source)
		case o.cfg.ports.Size() > maxDemoPorts:
			return o, fmt.Errorf("-ports %v: the demo opens a connection per port and upstream at once; use at most %d ports", *ports, maxDemoPorts)
		case o.demoSize < 1 || o.demoSize > maxDemoSize/(2*o.cfg.ports.Size()):
			// Each client holds what it sends and what comes back.
			return o, fmt.Errorf("-size %d: must be in 1-%d with %d ports (%d MiB for all clients)",
				o.demoSize, maxDemoSize/(2*o.cfg.ports.Size()), o.cfg.ports.Size(), maxDemoSize>>20)
		}
		return o, nil
	}
	if set["size"] {
		return o, errors.New("-size works only with -demo")
	}
	if *listen == "" {
		return o, errors.New("-listen is required (or use -demo)")
	}
	if o.listen, err = netip.ParseAddrPort(*listen); err != nil {
		return o, fmt.Errorf("-listen %q: want addr:port, such as 127.0.0.1:8080", *listen)
	}
	if *upstream == "" {
		return o, errors.New("-upstream is required (or use -demo)")
	}
	for s := range strings.SplitSeq(*upstream, ",") {
		u, err := netip.ParseAddrPort(strings.TrimSpace(s))
		if err != nil || u.Port() == 0 || u.Addr().Unmap().IsUnspecified() {
			return o, fmt.Errorf("-upstream %q: want a concrete addr:port, such as 127.0.0.1:8081", s)
		}
		if u.Addr().Unmap().Is4() != o.cfg.source.Unmap().Is4() {
			return o, fmt.Errorf("-upstream %v and -source %v: different address families", u, o.cfg.source)
		}
		if o.cfg.source.Unmap().IsLoopback() && !u.Addr().Unmap().IsLoopback() {
			// The kernel refuses the connect() (EINVAL).
			return o, fmt.Errorf("-upstream %v: not reachable from the loopback -source %v; give -source an address of this host", u, o.cfg.source)
		}
		o.cfg.upstreams = append(o.cfg.upstreams, u)
	}
	return o, nil
}

// reuseText describes the TIME_WAIT reuse of a proxy with reuse delay d.
func reuseText(d time.Duration) string {
	if d == 0 {
		return "no TIME_WAIT reuse"
	}
	return fmt.Sprintf("TIME_WAIT reuse after %v", d)
}
