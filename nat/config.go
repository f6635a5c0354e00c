package nat

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"runtime/debug"
	"slices"
	"time"

	"github.com/hash4/hash4"
)

// Proto is a protocol whose flows the NAT translates.
type Proto uint8

// The protocols: TCP, UDP, and ICMP echo (ICMPv4 and ICMPv6), whose
// identifier stands for a port.
const (
	TCP  Proto = iota // TCP
	UDP               // UDP
	ICMP              // ICMP and ICMPv6 echo
	numProtos
)

// String returns "tcp", "udp" or "icmp".
func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case ICMP:
		return "icmp"
	}
	return fmt.Sprintf("Proto(%d)", uint8(p))
}

// Behavior is a mapping or filtering behaviour of RFC 4787.
type Behavior uint8

const (
	// Default is endpoint-independent for mapping and address-dependent
	// for filtering (see Filtering).
	Default Behavior = iota
	// EndpointIndependent mapping gives an inside endpoint one external
	// endpoint whatever the destination (RFC 4787 REQ-1); endpoint-
	// independent filtering lets any remote endpoint reach a mapping.
	EndpointIndependent
	// AddressDependent mapping gives an inside endpoint one external
	// endpoint per remote address; address-dependent filtering lets a
	// remote endpoint reach a mapping only if the inside endpoint has sent
	// to its address.
	AddressDependent
	// AddressAndPortDependent mapping gives an inside endpoint one
	// external endpoint per remote address and port, and the same external
	// port may serve other inside endpoints toward other remote endpoints,
	// as Linux's masquerade does (Table.Connect's 4-tuple uniqueness);
	// address-and-port-dependent filtering lets only the remote endpoints
	// the inside endpoint has sent to reach it.
	AddressAndPortDependent
)

// String returns the behaviour's name as RFC 4787 writes it.
func (b Behavior) String() string {
	switch b {
	case Default:
		return "default"
	case EndpointIndependent:
		return "endpoint-independent"
	case AddressDependent:
		return "address-dependent"
	case AddressAndPortDependent:
		return "address-and-port-dependent"
	}
	return fmt.Sprintf("Behavior(%d)", uint8(b))
}

// ParseBehavior parses "endpoint-independent" (or "eim", "eif", "ei"),
// "address-dependent" ("adm", "adf", "ad") and "address-and-port-dependent"
// ("apdm", "apdf", "apd").
func ParseBehavior(s string) (Behavior, error) {
	switch s {
	case "endpoint-independent", "ei", "eim", "eif":
		return EndpointIndependent, nil
	case "address-dependent", "ad", "adm", "adf":
		return AddressDependent, nil
	case "address-and-port-dependent", "apd", "apdm", "apdf":
		return AddressAndPortDependent, nil
	case "default", "":
		return Default, nil
	}
	return Default, fmt.Errorf("nat: unknown behaviour %q (endpoint-independent, address-dependent, address-and-port-dependent)", s)
}

// Behaviors are the mapping and filtering behaviours of one protocol.
//
// Filtering defaults to address-dependent: it keeps out every host the
// inside endpoint has not contacted, which is RFC 4787 REQ-8's advice where
// stricter filtering matters, and it still lets the peer-to-peer techniques
// that endpoint-independent mapping is for (STUN, ICE hole punching) work,
// since those contact the peer's address first. Endpoint-independent
// filtering, RFC 4787's advice where transparency comes first, is one
// setting away.
type Behaviors struct {
	Mapping, Filtering Behavior
}

// Pooling says how mappings spread over the external addresses
// (RFC 4787 REQ-2).
type Pooling uint8

const (
	// Paired pooling, the default, puts every mapping of one inside address
	// on one external address of its family.
	Paired Pooling = iota
	// Arbitrary pooling may put an inside address's mappings on any
	// external address, moving on to the next when one's ports run out.
	Arbitrary
)

// Blocks configures port-block allocation: each inside host gets a block of
// Size consecutive external ports on one external address, and all its
// mappings take ports from it, as carrier-grade NATs assign and log them.
//
// The external port space of a family is numbered as blocks: the pool's
// addresses of that family in order, each cut into Ports.Size()/Size
// blocks from Ports.Low up. This NAT uses blocks First to First+Count-1 of
// it; several NATs (processes or machines) given disjoint block ranges of
// the same addresses never hand out the same external port, without
// talking to each other.
type Blocks struct {
	// Size is the number of ports per block; 0 turns blocks off.
	Size int
	// First and Count are the block numbers this NAT uses; Count 0 means
	// every block from First on.
	First, Count int
	// Deterministic, if set, computes each host's block from its address
	// (RFC 7422), in the families it has a prefix for (at most one each):
	// the n-th address of the prefix gets block First+n, and hosts of the
	// family outside the prefix get none. Otherwise, and in a family with
	// no prefix, a host gets the lowest free block when its first flow is
	// made and gives it back when its last flow ends.
	Deterministic []netip.Prefix
}

// Timeouts are idle timeouts by protocol and TCP state, each at most 100
// years. A zero field takes its default, given in brackets with its
// source.
type Timeouts struct {
	// UDP [5m, RFC 4787 REQ-5's recommendation] for a UDP flow that has
	// seen a reply; UDPUnreplied [2m, REQ-5's minimum] for one that has
	// not (conntrack: 120s and 30s).
	UDP, UDPUnreplied time.Duration
	// ICMP [60s, RFC 5508 REQ-2's minimum; conntrack 30s] for echo flows.
	ICMP time.Duration
	// TCPSynSent [4m], TCPSynRecv [4m]: the handshake (RFC 5382 REQ-5's
	// minimum for a connection partly open or closed; conntrack has 120s
	// and 60s).
	TCPSynSent, TCPSynRecv time.Duration
	// TCPEstablished [2h4m, RFC 5382's minimum; conntrack has 5 days].
	TCPEstablished time.Duration
	// TCPFinWait [4m], TCPCloseWait [4m], TCPLastAck [4m]: closing, one
	// way or both (REQ-5's minimum; conntrack has 120s, 60s and 30s).
	// TCPTimeWait [120s], TCPClose [10s]: closed, by FINs both ways
	// acknowledged or by a RST (conntrack's).
	TCPFinWait, TCPCloseWait, TCPLastAck, TCPTimeWait, TCPClose time.Duration
}

// DefaultTimeouts are the timeouts a zero Timeouts field takes.
var DefaultTimeouts = Timeouts{
	UDP: 5 * time.Minute, UDPUnreplied: 2 * time.Minute, ICMP: time.Minute,
	TCPSynSent: 4 * time.Minute, TCPSynRecv: 4 * time.Minute, TCPEstablished: 2*time.Hour + 4*time.Minute,
	TCPFinWait: 4 * time.Minute, TCPCloseWait: 4 * time.Minute, TCPLastAck: 4 * time.Minute,
	TCPTimeWait: 2 * time.Minute, TCPClose: 10 * time.Second,
}

// Config configures a NAT. The zero value of each field but External is a
// usable default.
type Config struct {
	// External is the pool of external addresses, IPv4 and IPv6 (at least
	// one; unicast: a loopback address serves the endpoint methods alone,
	// as packets to it are refused). Packets of a family with no external
	// address are refused.
	External []netip.Addr
	// Ports is the range of external ports and echo identifiers
	// [1024-65535].
	Ports hash4.PortRange
	// TCP, UDP and ICMP are each protocol's behaviours. A mapping that is
	// address-and-port-dependent shares external ports between inside
	// endpoints, so it takes address-and-port-dependent filtering only.
	TCP, UDP, ICMP Behaviors
	// PortPreservation gives a new endpoint-independent or address-
	// dependent mapping the inside port when it is free in the range, and
	// a new address-and-port-dependent flow the inside port when its
	// 4-tuple is free (RFC 4787 REQ-3's preservation, never overloading).
	PortPreservation bool
	// ParityPreservation gives a new mapping an external port of the
	// inside port's parity (RFC 4787 REQ-4), when one is free.
	ParityPreservation bool
	// Pooling is Paired (default) or Arbitrary.
	Pooling Pooling
	// Blocks configures port blocks per inside host; zero: none.
	Blocks Blocks
	// MaxFlows caps the flows at once [1<<20]: past it, a new flow evicts
	// the oldest flow that has not been answered (early drop), or is
	// refused if there is none.
	MaxFlows int
	// MaxFlowsPerHost caps the flows of one inside address [0: no cap]: a
	// new flow past it is refused.
	MaxFlowsPerHost int
	// Capacity is the flows each protocol's tables are sized for when the
	// NAT is made [1024, or MaxFlows if less], at most MaxFlows. Past it
	// they grow by themselves, doubling at two flows per bucket, while
	// lookups go on. A NAT sized for its flows skips those growths and
	// keeps one flow per bucket up to Capacity, where making a flow costs
	// less (docs/performance.md, "Flow creation"), for 64 bytes per flow of
	// Capacity, from the start, in each of a protocol's tables (two, two
	// more for mappings unless address-and-port-dependent, one more for
	// address-dependent filtering).
	Capacity int
	// Timeouts are the idle timeouts; zero fields take DefaultTimeouts.
	Timeouts Timeouts
	// Tick is the resolution of expiry [1s; 1ms to 1h]: Run calls Expire
	// this often, and a flow expires up to two Ticks after its timeout,
	// never before it.
	Tick time.Duration
	// ExpireBudget bounds the flows one Expire examines [65536]; flows
	// due beyond it wait for the next call.
	ExpireBudget int
	// Router is the NAT's own address on the inside, per family (at most
	// one each): the source of the ICMP errors it sends inside (time
	// exceeded, fragmentation needed, administratively prohibited). With
	// none of a family, the NAT sends no error for that family's packets.
	Router []netip.Addr
	// MTU is the largest packet the NAT forwards, each way [0: no limit]:
	// a larger one is answered with fragmentation needed (IPv4 with DF),
	// packet too big (IPv6) or, for IPv4 without DF, fragmented.
	MTU int
	// FragmentMemory bounds the fragments held while a datagram's first
	// fragment is awaited and the datagrams tracked, each counted at 256
	// bytes [4 MiB]: past it, the fragments of new datagrams but their
	// first are dropped. FragmentTimeout bounds how long a datagram's
	// fragments are remembered [30s, Linux's ipfrag_time].
	FragmentMemory  int
	FragmentTimeout time.Duration
}

// ErrConfig is the error of New for a bad Config, wrapped with the
// problem. Match it with errors.Is.
var ErrConfig = errors.New("nat: invalid configuration")

// cfgErr returns an error matching ErrConfig.
func cfgErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// maxTimeout bounds the timeouts: a flow's deadline, its last packet's
// time plus its timeout, must not overflow (about 292 years in all).
const maxTimeout = 100 * 365 * 24 * time.Hour

// minTick bounds Config.Tick from below: Expire looks at every tick since
// its last call, and a tick of nanoseconds would have it look at millions.
const minTick = time.Millisecond

// normalized returns c with its defaults filled in, or the first problem.
func (c Config) normalized() (Config, error) {
	if len(c.External) == 0 {
		return c, cfgErr("no external address")
	}
	ext := make([]netip.Addr, 0, len(c.External))
	seen := map[netip.Addr]bool{}
	for _, a := range c.External {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return c, cfgErr("external address %v: want a unicast address a router forwards to (or loopback, for the endpoint methods alone)", a)
		}
		if seen[a] {
			return c, cfgErr("external address %v given twice", a)
		}
		seen[a] = true
		ext = append(ext, a)
	}
	c.External = ext
	c.Blocks.Deterministic = slices.Clone(c.Blocks.Deterministic)
	if c.Ports == (hash4.PortRange{}) {
		c.Ports = hash4.PortRange{Low: 1024, High: 65535}
	}
	if err := c.Ports.Validate(); err != nil {
		return c, cfgErr("ports %d-%d: %v", c.Ports.Low, c.Ports.High, err)
	}
	for p, b := range []*Behaviors{&c.TCP, &c.UDP, &c.ICMP} {
		if b.Mapping > AddressAndPortDependent || b.Filtering > AddressAndPortDependent {
			return c, cfgErr("%v behaviours %v, %v", Proto(p), b.Mapping, b.Filtering)
		}
		if b.Mapping == Default {
			b.Mapping = EndpointIndependent
		}
		if b.Filtering == Default {
			b.Filtering = AddressDependent
		}
		if b.Mapping == AddressAndPortDependent && b.Filtering != AddressAndPortDependent {
			return c, cfgErr("%v: address-and-port-dependent mapping shares external ports, so it needs address-and-port-dependent filtering, not %v", Proto(p), b.Filtering)
		}
	}
	if c.Pooling > Arbitrary {
		return c, cfgErr("pooling %d", c.Pooling)
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = 1 << 20
	}
	if c.MaxFlows < 0 || c.MaxFlowsPerHost < 0 {
		return c, cfgErr("negative flow limit")
	}
	if c.MaxFlowsPerHost > math.MaxInt32 {
		return c, cfgErr("MaxFlowsPerHost %d: want at most %d", c.MaxFlowsPerHost, math.MaxInt32)
	}
	if c.Capacity < 0 || c.Capacity > c.MaxFlows {
		return c, cfgErr("capacity %d: want 0 to MaxFlows, %d", c.Capacity, c.MaxFlows)
	}
	if c.Capacity == 0 {
		c.Capacity = min(c.MaxFlows, 1024)
	}
	if err := c.checkTableMemory(); err != nil {
		return c, err
	}
	to := &c.Timeouts
	d := DefaultTimeouts
	for _, f := range []struct{ v, def *time.Duration }{
		{&to.UDP, &d.UDP}, {&to.UDPUnreplied, &d.UDPUnreplied}, {&to.ICMP, &d.ICMP},
		{&to.TCPSynSent, &d.TCPSynSent}, {&to.TCPSynRecv, &d.TCPSynRecv}, {&to.TCPEstablished, &d.TCPEstablished},
		{&to.TCPFinWait, &d.TCPFinWait}, {&to.TCPCloseWait, &d.TCPCloseWait}, {&to.TCPLastAck, &d.TCPLastAck},
		{&to.TCPTimeWait, &d.TCPTimeWait}, {&to.TCPClose, &d.TCPClose},
	} {
		if *f.v < 0 || *f.v > maxTimeout {
			return c, cfgErr("timeout %v: want 0 (the default) to %v", *f.v, maxTimeout)
		}
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if c.Tick == 0 {
		c.Tick = time.Second
	}
	if c.Tick < minTick || c.Tick > time.Hour {
		return c, cfgErr("tick %v: want %v to 1h", c.Tick, minTick)
	}
	if c.ExpireBudget == 0 {
		c.ExpireBudget = 1 << 16
	}
	if c.ExpireBudget < 0 {
		return c, cfgErr("expire budget %d", c.ExpireBudget)
	}
	var r4, r6 bool
	c.Router = slices.Clone(c.Router) // the caller's stays as it was, and its own
	for i, a := range c.Router {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || a.IsUnspecified() || a.Is4() && r4 || a.Is6() && r6 {
			return c, cfgErr("router address %v: want at most one concrete address per family", c.Router[i])
		}
		r4, r6 = r4 || a.Is4(), r6 || a.Is6()
		c.Router[i] = a
	}
	if c.MTU != 0 && (c.MTU < 1280 || c.MTU > 65535) {
		return c, cfgErr("MTU %d: want 1280 to 65535", c.MTU)
	}
	if c.FragmentMemory == 0 {
		c.FragmentMemory = 4 << 20
	}
	if c.FragmentTimeout == 0 {
		c.FragmentTimeout = 30 * time.Second
	}
	if c.FragmentMemory < 0 || c.FragmentTimeout < 0 {
		return c, cfgErr("negative fragment limit")
	}
	return c, c.Blocks.check(c)
}

// check validates the block configuration against c's pool and range.
func (b Blocks) check(c Config) error {
	if b.Size == 0 {
		if b.First != 0 || b.Count != 0 || len(b.Deterministic) != 0 {
			return cfgErr("blocks of size 0 with First, Count or Deterministic set")
		}
		return nil
	}
	if b.Size < 1 || b.Size > c.Ports.Size() {
		return cfgErr("block size %d: want 1 to %d (the range)", b.Size, c.Ports.Size())
	}
	if b.First < 0 || b.Count < 0 {
		return cfgErr("blocks %d+%d", b.First, b.Count)
	}
	var p4, p6 bool
	for _, p := range b.Deterministic {
		if !p.IsValid() || p.Addr().Is4() && p4 || p.Addr().Is6() && p6 {
			return cfgErr("deterministic prefixes %v: want at most one valid prefix per family", b.Deterministic)
		}
		p4, p6 = p4 || p.Addr().Is4(), p6 || p.Addr().Is6()
	}
	return nil
}

// timeout returns the idle timeout of a flow of protocol p in TCP state s
// (ignored for UDP and ICMP), replied or not.
func (t *Timeouts) timeout(p Proto, s tcpState, replied bool) time.Duration {
	switch p {
	case UDP:
		if replied {
			return t.UDP
		}
		return t.UDPUnreplied
	case ICMP:
		return t.ICMP
	}
	switch s {
	case tcpNone: // not tracked: as UDP, answered or not
		if replied {
			return t.TCPEstablished
		}
		return t.TCPSynSent
	case tcpSynSent, tcpSynSent2:
		return t.TCPSynSent
	case tcpSynRecv:
		return t.TCPSynRecv
	case tcpEstablished:
		return t.TCPEstablished
	case tcpFinWait:
		return t.TCPFinWait
	case tcpCloseWait:
		return t.TCPCloseWait
	case tcpLastAck:
		return t.TCPLastAck
	case tcpTimeWait:
		return t.TCPTimeWait
	}
	return t.TCPClose
}

// checkTableMemory refuses a Capacity whose tables' buckets could not be
// made (hash4.New would panic): more buckets than a table can have, or
// more bytes, all tables together, than the process's memory limit.
func (c *Config) checkTableMemory() error {
	const lineSize, maxBuckets = 64, 1 << 29
	buckets := uint64(1) << bits.Len(uint(c.Capacity-1)) // as hash4 rounds, one flow per bucket
	if buckets > maxBuckets {
		return cfgErr("capacity %d: beyond the %d buckets a table can have", c.Capacity, maxBuckets)
	}
	tables := uint64(0)
	for _, b := range []Behaviors{c.TCP, c.UDP, c.ICMP} {
		tables += 2
		if b.Mapping != AddressAndPortDependent {
			tables += 2
		}
		if b.Filtering == AddressDependent {
			tables++
		}
	}
	if size, limit := tables*buckets*lineSize, debug.SetMemoryLimit(-1); size > uint64(limit) {
		return cfgErr("capacity %d: %d tables of %d buckets take %d bytes, beyond the memory limit of %d", c.Capacity, tables, buckets, size, limit)
	}
	return nil
}
