package nat

import "testing"

// A handshake, data, and closes, through the tracker: established only
// after the third segment; RSTs, FINs and SYNs outside the window change
// nothing and are refused.
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
		{in, tcpRST | tcpACK, 12345, isnA + 1, 0, tcpSynSent, DropOutOfWindow}, // blind RST before the SYN-ACK
		{in, tcpSYN | tcpACK, isnB, isnA + 7, 0, tcpSynSent, DropOutOfWindow},  // acks the wrong sequence
		{in, tcpSYN | tcpACK, isnB, isnA + 1, 0, tcpSynRecv, DropNone},
		{out, tcpACK, isnA + 1, isnB + 1, 0, tcpEstablished, DropNone},
		{out, tcpACK, isnA + 1, isnB + 1, 100, tcpEstablished, DropNone},
		{in, tcpRST, 12345, 0, 0, tcpEstablished, DropOutOfWindow}, // blind
		{in, tcpFIN | tcpACK, 12345, isnA + 101, 0, tcpEstablished, DropOutOfWindow},
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
	run("rst", append(open[:len(open):len(open)], step{in, tcpRST, isnB + 51, 0, 0, tcpClose, DropNone}))
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
}
