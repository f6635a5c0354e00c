package nat

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
)

// out is one packet a NAT sent: the side and the bytes.
type out struct {
	to  Side
	pkt string
}

// batchSteps are batches of packets, each from one side, that make flows
// of every protocol and family, use them, hairpin, refuse, fragment and
// answer with ICMP errors: the inputs of TestBatchMatchesPackets. The NAT
// is one of port preservation, so that two NATs give the same ports.
func batchSteps() []struct {
	from Side
	pkts [][]byte
} {
	pl := []byte("payload")
	bigDF := build(spec{proto: ipUDP, src: ap("10.0.0.2", 40003), dst: remote4, payload: make([]byte, 1500), df: true})
	big := build(spec{proto: ipUDP, src: ap("10.0.0.2", 40004), dst: remote4, payload: make([]byte, 1500)})
	out := [][]byte{
		build(spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("a")}),
		build(spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("b")}), // the same flow
		build(spec{proto: ipTCP, src: ap("10.0.0.2", 40001), dst: remote4, flags: tcpSYN, seq: 100}),
		build(spec{proto: ipICMP, src: ap("10.0.0.2", 40077), dst: remote4, icmpType: icmpEcho, payload: pl}),
		build(spec{proto: ipUDP, src: in6, dst: remote6, payload: pl}),
		{0x45, 0, 0},
		build(spec{proto: ipUDP, src: ap("10.0.0.2", 40002), dst: remote4, payload: pl, ttl: 1}),
		build(spec{proto: ipUDP, src: ap("10.0.0.3", 40010), dst: netip.AddrPortFrom(ext1, in4.Port()), payload: pl}), // hairpin to the first packet's mapping
		bigDF,
		big,
		build(spec{proto: ipTCP, src: ap("10.0.0.2", 40005), dst: remote4, flags: tcpACK, seq: 1}), // no flow
		build(spec{proto: ipUDP, src: in4, dst: remote4, payload: []byte("c")}),
	}
	extIn4 := netip.AddrPortFrom(ext1, in4.Port())
	frag := fragments(build(spec{proto: ipUDP, src: remote4, dst: extIn4, payload: bytes.Repeat([]byte("fragment"), 300)}), 1000)
	in := [][]byte{
		build(spec{proto: ipUDP, src: remote4, dst: extIn4, payload: []byte("x")}),
		build(spec{proto: ipUDP, src: remote4, dst: extIn4, payload: []byte("y")}),
		build(spec{proto: ipTCP, src: remote4, dst: netip.AddrPortFrom(ext1, 40001), flags: tcpSYN | tcpACK, seq: 5000, ack: 101}),
		build(spec{proto: ipICMP, src: netip.AddrPortFrom(remote4.Addr(), 40077), dst: netip.AddrPortFrom(ext1, 40077), icmpType: icmpEchoReply, payload: pl}),
		build(spec{proto: ipUDP, src: remote6, dst: netip.AddrPortFrom(ext6, in6.Port()), payload: pl}),
		build(spec{proto: ipUDP, src: remote4, dst: netip.AddrPortFrom(ext1, 999), payload: pl}), // no flow
		icmpErrorAbout(remote4.Addr(), build(spec{proto: ipUDP, src: extIn4, dst: remote4, payload: pl}), icmpUnreach, 3, 0),
		frag[1], frag[0], frag[2],
		build(spec{proto: ipUDP, src: remote4, dst: extIn4, payload: []byte("z")}),
	}
	return []struct {
		from Side
		pkts [][]byte
	}{{Inside, out}, {Outside, in}, {Inside, out[:5]}, {Outside, in[:5]}}
}

// A batch gives what the same packets one at a time give: the same
// verdicts, the same bytes to the same sides, the same packets of the NAT's
// own (errors, fragments) in the same order, the same counters.
func TestBatchMatchesPackets(t *testing.T) {
	cfg := Config{External: []netip.Addr{ext1, ext6}, PortPreservation: true, MTU: 1400,
		UDP: Behaviors{Filtering: EndpointIndependent}}
	one, _ := packetNAT(t, cfg)
	many, _ := packetNAT(t, cfg)
	var b Batch
	for s, step := range batchSteps() {
		// One at a time: the packet translated in place is its own
		// output; anything else is the NAT's.
		var wantOwn []out
		var wantDrops []Drop
		var wantExtra []out
		for _, pkt := range step.pkts {
			buf := bytes.Clone(pkt)
			own := out{}
			emit := func(to Side, p []byte) {
				if len(p) > 0 && &p[0] == &buf[0] {
					own = out{to, string(p)}
					return
				}
				wantExtra = append(wantExtra, out{to, string(p)})
			}
			var why Drop
			if step.from == Inside {
				why = one.Outbound(buf, emit)
			} else {
				why = one.Inbound(buf, emit)
			}
			wantOwn, wantDrops = append(wantOwn, own), append(wantDrops, why)
		}
		bufs := make([][]byte, len(step.pkts))
		for i, p := range step.pkts {
			bufs[i] = bytes.Clone(p)
		}
		var extra []out
		emit := func(to Side, p []byte) { extra = append(extra, out{to, string(p)}) }
		var v []Verdict
		if step.from == Inside {
			v = many.OutboundBatch(&b, bufs, nil, emit)
		} else {
			v = many.InboundBatch(&b, bufs, nil, emit)
		}
		if len(v) != len(bufs) {
			t.Fatalf("step %d: %d verdicts for %d packets", s, len(v), len(bufs))
		}
		for i := range v {
			got := out{}
			if v[i].Len > 0 {
				got = out{v[i].To, string(bufs[i][:v[i].Len])}
			}
			if v[i].Drop != wantDrops[i] || got != wantOwn[i] {
				t.Errorf("step %d packet %d: %v, %v %x; one at a time %v, %v %x", s, i, v[i].Drop, got.to, got.pkt, wantDrops[i], wantOwn[i].to, wantOwn[i].pkt)
			}
			if fragment := len(got.pkt) > 8 && got.pkt[0]>>4 == 4 && (got.pkt[6]&0x3f != 0 || got.pkt[7] != 0); got.pkt != "" && !fragment {
				if err := verify([]byte(got.pkt)); err != nil {
					t.Errorf("step %d packet %d: %v", s, i, err)
				}
			}
		}
		if fmt.Sprint(extra) != fmt.Sprint(wantExtra) {
			t.Errorf("step %d: the NAT's own packets differ:\n%v\none at a time:\n%v", s, extra, wantExtra)
		}
	}
	m1, m2 := one.Metrics(), many.Metrics()
	if m1 != m2 {
		t.Errorf("metrics:\n%v\none at a time:\n%v", m2, m1)
	}
	// The steps cover what they are meant to.
	if m2.Drops[DropMalformed] == 0 || m2.Drops[DropTTL] == 0 || m2.Drops[DropTooBig] == 0 || m2.Drops[DropNoFlow] == 0 ||
		m2.Drops[DropTCPState] == 0 || m2.FlowsCreated < 6 {
		t.Errorf("the steps missed a case: %v", m2)
	}
}

// A batch of known flows allocates nothing, either way, once its Batch has
// grown.
func TestBatchNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	n, c := packetNAT(t, Config{PortPreservation: true})
	var outs, ins [][]byte
	for i := range 64 {
		src := ap("10.0.0.2", uint16(40000+i%8))
		o := build(spec{proto: ipUDP, src: src, dst: remote4, payload: []byte("ping")})
		one(t, n, c, true, bytes.Clone(o), Outside)
		outs = append(outs, o)
		ins = append(ins, build(spec{proto: ipUDP, src: remote4, dst: netip.AddrPortFrom(ext1, src.Port()), payload: []byte("pong")}))
	}
	o, i := make([][]byte, len(outs)), make([][]byte, len(ins))
	for k := range outs {
		o[k], i[k] = bytes.Clone(outs[k]), bytes.Clone(ins[k])
	}
	emit := func(Side, []byte) { t.Fatal("the NAT sent a packet of its own") }
	var b Batch
	if a := testing.AllocsPerRun(100, func() {
		for k := range outs {
			copy(o[k], outs[k])
			copy(i[k], ins[k])
		}
		for _, v := range n.OutboundBatch(&b, o, nil, emit) {
			if v.Drop != DropNone || v.To != Outside {
				t.Fatalf("outbound %v", v)
			}
		}
		for _, v := range n.InboundBatch(&b, i, nil, emit) {
			if v.Drop != DropNone || v.To != Inside {
				t.Fatalf("inbound %v", v)
			}
		}
	}); a != 0 {
		t.Errorf("%v allocations per pair of batches", a)
	}
}

// partialOf turns the full transport checksum of b (TCP or UDP, no IPv6
// extension headers) into a partial one: the folded pseudo-header sum, as
// a sender that offloads its checksum leaves it.
func partialOf(b []byte) []byte {
	b = bytes.Clone(b)
	src, dst, proto := addrs(b)
	off := l4Offset(b)
	binary.BigEndian.PutUint16(b[off+csumOff(proto):], ^checksum(nil, pseudoSum(src, dst, proto, len(b)-off)))
	return b
}

// complete completes a partial checksum from scratch, as the receiver of
// its offload metadata does.
func complete(b []byte) []byte {
	b = bytes.Clone(b)
	_, _, proto := addrs(b)
	off := l4Offset(b)
	f := off + csumOff(proto)
	initial := uint32(binary.BigEndian.Uint16(b[f:]))
	b[f], b[f+1] = 0, 0
	binary.BigEndian.PutUint16(b[f:], checksum(b[off:], initial))
	return b
}

// Packets with partial checksums and GSO super-packets (offload metadata):
// translated either way, the partial checksum holds the new pseudo-header's
// sum (completed from scratch, it verifies); the MTU applies to a
// super-packet's segments; one fragmented by the NAT goes with its
// checksum completed; a partial checksum of another protocol is refused.
func TestBatchOffload(t *testing.T) {
	n, _ := packetNAT(t, Config{MTU: 1280, UDP: Behaviors{Filtering: EndpointIndependent}})
	var b Batch
	big := bytes.Repeat([]byte("0123456789"), 300)
	pkts := [][]byte{
		partialOf(build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 1})),
		partialOf(build(spec{proto: ipUDP, src: in4, dst: remote4, payload: big, df: true})),
		partialOf(build(spec{proto: ipUDP, src: in6, dst: remote6, payload: big})),
		partialOf(build(spec{proto: ipUDP, src: ap("10.0.0.2", 40001), dst: remote4, payload: big})), // no DF, no GSO: fragmented
		partialOf(build(spec{proto: ipUDP, src: ap("10.0.0.2", 40002), dst: remote4, payload: big, df: true})),
		partialOf(build(spec{proto: ipICMP, src: ap("10.0.0.2", 40003), dst: remote4, icmpType: icmpEcho})),
	}
	off := []Offload{{PartialChecksum: true}, {PartialChecksum: true, SegmentSize: 1000}, {PartialChecksum: true, SegmentSize: 1200},
		{PartialChecksum: true}, {PartialChecksum: true, SegmentSize: 1400}, {PartialChecksum: true}}
	want := []Drop{DropNone, DropNone, DropNone, DropNone, DropTooBig, DropUnsupported}
	var frags [][]byte
	emit := func(_ Side, p []byte) {
		if p[9] == ipUDP {
			frags = append(frags, bytes.Clone(p))
		}
	}
	v := n.OutboundBatch(&b, pkts, off, emit)
	for i, x := range v {
		if x.Drop != want[i] {
			t.Errorf("packet %d: %v, want %v", i, x.Drop, want[i])
			continue
		}
		if x.Len == 0 {
			continue
		}
		p := pkts[i][:x.Len]
		if src, _, _ := addrs(p); src != ext1 && src != ext6 {
			t.Errorf("packet %d went out from %v", i, src)
		}
		if err := verify(complete(p)); err != nil {
			t.Errorf("packet %d, its partial checksum completed: %v", i, err)
		}
	}
	if whole := reassemble(t, frags); verify(whole) != nil {
		t.Errorf("the NAT's fragments: %v", verify(whole))
	}
	// The replies, partial too, to the ports the NAT gave (not the
	// inside ones: the ports' change must not touch a partial checksum).
	tcpPort, udpPort := binary.BigEndian.Uint16(pkts[0][20:]), binary.BigEndian.Uint16(pkts[2][40:])
	if tcpPort == in4.Port() || udpPort == in6.Port() {
		t.Fatalf("the NAT kept the ports %d and %d", tcpPort, udpPort)
	}
	back := [][]byte{
		partialOf(build(spec{proto: ipTCP, src: remote4, dst: netip.AddrPortFrom(ext1, tcpPort), flags: tcpSYN | tcpACK, seq: 9, ack: 2})),
		partialOf(build(spec{proto: ipUDP, src: remote6, dst: netip.AddrPortFrom(ext6, udpPort), payload: big})),
	}
	for i, x := range n.InboundBatch(&b, back, []Offload{{PartialChecksum: true}, {PartialChecksum: true, SegmentSize: 1000}}, emit) {
		if x.Drop != DropNone || x.To != Inside {
			t.Fatalf("reply %d: %v", i, x)
		}
		if _, dst, _ := addrs(back[i]); dst != in4.Addr() && dst != in6.Addr() {
			t.Errorf("reply %d went to %v", i, dst)
		}
		if err := verify(complete(back[i][:x.Len])); err != nil {
			t.Errorf("reply %d, its partial checksum completed: %v", i, err)
		}
	}
}
