package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// This file builds packets for the tests, with checksums computed in full,
// and checks packets' checksums the same way.

// pktSpec describes a packet to build.
type pktSpec struct {
	proto    uint8
	src, dst netip.AddrPort // for an echo, the ports are the identifier
	flags    uint8          // TCP
	icmpType uint8          // echo request or reply
	payload  []byte
	ttl      uint8 // 64 if 0
	noUDPSum bool  // IPv4 UDP without a checksum
}

// build returns the packet s describes.
func build(s pktSpec) []byte {
	v6 := s.src.Addr().Is6()
	var l4 []byte
	switch s.proto {
	case protoTCP:
		l4 = make([]byte, 20+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.src.Port())
		binary.BigEndian.PutUint16(l4[2:], s.dst.Port())
		binary.BigEndian.PutUint32(l4[4:], 1000)
		l4[12] = 5 << 4
		l4[13] = s.flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
		copy(l4[20:], s.payload)
	case protoUDP:
		l4 = make([]byte, 8+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.src.Port())
		binary.BigEndian.PutUint16(l4[2:], s.dst.Port())
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		l4[7] = 1 // not 0, which parse refuses over IPv6; fixChecksums sets it
		copy(l4[8:], s.payload)
	case protoICMP, protoICMPv6:
		l4 = make([]byte, 8+len(s.payload))
		l4[0] = s.icmpType
		binary.BigEndian.PutUint16(l4[4:], s.src.Port())
		binary.BigEndian.PutUint16(l4[6:], 1)
		copy(l4[8:], s.payload)
	default:
		l4 = append([]byte(nil), s.payload...)
	}
	ttl := s.ttl
	if ttl == 0 {
		ttl = 64
	}
	var b []byte
	if v6 {
		b = make([]byte, 40+len(l4))
		b[0] = 6 << 4
		binary.BigEndian.PutUint16(b[4:], uint16(len(l4)))
		b[6] = s.proto
		b[7] = ttl
		a, d := s.src.Addr().As16(), s.dst.Addr().As16()
		copy(b[8:], a[:])
		copy(b[24:], d[:])
		copy(b[40:], l4)
	} else {
		b = make([]byte, 20+len(l4))
		b[0] = 0x45
		binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
		binary.BigEndian.PutUint16(b[6:], 0x4000) // DF
		b[8] = ttl
		b[9] = s.proto
		a, d := s.src.Addr().As4(), s.dst.Addr().As4()
		copy(b[12:], a[:])
		copy(b[16:], d[:])
		copy(b[20:], l4)
	}
	fixChecksums(b, s.noUDPSum)
	return b
}

// fixChecksums computes the checksums of a packet that parse accepts (or
// would, but for its checksums) in full. noUDPSum leaves an IPv4 UDP
// checksum at 0.
func fixChecksums(b []byte, noUDPSum bool) bool {
	p, why := parse(b)
	if why != dropNone {
		return false
	}
	if !p.v6 {
		b[10], b[11] = 0, 0
		binary.BigEndian.PutUint16(b[10:], checksum(b[:p.l4], 0))
	}
	l4 := b[p.l4:p.length]
	off := map[uint8]int{protoTCP: 16, protoUDP: 6, protoICMP: 2, protoICMPv6: 2}[p.proto]
	l4[off], l4[off+1] = 0, 0
	if p.proto == protoUDP && noUDPSum && !p.v6 {
		return true
	}
	var initial uint32
	if p.proto != protoICMP {
		initial = pseudoSum(p.src, p.dst, p.proto, len(l4))
	}
	sum := checksum(l4, initial)
	if sum == 0 && p.proto == protoUDP {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(l4[off:], sum)
	return true
}

// verifyChecksums recomputes the checksums of a parsed packet in full and
// returns an error if one is wrong.
func verifyChecksums(b []byte) error {
	p, why := parse(b)
	if why != dropNone {
		return fmt.Errorf("parse: %v", why)
	}
	if !p.v6 {
		if s := checksum(b[:p.l4], 0); s != 0 {
			return fmt.Errorf("IPv4 header checksum off by %#04x", s)
		}
	}
	l4 := b[p.l4:p.length]
	var initial uint32
	switch p.proto {
	case protoICMP:
	case protoUDP:
		if !p.v6 && binary.BigEndian.Uint16(l4[6:]) == 0 {
			return nil
		}
		initial = pseudoSum(p.src, p.dst, p.proto, len(l4))
	default:
		initial = pseudoSum(p.src, p.dst, p.proto, len(l4))
	}
	if s := checksum(l4, initial); s != 0 {
		return fmt.Errorf("%d checksum off by %#04x", p.proto, s)
	}
	return nil
}
