package main

import (
	"encoding/binary"
	"net/netip"
)

// This file holds the packet parser and rewriter: what the NAT reads from an
// IPv4 or IPv6 header and the transport header behind it, and the in-place
// rewrite of one address and port with incremental checksum updates
// (RFC 1624). Nothing here allocates, and no input makes it panic: every
// offset is checked against the packet's length before it is read.

// IP protocol numbers the NAT knows.
const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
	protoFrag6  = 44 // IPv6 fragment header
)

// ICMP echo types.
const (
	icmpEchoReply     = 0
	icmpEchoRequest   = 8
	icmpv6EchoRequest = 128
	icmpv6EchoReply   = 129
)

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// icmpKeyPort stands for the remote port of an ICMP echo flow in the
// tables, whose tuples need a port on both sides: the echo identifier is
// the local one.
const icmpKeyPort = 1

// dropReason says why a packet was not forwarded; 0 is none.
type dropReason uint8

const (
	dropNone        dropReason = iota
	dropMalformed              // too short, bad version, bad header or total length
	dropTruncated              // transport header cut short
	dropFragment               // IPv4 fragment, IPv6 fragment header
	dropUnsupported            // another protocol, IPv6 extension header, ICMP other than echo, id 0
	dropNoFlow                 // inbound packet of no flow; outbound TCP other than SYN with no flow
	dropNotOurs                // inbound packet for another address than the external one
	dropNoPort                 // no free external port for a new flow
	dropFlowLimit              // -max-flows reached
	dropTTL                    // TTL or hop limit would reach 0
	dropWrite                  // the write to the other device failed
	numDropReasons
)

// dropNames names the drop reasons in the counters' output.
var dropNames = [numDropReasons]string{
	dropNone:        "none",
	dropMalformed:   "malformed",
	dropTruncated:   "truncated",
	dropFragment:    "fragment",
	dropUnsupported: "unsupported",
	dropNoFlow:      "no flow",
	dropNotOurs:     "not ours",
	dropNoPort:      "no port",
	dropFlowLimit:   "flow limit",
	dropTTL:         "ttl",
	dropWrite:       "write error",
}

func (r dropReason) String() string {
	if r < numDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// packet is what the parser reads from one IP packet: the fields the NAT
// keys and rewrites on, and where they are.
type packet struct {
	v6       bool
	proto    uint8 // protoTCP, protoUDP, protoICMP or protoICMPv6
	l4       int   // offset of the transport header
	length   int   // the packet's length as its IP header says (≤ len of the buffer)
	src, dst netip.Addr
	// sport and dport are the transport ports; for an ICMP echo both are
	// the echo identifier.
	sport, dport uint16
	flags        uint8 // TCP flags
	icmpType     uint8
}

// parse reads the IP and transport headers of b. It accepts unfragmented
// IPv4 (with options) and IPv6 without extension headers carrying TCP,
// UDP, or ICMP (ICMPv6) echo requests and replies, and returns the reason
// for anything else.
func parse(b []byte) (packet, dropReason) {
	var p packet
	if len(b) < 1 {
		return p, dropMalformed
	}
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return p, dropMalformed
		}
		ihl := int(b[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(b[2:4]))
		if ihl < 20 || total < ihl || total > len(b) {
			return p, dropMalformed
		}
		// MF set or a fragment offset: a fragment. (DF is 0x4000.)
		if binary.BigEndian.Uint16(b[6:8])&0x3fff != 0 {
			return p, dropFragment
		}
		p.proto, p.l4, p.length = b[9], ihl, total
		p.src = netip.AddrFrom4([4]byte(b[12:16]))
		p.dst = netip.AddrFrom4([4]byte(b[16:20]))
	case 6:
		if len(b) < 40 {
			return p, dropMalformed
		}
		total := 40 + int(binary.BigEndian.Uint16(b[4:6]))
		if total > len(b) {
			return p, dropMalformed
		}
		p.v6 = true
		p.proto, p.l4, p.length = b[6], 40, total
		p.src = netip.AddrFrom16([16]byte(b[8:24]))
		p.dst = netip.AddrFrom16([16]byte(b[24:40]))
		if p.proto == protoFrag6 {
			return p, dropFragment
		}
	default:
		return p, dropMalformed
	}
	l4 := b[p.l4:p.length]
	switch p.proto {
	case protoTCP:
		if len(l4) < 20 {
			return p, dropTruncated
		}
		p.sport = binary.BigEndian.Uint16(l4[0:2])
		p.dport = binary.BigEndian.Uint16(l4[2:4])
		p.flags = l4[13]
	case protoUDP:
		if len(l4) < 8 {
			return p, dropTruncated
		}
		p.sport = binary.BigEndian.Uint16(l4[0:2])
		p.dport = binary.BigEndian.Uint16(l4[2:4])
		// An IPv6 UDP checksum of 0 is invalid (RFC 8200, 8.1): it cannot
		// be updated, only recomputed, and the receiver drops it anyway.
		if p.v6 && binary.BigEndian.Uint16(l4[6:8]) == 0 {
			return p, dropMalformed
		}
	case protoICMP, protoICMPv6:
		if (p.proto == protoICMPv6) != p.v6 {
			return p, dropUnsupported
		}
		if len(l4) < 8 {
			return p, dropTruncated
		}
		p.icmpType = l4[0]
		switch p.icmpType {
		case icmpEchoRequest, icmpEchoReply, icmpv6EchoRequest, icmpv6EchoReply:
		default:
			return p, dropUnsupported
		}
		if (p.icmpType >= icmpv6EchoRequest) != p.v6 {
			return p, dropUnsupported
		}
		p.sport = binary.BigEndian.Uint16(l4[4:6])
		p.dport = p.sport
	default:
		return p, dropUnsupported
	}
	if p.sport == 0 || p.dport == 0 {
		// Port 0 (or echo id 0) cannot be a key.
		return p, dropUnsupported
	}
	return p, dropNone
}

// isEcho reports whether p is an ICMP or ICMPv6 echo request or reply.
func (p *packet) isEcho() bool { return p.proto == protoICMP || p.proto == protoICMPv6 }

// rewrite sets the source (dst false) or destination (dst true) address and
// port of the parsed packet b to to, decrements the TTL or hop limit, and
// updates the checksums incrementally. For an ICMP echo the port is the
// echo identifier. The address must be of the packet's family. It returns
// dropTTL, without changing b, if the TTL would reach 0.
func rewrite(b []byte, p *packet, dst bool, to netip.AddrPort) dropReason {
	var addrOff, portOff int
	if p.v6 {
		addrOff = 8
	} else {
		addrOff = 12
	}
	alen := 4
	if p.v6 {
		alen = 16
	}
	switch {
	case p.isEcho():
		portOff = p.l4 + 4 // the identifier
	case dst:
		portOff = p.l4 + 2
	default:
		portOff = p.l4
	}
	if dst {
		addrOff += alen
	}

	// The address must be of the packet's family: a caller's bug, not the
	// packet's, but no reason to panic.
	var newAddr [16]byte
	switch {
	case p.v6 && to.Addr().Is6():
		newAddr = to.Addr().As16()
	case !p.v6 && to.Addr().Is4():
		a4 := to.Addr().As4()
		copy(newAddr[:], a4[:])
	default:
		return dropUnsupported
	}

	// The TTL first: a packet that would die is left untouched.
	if p.v6 {
		if b[7] <= 1 {
			return dropTTL
		}
		b[7]--
	} else {
		if b[8] <= 1 {
			return dropTTL
		}
		// TTL is the high byte of the word at 8: the word drops by 0x100.
		b[8]--
		ipsum := binary.BigEndian.Uint16(b[10:12])
		binary.BigEndian.PutUint16(b[10:12], csumUpdate16(ipsum, uint16(b[8]+1)<<8|uint16(b[9]), uint16(b[8])<<8|uint16(b[9])))
	}

	// The sum of the changes, as RFC 1624's ~m + m' over every word.
	var addrDelta uint32
	for i := 0; i < alen; i += 2 {
		addrDelta += uint32(^binary.BigEndian.Uint16(b[addrOff+i:])) + uint32(binary.BigEndian.Uint16(newAddr[i:]))
	}
	copy(b[addrOff:addrOff+alen], newAddr[:alen])
	oldPort := binary.BigEndian.Uint16(b[portOff:])
	portDelta := uint32(^oldPort) + uint32(to.Port())
	binary.BigEndian.PutUint16(b[portOff:], to.Port())

	if !p.v6 {
		ipsum := binary.BigEndian.Uint16(b[10:12])
		binary.BigEndian.PutUint16(b[10:12], csumAdd(ipsum, addrDelta))
	}
	switch p.proto {
	case protoTCP:
		off := p.l4 + 16
		binary.BigEndian.PutUint16(b[off:], csumAdd(binary.BigEndian.Uint16(b[off:]), addrDelta+portDelta))
	case protoUDP:
		off := p.l4 + 6
		sum := binary.BigEndian.Uint16(b[off:])
		if sum == 0 && !p.v6 {
			break // no checksum (IPv4 only; parse refuses it on IPv6)
		}
		sum = csumAdd(sum, addrDelta+portDelta)
		if sum == 0 {
			sum = 0xffff // 0 means "no checksum": send its other form
		}
		binary.BigEndian.PutUint16(b[off:], sum)
	case protoICMP:
		// No pseudo-header in ICMPv4's checksum: only the identifier.
		off := p.l4 + 2
		binary.BigEndian.PutUint16(b[off:], csumAdd(binary.BigEndian.Uint16(b[off:]), portDelta))
	case protoICMPv6:
		off := p.l4 + 2
		binary.BigEndian.PutUint16(b[off:], csumAdd(binary.BigEndian.Uint16(b[off:]), addrDelta+portDelta))
	}
	if dst {
		p.dst, p.dport = to.Addr(), to.Port()
	} else {
		p.src, p.sport = to.Addr(), to.Port()
	}
	if p.isEcho() {
		p.sport, p.dport = to.Port(), to.Port()
	}
	return dropNone
}

// ttlExpired reports whether the TTL (hop limit) of the parsed packet b
// would reach 0 at this hop.
func ttlExpired(b []byte, p *packet) bool {
	if p.v6 {
		return b[7] <= 1
	}
	return b[8] <= 1
}

// csumAdd applies delta, a sum of ~old + new over the changed 16-bit words,
// to the checksum sum: RFC 1624's equation 3, HC' = ~(~HC + ~m + m').
// The one's complement sum is taken over 32 bits and folded, so delta may
// hold up to 2^16 words.
func csumAdd(sum uint16, delta uint32) uint16 {
	acc := uint64(^sum) + uint64(delta)
	acc = (acc & 0xffff) + (acc >> 16)
	acc = (acc & 0xffff) + (acc >> 16)
	acc = (acc & 0xffff) + (acc >> 16)
	return ^uint16(acc)
}

// csumUpdate16 updates sum for one 16-bit word changed from old to new.
func csumUpdate16(sum, old, new uint16) uint16 {
	return csumAdd(sum, uint32(^old)+uint32(new))
}

// checksum returns the Internet checksum (RFC 1071) of b, with initial
// one's complement sum initial; the full computation the tests and the
// packet builders use.
func checksum(b []byte, initial uint32) uint16 {
	acc := uint64(initial)
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
// transport segment of length n and protocol proto between src and dst
// (RFC 793 for IPv4, RFC 8200 8.1 for IPv6).
func pseudoSum(src, dst netip.Addr, proto uint8, n int) uint32 {
	var acc uint32
	for _, a := range [2]netip.Addr{src, dst} {
		s := a.AsSlice()
		for i := 0; i+1 < len(s); i += 2 {
			acc += uint32(binary.BigEndian.Uint16(s[i:]))
		}
	}
	return acc + uint32(proto) + uint32(n&0xffff) + uint32(n>>16)
}
