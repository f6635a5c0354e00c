package nat

import (
	"encoding/binary"
	"net/netip"

	"github.com/hash4/hash4"
)

// ICMP errors (RFC 5508, and RFC 5382 and 4787 for what they say of
// them): an error about a packet of a flow is translated with the packet it
// carries, the embedded headers put back into the form the other side
// knows, so that Path MTU discovery, traceroute and port-unreachable
// answers cross the NAT. An error never refreshes nor ends its flow
// (REQ-6), and one of no flow is dropped (REQ-4).

// icmpError translates the ICMP error b, parsed as p, from side from. An
// inside host's error about a packet hairpinned to it goes back in to the
// packet's sender: translated as it leaves, then again as if it came in
// (hairpin set: one hop, one TTL).
func (n *NAT) icmpError(b []byte, p *packet, from Side, emit Emit, hairpin bool) Drop {
	l4 := b[p.l4:p.length]
	var initial uint32
	if p.v6 {
		initial = pseudoSum(p.src, p.dst, ipICMPv6, len(l4))
	}
	if checksum(l4, initial) != 0 {
		return DropChecksum // RFC 5508 REQ-3
	}
	if !hairpin && ttl(b, p) <= 1 {
		return DropTTL // no error about an error
	}
	in := l4[8:]
	var q packet
	if why := parseEmbedded(in, p.v6, &q); why != DropNone {
		return why
	}
	pr := protoOf(q.proto)
	ps := &n.proto[pr]
	// The embedded packet went the other way: from the side the error
	// goes to. Its remote endpoint is its destination if it went out.
	var f *flow
	if from == Outside {
		remote := netip.AddrPortFrom(q.dst, q.dport)
		if q.echo() {
			remote = netip.AddrPortFrom(q.dst, icmpRemotePort)
		}
		f = ps.lookupIn(&hash4.Tuple{Local: netip.AddrPortFrom(q.src, q.sport), Remote: remote})
	} else {
		remote := netip.AddrPortFrom(q.src, q.sport)
		if q.echo() {
			remote = netip.AddrPortFrom(q.src, icmpRemotePort)
		}
		f = ps.lookupOut(&hash4.Tuple{Local: netip.AddrPortFrom(q.dst, q.dport), Remote: remote})
	}
	if f == nil {
		return DropICMPError
	}
	if !hairpin {
		decTTL(b, p)
	}
	// The embedded packet: its source (inbound error) or destination
	// (outbound) becomes the flow's inside or external endpoint.
	if from == Outside {
		a := f.inside()
		rewriteEmbedded(in, &q, false, a)
		setIPAddr(b, p, true, a.Addr())
	} else {
		rewriteEmbedded(in, &q, true, f.ext)
		setIPAddr(b, p, false, f.ext.Addr())
	}
	// The outer ICMP checksum covers the embedded packet (and, for ICMPv6,
	// the new addresses): computed again in full, as it was checked in
	// full above.
	l4[2], l4[3] = 0, 0
	initial = 0
	if p.v6 {
		initial = pseudoSum(p.src, p.dst, ipICMPv6, len(l4))
	}
	binary.BigEndian.PutUint16(l4[2:], checksum(l4, initial))
	to := Inside
	if from == Inside {
		if n.isExternal(p.dst) {
			return n.icmpError(b, p, Outside, emit, true)
		}
		to = Outside
	}
	return n.send(b, p, to, emit)
}

// parseEmbedded reads the packet an ICMP error carries: an IP header of
// the error's family and the first 8 bytes of its transport header (ports,
// or an echo's identifier), as RFC 5508 REQ-3 asks, IPv4 options skipped.
func parseEmbedded(b []byte, v6 bool, q *packet) Drop {
	*q = packet{v6: v6}
	if !v6 {
		if len(b) < 20 || b[0]>>4 != 4 {
			return DropICMPError
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl+8 {
			return DropICMPError
		}
		if binary.BigEndian.Uint16(b[6:8])&0x1fff != 0 {
			return DropICMPError // not the first fragment: no ports
		}
		q.proto, q.l4 = b[9], ihl
		q.src = netip.AddrFrom4([4]byte(b[12:16]))
		q.dst = netip.AddrFrom4([4]byte(b[16:20]))
	} else {
		if len(b) < 40 || b[0]>>4 != 6 {
			return DropICMPError
		}
		q.src = netip.AddrFrom16([16]byte(b[8:24]))
		q.dst = netip.AddrFrom16([16]byte(b[24:40]))
		next, off := b[6], 40
		for next == ip6Hop || next == ip6Dest || next == ip6Route || next == ip6Frag {
			if off+8 > len(b) {
				return DropICMPError
			}
			if next == ip6Frag {
				if binary.BigEndian.Uint16(b[off+2:])&0xfff8 != 0 {
					return DropICMPError
				}
				next, off = b[off], off+8
				continue
			}
			next, off = b[off], off+(int(b[off+1])+1)*8
		}
		if off+8 > len(b) {
			return DropICMPError
		}
		q.proto, q.l4 = next, off
	}
	l4 := b[q.l4:]
	switch q.proto {
	case ipTCP, ipUDP:
		q.sport = binary.BigEndian.Uint16(l4[0:2])
		q.dport = binary.BigEndian.Uint16(l4[2:4])
	case ipICMP, ipICMPv6:
		if (q.proto == ipICMPv6) != v6 {
			return DropICMPError
		}
		q.icmpType = l4[0]
		switch q.icmpType {
		case icmpEcho, icmpEchoReply, icmp6Echo, icmp6EchoReply:
		default:
			return DropICMPError // an error about an error, or another type
		}
		q.sport = binary.BigEndian.Uint16(l4[4:6])
		q.dport = q.sport
	default:
		return DropICMPError
	}
	q.length = len(b)
	if q.sport == 0 || q.dport == 0 {
		return DropICMPError
	}
	return DropNone
}

// rewriteEmbedded sets the source (dst false) or destination address and
// port of the embedded packet b, parsed as q, to a: its IPv4 header
// checksum, and its transport checksum where the error carries it (it may
// be cut short: RFC 5508 asks for 8 bytes only).
func rewriteEmbedded(b []byte, q *packet, dst bool, a netip.AddrPort) {
	addrOff, alen := 12, 4
	if q.v6 {
		addrOff, alen = 8, 16
	}
	if dst {
		addrOff += alen
	}
	delta := setAddr(b[addrOff:addrOff+alen], a.Addr())
	if !q.v6 {
		binary.BigEndian.PutUint16(b[10:12], csumAdd(binary.BigEndian.Uint16(b[10:12]), delta))
	}
	l4 := b[q.l4:]
	portOff := 0
	switch {
	case q.echo():
		portOff = 4
	case dst:
		portOff = 2
	}
	old := binary.BigEndian.Uint16(l4[portOff:])
	binary.BigEndian.PutUint16(l4[portOff:], a.Port())
	portDelta := uint32(^old) + uint32(a.Port())
	off, d := -1, delta+portDelta
	switch q.proto {
	case ipTCP:
		off = 16
	case ipUDP:
		if off = 6; !q.v6 && binary.BigEndian.Uint16(l4[6:]) == 0 {
			off = -1 // no checksum
		}
	case ipICMP:
		off, d = 2, portDelta
	case ipICMPv6:
		off = 2
	}
	if off >= 0 && off+2 <= len(l4) {
		sum := csumAdd(binary.BigEndian.Uint16(l4[off:]), d)
		if q.proto == ipUDP && sum == 0 {
			sum = 0xffff
		}
		binary.BigEndian.PutUint16(l4[off:], sum)
	}
}

// errorsPerSecond bounds the ICMP errors the NAT sends of its own.
const errorsPerSecond = 1000

// The errors the NAT sends of its own.
type errKind uint8

const (
	errTimeExceeded errKind = iota // TTL or hop limit exhausted
	errProhibited                  // no mapping could be made (RFC 5508 REQ-8)
	errTooBig                      // larger than the MTU (RFC 4787 REQ-13)
)

// sendError sends the sender of b, parsed as p and come from side from, an
// ICMP error of kind k, from Config.Router (to an inside host) or from the
// external address b was sent to (to an outside one), with as much of b
// as fits in 576 bytes (IPv4) or 1280 (IPv6). It sends none about an ICMP
// error or a fragment other than the first, as RFC 1812 and 4443 say.
func (n *NAT) sendError(b []byte, p *packet, from Side, k errKind, emit Emit) {
	if p.icmpErr || p.frag && !p.first || p.src.IsMulticast() || p.dst.IsMulticast() {
		return
	}
	var src netip.Addr
	if from == Outside {
		src = p.dst
	} else {
		for _, r := range n.cfg.Router {
			if r.Is4() == p.src.Is4() {
				src = r
			}
		}
	}
	if !src.IsValid() || !n.isExternal(src) && from == Outside {
		return
	}
	// At most errorsPerSecond each way, as Linux limits its own
	// (icmp_ratelimit): a flood of refused packets must not become a
	// flood of errors, nor one side's flood silence the other's.
	if n.errBudget[from].Add(-1) < 0 {
		return
	}
	mtu := uint32(n.cfg.MTU)
	var out []byte
	if !p.v6 {
		typ, code := uint8(icmpTimeExceeded), uint8(0)
		switch k {
		case errProhibited:
			typ, code = icmpUnreach, 13
		case errTooBig:
			typ, code = icmpUnreach, 4
		}
		quote := b[:min(p.length, 576-28)]
		out = make([]byte, 28+len(quote))
		out[0] = 0x45
		binary.BigEndian.PutUint16(out[2:], uint16(len(out)))
		out[8], out[9] = 64, ipICMP
		s4, d4 := src.As4(), p.src.As4()
		copy(out[12:], s4[:])
		copy(out[16:], d4[:])
		binary.BigEndian.PutUint16(out[10:], checksum(out[:20], 0))
		out[20], out[21] = typ, code
		if k == errTooBig {
			binary.BigEndian.PutUint16(out[26:], uint16(mtu))
		}
		copy(out[28:], quote)
		binary.BigEndian.PutUint16(out[22:], checksum(out[20:], 0))
	} else {
		typ, code := uint8(icmp6TimeExceeded), uint8(0)
		switch k {
		case errProhibited:
			typ, code = icmp6Unreach, 1
		case errTooBig:
			typ = icmp6TooBig
		}
		quote := b[:min(p.length, 1280-48)]
		out = make([]byte, 48+len(quote))
		out[0] = 0x60
		binary.BigEndian.PutUint16(out[4:], uint16(len(out)-40))
		out[6], out[7] = ipICMPv6, 64
		s16, d16 := src.As16(), p.src.As16()
		copy(out[8:], s16[:])
		copy(out[24:], d16[:])
		out[40], out[41] = typ, code
		if k == errTooBig {
			binary.BigEndian.PutUint32(out[44:], mtu)
		}
		copy(out[48:], quote)
		binary.BigEndian.PutUint16(out[42:], checksum(out[40:], pseudoSum(src, p.src, ipICMPv6, len(out)-40)))
	}
	emit(from, out)
}
