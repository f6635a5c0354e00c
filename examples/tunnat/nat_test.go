package main

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

// testNAT returns a NAT over ports with short timeouts.
func testNAT(t *testing.T, ports hash4.PortRange) *nat {
	t.Helper()
	n, err := newNAT(natConfig{external4: ext4, external6: ext6, ports: ports, maxFlows: 1000, timeouts: timeouts{
		udp: time.Second, icmp: time.Second, tcpSyn: time.Second, tcpEstablished: time.Hour,
		tcpFin: 2 * time.Second, tcpTimeWait: 3 * time.Second, tcpClose: 4 * time.Second,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// reply returns the server's answer to a translated packet b: addresses
// and ports swapped, echo requests turned into replies.
func reply(t *testing.T, b []byte, flags uint8, payload []byte) []byte {
	t.Helper()
	p, why := parse(b)
	if why != dropNone {
		t.Fatalf("translated packet does not parse: %v", why)
	}
	s := pktSpec{proto: p.proto, src: netip.AddrPortFrom(p.dst, p.dport), dst: netip.AddrPortFrom(p.src, p.sport), flags: flags, payload: payload}
	switch p.icmpType {
	case icmpEchoRequest:
		s.icmpType, s.src = icmpEchoReply, netip.AddrPortFrom(p.dst, p.sport)
	case icmpv6EchoRequest:
		s.icmpType, s.src = icmpv6EchoReply, netip.AddrPortFrom(p.dst, p.sport)
	}
	return build(s)
}

// Each kind of packet goes out with the external address, its reply comes
// back to the client, checksums right both ways; a second packet of the
// flow keeps its port.
func TestNATRoundTrip(t *testing.T) {
	n := testNAT(t, hash4.PortRange{Low: 30000, High: 30099})
	now := time.Now().UnixNano()
	for _, s := range specs() {
		out, why := n.outbound(build(s), now)
		if why != dropNone {
			t.Fatalf("%+v: outbound dropped: %v", s, why)
		}
		if err := verifyChecksums(out); err != nil {
			t.Errorf("outbound: %v", err)
		}
		p, _ := parse(out)
		if want := n.external(&p); p.src != want || p.sport < 30000 || p.sport > 30099 || p.dst != s.dst.Addr() {
			t.Errorf("%+v: went out as %v:%d -> %v", s, p.src, p.sport, p.dst)
		}
		again, _ := n.outbound(build(s), now)
		if q, _ := parse(again); q.sport != p.sport {
			t.Errorf("second packet of the flow left from port %d, the first from %d", q.sport, p.sport)
		}
		flags := uint8(0)
		if s.proto == protoTCP {
			flags = tcpSYN | tcpACK
		}
		in, why := n.inbound(reply(t, out, flags, []byte("back")), now)
		if why != dropNone {
			t.Fatalf("%+v: inbound dropped: %v", s, why)
		}
		if err := verifyChecksums(in); err != nil {
			t.Errorf("inbound: %v", err)
		}
		q, _ := parse(in)
		if q.dst != s.src.Addr() || q.dport != s.src.Port() || q.src != s.dst.Addr() {
			t.Errorf("%+v: reply came back as %v:%d -> %v:%d", s, q.src, q.sport, q.dst, q.dport)
		}
		if !bytes.HasSuffix(in, []byte("back")) {
			t.Errorf("payload changed")
		}
	}
	st := n.stats()
	if st.FlowsCreated != int64(len(specs())) || st.PktsOut != 2*int64(len(specs())) || st.PktsIn != int64(len(specs())) || st.dropped() != 0 {
		t.Errorf("counters: %v", st)
	}
}

// With a range of two ports, a third flow is dropped and counted, and the
// two existing flows go on.
func TestNATPortExhaustion(t *testing.T) {
	n := testNAT(t, hash4.PortRange{Low: 30000, High: 30001})
	now := time.Now().UnixNano()
	var outs [][]byte
	for i := range 3 {
		s := pktSpec{proto: protoUDP, src: netip.AddrPortFrom(client4.Addr(), uint16(40000+i)), dst: server4}
		out, why := n.outbound(build(s), now)
		if i < 2 && why != dropNone || i == 2 && why != dropNoPort {
			t.Fatalf("flow %d: %v", i, why)
		}
		if out != nil {
			outs = append(outs, out)
		}
	}
	for _, out := range outs {
		if _, why := n.inbound(reply(t, out, 0, nil), now); why != dropNone {
			t.Errorf("reply to an existing flow: %v", why)
		}
	}
	if st := n.stats(); st.Drops[dropNoPort] != 1 || st.FlowsActive != 2 {
		t.Errorf("counters: %v", st)
	}
}

// An idle flow expires, its reply is then dropped, and its port goes to
// the next flow.
func TestNATExpiryAndReuse(t *testing.T) {
	n := testNAT(t, hash4.PortRange{Low: 30000, High: 30000})
	now := time.Now().UnixNano()
	out, why := n.outbound(build(pktSpec{proto: protoUDP, src: client4, dst: server4}), now)
	if why != dropNone {
		t.Fatal(why)
	}
	other := pktSpec{proto: protoUDP, src: netip.AddrPortFrom(client4.Addr(), 40001), dst: server4}
	if _, why := n.outbound(build(other), now); why != dropNoPort {
		t.Fatalf("second flow with one port: %v", why)
	}
	if got := n.reap(now + int64(time.Second/2)); got != 0 {
		t.Fatalf("reaped %d flows before their timeout", got)
	}
	if got := n.reap(now + int64(2*time.Second)); got != 1 {
		t.Fatalf("reaped %d flows, want 1", got)
	}
	if _, why := n.inbound(reply(t, out, 0, nil), now); why != dropNoFlow {
		t.Errorf("reply to an expired flow: %v", why)
	}
	out2, why := n.outbound(build(other), now)
	if why != dropNone {
		t.Fatalf("new flow after expiry: %v", why)
	}
	if p, _ := parse(out2); p.sport != 30000 {
		t.Errorf("new flow got port %d, want the freed 30000", p.sport)
	}
	if st := n.stats(); st.FlowsExpired != 1 || st.FlowsCreated != 2 || st.FlowsActive != 1 {
		t.Errorf("counters: %v", st)
	}
}

// The TCP timeout follows the flags seen both ways; only a SYN opens a
// flow.
func TestNATTCPStates(t *testing.T) {
	n := testNAT(t, hash4.PortRange{Low: 30000, High: 30099})
	now := time.Now().UnixNano()
	seg := func(flags uint8) []byte {
		return build(pktSpec{proto: protoTCP, src: client4, dst: server4, flags: flags})
	}
	if _, why := n.outbound(seg(tcpACK), now); why != dropNoFlow {
		t.Errorf("ACK with no flow: %v", why)
	}
	out, why := n.outbound(seg(tcpSYN), now)
	if why != dropNone {
		t.Fatal(why)
	}
	m, _ := n.t[0].in.Lookup(hash4.Tuple{Local: client4, Remote: server4})
	steps := []struct {
		out   bool
		flags uint8
		want  time.Duration
	}{
		{true, tcpSYN, n.cfg.timeouts.tcpSyn},
		{false, tcpSYN | tcpACK, n.cfg.timeouts.tcpEstablished},
		{true, tcpACK, n.cfg.timeouts.tcpEstablished},
		{true, tcpFIN | tcpACK, n.cfg.timeouts.tcpFin},
		{false, tcpFIN | tcpACK, n.cfg.timeouts.tcpTimeWait},
		{false, tcpRST, n.cfg.timeouts.tcpClose},
	}
	for i, s := range steps {
		var why dropReason
		if s.out {
			_, why = n.outbound(seg(s.flags), now)
		} else {
			_, why = n.inbound(reply(t, out, s.flags, nil), now)
		}
		if why != dropNone {
			t.Fatalf("step %d: %v", i, why)
		}
		if got := n.timeout(m.f); got != s.want {
			t.Errorf("step %d (flags %#x): timeout %v, want %v", i, s.flags, got, s.want)
		}
	}
	if got := n.reap(now + int64(n.cfg.timeouts.tcpClose) + 1); got != 1 {
		t.Errorf("reaped %d after RST and its timeout", got)
	}
}

// Bad packets both ways are counted by reason and dropped; nothing
// panics, and packets from the outside to another address are refused.
func TestNATDrops(t *testing.T) {
	n := testNAT(t, hash4.PortRange{Low: 30000, High: 30099})
	now := time.Now().UnixNano()
	udp := build(pktSpec{proto: protoUDP, src: client4, dst: server4, payload: []byte("x")})
	frag := bytes.Clone(udp)
	frag[6] |= 0x20
	gre := bytes.Clone(udp)
	gre[9] = 47
	for i := range len(udp) {
		n.outbound(bytes.Clone(udp[:i]), now) // every truncation: malformed, shorter than its IP length
	}
	n.outbound(frag, now)
	n.outbound(gre, now)
	n.inbound(build(pktSpec{proto: protoUDP, src: server4, dst: netip.AddrPortFrom(ext4, 30000)}), now)
	n.inbound(build(pktSpec{proto: protoUDP, src: server4, dst: client4}), now)
	n.outbound(build(pktSpec{proto: protoUDP, src: client4, dst: server4, ttl: 1}), now)
	n.outbound(build(pktSpec{proto: protoICMP, src: client4, dst: server4, icmpType: icmpEchoReply}), now)
	st := n.stats()
	if st.Drops[dropFragment] != 1 || st.Drops[dropNoFlow] != 1 || st.Drops[dropNotOurs] != 1 || st.Drops[dropTTL] != 1 || st.Drops[dropUnsupported] != 2 {
		t.Errorf("counters: %v", st)
	}
	if st.Drops[dropMalformed] != int64(len(udp)) {
		t.Errorf("%d truncations counted malformed, want %d: %v", st.Drops[dropMalformed], len(udp), st)
	}
	if st.PktsOut != 0 || st.PktsIn != 0 || st.FlowsCreated != 0 {
		t.Errorf("something was forwarded: %v", st)
	}
}
