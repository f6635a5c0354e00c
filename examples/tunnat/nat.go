package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/hash4/hash4"
)

// This file holds the NAT itself, apart from any device: the flow tables,
// the translation of one packet each way, TCP state, expiry and counters.
// The devices (tun_linux.go) feed it packets.

// timeouts are the idle timeouts of flows, by protocol and TCP state, as
// conntrack's nf_conntrack_*_timeout sysctls.
type timeouts struct {
	udp, icmp time.Duration
	// TCP: handshake not answered yet; established; one side has sent a
	// FIN; both have; a RST was seen.
	tcpSyn, tcpEstablished, tcpFin, tcpTimeWait, tcpClose time.Duration
}

// natConfig is what a NAT needs.
type natConfig struct {
	external4, external6 netip.Addr // the NAT's external addresses; an invalid one turns its family off
	ports                hash4.PortRange
	maxFlows             int
	timeouts             timeouts
}

// TCP state bits of a flow, set by the packets seen; the state is their
// union, so both directions update it with one atomic OR.
const (
	tcpSynAckIn = 1 << iota // the server answered the SYN: established
	tcpFinOut
	tcpFinIn
	tcpRstSeen
)

// flow is the state of one translated flow, the value of the outside table.
// Its inside tuple is set before the flow is inserted and never changes, so
// the inbound path and the reaper read it without a lock. Its external port
// is not in it: the outside table's key holds it.
type flow struct {
	proto  uint8
	inside hash4.Tuple   // client address:port -> server address:port
	last   atomic.Int64  // unix nanoseconds of the last packet either way
	tcp    atomic.Uint32 // TCP state bits
	// dead is set by the reaper before it removes the flow, so that the
	// outbound path, which may still find the flow's mapping in the inside
	// table, starts a new flow instead of refreshing a dying one.
	dead atomic.Bool
}

// mapping is the value of the inside table: the flow and its outside tuple.
// It is complete before it is inserted, so that a reader never sees a
// mapping without its tuple: Connect inserts the flow into the outside table
// and only then returns the tuple it chose, so the tuple cannot be written
// into a value that Connect has already published.
type mapping struct {
	f       *flow
	outside hash4.Tuple // external address:port -> server address:port
}

// tables holds the two tables of one protocol.
type tables struct {
	in  *hash4.Table[mapping] // inside tuple -> mapping
	out *hash4.Table[flow]    // outside tuple -> flow
}

// nat translates packets between the inside (clients) and the outside
// (servers). outbound and inbound may run concurrently, each from one
// goroutine; the reaper from a third.
type nat struct {
	cfg   natConfig
	alloc *hash4.PortAllocator
	// t is indexed by protoIndex: TCP, UDP, ICMP echo (both families in
	// each: a tuple's family is part of its key).
	t [3]tables

	nflows atomic.Int64
	st     counters
}

// counters are the NAT's statistics, updated atomically.
type counters struct {
	flowsCreated, flowsExpired atomic.Int64
	pktsOut, pktsIn            atomic.Int64 // forwarded
	bytesOut, bytesIn          atomic.Int64
	drops                      [numDropReasons]atomic.Int64
}

// stats is a snapshot of the counters.
type stats struct {
	FlowsCreated, FlowsExpired, FlowsActive int64
	PktsOut, PktsIn, BytesOut, BytesIn      int64
	Drops                                   [numDropReasons]int64
}

// dropped returns the total of the drops.
func (s stats) dropped() int64 {
	var n int64
	for _, d := range s.Drops {
		n += d
	}
	return n
}

// String gives the counters on one line, drops by reason (those that are
// not 0).
func (s stats) String() string {
	line := fmt.Sprintf("flows created %d, expired %d, active %d; packets out %d (%d bytes), in %d (%d bytes); dropped %d",
		s.FlowsCreated, s.FlowsExpired, s.FlowsActive, s.PktsOut, s.BytesOut, s.PktsIn, s.BytesIn, s.dropped())
	sep := " ("
	for r, d := range s.Drops {
		if d != 0 {
			line += fmt.Sprintf("%s%s %d", sep, dropReason(r), d)
			sep = ", "
		}
	}
	if sep == ", " {
		line += ")"
	}
	return line
}

// newNAT returns a NAT for cfg.
func newNAT(cfg natConfig) (*nat, error) {
	if !cfg.external4.IsValid() && !cfg.external6.IsValid() {
		return nil, errors.New("no external address")
	}
	if cfg.external4.IsValid() && !cfg.external4.Is4() || cfg.external6.IsValid() && (!cfg.external6.Is6() || cfg.external6.Is4In6()) {
		return nil, fmt.Errorf("external addresses %v, %v: want one IPv4 and one IPv6 address", cfg.external4, cfg.external6)
	}
	if cfg.maxFlows < 1 {
		return nil, fmt.Errorf("max flows %d: must be at least 1", cfg.maxFlows)
	}
	alloc, err := hash4.NewPortAllocator(hash4.WithPortRange(cfg.ports))
	if err != nil {
		return nil, err
	}
	n := &nat{cfg: cfg, alloc: alloc}
	capacity := min(cfg.maxFlows, 1<<16)
	for i := range n.t {
		n.t[i] = tables{
			in:  hash4.New[mapping](hash4.WithCapacity(capacity)),
			out: hash4.New[flow](hash4.WithCapacity(capacity)),
		}
	}
	return n, nil
}

// protoIndex returns the index of p's tables.
func protoIndex(proto uint8) int {
	switch proto {
	case protoTCP:
		return 0
	case protoUDP:
		return 1
	}
	return 2
}

// external returns the external address of the packet's family.
func (n *nat) external(p *packet) netip.Addr {
	if p.v6 {
		return n.cfg.external6
	}
	return n.cfg.external4
}

// keyPorts returns the ports of a packet's tuples: for an echo the
// identifier stands for the port of the client (or of the NAT), and
// icmpKeyPort for the server's.
func keyPorts(p *packet, outbound bool) (local, remote uint16) {
	switch {
	case p.isEcho():
		return p.sport, icmpKeyPort
	case outbound:
		return p.sport, p.dport
	}
	return p.dport, p.sport
}

// outbound translates b, a packet from a client, in place. It returns the
// packet to forward to the outside (b cut to the IP length) or, with b
// unchanged or nil, why it dropped it; the drop is counted.
func (n *nat) outbound(b []byte, now int64) ([]byte, dropReason) {
	p, why := parse(b)
	if why == dropNone {
		why = n.translateOut(b, &p, now)
	}
	if why != dropNone {
		n.st.drops[why].Add(1)
		return nil, why
	}
	n.st.pktsOut.Add(1)
	n.st.bytesOut.Add(int64(p.length))
	return b[:p.length], dropNone
}

func (n *nat) translateOut(b []byte, p *packet, now int64) dropReason {
	ext := n.external(p)
	if !ext.IsValid() {
		return dropUnsupported
	}
	if p.isEcho() && p.icmpType != icmpEchoRequest && p.icmpType != icmpv6EchoRequest {
		return dropUnsupported
	}
	if ttlExpired(b, p) {
		return dropTTL // before a flow is made for it
	}
	t := &n.t[protoIndex(p.proto)]
	lp, rp := keyPorts(p, true)
	key := hash4.Tuple{Local: netip.AddrPortFrom(p.src, lp), Remote: netip.AddrPortFrom(p.dst, rp)}
	m, ok := t.in.Lookup(key)
	if !ok || m.f.dead.Load() {
		if p.proto == protoTCP && p.flags&(tcpSYN|tcpACK|tcpRST) != tcpSYN {
			// Only a SYN opens a TCP flow: a stray segment (of a flow
			// that expired, say) must not take a port.
			return dropNoFlow
		}
		var why dropReason
		if m, why = n.newFlow(t, key, m, p.proto, ext, now); why != dropNone {
			return why
		}
	}
	f := m.f
	f.last.Store(now)
	if p.proto == protoTCP {
		var bits uint32
		if p.flags&tcpFIN != 0 {
			bits |= tcpFinOut
		}
		if p.flags&tcpRST != 0 {
			bits |= tcpRstSeen
		}
		if bits != 0 {
			f.tcp.Or(bits)
		}
	}
	to := m.outside.Local
	return rewrite(b, p, false, to)
}

// newFlow makes the flow of key, whose mapping in the inside table is old
// (a dead flow's) or nil: Connect picks the external port and inserts the
// flow into the outside table, then the mapping, complete, goes into the
// inside table. Between the two, an inbound packet to the new port finds the
// flow and is translated, and the reaper sees a flow just touched.
func (n *nat) newFlow(t *tables, key hash4.Tuple, old *mapping, proto uint8, ext netip.Addr, now int64) (*mapping, dropReason) {
	if n.nflows.Add(1) > int64(n.cfg.maxFlows) {
		n.nflows.Add(-1)
		return nil, dropFlowLimit
	}
	f := &flow{proto: proto, inside: key}
	f.last.Store(now)
	out, err := t.out.Connect(n.alloc, ext, key.Remote, f)
	if err != nil {
		n.nflows.Add(-1)
		if errors.Is(err, hash4.ErrNoPorts) {
			return nil, dropNoPort
		}
		return nil, dropUnsupported
	}
	m := &mapping{f: f, outside: out}
	// The outbound path is one goroutine, so nobody else inserts key; the
	// reaper may delete old meanwhile, hence the Insert after a failed swap.
	if old == nil || !t.in.CompareAndSwap(key, old, m) {
		if err := t.in.Insert(key, m); err != nil {
			t.out.CompareAndDelete(out, f)
			n.nflows.Add(-1)
			return nil, dropUnsupported
		}
	}
	n.st.flowsCreated.Add(1)
	return m, dropNone
}

// inbound translates b, a packet from a server, in place, as outbound does
// the other way.
func (n *nat) inbound(b []byte, now int64) ([]byte, dropReason) {
	p, why := parse(b)
	if why == dropNone {
		why = n.translateIn(b, &p, now)
	}
	if why != dropNone {
		n.st.drops[why].Add(1)
		return nil, why
	}
	n.st.pktsIn.Add(1)
	n.st.bytesIn.Add(int64(p.length))
	return b[:p.length], dropNone
}

func (n *nat) translateIn(b []byte, p *packet, now int64) dropReason {
	ext := n.external(p)
	if !ext.IsValid() {
		return dropUnsupported
	}
	if p.dst != ext {
		return dropNotOurs
	}
	if p.isEcho() && p.icmpType != icmpEchoReply && p.icmpType != icmpv6EchoReply {
		return dropUnsupported
	}
	t := &n.t[protoIndex(p.proto)]
	lp, rp := keyPorts(p, false)
	f, ok := t.out.Lookup(hash4.Tuple{Local: netip.AddrPortFrom(p.dst, lp), Remote: netip.AddrPortFrom(p.src, rp)})
	if !ok || f.dead.Load() {
		return dropNoFlow
	}
	f.last.Store(now)
	if p.proto == protoTCP {
		var bits uint32
		if p.flags&(tcpSYN|tcpACK) == tcpSYN|tcpACK {
			bits |= tcpSynAckIn
		}
		if p.flags&tcpFIN != 0 {
			bits |= tcpFinIn
		}
		if p.flags&tcpRST != 0 {
			bits |= tcpRstSeen
		}
		if bits != 0 && f.tcp.Load()&bits != bits {
			f.tcp.Or(bits)
		}
	}
	return rewrite(b, p, true, f.inside.Local)
}

// timeout returns how long f may stay idle in its present state.
func (n *nat) timeout(f *flow) time.Duration {
	to := &n.cfg.timeouts
	switch f.proto {
	case protoUDP:
		return to.udp
	case protoTCP:
		s := f.tcp.Load()
		switch {
		case s&tcpRstSeen != 0:
			return to.tcpClose
		case s&(tcpFinOut|tcpFinIn) == tcpFinOut|tcpFinIn:
			return to.tcpTimeWait
		case s&(tcpFinOut|tcpFinIn) != 0:
			return to.tcpFin
		case s&tcpSynAckIn != 0:
			return to.tcpEstablished
		}
		return to.tcpSyn
	}
	return to.icmp
}

// reap expires the flows idle for longer than their timeout at now, and
// returns how many. It walks the outside tables with All and removes each
// expired flow with CompareAndDelete, the inside mapping first: from then
// on a client's packet starts a new flow; then the outside entry, which
// frees the external port for Connect.
func (n *nat) reap(now int64) int {
	expired := 0
	for i := range n.t {
		t := &n.t[i]
		for tup, f := range t.out.All() {
			if now-f.last.Load() <= int64(n.timeout(f)) {
				continue
			}
			f.dead.Store(true)
			if m, ok := t.in.Lookup(f.inside); ok && m.f == f {
				t.in.CompareAndDelete(f.inside, m)
			}
			if t.out.CompareAndDelete(tup, f) {
				n.nflows.Add(-1)
				n.st.flowsExpired.Add(1)
				expired++
			}
		}
	}
	return expired
}

// reapEvery returns the reaper's period: a quarter of the shortest
// timeout, between 10ms and 1s.
func (n *nat) reapEvery() time.Duration {
	to := n.cfg.timeouts
	d := min(to.udp, to.icmp, to.tcpSyn, to.tcpEstablished, to.tcpFin, to.tcpTimeWait, to.tcpClose) / 4
	return min(max(d, 10*time.Millisecond), time.Second)
}

// runReaper reaps until ctx is done.
func (n *nat) runReaper(ctx context.Context) {
	tick := time.NewTicker(n.reapEvery())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			n.reap(now.UnixNano())
		}
	}
}

// stats returns a snapshot of the counters.
func (n *nat) stats() stats {
	s := stats{
		FlowsCreated: n.st.flowsCreated.Load(),
		FlowsExpired: n.st.flowsExpired.Load(),
		FlowsActive:  n.nflows.Load(),
		PktsOut:      n.st.pktsOut.Load(),
		PktsIn:       n.st.pktsIn.Load(),
		BytesOut:     n.st.bytesOut.Load(),
		BytesIn:      n.st.bytesIn.Load(),
	}
	for i := range s.Drops {
		s.Drops[i] = n.st.drops[i].Load()
	}
	return s
}

// countDrop counts a drop outside the translation, such as a failed write.
func (n *nat) countDrop(why dropReason) { n.st.drops[why].Add(1) }
