package nat

import (
	"encoding/binary"
	"errors"
	"hash/maphash"
	"iter"
	"math"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hash4/hash4"
)

// The states of a mapping or flow. An object is inserted into its tables
// pending, made live with one atomic store once it is in all of them, and
// made dead with one atomic store before it leaves them: a reader that
// finds it treats pending and dead as absent, so both directions (a
// flow's inside and outside keys, a mapping's inside and external keys)
// appear together and vanish together, whatever order the table writes
// take. Only the goroutine that inserted an object makes it live, and only
// the one whose CompareAndSwap from live succeeds makes it dead.
const (
	statePending uint32 = iota
	stateLive
	stateDead
)

// Flow flags, set with atomic ORs.
const (
	flagReplied uint32 = 1 << iota // a packet went the other way from the first
	flagAssured                    // replied (UDP, ICMP) or established (TCP): no early drop
	flagInbound                    // made by an inbound packet (endpoint-independent or address-dependent filtering)
	flagListed                     // in the unassured list
	flagSib                        // held in its mapping's first flow's sibs, without keys
)

// icmpRemotePort is the remote port of an echo flow's keys: the tables'
// tuples need one, and echo has no remote identifier.
const icmpRemotePort = 1

// Key sentinels: the remote endpoint of the keys that name a mapping by one
// endpoint alone. They are valid tuple halves of each family that no real
// flow uses as its remote (a broadcast and a reserved multicast address).
var (
	sentinel4 = netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), 1)
	sentinel6 = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xff, 0x0f, 15: 1}), 1)
)

func sentinel(a netip.Addr) netip.AddrPort {
	if a.Is4() {
		return sentinel4
	}
	return sentinel6
}

// mapping joins an inside endpoint and its external endpoint, for
// endpoint-independent and address-dependent mapping. Its fields down to
// h, and first's endpoints, are set before it is inserted and never
// change; refs counts the flows that use it (and, briefly, a flow being
// made), and the last to go deletes it.
//
// first, under endpoint-independent mapping, is the flow that made the
// mapping. It has no keys of its own: a packet finds it through the
// mapping's (maps by its inside endpoint, extm by its external one), so
// that a new mapping and its flow write two keys, not four. The next
// flows of the mapping are held as first's sibs, without keys either, as
// long as a sib is free; the rest have their keys in fwd and rev. A flow
// to first's remote once first has ended is such a later flow (first is
// never made live again).
// Under address-dependent mapping first is never used: an inside endpoint
// has a mapping per remote address, and a flow made from outside may go
// to any, so only fwd's keys keep one flow per 5-tuple.
type mapping struct {
	// N.B. first at offset 0, and the mapping a multiple of 64 bytes in
	// size: first's hot line is the mapping's first (TestFlowLayout).
	first flow
	state atomic.Uint32
	refs  atomic.Int32
	key   hash4.Tuple // inside endpoint -> remote (address-dependent) or sentinel
	ext   netip.AddrPort
	p     Proto
	h     *host
	// fmu is held while a flow that is not the mapping's first is
	// placed, in a sib or by its keys (placeLater), so that two makers
	// of one remote's flow never both succeed.
	fmu sync.Mutex
	// Address-dependent filtering's permits: the remote addresses its
	// flows go to, each with its count of flows. The first few are here,
	// so that a mapping's first flows write no permit entry; the rest, spill of
	// them, are in the permit table. An address is in one place or the
	// other, never both. All under pmu.
	pmu   sync.Mutex
	near  [nearPermits]nearPermit
	spill int32
	// Padding to 448 bytes (64-bit), a size class whose objects start on
	// a cache line.
	_ [12]byte
}

// nearPermits is how many remote addresses a mapping's permits hold in the
// mapping itself: two cover the mappings that talk to one server, or to a
// STUN server and one peer.
const nearPermits = 2

// nearPermit is a remote address (As16) and its count of flows; n == 0: a
// free place.
type nearPermit struct {
	a [16]byte
	n int32
}

// flow joins a mapping and a remote endpoint: what a packet each way is
// translated by. inside, ext and remote are set before it is live and do
// not change after. A mapping's first flow is inside the mapping.
type flow struct {
	// The first cache line holds what a packet of the flow reads: its
	// state, flags and clock, where its addresses go (out: the external
	// endpoint, in: the inside one), and, for a packet that finds a
	// mapping's first flow through the mapping, the remote's port
	// (firstTo) and others; the second holds the remote, and, for a
	// mapping's first flow, its sibs.
	state atomic.Uint32
	flags atomic.Uint32
	last  atomic.Int64 // the clock at its last packet
	out   ep
	in    ep
	p     Proto
	rport uint16
	// others, in a mapping's first flow, counts the mapping's flows in
	// fwd and rev: a packet that neither the first flow nor a sib takes
	// looks there only if there are some (notFirst). It is raised before
	// such a flow's keys are inserted and lowered after they are
	// deleted. Unused in other flows.
	others atomic.Int32
	// The endpoints: remote, ext (the NAT's); the inside one (the
	// host's) is in (inside).
	remote netip.AddrPort
	// sibs, in a mapping's first flow, hold the mapping's next flows
	// without keys: a sib is set, under the mapping's fmu, to a flow
	// before it goes live, and cleared by the flow's end; a dead flow's
	// sib is free. sibPrints[i] is the print of sibs[i]'s remote,
	// stored before the sib (sibTo). Unused in other flows.
	sibs      [numSibs]atomic.Pointer[flow]
	sibPrints [numSibs]atomic.Uint32
	m         *mapping // nil for address-and-port-dependent mapping
	ext       netip.AddrPort
	h         *host
	tcp       *tcpTrack // TCP flows only
	// t files the flow in the timing wheel.
	t timer
	// up and down link the unassured list, under n.unassured.mu.
	up, down *flow
	// Padding to 256 bytes (64-bit), a size class whose objects start
	// on a cache line, so that the first line is the flow's own
	// (TestFlowLayout).
	_ [24]byte
}

// numSibs is how many of a mapping's flows after its first it holds
// without keys: with the first, they cover the mappings that talk to a
// server and a peer or two, as a STUN client's does, and with their
// prints they fill the first flow's second line beside its remote.
const numSibs = 2

// ep is an endpoint in 20 bytes, for a flow's first cache line.
type ep struct {
	a    [16]byte
	port uint16
	v6   bool
}

func epOf(a netip.AddrPort) ep {
	e := ep{port: a.Port(), v6: a.Addr().Is6()}
	if e.v6 {
		e.a = a.Addr().As16()
	} else {
		a4 := a.Addr().As4()
		copy(e.a[:], a4[:])
	}
	return e
}

func (e *ep) addrPort() netip.AddrPort {
	if e.v6 {
		return netip.AddrPortFrom(netip.AddrFrom16(e.a), e.port)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(e.a[:4])), e.port)
}

// inside returns the flow's inside endpoint.
func (f *flow) inside() netip.AddrPort { return f.in.addrPort() }

func (f *flow) insideKey() hash4.Tuple { return hash4.Tuple{Local: f.inside(), Remote: f.remote} }
func (f *flow) extKey() hash4.Tuple    { return hash4.Tuple{Local: f.ext, Remote: f.remote} }

// protoState holds one protocol's tables and allocator.
type protoState struct {
	b     Behaviors
	alloc *hash4.PortAllocator
	// fwd: inside endpoint, remote -> flow; rev: external endpoint,
	// remote -> flow; a keyless mapping's first flow and sibs excepted.
	fwd, rev *hash4.Table[flow]
	// maps: inside endpoint, remote address or sentinel -> mapping;
	// extm: external endpoint, sentinel -> mapping; ports: which ports
	// the mappings hold, by the address's family and place in NAT.pool.
	// Unused for address-and-port-dependent mapping, whose flows are its
	// mappings.
	maps, extm *hash4.Table[mapping]
	ports      [2][]addrPorts
	// perm: external endpoint, remote address:1 -> the count of flows
	// from the mapping to that address, for address-dependent filtering,
	// for the addresses past a mapping's near permits.
	perm *hash4.Table[permit]
}

// keyless reports whether ps's mappings hold their first flow and sibs,
// without keys of their own (mapping.first): endpoint-independent
// mapping's.
func (ps *protoState) keyless() bool { return ps.b.Mapping == EndpointIndependent }

// flows yields ps's flows: those in fwd, and the mappings' first flows
// and sibs, live or not (the caller checks).
func (ps *protoState) flows() iter.Seq[*flow] {
	return func(yield func(*flow) bool) {
		for _, f := range ps.fwd.All() {
			if !yield(f) {
				return
			}
		}
		if !ps.keyless() {
			return
		}
		for _, m := range ps.maps.All() {
			if !yield(&m.first) {
				return
			}
			for i := range m.first.sibs {
				if f := m.first.sibs[i].Load(); f != nil && !yield(f) {
					return
				}
			}
		}
	}
}

// permit counts a mapping's flows to one remote address. Its count changes
// under the mapping's pmu, and the permit table's bucket lock (Compute).
type permit struct{ n int }

// NAT is a network address translator's state: mappings, flows, their
// expiry and the counters. Make one with New; its methods are safe for
// concurrent use.
type NAT struct {
	cfg   Config
	proto [numProtos]protoState
	pool  [2][]netip.Addr    // external addresses: [0] IPv4, [1] IPv6
	place map[netip.Addr]int // each external address's index in its pool
	seed  maphash.Seed
	hosts hosts

	flows     atomic.Int64
	mappings  atomic.Int64
	clock     atomic.Int64 // unix nanoseconds, set by Expire
	wheel     wheel
	unassured struct {
		mu         sync.Mutex
		head, tail *flow
	}
	frags fragTable
	// errBudget is the ICMP errors the NAT may still send to each side
	// (by Side), refilled by Expire from errRefilled on (refillErrors).
	errBudget   [2]atomic.Int64
	errRefilled int64 // under wheel.mu
	ctr         counters
}

// New returns a NAT configured by c, or an error matching ErrConfig.
func New(c Config) (*NAT, error) {
	c, err := c.normalized()
	if err != nil {
		return nil, err
	}
	n := &NAT{cfg: c, seed: maphash.MakeSeed(), place: make(map[netip.Addr]int, len(c.External))}
	for _, a := range c.External {
		f := family(a)
		n.place[a] = len(n.pool[f])
		n.pool[f] = append(n.pool[f], a)
	}
	// The tables grow by themselves past capacity, while lookups go on.
	capacity := c.Capacity
	for i, b := range []Behaviors{c.TCP, c.UDP, c.ICMP} {
		alloc, err := hash4.NewPortAllocator(hash4.WithPortRange(c.Ports))
		if err != nil {
			return nil, cfgErr("ports: %v", err)
		}
		ps := &n.proto[i]
		ps.b, ps.alloc = b, alloc
		ps.fwd = hash4.New[flow](hash4.WithCapacity(capacity))
		ps.rev = hash4.New[flow](hash4.WithCapacity(capacity))
		if b.Mapping != AddressAndPortDependent {
			ps.maps = hash4.New[mapping](hash4.WithCapacity(capacity))
			ps.extm = hash4.New[mapping](hash4.WithCapacity(capacity))
			for f := range ps.ports {
				ps.ports[f] = make([]addrPorts, len(n.pool[f]))
			}
		}
		if b.Filtering == AddressDependent {
			ps.perm = hash4.New[permit](hash4.WithCapacity(capacity))
		}
	}
	if err := n.hosts.init(&n.cfg, &n.pool); err != nil {
		return nil, err
	}
	now := time.Now().UnixNano()
	n.clock.Store(now)
	n.wheel.init(c.Tick, now)
	for i := range n.errBudget {
		n.errBudget[i].Store(n.errorsPerTick())
	}
	n.errRefilled = n.now()
	return n, nil
}

// errorsPerTick is the ICMP errors the NAT may send per tick.
func (n *NAT) errorsPerTick() int64 {
	return max(1, int64(errorsPerSecond*n.cfg.Tick/time.Second))
}

// refillErrors adds to each side's ICMP error budget what errorsPerSecond
// allows from the last refill to now, up to a tick's worth: a flood in one
// direction cannot spend the other's errors, and Expire called more often
// than Config.Tick earns no more. wheel.mu is held.
func (n *NAT) refillErrors(now int64) {
	// A pause of over a tick earns a tick's worth: capped first, so that
	// the product cannot overflow whatever the pause.
	n.errRefilled = max(n.errRefilled, now-int64(n.cfg.Tick))
	add := (now - n.errRefilled) * errorsPerSecond / int64(time.Second)
	if add <= 0 {
		return
	}
	n.errRefilled += add * int64(time.Second) / errorsPerSecond // the rest counts next time
	limit := n.errorsPerTick()
	for i := range n.errBudget {
		b := &n.errBudget[i]
		for {
			v := b.Load()
			if b.CompareAndSwap(v, min(limit, max(v, 0)+add)) {
				break
			}
		}
	}
}

// family returns 0 for an IPv4 address, 1 for IPv6.
func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// Config returns the NAT's configuration, defaults filled in.
func (n *NAT) Config() Config { return n.cfg }

// now returns the NAT's clock.
func (n *NAT) now() int64 { return n.clock.Load() }

// isExternal reports whether a is one of the pool's addresses. Every
// packet asks (hairpin, spoofed source): a small pool is compared in
// place, which costs less than the map's hash.
func (n *NAT) isExternal(a netip.Addr) bool {
	if pool := n.pool[family(a)]; len(pool) <= 4 {
		for _, e := range pool {
			if e == a {
				return true
			}
		}
		return false
	}
	_, ok := n.place[a]
	return ok
}

// portsOf returns the ports of external address a that ps's mappings
// hold; a is in the pool and ps's mapping is not address-and-port-dependent.
func (n *NAT) portsOf(ps *protoState, a netip.Addr) *addrPorts {
	return &ps.ports[family(a)][n.place[a]]
}

// touch refreshes f's clock. It writes only when the clock moved, so that
// the packets of one tick share the flow's line rather than write it.
func (f *flow) touch(now int64) {
	if f.last.Load() != now {
		f.last.Store(now)
	}
}

// lookup returns the live flow of key k (from inside: the inside endpoint
// and the remote; from outside: the external endpoint and the remote) of
// a packet from side from. Where mappings hold their first flow it looks
// the mapping up, and only if its first flow is not the packet's, the
// flow (notFirst); else the flow.
func (ps *protoState) lookup(k *hash4.Tuple, from Side) *flow {
	if !ps.keyless() {
		return ps.later(k, from)
	}
	// Keyless first flows are endpoint-independent mapping's, whose
	// mappings are named by one endpoint each way.
	t := ps.maps
	if from == Outside {
		t = ps.extm
	}
	m, _ := t.Lookup(soloKey(k.Local))
	if f := m.firstTo(k.Remote); f != nil {
		return f
	}
	return ps.notFirst(m, k, from)
}

// notFirst returns the live flow of key k of a packet from side from,
// whose mapping's lookup found m (nil: none), and whose flow is not m's
// first: a sib, or one in fwd or rev if m has such flows.
func (ps *protoState) notFirst(m *mapping, k *hash4.Tuple, from Side) *flow {
	if f := m.sibTo(k.Remote); f != nil || m == nil || m.first.others.Load() == 0 {
		return f
	}
	return ps.later(k, from)
}

// later returns the live flow of key k of a packet from side from in fwd
// or rev, the tables of the flows that are not a mapping's first.
func (ps *protoState) later(k *hash4.Tuple, from Side) *flow {
	if from == Inside {
		return live(ps.fwd.Lookup(*k))
	}
	return live(ps.rev.Lookup(*k))
}

// lookupOut returns the live flow of a packet from the inside endpoint
// k.Local to k.Remote.
func (ps *protoState) lookupOut(k *hash4.Tuple) *flow { return ps.lookup(k, Inside) }

// lookupIn returns the live flow of a packet from k.Remote to the external
// endpoint k.Local.
func (ps *protoState) lookupIn(k *hash4.Tuple) *flow { return ps.lookup(k, Outside) }

// held reports whether a flow of key k from inside, live or not, holds
// its place: its keys in fwd, or a sib of its mapping. Such a flow that is
// not live is being made or deleted.
func (ps *protoState) held(k *hash4.Tuple) bool {
	if _, ok := ps.fwd.Lookup(*k); ok {
		return true
	}
	if !ps.keyless() {
		return false
	}
	m, _ := ps.maps.Lookup(soloKey(k.Local))
	if m == nil {
		return false
	}
	for i := range m.first.sibs {
		if f := m.first.sibs[i].Load(); f != nil && f.remote == k.Remote && f.state.Load() != stateDead {
			return true
		}
	}
	return false
}

// live returns f if a lookup found it (ok) and it is live.
func live(f *flow, ok bool) *flow {
	if !ok || f.state.Load() != stateLive {
		return nil
	}
	return f
}

// flowTo returns m's first flow or sib that is live and goes to remote;
// nil if none, or m is.
func (m *mapping) flowTo(remote netip.AddrPort) *flow {
	if f := m.firstTo(remote); f != nil {
		return f
	}
	return m.sibTo(remote)
}

// firstTo returns m's first flow if it is live and goes to remote; nil if
// not, or m is nil. N.B. apart from sibTo: in line in a packet's path.
func (m *mapping) firstTo(remote netip.AddrPort) *flow {
	if m == nil || !m.first.goesTo(remote) {
		return nil
	}
	return &m.first
}

// sibTo returns m's sib that is live and goes to remote; nil if none, or m
// is nil.
func (m *mapping) sibTo(remote netip.AddrPort) *flow {
	if m == nil {
		return nil
	}
	// N.B. a sib, then its print: a sib seen set was stored after its
	// print, and a print that is not the sib's turns a flow away only
	// if it is dead. Prints spare the sibs' own lines for the packets
	// of other flows.
	pr := printOf(remote)
	for i := range m.first.sibs {
		if f := m.first.sibs[i].Load(); f != nil && m.first.sibPrints[i].Load() == pr && f.goesTo(remote) {
			return f
		}
	}
	return nil
}

// printOf is the print of a remote endpoint kept beside a sib: its address
// and port folded into 32 bits.
func printOf(remote netip.AddrPort) uint32 {
	a := remote.Addr().As16()
	w := binary.LittleEndian.Uint64(a[:8]) ^ binary.LittleEndian.Uint64(a[8:])
	return uint32(w) ^ uint32(w>>32) ^ uint32(remote.Port())<<16
}

// goesTo reports whether f is live and goes to remote. N.B. the port, on
// the hot line, turns most other flows away; the address is compared on
// the second line, whose load the processor issues with the first's.
func (f *flow) goesTo(remote netip.AddrPort) bool {
	return f.rport == remote.Port() && f.remote == remote && f.state.Load() == stateLive
}

// parityTries bounds the ports of the right parity an
// address-and-port-dependent flow tries before it takes any port.
const parityTries = 64

// maxRetries bounds the waits of a flow's maker for another goroutine that
// is making or deleting the same flow or mapping (a few stores away).
const maxRetries = 1000

// outbound returns the flow of a packet of p from k.Local, inside, to
// k.Remote, whose lookup found no live flow: it makes the flow (and its
// mapping). A new TCP flow is made only if canCreate: other segments of no
// flow are refused.
func (n *NAT) outbound(p Proto, k hash4.Tuple, canCreate bool) (*flow, Drop) {
	ps := &n.proto[p]
	inside, remote := k.Local, k.Remote
	if !canCreate {
		return nil, DropTCPState
	}
	if len(n.pool[family(inside.Addr())]) == 0 {
		return nil, DropUnsupported
	}
	return n.newFlow(ps, p, inside, remote, nil)
}

// inbound returns the flow of a packet of p from k.Remote to the external
// endpoint k.Local, whose lookup found no live flow: where the filtering
// lets the remote reach the external endpoint's mapping, a new flow of that
// mapping. A new TCP flow is made only if canCreate. A hairpinned packet,
// from an inside host, is not filtered: filtering keeps out the outside's
// unsolicited packets, and inside hosts reach each other's mappings as
// they would reach any remote's.
func (n *NAT) inbound(p Proto, k hash4.Tuple, canCreate, hairpin bool) (*flow, Drop) {
	ps := &n.proto[p]
	ext, remote := k.Local, k.Remote
	if ps.extm == nil {
		return nil, n.noFlow(ext)
	}
	m, ok := ps.extm.Lookup(soloKey(ext))
	if !ok || m.state.Load() != stateLive {
		return nil, n.noFlow(ext)
	}
	switch {
	case hairpin:
	case ps.b.Filtering == AddressAndPortDependent:
		return nil, DropFiltered
	case ps.b.Filtering == AddressDependent:
		if !n.permitted(ps, m, remote.Addr()) {
			return nil, DropFiltered
		}
	}
	if !canCreate {
		return nil, DropTCPState
	}
	inside := m.key.Local
	return n.newFlow(ps, p, inside, remote, m)
}

// noFlow is the reason an inbound packet to ext found nothing.
func (n *NAT) noFlow(ext netip.AddrPort) Drop {
	if !n.isExternal(ext.Addr()) {
		return DropNotOurs
	}
	return DropNoFlow
}

// newFlow makes the flow from inside to remote, of mapping via if it is
// made by an inbound packet (nil otherwise), and returns it live; or the
// flow another goroutine made meanwhile. Its caller's lookup has just
// missed: it looks again only when a key turns out taken.
func (n *NAT) newFlow(ps *protoState, p Proto, inside, remote netip.AddrPort, via *mapping) (*flow, Drop) {
	for range maxRetries {
		f, why, retry := n.tryNewFlow(ps, p, inside, remote, via)
		if !retry {
			return f, why
		}
		k := hash4.Tuple{Local: inside, Remote: remote}
		for range maxRetries {
			if f := ps.lookupOut(&k); f != nil {
				return f, DropNone
			}
			if !ps.held(&k) {
				break // none, or deleted meanwhile: make it
			}
			runtime.Gosched() // being made or deleted: a few stores away
		}
	}
	return nil, DropBusy // counted by the caller, as every refusal
}

// tryNewFlow makes one attempt at newFlow's flow. retry says that another
// goroutine won a race for one of its keys.
func (n *NAT) tryNewFlow(ps *protoState, p Proto, inside, remote netip.AddrPort, via *mapping) (f *flow, why Drop, retry bool) {
	var mkey hash4.Tuple
	if via == nil && ps.maps != nil {
		mkey = mapKeyOf(ps, inside, remote)
		ps.maps.Prefetch(mkey)
	}
	h, why := n.hosts.acquire(inside.Addr())
	if why != DropNone {
		return nil, why, false
	}
	if why := n.reserveFlow(); why != DropNone {
		n.hosts.release(h)
		return nil, why, false
	}
	undo := func() {
		n.flows.Add(-1)
		n.hosts.release(h)
	}
	now := n.now()
	if ps.b.Mapping == AddressAndPortDependent {
		f = newFlowOf(p, inside, remote, h, now)
		if why := n.connectFlow(ps, f, h); why != DropNone {
			undo()
			return nil, why, false
		}
		f.out = epOf(f.ext)
		if why, retry := n.insertFlow(ps, f); why != DropNone {
			undo()
			return nil, why, retry
		}
		n.start(ps, f)
		return f, DropNone, false
	}
	m := via
	if m != nil {
		if !m.tryRef() {
			undo()
			return nil, DropNoFlow, false // the mapping ended meanwhile
		}
	} else {
		var made bool
		if m, made, why = n.mapping(ps, p, mkey, remote, h, now); why != DropNone {
			undo()
			return nil, why, false
		}
		if made {
			// The mapping and its first flow go live together: the flow
			// first, so that a live mapping's first flow is live or
			// ended, never still being made (see below).
			n.start(ps, &m.first)
			n.goLive(m)
			return &m.first, DropNone, false
		}
	}
	if g := m.flowTo(remote); g != nil {
		// Made by another goroutine since the caller's lookup.
		n.unref(ps, m)
		undo()
		return g, DropNone, false
	}
	f = newFlowOf(p, inside, remote, h, now)
	if via != nil {
		f.flags.Store(flagInbound)
	}
	f.m, f.ext = m, m.ext
	f.out = epOf(f.ext)
	if why, retry := n.placeLater(ps, f); why != DropNone {
		n.unref(ps, m)
		undo()
		return nil, why, retry
	}
	n.start(ps, f)
	return f, DropNone, false
}

// placeLater makes f, pending, a flow of its mapping after the first: a
// sib of the first if one is free and the mapping's flows are keyless,
// else by its keys (insertFlow). retry says that another goroutine is
// making or deleting the flow of f's 5-tuple. Under the mapping's fmu:
// a maker checks the sibs and the keys and places f in one go.
func (n *NAT) placeLater(ps *protoState, f *flow) (why Drop, retry bool) {
	m := f.m
	m.fmu.Lock()
	defer m.fmu.Unlock()
	free := -1
	if ps.keyless() {
		if m.first.goesTo(f.remote) {
			return DropBusy, true
		}
		for i := range m.first.sibs {
			switch g := m.first.sibs[i].Load(); {
			case g == nil || g.state.Load() == stateDead:
				if free < 0 {
					free = i
				}
			case g.remote == f.remote:
				return DropBusy, true // pending or live
			}
		}
	}
	if free >= 0 {
		// others == 0: no keyed flow has keys (flow.others).
		if m.first.others.Load() > 0 {
			if _, ok := ps.fwd.Lookup(f.insideKey()); ok {
				return DropBusy, true // a keyed flow's, not yet deleted
			}
		}
		f.flags.Or(flagSib)
		m.first.sibPrints[free].Store(printOf(f.remote))
		m.first.sibs[free].Store(f) // after its print (sibTo)
		return DropNone, false
	}
	m.first.others.Add(1) // before the keys (flow.others)
	if why, retry := n.insertFlow(ps, f); why != DropNone {
		m.first.others.Add(-1)
		return why, retry
	}
	return DropNone, false
}

// newFlowOf returns a flow, pending, from inside to remote, of host h, its
// clock at now.
func newFlowOf(p Proto, inside, remote netip.AddrPort, h *host, now int64) *flow {
	f := &flow{}
	f.init(p, inside, remote, h, now)
	return f
}

// init sets up f, pending, from inside to remote, of host h, its clock at
// now.
func (f *flow) init(p Proto, inside, remote netip.AddrPort, h *host, now int64) {
	f.p, f.remote, f.h = p, remote, h
	f.in = epOf(inside)
	f.rport = remote.Port()
	f.last.Store(now)
	if p == TCP {
		f.tcp = &tcpTrack{}
	}
}

// insertFlow inserts f's keys: its external one, unless connectFlow has,
// then its inside one. retry says that a key was taken.
func (n *NAT) insertFlow(ps *protoState, f *flow) (why Drop, retry bool) {
	if f.m != nil {
		if err := ps.rev.Insert(f.extKey(), f); err != nil {
			return DropBusy, errors.Is(err, hash4.ErrExists)
		}
	}
	// N.B. Insert, not LookupOrInsert: the caller's lookup has just
	// missed, and a key taken since is rare (newFlow looks it up).
	if err := ps.fwd.Insert(f.insideKey(), f); err != nil {
		ps.rev.CompareAndDelete(f.extKey(), f)
		return DropBusy, errors.Is(err, hash4.ErrExists)
	}
	return DropNone, false
}

// start makes f, its keys or its mapping's inserted, live: its permit,
// its place in the unassured list and in the timing wheel.
func (n *NAT) start(ps *protoState, f *flow) {
	if ps.perm != nil {
		n.permit(ps, f, 1)
	}
	n.unassuredPush(f)
	f.state.Store(stateLive)
	n.schedule(f)
	n.ctr.flowsCreated.Add(1)
}

// connectFlow gives f, a flow of address-and-port-dependent mapping, its
// external endpoint and inserts it, pending, into ps.rev, as Linux's
// connect() picks a source port: the 4-tuple (external endpoint, remote)
// unique, the port free for other remotes.
func (n *NAT) connectFlow(ps *protoState, f *flow, h *host) Drop {
	var opts []hash4.ConnectOption
	if h.block >= 0 {
		opts = append(opts, hash4.WithConnectRange(hash4.PortRange{Low: h.lo, High: h.hi}))
	}
	lo, hi := n.cfg.Ports.Low, n.cfg.Ports.High
	if h.block >= 0 {
		lo, hi = h.lo, h.hi
	}
	why := DropNoPort
	inside := f.inside()
	n.eachAddr(inside.Addr(), h, func(ext netip.Addr) bool {
		if port := inside.Port(); n.cfg.PortPreservation && port >= lo && port <= hi && !ps.alloc.Reserved(port) {
			f.ext = netip.AddrPortFrom(ext, port)
			if ps.rev.Insert(f.extKey(), f) == nil {
				why = DropNone
				return false
			}
		}
		if n.cfg.ParityPreservation {
			// Ports of the inside port's parity from a random start, each
			// a 4-tuple tried as Connect would (Connect's own order would
			// offer a whole parity first); then any port.
			size := int(hi-lo) + 1
			start := int(randUint32() % uint32(size))
			for i := 0; i < min(size, 2*parityTries); i++ {
				p := lo + uint16((start+i)%size)
				if p&1 != inside.Port()&1 || ps.alloc.Reserved(p) {
					continue
				}
				f.ext = netip.AddrPortFrom(ext, p)
				if ps.rev.Insert(f.extKey(), f) == nil {
					why = DropNone
					return false
				}
			}
		}
		tup, err := ps.rev.Connect(ps.alloc, ext, f.remote, f, opts...)
		if err == nil {
			f.ext = tup.Local
			why = DropNone
			return false
		}
		return errors.Is(err, hash4.ErrNoPorts)
	})
	return why
}

// eachAddr calls try with the external addresses a host of inside address
// a may use, in order, until try returns false: its block's address, or
// under paired pooling the one its address hashes to, or under arbitrary
// pooling each address from that one on.
func (n *NAT) eachAddr(a netip.Addr, h *host, try func(netip.Addr) bool) {
	if h.block >= 0 {
		try(h.addr)
		return
	}
	pool := n.pool[family(a)]
	b := a.As16()
	i := int(maphash.Bytes(n.seed, b[:]) % uint64(len(pool)))
	if n.cfg.Pooling == Paired {
		try(pool[i])
		return
	}
	for j := range pool {
		if !try(pool[(i+j)%len(pool)]) {
			return
		}
	}
}

// mapping returns, referenced, the mapping of key (mapKeyOf: an inside
// endpoint toward remote, endpoint-independent: any remote;
// address-dependent: remote's address), live; or, made = true
// (endpoint-independent), a new one, pending, whose first flow, pending,
// goes to remote (host h, its clock at now), its keys inserted: the caller
// makes both live.
func (n *NAT) mapping(ps *protoState, p Proto, key hash4.Tuple, remote netip.AddrPort, h *host, now int64) (m *mapping, made bool, why Drop) {
	inside := key.Local
	for range maxRetries {
		if m, ok := ps.maps.Lookup(key); ok {
			if m.state.Load() == stateLive && m.tryRef() {
				return m, false, DropNone
			}
			runtime.Gosched() // being made or deleted
			continue
		}
		m := &mapping{key: key, p: p, h: h}
		m.refs.Store(1)
		if m.ext, why = n.holdPort(ps, inside, h); why != DropNone {
			return nil, false, why
		}
		if hookHeld != nil {
			hookHeld(m)
		}
		ps.extm.Prefetch(soloKey(m.ext))
		if ps.keyless() {
			f := &m.first
			f.init(p, inside, remote, h, now)
			f.m, f.ext, f.out = m, m.ext, epOf(m.ext)
		}
		if err := ps.maps.Insert(key, m); err != nil { // as the lookup above missed
			n.releasePort(ps, m.ext)
			if !errors.Is(err, hash4.ErrExists) {
				return nil, false, DropBusy
			}
			runtime.Gosched()
			continue
		}
		// No other mapping's key holds m's port: unref deletes the key
		// before it lets the port go.
		if err := ps.extm.Insert(soloKey(m.ext), m); err != nil {
			ps.maps.CompareAndDelete(key, m)
			n.releasePort(ps, m.ext)
			return nil, false, DropBusy
		}
		if !ps.keyless() {
			// Its flows, this one first, are made with keys.
			n.goLive(m)
			return m, false, DropNone
		}
		return m, true, DropNone
	}
	return nil, false, DropBusy
}

// goLive makes m, made and its keys inserted, live, and counts it. N.B. a
// CompareAndSwap: early drop may have ended its first flow, and with it
// the mapping, since the flow went live.
func (n *NAT) goLive(m *mapping) {
	m.state.CompareAndSwap(statePending, stateLive)
	n.mappings.Add(1)
	n.ctr.mappingsCreated.Add(1)
}

// soloKey is the key of the mapping named by endpoint e alone: e and the
// sentinel. extm's keys are such, and so are maps' under
// endpoint-independent mapping.
func soloKey(e netip.AddrPort) hash4.Tuple {
	return hash4.Tuple{Local: e, Remote: sentinel(e.Addr())}
}

// releasePort lets ext's port go (holdPort).
func (n *NAT) releasePort(ps *protoState, ext netip.AddrPort) {
	n.portsOf(ps, ext.Addr()).release(ext.Port())
}

// hookHeld, nil but in tests, is called when a new mapping holds its
// port, before its keys are inserted.
var hookHeld func(m *mapping)

// mapKeyOf returns the key in ps.maps of the mapping of inside toward
// remote: remote's address (address-dependent mapping) or the sentinel
// (endpoint-independent) in place of remote.
func mapKeyOf(ps *protoState, inside, remote netip.AddrPort) hash4.Tuple {
	if ps.b.Mapping == AddressDependent {
		return hash4.Tuple{Local: inside, Remote: netip.AddrPortFrom(remote.Addr(), 1)}
	}
	return soloKey(inside)
}

// holdPort returns an external endpoint for a new mapping of the inside
// endpoint inside, its port the mapping's alone (ps.ports) until it lets
// it go: the inside port if port preservation asks for it and it is free,
// else a free port of the inside port's parity if parity preservation
// asks for it (among 2*parityTries ports), else any free port, each tried
// from a random start.
func (n *NAT) holdPort(ps *protoState, inside netip.AddrPort, h *host) (ext netip.AddrPort, why Drop) {
	lo, hi := n.cfg.Ports.Low, n.cfg.Ports.High
	if h.block >= 0 {
		lo, hi = h.lo, h.hi
	}
	why = DropNoPort
	n.eachAddr(inside.Addr(), h, func(a netip.Addr) bool {
		ports := n.portsOf(ps, a)
		port := inside.Port()
		if n.cfg.PortPreservation && port >= lo && port <= hi && !ps.alloc.Reserved(port) && ports.take(port) {
			ext, why = netip.AddrPortFrom(a, port), DropNone
			return false
		}
		if n.cfg.ParityPreservation {
			if p, ok := ports.takeAny(lo, hi, randUint32(), int(port&1), 2*parityTries, ps.alloc); ok {
				ext, why = netip.AddrPortFrom(a, p), DropNone
				return false
			}
		}
		if p, ok := ports.takeAny(lo, hi, randUint32(), anyParity, math.MaxUint32, ps.alloc); ok {
			ext, why = netip.AddrPortFrom(a, p), DropNone
			return false
		}
		return true // this address is full: the next, if any
	})
	return ext, why
}

// tryRef takes a reference to m unless its last flow has gone.
func (m *mapping) tryRef() bool {
	for {
		r := m.refs.Load()
		if r <= 0 {
			return false
		}
		if m.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// unref drops a reference to m; the last deletes it.
func (n *NAT) unref(ps *protoState, m *mapping) {
	if m.refs.Add(-1) != 0 {
		return
	}
	m.state.Store(stateDead)
	ps.maps.CompareAndDelete(m.key, m)
	ps.extm.CompareAndDelete(soloKey(m.ext), m)
	n.releasePort(ps, m.ext) // after its key (mapping)
	n.mappings.Add(-1)
}

// permit adds d (1 or -1) to the count of f's mapping's flows to f's
// remote address: in the mapping's near permits if the address is there or
// one is free, else in the permit table.
func (n *NAT) permit(ps *protoState, f *flow, d int) {
	m, a := f.m, f.remote.Addr().As16()
	m.pmu.Lock()
	defer m.pmu.Unlock()
	free := -1
	for i := range m.near {
		switch p := &m.near[i]; {
		case p.n > 0 && p.a == a:
			p.n += int32(d)
			return
		case p.n == 0 && free < 0:
			free = i
		}
	}
	if d > 0 && free >= 0 {
		m.near[free] = nearPermit{a: a, n: int32(d)}
		return
	}
	key := hash4.Tuple{Local: m.ext, Remote: netip.AddrPortFrom(f.remote.Addr(), 1)}
	ps.perm.Compute(key, func(old *permit, loaded bool) (*permit, hash4.ComputeOp) {
		if !loaded {
			if d < 0 {
				return nil, hash4.CancelOp
			}
			m.spill++
			return &permit{n: d}, hash4.UpdateOp
		}
		old.n += d
		if old.n <= 0 {
			m.spill--
			return nil, hash4.DeleteOp
		}
		return old, hash4.UpdateOp
	})
}

// permitted reports whether mapping m has a flow to remote address a:
// whether address-dependent filtering lets a in.
func (n *NAT) permitted(ps *protoState, m *mapping, a netip.Addr) bool {
	a16 := a.As16()
	m.pmu.Lock()
	defer m.pmu.Unlock()
	for _, p := range m.near {
		if p.n > 0 && p.a == a16 {
			return true
		}
	}
	if m.spill == 0 {
		return false
	}
	_, ok := ps.perm.Lookup(hash4.Tuple{Local: m.ext, Remote: netip.AddrPortFrom(a, 1)})
	return ok
}

// reserveFlow counts a new flow against MaxFlows, evicting the oldest
// unassured flow if the NAT is full (conntrack's early_drop).
func (n *NAT) reserveFlow() Drop {
	if n.flows.Add(1) <= int64(n.cfg.MaxFlows) {
		return DropNone
	}
	for range 4 {
		if n.earlyDrop() {
			return DropNone
		}
		if n.flows.Load() <= int64(n.cfg.MaxFlows) {
			return DropNone // another flow ended meanwhile
		}
	}
	n.flows.Add(-1)
	return DropTableFull
}

// earlyDropScan is how many of the oldest unassured flows early drop looks
// at to choose one.
const earlyDropScan = 8

// earlyDrop deletes an unassured flow; false if there is none. Of the
// oldest few it takes the one whose inside host has the most flows: under
// a flood from one host, the flood's flows go, and another host's new
// flow, unassured until it is answered, survives its handshake even when
// it is the oldest. (conntrack's early_drop looks at the new flow's hash
// neighbours instead, which a flood fills alike.)
func (n *NAT) earlyDrop() bool {
	u := &n.unassured
	u.mu.Lock()
	// Of the live flows: one still being made is listed before it is
	// live, and deleteFlow would refuse it, leaving it live but off the
	// list, out of early drop's reach for good.
	var f *flow
	for c, i := u.head, 0; c != nil && i < earlyDropScan; c, i = c.down, i+1 {
		if c.state.Load() == stateLive && (f == nil || c.h.n.Load() > f.h.n.Load()) {
			f = c
		}
	}
	if f != nil {
		n.unlinkLocked(f)
	}
	u.mu.Unlock()
	if f == nil {
		return false
	}
	return n.deleteFlow(f, ExpiredEarlyDrop)
}

// unassuredPush appends f to the unassured list.
func (n *NAT) unassuredPush(f *flow) {
	u := &n.unassured
	u.mu.Lock()
	f.flags.Or(flagListed)
	f.up, f.down = u.tail, nil
	if u.tail != nil {
		u.tail.down = f
	} else {
		u.head = f
	}
	u.tail = f
	u.mu.Unlock()
}

// unlinkLocked removes f from the unassured list; n.unassured.mu is held.
func (n *NAT) unlinkLocked(f *flow) {
	if f.flags.Load()&flagListed == 0 {
		return
	}
	f.flags.And(^flagListed)
	u := &n.unassured
	if f.up != nil {
		f.up.down = f.down
	} else {
		u.head = f.down
	}
	if f.down != nil {
		f.down.up = f.up
	} else {
		u.tail = f.up
	}
	f.up, f.down = nil, nil
}

// unlist removes f from the unassured list if it is there.
func (n *NAT) unlist(f *flow) {
	if f.flags.Load()&flagListed == 0 {
		return
	}
	n.unassured.mu.Lock()
	n.unlinkLocked(f)
	n.unassured.mu.Unlock()
}

// assure marks f assured: it leaves the unassured list, out of early drop's
// reach.
func (n *NAT) assure(f *flow) {
	if f.flags.Load()&flagAssured != 0 {
		return
	}
	f.flags.Or(flagAssured)
	n.unlist(f)
}

// deleteFlow ends f for reason and reports whether this call did: both of
// its keys go, then its mapping's reference, its host's count and its
// place in the count of flows.
func (n *NAT) deleteFlow(f *flow, reason Expiry) bool {
	if !f.state.CompareAndSwap(stateLive, stateDead) {
		return false
	}
	ps := &n.proto[f.p]
	switch {
	case f.m != nil && f == &f.m.first: // no keys of its own
	case f.flags.Load()&flagSib != 0: // nor a sib
		for i := range f.m.first.sibs {
			f.m.first.sibs[i].CompareAndSwap(f, nil)
		}
	default:
		ps.fwd.CompareAndDelete(f.insideKey(), f)
		ps.rev.CompareAndDelete(f.extKey(), f) // frees an address-and-port-dependent flow's port
		if f.m != nil {
			f.m.first.others.Add(-1) // after the keys (flow.others)
		}
	}
	if ps.perm != nil {
		n.permit(ps, f, -1)
	}
	if f.m != nil {
		n.unref(ps, f.m)
	}
	n.hosts.release(f.h)
	n.unlist(f)
	f.t.mu.Lock()
	n.wheel.unfile(f)
	f.t.mu.Unlock()
	n.flows.Add(-1)
	n.ctr.expired[reason].Add(1)
	return true
}

// timeout returns f's idle timeout in its present state.
func (n *NAT) timeout(f *flow) time.Duration {
	return n.cfg.Timeouts.timeout(f.p, f.tcp.stateNow(), f.flags.Load()&flagReplied != 0)
}

// MapOutbound returns the external endpoint of a packet of protocol p from
// the inside endpoint src to the remote endpoint dst, making its flow (and
// mapping) if there is none, as Outbound does for a packet, without TCP
// state (a TCP flow made here is assured once answered, as UDP is). It is
// for a NAT that sees endpoints rather than packets, such as one on
// sockets. For ICMP the ports are echo identifiers, dst's ignored. On
// failure it returns the reason, also counted in Metrics.
func (n *NAT) MapOutbound(p Proto, src, dst netip.AddrPort) (netip.AddrPort, Drop) {
	if why := checkTuple(p, src, dst); why != DropNone {
		n.ctr.drops[why].Add(1)
		return netip.AddrPort{}, why
	}
	src, dst = norm(src), norm(dst)
	if p == ICMP {
		dst = netip.AddrPortFrom(dst.Addr(), icmpRemotePort)
	}
	k := hash4.Tuple{Local: src, Remote: dst}
	f := n.proto[p].lookupOut(&k)
	if f == nil {
		var why Drop
		if f, why = n.outbound(p, k, true); why != DropNone {
			n.ctr.drops[why].Add(1)
			return netip.AddrPort{}, why
		}
	}
	f.touch(n.now())
	if f.flags.Load()&flagInbound != 0 {
		n.replied(f)
	}
	return f.out.addrPort(), DropNone
}

// MapInbound returns the inside endpoint a packet of protocol p from the
// remote endpoint src to the external endpoint dst goes to, as Inbound does
// for a packet: its flow's, or, where the filtering allows, that of the
// mapping of dst, with a new flow. On failure it returns the reason (no
// flow, filtered, ...), also counted in Metrics.
func (n *NAT) MapInbound(p Proto, src, dst netip.AddrPort) (netip.AddrPort, Drop) {
	if why := checkTuple(p, dst, src); why != DropNone {
		n.ctr.drops[why].Add(1)
		return netip.AddrPort{}, why
	}
	src, dst = norm(src), norm(dst)
	if p == ICMP {
		src = netip.AddrPortFrom(src.Addr(), icmpRemotePort)
	}
	k := hash4.Tuple{Local: dst, Remote: src}
	f := n.proto[p].lookupIn(&k)
	if f == nil {
		var why Drop
		if f, why = n.inbound(p, k, true, false); why != DropNone {
			n.ctr.drops[why].Add(1)
			return netip.AddrPort{}, why
		}
	}
	f.touch(n.now())
	if f.flags.Load()&flagInbound == 0 {
		n.replied(f)
	}
	return f.in.addrPort(), DropNone
}

// replied marks f as answered: UDP and ICMP flows are then assured, and
// UDP flows take the longer timeout.
func (n *NAT) replied(f *flow) {
	if f.flags.Load()&flagReplied != 0 {
		return
	}
	f.flags.Or(flagReplied)
	if f.p != TCP || !f.tcp.tracked() {
		n.assure(f)
	}
}

// norm drops zones and unmaps IPv4-mapped addresses.
func norm(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap().WithZone(""), a.Port())
}

// checkTuple returns DropMalformed for endpoints no flow can have: local,
// the inside or external endpoint, and remote, whose port is 0 for ICMP
// (an echo's remote has no identifier).
func checkTuple(p Proto, local, remote netip.AddrPort) Drop {
	x, y := local.Addr().Unmap(), remote.Addr().Unmap()
	if p >= numProtos || !x.IsValid() || !y.IsValid() || x.Is4() != y.Is4() || x.IsUnspecified() || y.IsUnspecified() ||
		local.Port() == 0 || (p != ICMP && remote.Port() == 0) {
		return DropMalformed
	}
	return DropNone
}

// Len returns the number of flows and of mappings (endpoint-independent and
// address-dependent; an address-and-port-dependent flow is its own mapping
// and counts as a flow only).
func (n *NAT) Len() (flows, mappings int) {
	return int(n.flows.Load()), int(n.mappings.Load())
}

// atomicState is a tcpState read without a lock.
type atomicState struct{ v atomic.Uint32 }

func (s *atomicState) load() tcpState   { return tcpState(s.v.Load()) }
func (s *atomicState) store(v tcpState) { s.v.Store(uint32(v)) }
