package nat

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

var (
	in4     = ap("10.0.0.2", 40000)
	in4b    = ap("10.0.0.3", 40000)
	remote4 = ap("198.51.100.1", 80)
	in6     = ap("fd00::2", 40000)
	remote6 = ap("2001:db8:1::1", 80)
	router4 = netip.MustParseAddr("10.0.0.1")
	router6 = netip.MustParseAddr("fd00::1")
)

func packetNAT(t testing.TB, c Config) (*NAT, *collect) {
	t.Helper()
	n, _, col := clockedNAT(t, c)
	return n, col
}

// clockedNAT is packetNAT with the NAT's test clock.
func clockedNAT(t testing.TB, c Config) (*NAT, *testClock, *collect) {
	t.Helper()
	if c.External == nil {
		c.External = []netip.Addr{ext1, ext6}
	}
	if c.Router == nil {
		c.Router = []netip.Addr{router4, router6}
	}
	n, clk := newTest(t, c)
	return n, clk, &collect{}
}

// one sends b through dir and returns the one packet emitted.
func one(t *testing.T, n *NAT, c *collect, out bool, b []byte, want Side) []byte {
	t.Helper()
	c.reset()
	var why Drop
	if out {
		why = n.Outbound(b, c.emit)
	} else {
		why = n.Inbound(b, c.emit)
	}
	if why != DropNone || len(c.pkts) != 1 || c.sides[0] != want {
		t.Fatalf("got %v, %d packets to %v; want one to %v", why, len(c.pkts), c.sides, want)
	}
	if err := verify(c.pkts[0]); err != nil {
		t.Fatalf("emitted packet: %v", err)
	}
	return c.pkts[0]
}

// Each kind of packet goes out from the external address and its reply
// comes back to the inside endpoint, checksums right both ways.
func TestPacketRoundTrip(t *testing.T) {
	n, c := packetNAT(t, Config{})
	pl := []byte("hello, world!")
	for _, s := range []spec{
		{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 100, payload: pl},
		{proto: ipUDP, src: in4, dst: remote4, payload: pl},
		{proto: ipUDP, src: ap("10.0.0.2", 40001), dst: remote4, payload: pl, noUDPSum: true},
		{proto: ipICMP, src: ap("10.0.0.2", 77), dst: remote4, icmpType: icmpEcho, payload: pl},
		{proto: ipTCP, src: in6, dst: remote6, flags: tcpSYN, seq: 100, payload: pl},
		{proto: ipUDP, src: in6, dst: remote6, payload: pl},
		{proto: ipICMPv6, src: ap("fd00::2", 77), dst: remote6, icmpType: icmp6Echo, payload: pl},
	} {
		out := one(t, n, c, true, build(s), Outside)
		src, dst, _ := addrs(out)
		off := l4Offset(out)
		eport := binary.BigEndian.Uint16(out[off:])
		if s.proto == ipICMP || s.proto == ipICMPv6 {
			eport = binary.BigEndian.Uint16(out[off+4:])
		}
		if src != ext1 && src != ext6 || dst != s.dst.Addr() || out[7] == 64 && out[8] == 64 {
			t.Errorf("%v went out as %v:%d -> %v", s.src, src, eport, dst)
		}
		r := spec{proto: s.proto, src: s.dst, dst: netip.AddrPortFrom(src, eport), payload: []byte("back")}
		switch s.proto {
		case ipTCP:
			r.flags, r.seq, r.ack = tcpSYN|tcpACK, 9000, 101+uint32(len(pl))
		case ipICMP:
			r.icmpType, r.src = icmpEchoReply, netip.AddrPortFrom(s.dst.Addr(), eport)
		case ipICMPv6:
			r.icmpType, r.src = icmp6EchoReply, netip.AddrPortFrom(s.dst.Addr(), eport)
		}
		back := one(t, n, c, false, build(r), Inside)
		_, bdst, _ := addrs(back)
		bport := binary.BigEndian.Uint16(back[l4Offset(back)+2:])
		if s.proto == ipICMP || s.proto == ipICMPv6 {
			bport = binary.BigEndian.Uint16(back[l4Offset(back)+4:])
		}
		if bdst != s.src.Addr() || bport != s.src.Port() {
			t.Errorf("reply to %v came back to %v:%d", s.src, bdst, bport)
		}
	}
}

// An inside host reaches another through its external endpoint, and the
// packet arrives from the sender's external endpoint (REQ-9), whatever the
// filtering: it keeps out the outside, not inside hosts.
func TestHairpinning(t *testing.T) {
	n, c := packetNAT(t, Config{UDP: Behaviors{Filtering: AddressAndPortDependent}})
	out := one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: remote4}), Outside)
	aExt := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	got := one(t, n, c, true, build(spec{proto: ipUDP, src: in4b, dst: aExt, payload: []byte("hi")}), Inside)
	src, dst, _ := addrs(got)
	sport, dport := binary.BigEndian.Uint16(got[20:]), binary.BigEndian.Uint16(got[22:])
	if dst != in4.Addr() || dport != in4.Port() || src != ext1 || sport == in4b.Port() && src == in4b.Addr() {
		t.Fatalf("hairpinned as %v:%d -> %v:%d", src, sport, dst, dport)
	}
	bExt := netip.AddrPortFrom(src, sport)
	// The answer goes back the same way.
	back := one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: bExt, payload: []byte("ho")}), Inside)
	if _, d, _ := addrs(back); d != in4b.Addr() || binary.BigEndian.Uint16(back[22:]) != in4b.Port() {
		t.Errorf("answer went to %v", d)
	}
	// And with the default filtering a host reaches its own mapping (the
	// RFC 5780 hairpinning test).
	n, c = packetNAT(t, Config{})
	out = one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: remote4}), Outside)
	aExt = netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	self := one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: aExt}), Inside)
	if s, d, _ := addrs(self); s != ext1 || d != in4.Addr() {
		t.Errorf("to itself: %v -> %v", s, d)
	}
}

// ICMP errors from outside about a flow's packet reach the inside host
// with the embedded packet as the host sent it (RFC 5508), for UDP, TCP
// and echo, IPv4 and IPv6; an error of no flow is dropped; and an error
// from inside about an inbound packet goes out with the external endpoint.
func TestICMPErrors(t *testing.T) {
	for _, c := range []struct {
		s      spec
		typ    uint8
		cut    int
		router netip.Addr
	}{
		{spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("port closed?")}, icmpUnreach, 0, netip.MustParseAddr("198.51.100.254")},
		{spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("port closed?")}, icmpUnreach, 28, remote4.Addr()},
		{spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, payload: make([]byte, 1400), df: true}, icmpUnreach, 576 - 28, netip.MustParseAddr("198.51.100.254")},
		{spec{proto: ipICMP, src: ap("10.0.0.2", 99), dst: remote4, icmpType: icmpEcho}, icmpTimeExceeded, 0, netip.MustParseAddr("198.51.100.254")},
		{spec{proto: ipUDP, src: in6, dst: remote6, payload: []byte("six")}, icmp6Unreach, 0, remote6.Addr()},
		{spec{proto: ipTCP, src: in6, dst: remote6, flags: tcpSYN, payload: make([]byte, 1400)}, icmp6TooBig, 1232, netip.MustParseAddr("2001:db8:1::fe")},
		{spec{proto: ipICMPv6, src: ap("fd00::2", 99), dst: remote6, icmpType: icmp6Echo}, icmp6TimeExceeded, 0, netip.MustParseAddr("2001:db8:1::fe")},
	} {
		n, col := packetNAT(t, Config{})
		orig := build(c.s)
		sent := one(t, n, col, true, bytes.Clone(orig), Outside)
		e := icmpErrorAbout(c.router, sent, c.typ, 4, c.cut)
		got := one(t, n, col, false, bytes.Clone(e), Inside)
		_, dst, _ := addrs(got)
		if dst != c.s.src.Addr() {
			t.Errorf("%v: error went to %v", c.s.src, dst)
		}
		inner := got[l4Offset(got)+8:]
		want := bytes.Clone(orig[:len(inner)])
		// The host's packet as the NAT sent it on: one hop less.
		if want[0]>>4 == 4 {
			want[8]--
			want[10], want[11] = 0, 0
			binary.BigEndian.PutUint16(want[10:], checksum(want[:l4Offset(want)], 0))
		} else {
			want[7]--
		}
		if !bytes.Equal(inner, want) {
			t.Errorf("%v type %d: embedded\n%x\nwant\n%x", c.s.src, c.typ, inner, want)
		}
		if m := n.Metrics(); m.Flows != 1 {
			t.Errorf("the error changed the flows: %v", m)
		}
		// No flow: dropped.
		var stray []byte
		if c.s.src.Addr().Is4() {
			stray = icmpErrorAbout(c.router, build(spec{proto: ipUDP, src: netip.AddrPortFrom(ext1, 999), dst: c.s.dst}), c.typ, 0, 0)
		} else {
			stray = icmpErrorAbout(c.router, build(spec{proto: ipUDP, src: netip.AddrPortFrom(ext6, 999), dst: c.s.dst}), c.typ, 0, 0)
		}
		if why := n.Inbound(stray, col.emit); why != DropICMPError {
			t.Errorf("an error of no flow: %v", why)
		}
		bad := bytes.Clone(e)
		bad[len(bad)-1] ^= 0xff
		if why := n.Inbound(bad, col.emit); why != DropChecksum {
			t.Errorf("an error with a bad checksum: %v", why)
		}
	}

	// From inside: an inside host's port unreachable about an inbound
	// packet leaves from the external endpoint, embedded included.
	n, col := packetNAT(t, Config{UDP: Behaviors{Filtering: EndpointIndependent}})
	out := one(t, n, col, true, build(spec{proto: ipUDP, src: in4, dst: remote4}), Outside)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	inbound := build(spec{proto: ipUDP, src: remote4, dst: ext, payload: []byte("x")})
	arrived := one(t, n, col, false, bytes.Clone(inbound), Inside)
	e := icmpErrorAbout(in4.Addr(), arrived, icmpUnreach, 3, 0)
	left := one(t, n, col, true, e, Outside)
	if s, _, _ := addrs(left); s != ext1 {
		t.Errorf("inside error left from %v", s)
	}
	inner := left[28:]
	if !bytes.Equal(inner[12:20], inbound[12:20]) || !bytes.Equal(inner[20:24], inbound[20:24]) {
		t.Errorf("embedded %x, want the packet as the remote sent it %x", inner[:28], inbound[:28])
	}
}

// A packet whose TTL runs out gets time exceeded from the router address;
// one larger than the MTU with DF (or IPv6) gets fragmentation needed
// (packet too big) with the MTU, and without DF goes out in fragments; a
// flow refused gets administratively prohibited.
func TestErrorsSent(t *testing.T) {
	n, c := packetNAT(t, Config{MTU: 1280, MaxFlows: 1})
	c.reset()
	if why := n.Outbound(build(spec{proto: ipUDP, src: in4, dst: remote4, ttl: 1}), c.emit); why != DropTTL || len(c.pkts) != 1 {
		t.Fatalf("TTL 1: %v, %d packets", why, len(c.pkts))
	}
	if s, d, pr := addrs(c.pkts[0]); s != router4 || d != in4.Addr() || pr != ipICMP || c.pkts[0][20] != icmpTimeExceeded || verify(c.pkts[0]) != nil {
		t.Errorf("time exceeded: %v -> %v, proto %d type %d", s, d, pr, c.pkts[0][20])
	}
	for _, s := range []spec{
		{proto: ipUDP, src: in4, dst: remote4, payload: make([]byte, 1400), df: true},
		{proto: ipUDP, src: in6, dst: remote6, payload: make([]byte, 1400)},
	} {
		c.reset()
		if why := n.Outbound(build(s), c.emit); why != DropTooBig || len(c.pkts) != 1 {
			t.Fatalf("too big: %v, %d packets", why, len(c.pkts))
		}
		e := c.pkts[0]
		off := l4Offset(e)
		mtu := binary.BigEndian.Uint16(e[off+6:])
		if s.src.Addr().Is4() && (e[off] != icmpUnreach || e[off+1] != 4) || s.src.Addr().Is6() && e[off] != icmp6TooBig || mtu != 1280 || verify(e) != nil {
			t.Errorf("too big: type %d code %d mtu %d", e[off], e[off+1], mtu)
		}
	}
	c.reset()
	big := build(spec{proto: ipUDP, src: in4, dst: remote4, payload: bytes.Repeat([]byte("0123456789"), 300)})
	if why := n.Outbound(big, c.emit); why != DropNone || len(c.pkts) != 3 {
		t.Fatalf("3000 bytes without DF: %v, %d packets", why, len(c.pkts))
	}
	whole := reassemble(t, c.pkts)
	if err := verify(whole); err != nil || len(whole) != len(big) {
		t.Errorf("the fragments reassembled: %v, %d bytes", err, len(whole))
	}
	// Answered, the one flow allowed cannot be evicted: the next is refused.
	one(t, n, c, false, build(spec{proto: ipUDP, src: remote4, dst: netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(whole[20:]))}), Inside)
	c.reset()
	if why := n.Outbound(build(spec{proto: ipUDP, src: in4b, dst: remote4}), c.emit); why != DropTableFull || len(c.pkts) != 1 || c.pkts[0][20] != icmpUnreach || c.pkts[0][21] != 13 {
		t.Errorf("refused: %v, %d packets", why, len(c.pkts))
	}
}

// reassemble joins IPv4 fragments, in any order, into their datagram.
func reassemble(t *testing.T, frags [][]byte) []byte {
	t.Helper()
	var hdr []byte
	payload := make([]byte, 1<<16)
	end := 0
	for _, f := range frags {
		ihl := int(f[0]&0xf) * 4
		if checksum(f[:ihl], 0) != 0 {
			t.Fatalf("fragment header checksum")
		}
		ff := binary.BigEndian.Uint16(f[6:])
		off := int(ff&0x1fff) * 8
		copy(payload[off:], f[ihl:])
		if off == 0 {
			hdr = bytes.Clone(f[:20]) // its options dropped
			hdr[0] = 0x45
		}
		if ff&0x2000 == 0 {
			end = off + len(f) - ihl
		}
	}
	whole := append(hdr, payload[:end]...)
	binary.BigEndian.PutUint16(whole[2:], uint16(len(whole)))
	binary.BigEndian.PutUint16(whole[6:], 0)
	whole[10], whole[11] = 0, 0
	binary.BigEndian.PutUint16(whole[10:], checksum(whole[:20], 0))
	return whole
}

// fragments cuts the IPv4 packet b into fragments of at most size bytes of
// payload (a multiple of 8).
func fragments(b []byte, size int) [][]byte {
	var out [][]byte
	pl := b[20:]
	for off := 0; off < len(pl); off += size {
		end := min(off+size, len(pl))
		f := append(bytes.Clone(b[:20]), pl[off:end]...)
		ff := uint16(off / 8)
		if end < len(pl) {
			ff |= 0x2000
		}
		binary.BigEndian.PutUint16(f[6:], ff)
		binary.BigEndian.PutUint16(f[2:], uint16(len(f)))
		f[10], f[11] = 0, 0
		binary.BigEndian.PutUint16(f[10:], checksum(f[:20], 0))
		out = append(out, f)
	}
	return out
}

// Fragments in order and out of order: all go through with the flow's
// address, the datagram whole at the other end; held ones are bounded and
// time out.
func TestFragments(t *testing.T) {
	n, c := packetNAT(t, Config{})
	big := build(spec{proto: ipUDP, src: in4, dst: remote4, payload: bytes.Repeat([]byte("abcdefgh"), 375)})
	fr := fragments(big, 1480)
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 0, 2}} {
		c.reset()
		for _, i := range order {
			f := bytes.Clone(fr[i])
			binary.BigEndian.PutUint16(f[4:], uint16(order[0]*10+order[1])) // a new datagram each round
			f[10], f[11] = 0, 0
			binary.BigEndian.PutUint16(f[10:], checksum(f[:20], 0))
			if why := n.Outbound(f, c.emit); why != DropNone {
				t.Fatalf("order %v fragment %d: %v", order, i, why)
			}
		}
		if len(c.pkts) != 3 {
			t.Fatalf("order %v: %d fragments out", order, len(c.pkts))
		}
		whole := reassemble(t, c.pkts)
		if s, _, _ := addrs(whole); s != ext1 || verify(whole) != nil || len(whole) != len(big) {
			t.Errorf("order %v: from %v, checksum %v", order, s, verify(whole))
		}
		// The reply, in fragments, comes back whole.
		port := binary.BigEndian.Uint16(whole[20:])
		reply := build(spec{proto: ipUDP, src: remote4, dst: netip.AddrPortFrom(ext1, port), payload: bytes.Repeat([]byte("zyxwvuts"), 375)})
		c.reset()
		for _, f := range fragments(reply, 1480) {
			n.Inbound(f, c.emit)
		}
		back := reassemble(t, c.pkts)
		if _, d, _ := addrs(back); d != in4.Addr() || binary.BigEndian.Uint16(back[22:]) != in4.Port() || verify(back) != nil {
			t.Errorf("reply in fragments came back to %v", d)
		}
	}
	// Fragments whose first never comes: held, bounded, then forgotten.
	lone := bytes.Clone(fr[1])
	binary.BigEndian.PutUint16(lone[4:], 999)
	lone[10], lone[11] = 0, 0
	binary.BigEndian.PutUint16(lone[10:], checksum(lone[:20], 0))
	c.reset()
	before := n.Metrics().FragmentBytes // the datagrams above, known
	n.Outbound(lone, c.emit)
	if m := n.Metrics(); len(c.pkts) != 0 || m.FragmentBytes-before != len(lone)+fragEntryCost {
		t.Errorf("a lone fragment: %d out, %d bytes held more", len(c.pkts), m.FragmentBytes-before)
	}
	n.Expire(time.Unix(0, n.now()).Add(n.cfg.FragmentTimeout + time.Second))
	if m := n.Metrics(); m.FragmentBytes != 0 || m.Drops[DropFragmentTimeout] != 1 {
		t.Errorf("after the timeout: %v, %d bytes", m, m.FragmentBytes)
	}
}

// Packets a router refuses are dropped and counted: a bad IPv4 header
// checksum, source routes, TCP data offsets past the segment or too small,
// an IPv6 routing header with segments left; and a blind RST from outside
// leaves the flow alone.
func TestRefusedPackets(t *testing.T) {
	n, c := packetNAT(t, Config{})
	udp := build(spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("x")})
	badSum := bytes.Clone(udp)
	badSum[10] ^= 1
	lsrr := build(spec{proto: ipUDP, src: in4, dst: remote4, options: []byte{0x83, 7, 4, 1, 2, 3, 4, 0}})
	ssrr := build(spec{proto: ipUDP, src: in4, dst: remote4, options: []byte{0x89, 7, 4, 1, 2, 3, 4, 0}})
	rr := build(spec{proto: ipUDP, src: ap("10.0.0.2", 1), dst: remote4, options: []byte{0x07, 7, 4, 0, 0, 0, 0, 0}})
	off2, off15 := build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN}), build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN})
	off2[32] = 2 << 4
	off15[32] = 15 << 4
	fixChecksums(off2, false)
	fixChecksums(off15, false)
	route6 := build(spec{proto: ipUDP, src: in6, dst: remote6})
	// A routing header (type 0, one segment left) before the UDP header.
	rh := []byte{ipUDP, 2, 0, 1, 0, 0, 0, 0}
	rh = append(rh, make([]byte, 16)...)
	route6 = append(append(bytes.Clone(route6[:40]), rh...), route6[40:]...)
	route6[6] = ip6Route
	binary.BigEndian.PutUint16(route6[4:], uint16(len(route6)-40))
	for _, x := range []struct {
		b    []byte
		want Drop
	}{{badSum, DropChecksum}, {lsrr, DropOptions}, {ssrr, DropOptions}, {off2, DropBadTCP}, {off15, DropBadTCP}, {route6, DropOptions}} {
		if why := n.Outbound(x.b, c.emit); why != x.want {
			t.Errorf("%x: %v, want %v", x.b[:24], why, x.want)
		}
	}
	if why := n.Outbound(rr, c.emit); why != DropNone {
		t.Errorf("record route: %v", why)
	}
	if m := n.Metrics(); m.Drops[DropOptions] != 3 || m.Drops[DropBadTCP] != 2 || m.Drops[DropChecksum] != 1 {
		t.Errorf("metrics: %v", m)
	}

	// Blind RSTs and FINs from the remote's endpoint: dropped, the flow stays.
	c.reset()
	syn := one(t, n, c, true, build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 1000}), Outside)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(syn[20:]))
	one(t, n, c, false, build(spec{proto: ipTCP, src: remote4, dst: ext, flags: tcpSYN | tcpACK, seq: 7000000, ack: 1001}), Inside)
	one(t, n, c, true, build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpACK, seq: 1001, ack: 7000001}), Outside)
	for _, fl := range []uint8{tcpRST, tcpRST | tcpACK, tcpFIN | tcpACK} {
		for range 100 {
			if why := n.Inbound(build(spec{proto: ipTCP, src: remote4, dst: ext, flags: fl, seq: 12345, ack: 1001}), c.emit); why != DropOutOfWindow {
				t.Fatalf("blind %#x: %v", fl, why)
			}
		}
	}
	f := n.proto[TCP].lookupOut(&hash4.Tuple{Local: in4, Remote: remote4})
	if f == nil || f.tcp.stateNow() != tcpEstablished {
		t.Fatalf("flow after blind RSTs: %v", f)
	}
	one(t, n, c, false, build(spec{proto: ipTCP, src: remote4, dst: ext, flags: tcpACK, seq: 7000001, ack: 1001, payload: []byte("data")}), Inside)
	if m := n.Metrics(); m.Drops[DropOutOfWindow] != 300 {
		t.Errorf("out-of-window drops %d", m.Drops[DropOutOfWindow])
	}
}

// A packet of a known flow, either way, allocates nothing.
func TestPacketNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	n, c := packetNAT(t, Config{})
	out := build(spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("x")})
	sent := one(t, n, c, true, bytes.Clone(out), Outside)
	back := build(spec{proto: ipUDP, src: remote4, dst: netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(sent[20:])), payload: []byte("y")})
	emit := func(Side, []byte) {}
	o, i := bytes.Clone(out), bytes.Clone(back)
	if a := testing.AllocsPerRun(1000, func() {
		copy(o, out)
		copy(i, back)
		if n.Outbound(o, emit) != DropNone || n.Inbound(i, emit) != DropNone {
			t.Fatal("dropped")
		}
	}); a != 0 {
		t.Errorf("%v allocations per packet pair", a)
	}
}

// ipv6Frags builds the fragments of an IPv6 datagram whose fragmentable
// part starts with a Destination Options header (RFC 8200 4.1 allows it
// after the Fragment header), cut after first bytes.
func ipv6Frags(whole []byte, first int) [][]byte {
	dest := []byte{ipUDP, 0, 1, 4, 0, 0, 0, 0} // next UDP, 8 bytes, PadN
	frag := append(append([]byte(nil), dest...), whole[40:]...)
	var out [][]byte
	for off := 0; off < len(frag); off += first {
		end := min(off+first, len(frag))
		p := append([]byte(nil), whole[:40]...)
		p[6] = ip6Frag
		fh := make([]byte, 8)
		fh[0] = ip6Dest
		fo := uint16(off)
		if end < len(frag) {
			fo |= 1
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], 0xabcd)
		p = append(append(p, fh...), frag[off:end]...)
		binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
		out = append(out, p)
	}
	return out
}

// A fragmented datagram from one inside host to another's external
// endpoint (hairpinning, RFC 4787 REQ-9): every fragment goes back inside
// to the mapping's host, as the first does.
func TestHairpinFragments(t *testing.T) {
	n, _, c := clockedNAT(t, Config{})
	out := one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: remote4}), Outside)
	aExt := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	big := build(spec{proto: ipUDP, src: in4b, dst: aExt, payload: bytes.Repeat([]byte("abcdefgh"), 375)})
	c.reset()
	for i, f := range fragments(big, 1480) {
		if why := n.Outbound(f, c.emit); why != DropNone {
			t.Fatalf("fragment %d: %v", i, why)
		}
	}
	if len(c.pkts) != 3 {
		t.Fatalf("%d packets emitted, want 3", len(c.pkts))
	}
	for i, p := range c.pkts {
		_, dst, _ := addrs(p)
		if c.sides[i] != Inside || dst != in4.Addr() {
			t.Errorf("hairpinned fragment %d went %v to %v; want inside to %v", i, c.sides[i], dst, in4.Addr())
		}
	}
}

// An inside host's ICMP error about a hairpinned packet (port
// unreachable), addressed to the sender's external endpoint, is hairpinned
// back to the sender.
func TestHairpinICMPError(t *testing.T) {
	n, _, c := clockedNAT(t, Config{})
	out := one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: remote4}), Outside)
	aExt := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	got := one(t, n, c, true, build(spec{proto: ipUDP, src: in4b, dst: aExt, payload: []byte("hi")}), Inside)
	e := icmpErrorAbout(in4.Addr(), got, icmpUnreach, 3, 0)
	c.reset()
	why := n.Outbound(e, c.emit)
	if why != DropNone || len(c.pkts) != 1 {
		t.Fatalf("error about a hairpinned packet: %v, %d packets", why, len(c.pkts))
	}
	_, dst, _ := addrs(c.pkts[0])
	if c.sides[0] != Inside || dst != in4b.Addr() {
		t.Errorf("error about a hairpinned packet went %v to %v; want inside to %v", c.sides[0], dst, in4b.Addr())
	}
}

// A non-first IPv6 fragment carries the datagram after its Fragment
// header, here a Destination Options header's bytes (RFC 8200 4.1): it is
// not parsed as headers, and follows the first.
func TestIPv6FragmentAfterDestOpts(t *testing.T) {
	n, _, c := clockedNAT(t, Config{})
	whole := build(spec{proto: ipUDP, src: in6, dst: remote6, payload: bytes.Repeat([]byte("x"), 2000)})
	frs := ipv6Frags(whole, 1232)
	c.reset()
	for i, f := range frs {
		if why := n.Outbound(f, c.emit); why != DropNone {
			t.Errorf("IPv6 fragment %d (Destination Options after the Fragment header): %v", i, why)
		}
	}
	if len(c.pkts) != len(frs) {
		t.Errorf("%d of %d fragments went out", len(c.pkts), len(frs))
	}
}

// Each fragmented datagram's entry counts against Config.FragmentMemory:
// first fragments from outside, each with a new identification, do not
// grow the fragment table past it.
func TestFragmentEntriesBounded(t *testing.T) {
	n, _, c := clockedNAT(t, Config{FragmentMemory: 4096})
	out := one(t, n, c, true, build(spec{proto: ipUDP, src: in6, dst: remote6}), Outside)
	ext := netip.AddrPortFrom(ext6, binary.BigEndian.Uint16(out[40:]))
	whole := build(spec{proto: ipUDP, src: remote6, dst: ext, payload: bytes.Repeat([]byte("y"), 64)})
	emit := func(Side, []byte) {}
	const N = 20000
	for i := 0; i < N; i++ {
		// A first fragment (offset 0, M set), identification i.
		p := append([]byte(nil), whole[:40]...)
		p[6] = ip6Frag
		fh := []byte{ipUDP, 0, 0, 1, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(fh[4:], uint32(i))
		p = append(append(p, fh...), whole[40:]...)
		binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
		if why := n.Inbound(p, emit); why != DropNone {
			t.Fatalf("first fragment %d: %v", i, why)
		}
	}
	n.frags.mu.Lock()
	entries := len(n.frags.m)
	n.frags.mu.Unlock()
	if entries > 1000 {
		t.Errorf("%d fragment entries held after %d first fragments from outside, with FragmentMemory 4096 (FragmentBytes %d)", entries, N, n.Metrics().FragmentBytes)
	}
}

// A segment with SYN and FIN both set makes no flow (conntrack's
// tcp_valid_flags refuses it).
func TestTCPInvalidFlagsMakeNoFlow(t *testing.T) {
	n, _, c := clockedNAT(t, Config{TCP: Behaviors{Filtering: EndpointIndependent}})
	out := one(t, n, c, true, build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 1}), Outside)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	c.reset()
	other := ap("203.0.113.9", 5555)
	if why := n.Inbound(build(spec{proto: ipTCP, src: other, dst: ext, flags: tcpSYN | tcpFIN, seq: 99}), c.emit); why == DropNone {
		t.Errorf("a SYN|FIN segment from a new remote made a flow and was delivered inside (%d packets)", len(c.pkts))
	}
}

// A packet from the outside whose source is one of the NAT's own external
// endpoints (spoofed), which would match a hairpin flow, is refused.
func TestSpoofedExternalSource(t *testing.T) {
	n, _, c := clockedNAT(t, Config{})
	out := one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: remote4}), Outside)
	aExt := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	got := one(t, n, c, true, build(spec{proto: ipUDP, src: in4b, dst: aExt, payload: []byte("hi")}), Inside)
	bs, _, _ := addrs(got)
	bExt := netip.AddrPortFrom(bs, binary.BigEndian.Uint16(got[20:]))
	c.reset()
	spoof := build(spec{proto: ipUDP, src: bExt, dst: aExt, payload: []byte("spoofed")})
	if why := n.Inbound(spoof, c.emit); why == DropNone && len(c.pkts) == 1 {
		t.Errorf("a packet from outside with the NAT's own address %v as source was delivered inside to %v", bExt, in4)
	}
}

// Packets no router forwards are refused (DropAddress), making no flow:
// from the unspecified address, to the limited broadcast address (RFC 1812
// 5.3.5.1), to link-local multicast (RFC 5771), from an IPv6 link-local
// source (RFC 4291 2.5.6).
func TestNonForwardable(t *testing.T) {
	n, _, c := clockedNAT(t, Config{})
	for _, s := range []spec{
		{proto: ipUDP, src: ap("0.0.0.0", 68), dst: ap("255.255.255.255", 67), payload: []byte("dhcp")},
		{proto: ipUDP, src: ap("10.0.0.2", 137), dst: ap("255.255.255.255", 137), payload: []byte("nb")},
		{proto: ipUDP, src: ap("10.0.0.2", 5353), dst: ap("224.0.0.251", 5353), payload: []byte("mdns")},
		{proto: ipUDP, src: ap("fe80::2", 5000), dst: remote6, payload: []byte("ll")},
	} {
		c.reset()
		if why := n.Outbound(build(s), c.emit); why != DropAddress || len(c.pkts) != 0 {
			t.Errorf("%v -> %v: %v, %d packets sent", s.src, s.dst, why, len(c.pkts))
		}
	}
	if flows, _ := n.Len(); flows != 0 {
		t.Errorf("%d flows made", flows)
	}
}

// RFC 791: an option whose copied flag is 0 (Record Route, 7) goes into
// the first fragment only; one whose flag is set (Router Alert, 148) into
// every fragment.
func TestFragmentOutOptions(t *testing.T) {
	n, _, c := clockedNAT(t, Config{MTU: 1280})
	opts := []byte{0x07, 7, 4, 0, 0, 0, 0, 1, 0x94, 4, 0, 0} // Record Route, NOP, Router Alert
	big := build(spec{proto: ipUDP, src: in4, dst: remote4, options: opts, payload: bytes.Repeat([]byte("z"), 3000)})
	c.reset()
	if why := n.Outbound(big, c.emit); why != DropNone || len(c.pkts) < 2 {
		t.Fatalf("%v, %d packets", why, len(c.pkts))
	}
	for i, f := range c.pkts {
		want := []byte{0x94, 4, 0, 0}
		if i == 0 {
			want = opts
		}
		if ihl := int(f[0]&0xf) * 4; !bytes.Equal(f[20:ihl], want) || checksum(f[:ihl], 0) != 0 || len(f) > 1280 {
			t.Errorf("fragment %d: options % x, want % x; header checksum %#x, %d bytes", i, f[20:ihl], want, checksum(f[:ihl], 0), len(f))
		}
	}
	if whole := reassemble(t, c.pkts); verify(whole) != nil || len(whole) != len(big)-len(opts) {
		t.Errorf("reassembled: %v, %d bytes", verify(whole), len(whole))
	}
}

// A fragment whose end lies past 65,535 bytes, which the NAT would have to
// fragment again for its MTU, is refused: no fragment offset names its
// pieces.
func TestFragmentPastDatagramEnd(t *testing.T) {
	n, c := packetNAT(t, Config{MTU: 1280})
	big := build(spec{proto: ipUDP, src: in4, dst: remote4, payload: bytes.Repeat([]byte("q"), 1400)})
	if why := n.Outbound(fragments(big, 1000)[0], c.emit); why != DropNone {
		t.Fatal(why)
	}
	last := bytes.Clone(big[:20])
	last = append(last, bytes.Repeat([]byte("r"), 1400)...)
	binary.BigEndian.PutUint16(last[6:], 0x1fff) // the last offset, more fragments clear
	binary.BigEndian.PutUint16(last[2:], uint16(len(last)))
	last[10], last[11] = 0, 0
	binary.BigEndian.PutUint16(last[10:], checksum(last[:20], 0))
	c.reset()
	if why := n.Outbound(last, c.emit); why != DropMalformed || len(c.pkts) != 0 {
		t.Errorf("a fragment from offset 65,528 of 1,400 bytes: %v, %d packets out", why, len(c.pkts))
	}
}

// The NAT's own ICMP errors are limited each way, to errorsPerSecond:
// errors an outside flood earns do not spend the inside's, and a refill
// comes with the clock, not with calls of Expire.
func TestErrorBudgetEachWay(t *testing.T) {
	n, clk, c := clockedNAT(t, Config{})
	out := one(t, n, c, true, build(spec{proto: ipUDP, src: in4, dst: remote4}), Outside)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(out[20:]))
	errs := func(from Side, count int) int {
		c.reset()
		for range count {
			if from == Inside {
				n.Outbound(build(spec{proto: ipUDP, src: in4, dst: remote4, ttl: 1}), c.emit)
			} else {
				n.Inbound(build(spec{proto: ipUDP, src: remote4, dst: ext, ttl: 1}), c.emit)
			}
		}
		return len(c.pkts)
	}
	budget := int(n.errorsPerTick())
	if got := errs(Outside, budget+100); got != budget {
		t.Fatalf("%d errors for %d expiring packets from outside, want %d", got, budget+100, budget)
	}
	if got := errs(Inside, 10); got != 10 {
		t.Errorf("after the outside's flood, %d errors for 10 packets from inside", got)
	}
	clk.advance(0)
	if got := errs(Outside, 10); got != 0 {
		t.Errorf("Expire at the same time refilled %d errors", got)
	}
	clk.advance(100 * time.Millisecond)
	if got := errs(Outside, 200); got != budget/10 {
		t.Errorf("100 ms later: %d errors, want %d", got, budget/10)
	}
	clk.advance(200 * 24 * time.Hour) // whose errors' product would overflow
	if got := errs(Inside, budget+10); got != budget {
		t.Errorf("after 200 days: %d errors, want %d", got, budget)
	}
}

// unicast4 and unicast6 agree with netip's predicates (and IPv4-mapped
// addresses refused in IPv6), at the edges of the ranges they refuse and
// at random.
func TestUnicastReference(t *testing.T) {
	ref := func(a netip.Addr) bool {
		return !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() && !a.IsLinkLocalUnicast() &&
			a != netip.AddrFrom4([4]byte{255, 255, 255, 255}) && !a.Is4In6()
	}
	addrs := []string{"0.0.0.0", "0.0.0.1", "126.255.255.255", "127.0.0.0", "127.255.255.255", "128.0.0.0",
		"169.253.255.255", "169.254.0.0", "169.254.255.255", "169.255.0.0", "223.255.255.255", "224.0.0.0",
		"239.255.255.255", "240.0.0.0", "255.255.255.254", "255.255.255.255",
		"::", "::1", "::2", "::ffff:127.0.0.1", "::ffff:8.8.8.8", "::fffe:0:1", "::1:0:0:1", "fe7f:ffff::", "fe80::", "febf:ffff::1", "fec0::", "feff::",
		"ff00::", "ff02::1", "2001:db8::1"}
	for range 10000 {
		var b [16]byte
		binary.BigEndian.PutUint64(b[:], rand.Uint64())
		binary.BigEndian.PutUint64(b[8:], rand.Uint64())
		addrs = append(addrs, netip.AddrFrom16(b).String(), netip.AddrFrom4([4]byte(b[:4])).String())
	}
	for _, s := range addrs {
		a := netip.MustParseAddr(s)
		var got bool
		if a.Is4() {
			b := a.As4()
			got = unicast4(binary.BigEndian.Uint32(b[:]))
		} else {
			b := a.As16()
			got = unicast6(binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]))
		}
		if got != ref(a) {
			t.Errorf("%v: %v, netip says %v", a, got, ref(a))
		}
	}
}

// The same with the default (address-dependent) filtering, through
// hairpinning, which filtering does not stop: x has a mapping toward the
// external address (its first flow to y's external endpoint eY) and one
// toward an outside address (eXA); y's packet to eXA, hairpinned from eY,
// finds x -> eY, not a second flow.
func TestAddressDependentOneFlowHairpin(t *testing.T) {
	n, c := packetNAT(t, Config{UDP: Behaviors{Mapping: AddressDependent}})
	ps := &n.proto[UDP]
	x, y, z := ap("10.0.0.2", 4000), ap("10.0.0.3", 4001), ap("10.0.0.4", 4002)
	send := func(src, dst netip.AddrPort, want Side) netip.AddrPort {
		t.Helper()
		got := one(t, n, c, true, build(spec{proto: ipUDP, src: src, dst: dst}), want)
		s, _, _ := addrs(got)
		return netip.AddrPortFrom(s, binary.BigEndian.Uint16(got[l4Offset(got):]))
	}
	eZ := send(z, ap("198.51.100.9", 80), Outside) // z's mapping toward 198.51.100.9
	eY := send(y, eZ, Inside)                      // y's mapping toward ext1: eY
	send(x, ap("198.51.100.1", 80), Outside)       // x's mapping toward 198.51.100.1
	eXA := n.proto[UDP].lookupOut(&hash4.Tuple{Local: x, Remote: ap("198.51.100.1", 80)}).ext
	send(x, eY, Inside) // x's mapping toward ext1, its first flow x -> eY
	send(y, eXA, Inside)
	if c := liveByInside(ps, hash4.Tuple{Local: x, Remote: eY}); c != 1 {
		flows, _ := n.Len()
		t.Fatalf("%d live flows for %v -> %v (%d flows in all)", c, x, eY, flows)
	}
}
