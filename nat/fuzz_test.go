package nat

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// FuzzICMPError: an ICMP error about any packet of a flow (any protocol,
// family, payload, TTL, cut anywhere past the 8 bytes RFC 5508 asks
// for) is translated so that its checksums equal a full recomputation:
// the outer ICMP checksum, the outer and embedded IPv4 headers', and, when
// the embedded packet is whole, its transport checksum; and the embedded
// packet is the one the inside host sent, one hop older.
func FuzzICMPError(f *testing.F) {
	f.Add(uint8(0), false, []byte("payload"), uint16(0), uint8(64), uint16(40000))
	f.Add(uint8(1), true, []byte("x"), uint16(48), uint8(2), uint16(1))
	f.Add(uint8(2), false, bytes.Repeat([]byte{0xff}, 1000), uint16(576), uint8(255), uint16(65535))
	f.Add(uint8(3), false, []byte{}, uint16(28), uint8(9), uint16(77))
	n, c := packetNAT(f, Config{})
	f.Fuzz(func(t *testing.T, kind uint8, v6 bool, payload []byte, cut uint16, ttl uint8, port uint16) {
		if port == 0 || ttl < 2 || len(payload) > 1200 {
			return
		}
		src, dst := netip.AddrPortFrom(in4.Addr(), port), remote4
		router := netip.MustParseAddr("198.51.100.254")
		if v6 {
			src, dst, router = netip.AddrPortFrom(in6.Addr(), port), remote6, netip.MustParseAddr("2001:db8:1::fe")
		}
		s := spec{src: src, dst: dst, payload: payload, ttl: ttl}
		typ := uint8(icmpUnreach)
		if v6 {
			typ = icmp6Unreach
		}
		switch kind % 4 {
		case 0:
			s.proto = ipUDP
		case 1:
			s.proto, s.flags = ipTCP, tcpSYN
		case 2:
			s.proto, s.noUDPSum = ipUDP, !v6
		case 3:
			s.proto, s.icmpType = ipICMP, icmpEcho
			if v6 {
				s.proto, s.icmpType = ipICMPv6, icmp6Echo
			}
		}
		orig := build(s)
		c.reset()
		if why := n.Outbound(bytes.Clone(orig), c.emit); why != DropNone {
			t.Fatalf("outbound: %v", why)
		}
		sent := c.pkts[0]
		hdr := l4Offset(sent)
		n8 := int(cut)
		if n8 != 0 && n8 < hdr+8 {
			n8 = hdr + 8
		}
		e := icmpErrorAbout(router, sent, typ, 3, n8)
		c.reset()
		if why := n.Inbound(e, c.emit); why != DropNone {
			t.Fatalf("inbound error: %v", why)
		}
		got := c.pkts[0]
		off := l4Offset(got)
		if got[0]>>4 == 4 && checksum(got[:off], 0) != 0 {
			t.Fatal("outer IPv4 header checksum")
		}
		osrc, odst, _ := addrs(got)
		var initial uint32
		if v6 {
			initial = pseudoSum(osrc, odst, ipICMPv6, len(got)-off)
		}
		if checksum(got[off:], initial) != 0 {
			t.Fatal("outer ICMP checksum")
		}
		inner := got[off+8:]
		if !v6 && checksum(inner[:l4Offset(inner)], 0) != 0 {
			t.Fatal("embedded IPv4 header checksum")
		}
		if len(inner) == len(sent) {
			if err := verify(inner); err != nil {
				t.Fatalf("embedded whole packet: %v", err)
			}
		}
		want := bytes.Clone(orig[:len(inner)])
		if !v6 {
			want[8]--
			binary.BigEndian.PutUint16(want[10:], 0)
			binary.BigEndian.PutUint16(want[10:], checksum(want[:l4Offset(want)], 0))
		} else {
			want[7]--
		}
		if _, _, pr := addrs(inner); pr == ipTCP && len(inner) == l4Offset(inner)+17 {
			// Cut inside the TCP checksum: half a field, not updated.
			inner, want = inner[:len(inner)-1], want[:len(want)-1]
		}
		if !bytes.Equal(inner, want) {
			t.Fatalf("embedded\n%x\nwant\n%x", inner, want)
		}
	})
}

// FuzzPackets: no input makes the NAT panic, either way; every packet it
// emits has a right IPv4 header checksum.
func FuzzPackets(f *testing.F) {
	f.Add(build(spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("x")}), true)
	f.Add(build(spec{proto: ipTCP, src: remote6, dst: ap("2001:db8::1", 1024), flags: tcpSYN}), false)
	f.Add(icmpErrorAbout(remote4.Addr(), build(spec{proto: ipUDP, src: ap("192.0.2.1", 1024), dst: remote4}), icmpUnreach, 3, 0), false)
	n, _ := packetNAT(f, Config{UDP: Behaviors{Filtering: EndpointIndependent}})
	f.Fuzz(func(t *testing.T, b []byte, out bool) {
		emit := func(_ Side, p []byte) {
			if len(p) >= 20 && p[0]>>4 == 4 && checksum(p[:int(p[0]&0xf)*4], 0) != 0 {
				t.Fatalf("emitted a bad IPv4 header: %x", p)
			}
		}
		if out {
			n.Outbound(bytes.Clone(b), emit)
		} else {
			n.Inbound(bytes.Clone(b), emit)
		}
	})
}
