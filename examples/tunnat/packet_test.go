package main

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

var (
	client4 = netip.MustParseAddrPort("10.48.0.2:40000")
	server4 = netip.MustParseAddrPort("10.48.1.1:80")
	ext4    = netip.MustParseAddr("10.48.1.2")
	client6 = netip.MustParseAddrPort("[fd48::2]:40000")
	server6 = netip.MustParseAddrPort("[fd48:1::1]:80")
	ext6    = netip.MustParseAddr("fd48:1::2")
)

// specs returns one packet of each kind the NAT translates, client to
// server.
func specs() []pktSpec {
	pl := []byte("hello, world!") // odd length: the checksum's last byte is padded
	return []pktSpec{
		{proto: protoTCP, src: client4, dst: server4, flags: tcpSYN, payload: pl},
		{proto: protoUDP, src: client4, dst: server4, payload: pl},
		{proto: protoUDP, src: netip.AddrPortFrom(client4.Addr(), 40001), dst: server4, payload: pl, noUDPSum: true},
		{proto: protoICMP, src: client4, dst: netip.AddrPortFrom(server4.Addr(), client4.Port()), icmpType: icmpEchoRequest, payload: pl},
		{proto: protoTCP, src: client6, dst: server6, flags: tcpSYN, payload: pl},
		{proto: protoUDP, src: client6, dst: server6, payload: pl},
		{proto: protoICMPv6, src: client6, dst: netip.AddrPortFrom(server6.Addr(), client6.Port()), icmpType: icmpv6EchoRequest, payload: pl},
	}
}

func TestParse(t *testing.T) {
	for _, s := range specs() {
		b := build(s)
		p, why := parse(b)
		if why != dropNone {
			t.Fatalf("%+v: parse: %v", s, why)
		}
		if p.src != s.src.Addr() || p.dst != s.dst.Addr() || p.proto != s.proto || p.sport != s.src.Port() || p.length != len(b) {
			t.Errorf("%+v: parsed %+v", s, p)
		}
		if s.proto == protoTCP && p.flags != s.flags {
			t.Errorf("flags %#x, want %#x", p.flags, s.flags)
		}
		if err := verifyChecksums(b); err != nil {
			t.Errorf("%+v: built with bad checksums: %v", s, err)
		}
	}
}

func TestParseRejects(t *testing.T) {
	udp := build(pktSpec{proto: protoUDP, src: client4, dst: server4, payload: []byte("x")})
	tcp6 := build(pktSpec{proto: protoTCP, src: client6, dst: server6})
	mod := func(b []byte, f func(b []byte)) []byte {
		b = bytes.Clone(b)
		f(b)
		return b
	}
	cases := []struct {
		name string
		b    []byte
		want dropReason
	}{
		{"empty", nil, dropMalformed},
		{"version 5", mod(udp, func(b []byte) { b[0] = 0x55 }), dropMalformed},
		{"IPv4 short", udp[:19], dropMalformed},
		{"IHL 4", mod(udp, func(b []byte) { b[0] = 0x44 }), dropMalformed},
		{"total length beyond the buffer", udp[:len(udp)-1], dropMalformed},
		{"total length below the header", mod(udp, func(b []byte) { binary.BigEndian.PutUint16(b[2:], 10) }), dropMalformed},
		{"more fragments", mod(udp, func(b []byte) { b[6] |= 0x20 }), dropFragment},
		{"fragment offset", mod(udp, func(b []byte) { b[7] = 1 }), dropFragment},
		{"UDP header cut", mod(udp[:24], func(b []byte) { binary.BigEndian.PutUint16(b[2:], 24) }), dropTruncated},
		{"GRE", mod(udp, func(b []byte) { b[9] = 47 }), dropUnsupported},
		{"source port 0", mod(udp, func(b []byte) { b[20], b[21] = 0, 0 }), dropUnsupported},
		{"ICMP unreachable", build(pktSpec{proto: protoICMP, src: client4, dst: server4, icmpType: 3}), dropUnsupported},
		{"ICMPv6 echo over IPv4", build(pktSpec{proto: protoICMP, src: client4, dst: server4, icmpType: icmpv6EchoRequest}), dropUnsupported},
		{"ICMP over IPv6", mod(tcp6, func(b []byte) { b[6] = protoICMP }), dropUnsupported},
		{"IPv6 short", tcp6[:39], dropMalformed},
		{"IPv6 payload length beyond", tcp6[:len(tcp6)-1], dropMalformed},
		{"IPv6 fragment header", mod(tcp6, func(b []byte) { b[6] = protoFrag6 }), dropFragment},
		{"IPv6 hop-by-hop", mod(tcp6, func(b []byte) { b[6] = 0 }), dropUnsupported},
		{"IPv6 UDP checksum 0", mod(build(pktSpec{proto: protoUDP, src: client6, dst: server6}), func(b []byte) { b[46], b[47] = 0, 0 }), dropMalformed},
		{"TCP header cut", mod(tcp6[:50], func(b []byte) { binary.BigEndian.PutUint16(b[4:], 10) }), dropTruncated},
	}
	for _, c := range cases {
		if _, why := parse(c.b); why != c.want {
			t.Errorf("%s: %v, want %v", c.name, why, c.want)
		}
	}
}

// Rewriting either address and port keeps every checksum right.
func TestRewrite(t *testing.T) {
	for _, s := range specs() {
		for _, dst := range []bool{false, true} {
			b := build(s)
			p, _ := parse(b)
			to := netip.AddrPortFrom(ext4, 61234)
			if p.v6 {
				to = netip.AddrPortFrom(ext6, 61234)
			}
			if why := rewrite(b, &p, dst, to); why != dropNone {
				t.Fatalf("%+v: %v", s, why)
			}
			if err := verifyChecksums(b); err != nil {
				t.Errorf("%+v dst %v: %v", s, dst, err)
			}
			q, _ := parse(b)
			got := netip.AddrPortFrom(q.src, q.sport)
			if dst {
				got = netip.AddrPortFrom(q.dst, q.dport)
			}
			if got != to {
				t.Errorf("%+v dst %v: rewritten to %v, want %v", s, dst, got, to)
			}
			if q != p {
				t.Errorf("rewrite left %+v, the packet parses as %+v", p, q)
			}
			if ttl := b[8]; !p.v6 && ttl != 63 || p.v6 && b[7] != 63 {
				t.Errorf("%+v: TTL not decremented", s)
			}
			if s.noUDPSum && binary.BigEndian.Uint16(b[p.l4+6:]) != 0 {
				t.Errorf("a UDP packet without checksum got one")
			}
		}
	}
}

// A packet whose TTL would reach 0 is dropped, untouched; an address of
// the other family is refused.
func TestRewriteRefuses(t *testing.T) {
	b := build(pktSpec{proto: protoUDP, src: client4, dst: server4, ttl: 1})
	orig := bytes.Clone(b)
	p, _ := parse(b)
	if why := rewrite(b, &p, false, netip.AddrPortFrom(ext4, 1)); why != dropTTL || !bytes.Equal(b, orig) {
		t.Errorf("TTL 1: %v, changed %v", why, !bytes.Equal(b, orig))
	}
	b = build(pktSpec{proto: protoUDP, src: client4, dst: server4})
	p, _ = parse(b)
	orig = bytes.Clone(b)
	if why := rewrite(b, &p, false, netip.AddrPortFrom(ext6, 1)); why != dropUnsupported || !bytes.Equal(b, orig) {
		t.Errorf("IPv6 address into IPv4: %v, changed %v", why, !bytes.Equal(b, orig))
	}
}

// A UDP checksum that the update would make 0 goes out as 0xffff.
func TestRewriteUDPZero(t *testing.T) {
	found := false
	for port := 1; port < 65536 && !found; port++ {
		b := build(pktSpec{proto: protoUDP, src: client4, dst: server4, payload: []byte{1, 2, 3}})
		p, _ := parse(b)
		rewrite(b, &p, false, netip.AddrPortFrom(ext4, uint16(port)))
		if binary.BigEndian.Uint16(b[26:]) == 0xffff {
			found = true
			if err := verifyChecksums(b); err != nil {
				t.Error(err)
			}
		}
		if binary.BigEndian.Uint16(b[26:]) == 0 {
			t.Fatalf("port %d: UDP checksum 0", port)
		}
	}
	if !found {
		t.Error("no port gave a checksum of 0xffff")
	}
}

// The rewriter's checksums equal a full recomputation, for any packet that
// parses, and no input makes parse or rewrite panic.
func FuzzRewrite(f *testing.F) {
	for _, s := range specs() {
		f.Add(build(s), uint16(61234), true, false)
		f.Add(build(s), uint16(1), false, true)
	}
	f.Add([]byte{0x45, 0, 0, 20}, uint16(1), false, false)
	f.Fuzz(func(t *testing.T, b []byte, port uint16, dst, noUDPSum bool) {
		raw := bytes.Clone(b)
		p, why := parse(raw)
		if why == dropNone {
			rewrite(raw, &p, dst, netip.AddrPortFrom(ext4, port)) // any packet, any family: no panic
		}
		if !fixChecksums(b, noUDPSum) {
			return
		}
		if err := verifyChecksums(b); err != nil {
			t.Fatalf("fixChecksums left %v", err)
		}
		p, why = parse(b)
		if why != dropNone {
			t.Fatalf("parsed before, now %v", why)
		}
		to := netip.AddrPortFrom(ext4, port)
		if p.v6 {
			to = netip.AddrPortFrom(ext6, port)
		}
		switch why := rewrite(b, &p, dst, to); {
		case why == dropTTL:
			return
		case why != dropNone:
			t.Fatalf("rewrite: %v", why)
		}
		if port == 0 {
			return // parse refuses port 0; the checksums are still right
		}
		if err := verifyChecksums(b); err != nil {
			t.Fatalf("after rewrite to %v (dst %v): %v", to, dst, err)
		}
	})
}
