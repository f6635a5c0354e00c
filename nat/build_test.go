package nat

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Packets for the tests, built with checksums computed in full, and a
// check of a packet's checksums the same way: the reference the
// incremental updates are held to.

type spec struct {
	proto    uint8
	src, dst netip.AddrPort // an echo's identifier is src's port
	flags    uint8
	seq, ack uint32
	icmpType uint8
	payload  []byte
	ttl      uint8  // 64 if 0
	options  []byte // IPv4 options, a multiple of 4 bytes
	noUDPSum bool
	df       bool
}

func build(s spec) []byte {
	v6 := s.src.Addr().Is6()
	var l4 []byte
	switch s.proto {
	case ipTCP:
		l4 = make([]byte, 20+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.src.Port())
		binary.BigEndian.PutUint16(l4[2:], s.dst.Port())
		binary.BigEndian.PutUint32(l4[4:], s.seq)
		binary.BigEndian.PutUint32(l4[8:], s.ack)
		l4[12] = 5 << 4
		l4[13] = s.flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
		copy(l4[20:], s.payload)
	case ipUDP:
		l4 = make([]byte, 8+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.src.Port())
		binary.BigEndian.PutUint16(l4[2:], s.dst.Port())
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], s.payload)
	default:
		l4 = make([]byte, 8+len(s.payload))
		l4[0] = s.icmpType
		binary.BigEndian.PutUint16(l4[4:], s.src.Port())
		binary.BigEndian.PutUint16(l4[6:], 1)
		copy(l4[8:], s.payload)
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
		b[6], b[7] = s.proto, ttl
		a, d := s.src.Addr().As16(), s.dst.Addr().As16()
		copy(b[8:], a[:])
		copy(b[24:], d[:])
		copy(b[40:], l4)
	} else {
		ihl := 20 + len(s.options)
		b = make([]byte, ihl+len(l4))
		b[0] = 0x40 | byte(ihl/4)
		binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
		binary.BigEndian.PutUint16(b[4:], 0x1234)
		if s.df {
			binary.BigEndian.PutUint16(b[6:], 0x4000)
		}
		b[8], b[9] = ttl, s.proto
		a, d := s.src.Addr().As4(), s.dst.Addr().As4()
		copy(b[12:], a[:])
		copy(b[16:], d[:])
		copy(b[20:], s.options)
		copy(b[ihl:], l4)
	}
	fixChecksums(b, s.noUDPSum)
	return b
}

// l4Offset returns where b's transport header starts (no IPv6 extension
// headers in these tests).
func l4Offset(b []byte) int {
	if b[0]>>4 == 6 {
		return 40
	}
	return int(b[0]&0x0f) * 4
}

func addrs(b []byte) (src, dst netip.Addr, proto uint8) {
	if b[0]>>4 == 6 {
		return netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40])), b[6]
	}
	return netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20])), b[9]
}

// csumOff returns the offset of a transport protocol's checksum.
func csumOff(proto uint8) int {
	switch proto {
	case ipTCP:
		return 16
	case ipUDP:
		return 6
	}
	return 2
}

// fixChecksums computes the checksums of the whole packet b in full.
func fixChecksums(b []byte, noUDPSum bool) {
	v6 := b[0]>>4 == 6
	off := l4Offset(b)
	if !v6 {
		b[10], b[11] = 0, 0
		binary.BigEndian.PutUint16(b[10:], checksum(b[:off], 0))
	}
	src, dst, proto := addrs(b)
	l4 := b[off:]
	c := csumOff(proto)
	l4[c], l4[c+1] = 0, 0
	if proto == ipUDP && noUDPSum && !v6 {
		return
	}
	var initial uint32
	if proto != ipICMP {
		initial = pseudoSum(src, dst, proto, len(l4))
	}
	sum := checksum(l4, initial)
	if sum == 0 && proto == ipUDP {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(l4[c:], sum)
}

// verify recomputes the checksums of the whole packet b in full.
func verify(b []byte) error {
	v6 := b[0]>>4 == 6
	off := l4Offset(b)
	if !v6 && checksum(b[:off], 0) != 0 {
		return fmt.Errorf("IPv4 header checksum")
	}
	src, dst, proto := addrs(b)
	l4 := b[off:]
	if proto == ipUDP && !v6 && binary.BigEndian.Uint16(l4[6:]) == 0 {
		return nil
	}
	var initial uint32
	if proto != ipICMP {
		initial = pseudoSum(src, dst, proto, len(l4))
	}
	if s := checksum(l4, initial); s != 0 {
		return fmt.Errorf("protocol %d checksum off by %#04x", proto, s)
	}
	return nil
}

// icmpErrorAbout builds an ICMP error of type typ and code from src about
// the packet inner (whole, or cut to n bytes if n > 0).
func icmpErrorAbout(src netip.Addr, inner []byte, typ, code uint8, n int) []byte {
	if n > 0 && n < len(inner) {
		inner = inner[:n]
	}
	isrc, _, _ := addrs(inner)
	s := spec{src: netip.AddrPortFrom(src, 1), dst: netip.AddrPortFrom(isrc, 1), icmpType: typ, payload: inner}
	if src.Is6() {
		s.proto = ipICMPv6
	} else {
		s.proto = ipICMP
	}
	b := build(s)
	// build wrote an identifier at bytes 4-6 and 1 at 6-8: an error has
	// its own fields there (unused, or an MTU).
	off := l4Offset(b)
	for i := 4; i < 8; i++ {
		b[off+i] = 0
	}
	b[off+1] = code
	fixChecksums(b, false)
	return b
}

// collect is an Emit that keeps copies of what it is given.
type collect struct {
	pkts  [][]byte
	sides []Side
}

func (c *collect) emit(to Side, b []byte) {
	c.pkts = append(c.pkts, append([]byte(nil), b...))
	c.sides = append(c.sides, to)
}

func (c *collect) reset() { c.pkts, c.sides = nil, nil }
