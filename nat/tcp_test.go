package nat

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

// A handshake, data, and closes, through the tracker: established only
// after the third segment; RSTs, FINs and SYNs outside the window change
// nothing and are refused; what an endpoint would accept passes (a
// refusal of the SYN, a RST in the window but not at the expected
// sequence, which keeps the flow, the originator's SYN again or anew).
func TestTCPTracking(t *testing.T) {
	const out, in = 0, 1
	type step struct {
		dir      int
		flags    uint8
		seq, ack uint32
		len      uint32
		want     tcpState
		drop     Drop
	}
	const isnA, isnB = 1000, 5000000
	open := []step{
		{out, tcpSYN, isnA, 0, 0, tcpSynSent, DropNone},
		{in, tcpRST | tcpACK, 12345, isnA + 2, 0, tcpSynSent, DropOutOfWindow}, // blind RST before the SYN-ACK
		{in, tcpRST, 0, 0, 0, tcpSynSent, DropOutOfWindow},                     // acknowledges nothing
		{in, tcpSYN | tcpACK, isnB, isnA + 7, 0, tcpSynSent, DropOutOfWindow},  // acks the wrong sequence
		{in, tcpSYN | tcpACK, isnB, isnA + 1, 0, tcpSynRecv, DropNone},
		{out, tcpACK, isnA + 1, isnB + 1, 0, tcpEstablished, DropNone},
		{out, tcpACK, isnA + 1, isnB + 1, 100, tcpEstablished, DropNone},
		{in, tcpRST, 12345, 0, 0, tcpEstablished, DropOutOfWindow}, // blind
		{in, tcpFIN | tcpACK, 12345, isnA + 101, 0, tcpEstablished, DropOutOfWindow},
		{in, tcpFIN | tcpACK, isnB + 1, isnA + 5000, 0, tcpEstablished, DropOutOfWindow},              // acks what was never sent
		{in, tcpRST | tcpACK, isnB + 1, 1<<32 - 1e6 + isnA + 101, 0, tcpEstablished, DropOutOfWindow}, // an ack far too old
		{in, tcpSYN, 777, 0, 0, tcpEstablished, DropOutOfWindow},
		{out, tcpRST, isnA + 1e9, 0, 0, tcpEstablished, DropOutOfWindow},
		{in, tcpACK, isnB + 1, isnA + 101, 50, tcpEstablished, DropNone},
	}
	run := func(name string, steps []step) *tcpTrack {
		tr := &tcpTrack{}
		for i, s := range steps {
			seg := tcpSeg{dir: s.dir, flags: s.flags, seq: s.seq, ack: s.ack, win: 65535, wscale: -1, len: s.len}
			st, why := tr.update(&seg)
			if st != s.want || why != s.drop {
				t.Fatalf("%s step %d (%+v): %v %v, want %v %v", name, i, s, st, why, s.want, s.drop)
			}
		}
		return tr
	}
	run("open", open)
	then := func(more ...step) []step { return append(open[:len(open):len(open)], more...) }
	run("rst", then(step{in, tcpRST, isnB + 51, 0, 0, tcpClose, DropNone}))
	run("rst at the ack", then(step{out, tcpRST, isnA + 101, 0, 0, tcpClose, DropNone}))
	run("rst inexact", then(
		step{in, tcpRST, isnB + 51 + 1000, 0, 0, tcpEstablished, DropNone}, // RFC 5961: a challenge ACK
		step{out, tcpACK, isnA + 101, isnB + 51, 0, tcpEstablished, DropNone},
		step{in, tcpRST, isnB + 50, 0, 0, tcpEstablished, DropOutOfWindow}, // before the ack: stale
	))
	run("refused", []step{
		{out, tcpSYN, isnA, 0, 0, tcpSynSent, DropNone},
		{in, tcpRST | tcpACK, 0, isnA + 1, 0, tcpClose, DropNone},
	})
	run("syn again", []step{
		{out, tcpSYN, isnA, 0, 0, tcpSynSent, DropNone},
		{out, tcpSYN, isnA, 0, 0, tcpSynSent, DropNone},
		{out, tcpSYN, isnA + 5e6, 0, 0, tcpSynSent, DropNone}, // a new ISN: the handshake again
		{in, tcpSYN | tcpACK, isnB, isnA + 1, 0, tcpSynSent, DropOutOfWindow},
		{in, tcpSYN | tcpACK, isnB, isnA + 5e6 + 1, 0, tcpSynRecv, DropNone},
		{out, tcpSYN, isnA + 5e6, 0, 0, tcpSynRecv, DropNone}, // its SYN-ACK lost on the way in
		{out, tcpACK, isnA + 5e6 + 1, isnB + 1, 0, tcpEstablished, DropNone},
	})
	// A host that lost the connection connects again from the same port.
	run("resyn", then(
		step{out, tcpSYN, 3e9, 0, 0, tcpEstablished, DropNone},
		step{in, tcpACK, isnB + 51, isnA + 101, 0, tcpEstablished, DropNone}, // the old connection's
		step{in, tcpSYN | tcpACK, 7e6, 3e9 + 1, 0, tcpSynRecv, DropNone},
		step{out, tcpACK, 3e9 + 1, 7e6 + 1, 0, tcpEstablished, DropNone},
	))
	run("resyn refused", then(
		step{out, tcpSYN, 3e9, 0, 0, tcpEstablished, DropNone},
		step{in, tcpRST | tcpACK, 0, 3e9 + 2, 0, tcpEstablished, DropOutOfWindow},
		step{in, tcpRST | tcpACK, 0, 3e9 + 1, 0, tcpClose, DropNone},
	))
	closeSteps := append(open[:len(open):len(open)],
		step{out, tcpFIN | tcpACK, isnA + 101, isnB + 51, 0, tcpFinWait, DropNone},
		step{in, tcpACK, isnB + 51, isnA + 102, 0, tcpCloseWait, DropNone},
		step{in, tcpFIN | tcpACK, isnB + 51, isnA + 102, 0, tcpLastAck, DropNone},
		step{out, tcpACK, isnA + 102, isnB + 52, 0, tcpTimeWait, DropNone},
		step{out, tcpSYN, isnA + 100000, 0, 0, tcpSynSent, DropNone}, // the tuple used again
	)
	run("close", closeSteps)
	// Simultaneous open.
	run("simultaneous", []step{
		{out, tcpSYN, isnA, 0, 0, tcpSynSent, DropNone},
		{in, tcpSYN, isnB, 0, 0, tcpSynSent2, DropNone},
		{out, tcpSYN | tcpACK, isnA, isnB + 1, 0, tcpSynRecv, DropNone},
		{out, tcpACK, isnA + 1, isnB + 1, 0, tcpEstablished, DropNone},
	})
	// Only a SYN starts tracking.
	tr := &tcpTrack{}
	if _, why := tr.update(&tcpSeg{flags: tcpACK, wscale: -1}); why != DropTCPState {
		t.Errorf("an ACK first: %v", why)
	}
	// Flags no TCP sends together, first or on an established flow.
	for _, f := range []uint8{tcpSYN | tcpFIN, tcpSYN | tcpRST, tcpFIN | tcpRST | tcpACK, tcpFIN, 0, tcpSYN | tcpACK | tcpFIN} {
		if _, why := (&tcpTrack{}).update(&tcpSeg{flags: f, wscale: -1}); why != DropTCPState {
			t.Errorf("flags %#x first: %v", f, why)
		}
		run(fmt.Sprintf("flags %#x", f), then(step{in, f, isnB + 51, isnA + 101, 0, tcpEstablished, DropTCPState}))
	}
}

// Window scaling (RFC 7323) is in force after a simultaneous open as after
// a handshake: a FIN 20,000 bytes into a window of 512<<7 passes.
func TestTCPWindowScale(t *testing.T) {
	const out, in = 0, 1
	const a, b = 1000, 5000000
	type step struct {
		dir      int
		flags    uint8
		seq, ack uint32
		win      uint16
		ws       int8
		len      uint32
	}
	tail := []step{
		{in, tcpACK, b + 1, a + 1, 512, -1, 0},
		{out, tcpACK, a + 1, b + 1, 512, -1, 10000},
		{out, tcpACK, a + 10001, b + 1, 512, -1, 10000},
		{out, tcpFIN | tcpACK, a + 20001, b + 1, 512, -1, 0},
	}
	for name, open := range map[string][]step{
		"handshake": {
			{out, tcpSYN, a, 0, 65535, 7, 0},
			{in, tcpSYN | tcpACK, b, a + 1, 65535, 7, 0},
			{out, tcpACK, a + 1, b + 1, 512, -1, 0},
		},
		"simultaneous": {
			{out, tcpSYN, a, 0, 65535, 7, 0},
			{in, tcpSYN, b, 0, 65535, 7, 0},
			{out, tcpSYN | tcpACK, a, b + 1, 65535, 7, 0},
			{in, tcpSYN | tcpACK, b, a + 1, 65535, 7, 0},
			{out, tcpACK, a + 1, b + 1, 512, -1, 0},
		},
	} {
		tr := &tcpTrack{}
		for i, s := range append(open, tail...) {
			seg := tcpSeg{dir: s.dir, flags: s.flags, seq: s.seq, ack: s.ack, win: s.win, wscale: s.ws, len: s.len}
			if _, why := tr.update(&seg); why != DropNone {
				t.Fatalf("%s, step %d: %v", name, i, why)
			}
		}
	}
}

// A server's RST answering a SYN to a closed port (seq 0, the SYN
// acknowledged) reaches the client, as "connection refused": RFC 793 and
// RFC 5961 3.2 take it in SYN-SENT.
func TestTCPRefusalDelivered(t *testing.T) {
	n, _, c := clockedNAT(t, Config{})
	syn := one(t, n, c, true, build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 1000}), Outside)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(syn[20:]))
	c.reset()
	rst := build(spec{proto: ipTCP, src: remote4, dst: ext, flags: tcpRST | tcpACK, seq: 0, ack: 1001})
	if why := n.Inbound(rst, c.emit); why != DropNone || len(c.pkts) != 1 {
		t.Fatalf("RST|ACK answering the SYN (seq 0, ack isn+1): %v, %d packets; want it delivered inside", why, len(c.pkts))
	}
}

// RFC 5961 3.2: a RST in the window but not at RCV.NXT gets a challenge
// ACK and the connection stays; so does the flow, ESTABLISHED, past
// TCPClose.
func TestTCPInexactRSTKeepsFlow(t *testing.T) {
	n, clk, c := clockedNAT(t, Config{})
	ext := packetHandshake(t, n, c)
	// Off-path RST: in the window (65535), 30000 past RCV.NXT (5001).
	c.reset()
	n.Inbound(build(spec{proto: ipTCP, src: remote4, dst: ext, flags: tcpRST, seq: 5001 + 30000}), c.emit)
	if f := n.proto[TCP].lookupOut(&hash4.Tuple{Local: in4, Remote: remote4}); f == nil || f.tcp.stateNow() != tcpEstablished {
		t.Errorf("after an in-window RST with seq != RCV.NXT: flow %v; want it ESTABLISHED (RFC 5961 challenge ACK)", f)
	}
	clk.advance(20 * time.Second)
	if flows, _ := n.Len(); flows != 1 {
		t.Errorf("the flow expired 20 s after a non-exact in-window RST; the endpoints still have the connection")
	}
}

// A RST outside the window is dropped and changes nothing, the flow's
// clock included: blind RSTs do not keep a flow alive past its timeout.
func TestTCPBlindRSTNoRefresh(t *testing.T) {
	n, clk, c := clockedNAT(t, Config{})
	syn := one(t, n, c, true, build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 1000}), Outside)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(syn[20:]))
	to := n.Config().Timeouts.TCPSynSent
	for i := 0; i < 10; i++ {
		clk.advance(to / 4)
		why := n.Inbound(build(spec{proto: ipTCP, src: remote4, dst: ext, flags: tcpRST, seq: 777}), c.emit)
		if flows, _ := n.Len(); why != DropOutOfWindow && !(why == DropNoFlow && flows == 0) {
			t.Fatalf("blind RST %d: %v", i, why)
		}
	}
	// 10 * TCPSynSent/4 = 2.5 timeouts with no valid packet.
	clk.advance(time.Second)
	if flows, _ := n.Len(); flows != 0 {
		t.Errorf("a SYN_SENT flow outlived its %v timeout by 2.5x on DropOutOfWindow RSTs alone: %d flows", to, flows)
	}
}

// RFC 5382 REQ-5: "The value of the 'transitory connection idle-timeout'
// MUST NOT be less than 4 minutes" (partly open or closing connections).
func TestTCPTransitoryTimeouts(t *testing.T) {
	d := DefaultTimeouts
	for name, v := range map[string]time.Duration{
		"TCPSynSent": d.TCPSynSent, "TCPSynRecv": d.TCPSynRecv, "TCPFinWait": d.TCPFinWait,
		"TCPCloseWait": d.TCPCloseWait, "TCPLastAck": d.TCPLastAck,
	} {
		if v < 4*time.Minute {
			t.Errorf("default %s %v < 4m (RFC 5382 REQ-5 transitory idle-timeout)", name, v)
		}
	}
}

// An inside host whose connection died without a FIN or RST (it rebooted)
// connects again from the same port: its SYN meets the flow still
// ESTABLISHED, is forwarded, and the server's SYN-ACK for it starts the
// flow anew, as conntrack resynchronises.
func TestTCPNewConnectionOnLostFlow(t *testing.T) {
	n, clk, c := clockedNAT(t, Config{})
	ext := packetHandshake(t, n, c)
	clk.advance(10 * time.Minute)
	c.reset()
	if why := n.Outbound(build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 3000000000}), c.emit); why != DropNone {
		t.Fatalf("a new connection's SYN from the same inside endpoint, 10 min after the old one went quiet: %v", why)
	}
	one(t, n, c, false, build(spec{proto: ipTCP, src: remote4, dst: ext, flags: tcpSYN | tcpACK, seq: 9000, ack: 3000000001}), Inside)
	f := n.proto[TCP].lookupOut(&hash4.Tuple{Local: in4, Remote: remote4})
	if st := f.tcp.stateNow(); st != tcpSynRecv {
		t.Errorf("after the SYN-ACK of the new connection: %v, want SYN_RECV", st)
	}
}

// packetHandshake makes the TCP flow in4 -> remote4 (ISNs 1000 and 5000) through
// n's packets, and returns its external endpoint.
func packetHandshake(t *testing.T, n *NAT, c *collect) netip.AddrPort {
	t.Helper()
	syn := one(t, n, c, true, build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpSYN, seq: 1000}), Outside)
	ext := netip.AddrPortFrom(ext1, binary.BigEndian.Uint16(syn[20:]))
	one(t, n, c, false, build(spec{proto: ipTCP, src: remote4, dst: ext, flags: tcpSYN | tcpACK, seq: 5000, ack: 1001}), Inside)
	one(t, n, c, true, build(spec{proto: ipTCP, src: in4, dst: remote4, flags: tcpACK, seq: 1001, ack: 5001}), Outside)
	return ext
}
