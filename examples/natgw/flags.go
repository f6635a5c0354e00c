package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/examples/internal/cmdline"
)

// Defaults of the flags.
const (
	defaultPorts       = "20000-20999" // below Linux's 32768-60999 and the IANA 49152-65535 ephemeral ranges
	defaultIdle        = 30 * time.Second
	defaultDemoIdle    = time.Second
	defaultMaxFlows    = 1000
	defaultMaxDatagram = 1472 // a full Ethernet frame's UDP payload
	defaultClients     = 64
	defaultDuration    = 5 * time.Second
	defaultRate        = 50
)

// options is the parsed command line.
type options struct {
	gw   config
	demo bool
	dc   demoConfig // with demo
}

// parseFlags parses args (without the program name). Errors describe the
// offending flag; usage goes to out.
func parseFlags(args []string, out io.Writer) (options, error) {
	fs := flag.NewFlagSet("natgw", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		inside      = fs.String("inside", "", "`addr:port` clients send to (default 127.0.0.1:0 with -demo; required otherwise)")
		outside     = fs.String("outside", "127.0.0.1", "`IP` the outside sockets bind to")
		upstream    = fs.String("upstream", "", "`addr:port` every flow is forwarded to (required; not with -demo, which runs its own)")
		ports       = fs.String("ports", defaultPorts, "outside source port range `low-high`")
		idle        = fs.Duration("idle", defaultIdle, "a flow with no datagram either way for this `long` expires and frees its port (default 1s with -demo)")
		maxFlows    = fs.Int("max-flows", defaultMaxFlows, "flows allowed at once; datagrams of further new flows are dropped")
		maxDatagram = fs.Int("max-datagram", defaultMaxDatagram, "largest datagram forwarded, in `bytes`; larger ones are dropped")
		demo        = fs.Bool("demo", false, "run a self-contained demo on loopback: echo upstream, clients, gateway; exit 0 only if every datagram came back to its sender")
		clients     = fs.Int("clients", defaultClients, "demo: number of clients")
		duration    = fs.Duration("duration", defaultDuration, "demo: how long the clients send")
		rate        = fs.Float64("rate", defaultRate, "demo: datagrams per second per client")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: natgw -inside addr:port -upstream addr:port [flags]\n       natgw -demo [flags]\n\nflags:\n")
		fs.PrintDefaults()
	}
	set, err := cmdline.Parse(fs, args)
	if err != nil {
		return options{}, err
	}

	o := options{demo: *demo}
	if *inside == "" {
		if !o.demo {
			return o, errors.New("-inside is required (or use -demo)")
		}
		*inside = "127.0.0.1:0"
	}
	if o.gw.inside, err = netip.ParseAddrPort(*inside); err != nil {
		return o, fmt.Errorf("-inside %q: want addr:port, such as 127.0.0.1:5353", *inside)
	}
	if o.gw.inside.Addr().Unmap().IsUnspecified() {
		return o, fmt.Errorf("-inside %q: need a concrete IP address, not a wildcard", *inside)
	}
	if o.gw.outside, err = netip.ParseAddr(*outside); err != nil || o.gw.outside.Unmap().IsUnspecified() {
		return o, fmt.Errorf("-outside %q: want a concrete IP address, such as 127.0.0.1", *outside)
	}
	if o.gw.ports, err = hash4.ParsePortRange(*ports); err != nil {
		return o, fmt.Errorf("-ports %q: %v", *ports, err)
	}
	o.gw.idle = *idle
	if o.demo && !set["idle"] {
		o.gw.idle = defaultDemoIdle
	}
	if o.gw.idle <= 0 {
		return o, fmt.Errorf("-idle %v: must be positive", *idle)
	}
	if o.gw.maxFlows = *maxFlows; o.gw.maxFlows < 1 {
		return o, fmt.Errorf("-max-flows %d: must be at least 1", *maxFlows)
	}
	if o.gw.maxDatagram = *maxDatagram; o.gw.maxDatagram < 1 || o.gw.maxDatagram > maxUDPPayload {
		return o, fmt.Errorf("-max-datagram %d: must be in 1-%d", *maxDatagram, maxUDPPayload)
	}

	if !o.demo {
		for _, name := range []string{"clients", "duration", "rate"} {
			if set[name] {
				return o, fmt.Errorf("-%s works only with -demo", name)
			}
		}
		if *upstream == "" {
			return o, errors.New("-upstream is required (or use -demo)")
		}
		if o.gw.upstream, err = netip.ParseAddrPort(*upstream); err != nil || o.gw.upstream.Port() == 0 || o.gw.upstream.Addr().Unmap().IsUnspecified() {
			return o, fmt.Errorf("-upstream %q: want a concrete addr:port, such as 127.0.0.1:7", *upstream)
		}
		if o.gw.upstream.Addr().Unmap().Is4() != o.gw.outside.Unmap().Is4() {
			return o, fmt.Errorf("-upstream %v and -outside %v: different address families", o.gw.upstream, o.gw.outside)
		}
		return o, nil
	}

	if *upstream != "" {
		return o, errors.New("-upstream cannot be used with -demo: the demo runs its own echo upstream")
	}
	o.dc = demoConfig{clients: *clients, duration: *duration, rate: *rate}
	switch {
	case o.dc.clients < 1 || o.dc.clients > 10000:
		return o, fmt.Errorf("-clients %d: must be in 1-10000", *clients)
	case o.dc.duration <= 0 || o.dc.duration > time.Hour:
		return o, fmt.Errorf("-duration %v: must be positive and at most 1h", *duration)
	case !(o.dc.rate > 0 && o.dc.rate <= 10000): // also rejects NaN
		return o, fmt.Errorf("-rate %v: must be in (0, 10000] datagrams per second", *rate)
	case o.gw.maxDatagram < demoHeader:
		return o, fmt.Errorf("-max-datagram %d: the demo's datagrams need at least %d bytes", o.gw.maxDatagram, demoHeader)
	}
	// Each client changes its source port halfway, so for a moment its old
	// flow (not yet expired) and its new one both exist.
	if need := 2 * o.dc.clients; need > o.gw.maxFlows || need > o.gw.ports.Size() {
		return o, fmt.Errorf("-clients %d needs up to %d flows and outside ports (each client changes its source port halfway), but -max-flows is %d and -ports has %d",
			o.dc.clients, need, o.gw.maxFlows, o.gw.ports.Size())
	}
	return o, nil
}
