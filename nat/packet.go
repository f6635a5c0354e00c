package nat

import (
	"encoding/binary"
	"net/netip"

	"github.com/hash4/hash4"
)

// The packet layer: parse an IPv4 or IPv6 packet, find or make its flow,
// rewrite it in place with incremental checksum updates (RFC 1624). No
// offset is read before it is checked against the packet's length, and
// nothing on the path of a translated packet allocates.

// IP protocol numbers.
const (
	ipICMP   = 1
	ipTCP    = 6
	ipUDP    = 17
	ipICMPv6 = 58
	ip6Hop   = 0
	ip6Route = 43
	ip6Frag  = 44
	ip6Dest  = 60
)

// ICMP types the NAT knows.
const (
	icmpEchoReply     = 0
	icmpUnreach       = 3
	icmpEcho          = 8
	icmpTimeExceeded  = 11
	icmpParamProblem  = 12
	icmp6Unreach      = 1
	icmp6TooBig       = 2
	icmp6TimeExceeded = 3
	icmp6ParamProblem = 4
	icmp6Echo         = 128
	icmp6EchoReply    = 129
)

// Side is where a packet goes: to the inside hosts or to the outside.
type Side uint8

const (
	Inside  Side = iota // toward the inside hosts
	Outside             // toward the outside
)

// String returns "inside" or "outside".
func (s Side) String() string {
	if s == Inside {
		return "inside"
	}
	return "outside"
}

// Emit receives each packet the NAT sends: translated, hairpinned,
// reassembled from held fragments, or an ICMP error of its own. pkt is
// valid only during the call.
type Emit func(to Side, pkt []byte)

// packet is what the parser reads from one IP packet.
type packet struct {
	v6       bool
	proto    uint8 // ipTCP, ipUDP, ipICMP, ipICMPv6
	l4       int   // offset of the transport header
	length   int   // the IP length (≤ len of the buffer)
	src, dst netip.Addr
	// sport and dport are the ports; for an echo, both the identifier.
	sport, dport uint16
	icmpType     uint8
	icmpErr      bool // an ICMP error, with an embedded packet
	tcp          tcpSeg
	// Fragments: frag is set for any fragment, first for the one at offset
	// 0; fragID is the datagram's identification, fragNext the protocol
	// field every fragment carries (IPv4's; IPv6's Fragment header's next
	// header, which may be an extension header of the first fragment's).
	frag, first bool
	df          bool
	fragID      uint32
	fragNext    uint8
	// Offload metadata, from a batch's Offload: the transport checksum
	// holds the pseudo-header's sum only; the packet is a GSO
	// super-packet of segments of segSize payload bytes.
	partial bool
	segSize int
}

// echo reports whether p is an echo request or reply.
func (p *packet) echo() bool { return (p.proto == ipICMP || p.proto == ipICMPv6) && !p.icmpErr }

// protoOf returns the NAT protocol of an IP protocol number.
func protoOf(ip uint8) Proto {
	switch ip {
	case ipTCP:
		return TCP
	case ipUDP:
		return UDP
	}
	return ICMP
}

// parse reads the headers of b. A fragment other than the first has no
// transport header: only its IP fields are read.
func parse(b []byte, p *packet) Drop {
	*p = packet{}
	if len(b) < 1 {
		return DropMalformed
	}
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return DropMalformed
		}
		ihl := int(b[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(b[2:4]))
		if ihl < 20 || total < ihl || total > len(b) {
			return DropMalformed
		}
		if checksum(b[:ihl], 0) != 0 {
			return DropChecksum
		}
		if why := ipv4Options(b[20:ihl]); why != DropNone {
			return why
		}
		p.proto, p.l4, p.length = b[9], ihl, total
		p.src = netip.AddrFrom4([4]byte(b[12:16]))
		p.dst = netip.AddrFrom4([4]byte(b[16:20]))
		ff := binary.BigEndian.Uint16(b[6:8])
		p.df = ff&0x4000 != 0
		if ff&0x3fff != 0 {
			p.frag, p.first = true, ff&0x1fff == 0
			p.fragID, p.fragNext = uint32(binary.BigEndian.Uint16(b[4:6])), b[9]
		}
	case 6:
		if len(b) < 40 {
			return DropMalformed
		}
		total := 40 + int(binary.BigEndian.Uint16(b[4:6]))
		if total > len(b) {
			return DropMalformed
		}
		p.v6, p.length = true, total
		p.src = netip.AddrFrom16([16]byte(b[8:24]))
		p.dst = netip.AddrFrom16([16]byte(b[24:40]))
		next, off := b[6], 40
	ext:
		for {
			switch next {
			case ip6Hop, ip6Dest, ip6Route:
				if off+8 > total {
					return DropMalformed
				}
				if next == ip6Route && b[off+3] != 0 {
					return DropOptions // segments left: a source route
				}
				next, off = b[off], off+(int(b[off+1])+1)*8
			case ip6Frag:
				if off+8 > total {
					return DropMalformed
				}
				fo := binary.BigEndian.Uint16(b[off+2:])
				p.frag, p.first = true, fo&0xfff8 == 0
				if fo&1 == 0 && p.first {
					p.frag = false // an atomic fragment: a whole datagram
				}
				p.fragID, p.fragNext = binary.BigEndian.Uint32(b[off+4:]), b[off]
				next, off = b[off], off+8
				if p.frag && !p.first {
					break ext // the rest is the datagram's, past its headers
				}
			default:
				break ext
			}
		}
		if off > total {
			return DropMalformed
		}
		p.proto, p.l4 = next, off
	default:
		return DropMalformed
	}
	if p.frag && !p.first && p.v6 {
		return DropNone // its protocol is its first fragment's to check
	}
	switch p.proto {
	case ipTCP, ipUDP:
	case ipICMP:
		if p.v6 {
			return DropUnsupported
		}
	case ipICMPv6:
		if !p.v6 {
			return DropUnsupported
		}
	default:
		return DropUnsupported
	}
	if p.frag && !p.first {
		return DropNone
	}
	return parseL4(b[p.l4:p.length], p)
}

// ipv4Options refuses source routes and malformed options.
func ipv4Options(o []byte) Drop {
	for len(o) > 0 {
		switch o[0] {
		case 0: // end of options
			return DropNone
		case 1: // no-op
			o = o[1:]
			continue
		case 0x83, 0x89: // loose and strict source and record route
			return DropOptions
		}
		if len(o) < 2 || o[1] < 2 || int(o[1]) > len(o) {
			return DropMalformed
		}
		o = o[o[1]:]
	}
	return DropNone
}

// parseL4 reads the transport header l4 of p.
func parseL4(l4 []byte, p *packet) Drop {
	switch p.proto {
	case ipTCP:
		if len(l4) < 20 {
			return DropMalformed
		}
		off := int(l4[12]>>4) * 4
		if off < 20 || off > len(l4) {
			return DropBadTCP
		}
		p.sport = binary.BigEndian.Uint16(l4[0:2])
		p.dport = binary.BigEndian.Uint16(l4[2:4])
		s := &p.tcp
		s.seq = binary.BigEndian.Uint32(l4[4:8])
		s.ack = binary.BigEndian.Uint32(l4[8:12])
		s.flags = l4[13]
		s.win = binary.BigEndian.Uint16(l4[14:16])
		s.wscale = -1
		if s.flags&tcpSYN != 0 {
			s.wscale = windowScale(l4[20:off])
		}
		if !p.frag {
			s.len = uint32(len(l4) - off)
		}
	case ipUDP:
		if len(l4) < 8 {
			return DropMalformed
		}
		p.sport = binary.BigEndian.Uint16(l4[0:2])
		p.dport = binary.BigEndian.Uint16(l4[2:4])
		if p.v6 && binary.BigEndian.Uint16(l4[6:8]) == 0 {
			return DropMalformed // RFC 8200 8.1: a zero checksum is invalid
		}
	default:
		if len(l4) < 8 {
			return DropMalformed
		}
		p.icmpType = l4[0]
		t := p.icmpType
		switch {
		case !p.v6 && (t == icmpEcho || t == icmpEchoReply), p.v6 && (t == icmp6Echo || t == icmp6EchoReply):
		case !p.v6 && (t == icmpUnreach || t == icmpTimeExceeded || t == icmpParamProblem),
			p.v6 && (t == icmp6Unreach || t == icmp6TooBig || t == icmp6TimeExceeded || t == icmp6ParamProblem):
			p.icmpErr = true
			return DropNone
		default:
			return DropUnsupported
		}
		p.sport = binary.BigEndian.Uint16(l4[4:6])
		p.dport = p.sport
	}
	if p.sport == 0 || p.dport == 0 {
		return DropMalformed
	}
	return DropNone
}

// windowScale returns the window scale option among TCP options o, or -1.
func windowScale(o []byte) int8 {
	for len(o) > 0 {
		switch o[0] {
		case 0:
			return -1
		case 1:
			o = o[1:]
			continue
		}
		if len(o) < 2 || o[1] < 2 || int(o[1]) > len(o) {
			return -1
		}
		if o[0] == 3 && o[1] == 3 {
			return int8(min(o[2], 14))
		}
		o = o[o[1]:]
	}
	return -1
}

// Outbound translates pkt, a packet from the inside, in place, and passes
// what it sends to emit: the packet to the outside; or, if it is for one
// of the NAT's external endpoints, back to the inside with the sender's
// external endpoint as its source (hairpinning); or an ICMP error back to
// the sender (time exceeded, fragmentation needed, administratively
// prohibited, from Config.Router). It returns why it dropped pkt, or
// DropNone (also for a fragment held until its datagram's first arrives).
// Drops are counted in Metrics.
func (n *NAT) Outbound(pkt []byte, emit Emit) Drop {
	var p packet
	why := parse(pkt, &p)
	if why == DropNone {
		why = n.translate(pkt, &p, Inside, emit, nil)
	}
	if why != DropNone {
		n.ctr.drops[why].Add(1)
	}
	return why
}

// Inbound translates pkt, a packet from the outside, in place, as Outbound
// does the other way: to an inside host if its flow, or its mapping and the
// filtering, let it in.
func (n *NAT) Inbound(pkt []byte, emit Emit) Drop {
	var p packet
	why := parse(pkt, &p)
	if why == DropNone {
		why = n.translate(pkt, &p, Outside, emit, nil)
	}
	if why != DropNone {
		n.ctr.drops[why].Add(1)
	}
	return why
}

// translate translates the parsed packet b, which came from side from.
// known, if not nil, is what a batch's lookup found for b's flow.
func (n *NAT) translate(b []byte, p *packet, from Side, emit Emit, known *flow) Drop {
	if len(n.pool[family(p.src)]) == 0 {
		return DropUnsupported
	}
	if !forwardable(b, p.v6) || from == Outside && n.isExternal(p.src) {
		return DropAddress
	}
	if p.frag && !p.first {
		return n.fragment(b, p, from, emit)
	}
	if p.icmpErr {
		return n.icmpError(b, p, from, emit, false)
	}
	if ttl(b, p) <= 1 {
		n.sendError(b, p, from, errTimeExceeded, emit)
		return DropTTL
	}
	if mtu := n.cfg.MTU; mtu > 0 && p.length > mtu && (p.v6 || p.df || p.segSize > 0) {
		// A GSO super-packet is too big if its segments are: it is not
		// fragmented, as the kernel would not fragment its segments.
		if p.segSize == 0 || segmentLen(b, p) > mtu {
			n.sendError(b, p, from, errTooBig, emit)
			return DropTooBig
		}
	}
	to := Outside
	if from == Outside {
		to = Inside
	}
	f, why := n.flowOf(p, from, false, known)
	if why != DropNone {
		if from == Inside && (why == DropNoPort || why == DropNoBlock || why == DropTableFull || why == DropHostLimit) {
			n.sendError(b, p, from, errProhibited, emit)
		}
		return why
	}
	if p.proto == ipTCP {
		seg := p.tcp
		seg.dir = int(from)
		if why := n.trackTCP(f, &seg); why != DropNone {
			return why
		}
	}
	n.refresh(f, from)
	// The flow's other end: where the packet's address and port go.
	var a netip.AddrPort
	if from == Inside {
		a = f.out.addrPort()
	} else {
		a = f.in.addrPort()
	}
	var fk fragKey
	if p.frag {
		fk = fragKeyOf(p, from)
	}
	decTTL(b, p)
	rewrite(b, p, from == Outside, a)
	if from == Inside && n.isExternal(p.dst) {
		// Hairpinning (RFC 4787 REQ-9): the packet, now from the
		// sender's external endpoint, goes in as if it came from outside.
		q := *p
		q.src, q.sport = f.ext.Addr(), f.ext.Port()
		g, why := n.flowOf(&q, Outside, true, nil)
		if why != DropNone {
			return why
		}
		if q.proto == ipTCP {
			seg := q.tcp
			seg.dir = int(Outside)
			if why := n.trackTCP(g, &seg); why != DropNone {
				return why
			}
		}
		n.refresh(g, Outside)
		ia := g.inside()
		rewrite(b, &q, true, ia)
		why = n.send(b, &q, Inside, emit)
		if q.frag {
			n.fragFirst(fk, q.src, q.dst, Inside, emit)
		}
		return why
	}
	why = n.send(b, p, to, emit)
	if p.frag {
		// After the first, which gives the others their addresses. N.B.
		// not deferred: a defer in this function, with its many
		// returns, costs every packet the runtime's defer records.
		n.fragFirst(fk, p.src, p.dst, to, emit)
	}
	return why
}

// forwardable reports whether a router forwards the parsed packet b, of
// IPv6 if v6 (RFC 1812 5.3.7, RFC 4291 2.5.6): neither address is
// unspecified, loopback, multicast, link-local, IPv4's limited broadcast
// or, in IPv6, IPv4-mapped. (A packet from the outside with one of the
// NAT's own addresses as its source is refused too, in translate:
// spoofed, it would reach an inside host as another inside host's
// hairpinned packet.) N.B. on the header's words: netip's predicates, a
// call each, cost a packet 10 ns.
func forwardable(b []byte, v6 bool) bool {
	if !v6 {
		return unicast4(binary.BigEndian.Uint32(b[12:])) && unicast4(binary.BigEndian.Uint32(b[16:]))
	}
	return unicast6(binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])) &&
		unicast6(binary.BigEndian.Uint64(b[24:]), binary.BigEndian.Uint64(b[32:]))
}

// unicast4 reports whether IPv4 address a is none of 0.0.0.0,
// 127.0.0.0/8, 224.0.0.0/4, 169.254.0.0/16 and 255.255.255.255.
func unicast4(a uint32) bool {
	return a != 0 && a>>24 != 127 && a>>28 != 0xe && a>>16 != 0xa9fe && a != 0xffffffff
}

// unicast6 reports whether the IPv6 address hi:lo is none of ::, ::1,
// ff00::/8, fe80::/10 and the IPv4-mapped ::ffff:0:0/96 (which RFC 4291
// 2.5.5.2 keeps off the wire).
func unicast6(hi, lo uint64) bool {
	return hi>>56 != 0xff && hi>>54 != 0xfe80>>6 && (hi != 0 || lo > 1 && lo>>32 != 0xffff)
}

// flowKey sets k to the key of the flow of the parsed packet p from side
// from (from inside: the inside endpoint and the remote; from outside: the
// external endpoint and the remote), and returns the protocol and whether
// the packet may make a flow.
func flowKey(p *packet, from Side, k *hash4.Tuple) (pr Proto, canCreate bool) {
	if from == Inside {
		k.Local, k.Remote = netip.AddrPortFrom(p.src, p.sport), netip.AddrPortFrom(p.dst, p.dport)
	} else {
		k.Local, k.Remote = netip.AddrPortFrom(p.dst, p.dport), netip.AddrPortFrom(p.src, p.sport)
	}
	// An echo's flow: requests go out, replies come in; the remote has no
	// identifier of its own.
	canCreate = true
	switch {
	case p.echo():
		k.Remote = netip.AddrPortFrom(k.Remote.Addr(), icmpRemotePort)
		req := p.icmpType == icmpEcho || p.icmpType == icmp6Echo
		canCreate = req == (from == Inside)
	case p.proto == ipTCP:
		canCreate = p.tcp.flags&(tcpSYN|tcpACK|tcpRST|tcpFIN) == tcpSYN
	}
	return protoOf(p.proto), canCreate
}

// flowOf returns the flow of the parsed packet p from side from, made if
// there is none and the packet may make one; the caller refreshes it.
// hairpin says that p, from Outside, is an inside host's packet to
// another's mapping. known, if not nil, is what a lookup of p's key found:
// it is used if still live.
func (n *NAT) flowOf(p *packet, from Side, hairpin bool, known *flow) (*flow, Drop) {
	var k hash4.Tuple
	pr, canCreate := flowKey(p, from, &k)
	ps := &n.proto[pr]
	f := known
	switch {
	case f == nil:
		f = ps.lookup(&k, from)
	case f.state.Load() != stateLive:
		f = nil
	}
	if f == nil {
		var why Drop
		if from == Inside {
			f, why = n.outbound(pr, k, canCreate)
		} else {
			f, why = n.inbound(pr, k, canCreate, hairpin)
		}
		if why != DropNone {
			return nil, why
		}
	}
	return f, DropNone
}

// refresh records a packet of f from side from that the NAT forwards: f's
// clock, and whether f has been answered. A segment the tracker refuses
// does neither, so that blind segments cannot keep a flow alive.
func (n *NAT) refresh(f *flow, from Side) {
	f.touch(n.now())
	if (from == Outside) != (f.flags.Load()&flagInbound != 0) {
		n.replied(f)
	}
}

// send passes p to emit, in fragments if it is larger than the MTU (translate
// refused those that may not be fragmented).
func (n *NAT) send(b []byte, p *packet, to Side, emit Emit) Drop {
	if mtu := n.cfg.MTU; mtu > 0 && p.length > mtu && p.segSize == 0 {
		if p.partial {
			// The fragments go without the packet's offload metadata:
			// its checksum is completed first.
			completeChecksum(b, p)
		}
		return fragmentOut(b[:p.length], p, mtu, to, emit)
	}
	emit(to, b[:p.length])
	return DropNone
}

// ttl returns the packet's TTL or hop limit.
func ttl(b []byte, p *packet) uint8 {
	if p.v6 {
		return b[7]
	}
	return b[8]
}

// decTTL decrements the TTL (hop limit), with the IPv4 header checksum.
func decTTL(b []byte, p *packet) {
	if p.v6 {
		b[7]--
		return
	}
	old := binary.BigEndian.Uint16(b[8:10])
	b[8]--
	binary.BigEndian.PutUint16(b[10:12], csumUpdate16(binary.BigEndian.Uint16(b[10:12]), old, binary.BigEndian.Uint16(b[8:10])))
}

// rewrite sets the source (dst false) or destination address and port of
// the parsed packet b to a, with its checksums. For an echo the port is the
// identifier; a fragment other than the first has only its address.
func rewrite(b []byte, p *packet, dst bool, a netip.AddrPort) {
	delta := setIPAddr(b, p, dst, a.Addr())
	if p.frag && !p.first {
		return
	}
	portOff := p.l4
	switch {
	case p.echo():
		portOff += 4
	case dst:
		portOff += 2
	}
	old := binary.BigEndian.Uint16(b[portOff:])
	binary.BigEndian.PutUint16(b[portOff:], a.Port())
	portDelta := uint32(^old) + uint32(a.Port())
	switch {
	case p.echo():
		p.sport, p.dport = a.Port(), a.Port()
	case dst:
		p.dport = a.Port()
	default:
		p.sport = a.Port()
	}
	switch p.proto {
	case ipTCP, ipUDP:
		if p.partial {
			// The field holds the pseudo-header's sum, not complemented:
			// only the address changes it; the port is in what the
			// receiver sums.
			off := p.l4 + csumField(p.proto)
			binary.BigEndian.PutUint16(b[off:], ^csumAdd(^binary.BigEndian.Uint16(b[off:]), delta))
			return
		}
	}
	switch p.proto {
	case ipTCP:
		off := p.l4 + 16
		binary.BigEndian.PutUint16(b[off:], csumAdd(binary.BigEndian.Uint16(b[off:]), delta+portDelta))
	case ipUDP:
		off := p.l4 + 6
		sum := binary.BigEndian.Uint16(b[off:])
		if sum == 0 && !p.v6 {
			return // no checksum
		}
		if sum = csumAdd(sum, delta+portDelta); sum == 0 {
			sum = 0xffff
		}
		binary.BigEndian.PutUint16(b[off:], sum)
	case ipICMP:
		off := p.l4 + 2 // no pseudo-header: the identifier only
		binary.BigEndian.PutUint16(b[off:], csumAdd(binary.BigEndian.Uint16(b[off:]), portDelta))
	case ipICMPv6:
		off := p.l4 + 2
		binary.BigEndian.PutUint16(b[off:], csumAdd(binary.BigEndian.Uint16(b[off:]), delta+portDelta))
	}
}

// setIPAddr sets the source (dst false) or destination address of the
// parsed packet b to a, with the IPv4 header checksum, and returns the sum
// of the change for the transport checksum.
func setIPAddr(b []byte, p *packet, dst bool, a netip.Addr) uint32 {
	addrOff, alen := 12, 4
	if p.v6 {
		addrOff, alen = 8, 16
	}
	if dst {
		addrOff += alen
	}
	delta := setAddr(b[addrOff:addrOff+alen], a)
	if !p.v6 {
		binary.BigEndian.PutUint16(b[10:12], csumAdd(binary.BigEndian.Uint16(b[10:12]), delta))
	}
	if dst {
		p.dst = a
	} else {
		p.src = a
	}
	return delta
}

// setAddr writes a (4 or 16 bytes, as len(dst)) into dst and returns the
// one's complement sum of the change, ~old + new over its words.
func setAddr(dst []byte, a netip.Addr) uint32 {
	var nw [16]byte
	if len(dst) == 4 {
		a4 := a.As4()
		copy(nw[:], a4[:])
	} else {
		nw = a.As16()
	}
	var delta uint32
	for i := 0; i < len(dst); i += 2 {
		delta += uint32(^binary.BigEndian.Uint16(dst[i:])) + uint32(binary.BigEndian.Uint16(nw[i:]))
	}
	copy(dst, nw[:len(dst)])
	return delta
}

// csumField returns the offset of the checksum in a TCP or UDP header.
func csumField(proto uint8) int {
	if proto == ipTCP {
		return 16
	}
	return 6
}

// segmentLen returns the length of the largest segment of the GSO
// super-packet b: its headers and segSize bytes of payload.
func segmentLen(b []byte, p *packet) int {
	h := p.l4 + 8
	if p.proto == ipTCP {
		h = p.l4 + int(b[p.l4+12]>>4)*4
	}
	return min(h+p.segSize, p.length)
}

// completeChecksum completes the partial transport checksum of the TCP or
// UDP packet b: what the receiver of its offload metadata would do.
func completeChecksum(b []byte, p *packet) {
	off := p.l4 + csumField(p.proto)
	initial := uint32(binary.BigEndian.Uint16(b[off:]))
	b[off], b[off+1] = 0, 0
	sum := checksum(b[p.l4:p.length], initial)
	if sum == 0 && p.proto == ipUDP {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(b[off:], sum)
	p.partial = false
}

// csumAdd applies delta, a sum of ~old + new over changed words, to the
// checksum sum: RFC 1624's HC' = ~(~HC + ~m + m').
func csumAdd(sum uint16, delta uint32) uint16 {
	acc := uint64(^sum) + uint64(delta)
	acc = (acc & 0xffff) + (acc >> 16)
	acc = (acc & 0xffff) + (acc >> 16)
	acc = (acc & 0xffff) + (acc >> 16)
	return ^uint16(acc)
}

// csumUpdate16 updates sum for one word changed from old to new.
func csumUpdate16(sum, old, new uint16) uint16 {
	return csumAdd(sum, uint32(^old)+uint32(new))
}

// checksum returns the Internet checksum (RFC 1071) of b, with initial one's
// complement sum initial.
func checksum(b []byte, initial uint32) uint16 {
	acc := uint64(initial)
	for len(b) >= 8 {
		acc += uint64(binary.BigEndian.Uint32(b)) + uint64(binary.BigEndian.Uint32(b[4:]))
		b = b[8:]
	}
	for len(b) >= 2 {
		acc += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	for acc>>16 != 0 {
		acc = (acc & 0xffff) + (acc >> 16)
	}
	return ^uint16(acc)
}

// pseudoSum returns the one's complement sum of the pseudo-header of a
// transport segment of length n and protocol proto between src and dst.
func pseudoSum(src, dst netip.Addr, proto uint8, n int) uint32 {
	var acc uint32
	for _, a := range [2]netip.Addr{src, dst} {
		if a.Is4() {
			b := a.As4()
			acc += uint32(binary.BigEndian.Uint16(b[0:])) + uint32(binary.BigEndian.Uint16(b[2:]))
			continue
		}
		b := a.As16()
		for i := 0; i < 16; i += 2 {
			acc += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	return acc + uint32(proto) + uint32(n&0xffff) + uint32(n>>16)
}
