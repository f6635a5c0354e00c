package nat

import "sync"

// TCP connection tracking, after conntrack's (nf_conntrack_proto_tcp.c,
// tcp_packet and tcp_in_window): a flow's state follows the segments both
// ways, a flow is established only once the three-way handshake is
// complete, and a RST, FIN or SYN counts only if its sequence number lies
// in the window the tracker has seen: blind ones are dropped and counted
// (DropOutOfWindow) and change nothing, not even the flow's clock. Other
// segments outside the window (sequence or ack) are forwarded without
// changing the state, as the endpoints, not the NAT, judge data.
//
// What an endpoint would accept, the tracker lets through:
//   - a RST that acknowledges the SYN it answers (a closed port's
//     refusal, RFC 793's SYN-SENT rule);
//   - a RST in the window closes the flow only at the exact sequence the
//     receiver expects (RFC 5961 3.2); another in the window is forwarded,
//     for the receiver's challenge ACK, and the flow kept;
//   - the originator's SYN again (a retransmission keeps the state, a new
//     ISN before the answer starts the handshake again), and its SYN on a
//     flow it has lost (a host that rebooted connects from the same port):
//     forwarded, and the flow tracked anew once the other side answers it
//     with a SYN-ACK, or closed if it answers with a RST.
// Segments with flags no TCP sends together (SYN with FIN or RST, FIN
// with RST, FIN without ACK, none of SYN, ACK, RST) are refused
// (DropTCPState), as conntrack's tcp_valid_flags does.

// tcpState is a TCP flow's state, as conntrack names them.
type tcpState uint32

const (
	tcpNone        tcpState = iota // not tracked (made by MapOutbound)
	tcpSynSent                     // the originator's SYN
	tcpSynSent2                    // SYNs both ways (simultaneous open)
	tcpSynRecv                     // the SYN answered
	tcpEstablished                 // the handshake's last ACK seen
	tcpFinWait                     // a FIN one way
	tcpCloseWait                   // that FIN acknowledged
	tcpLastAck                     // FINs both ways, the second not acknowledged
	tcpTimeWait                    // FINs both ways, both acknowledged
	tcpClose                       // a RST in the window
)

var tcpStateNames = [...]string{"NONE", "SYN_SENT", "SYN_SENT2", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE"}

func (s tcpState) String() string {
	if int(s) < len(tcpStateNames) {
		return tcpStateNames[s]
	}
	return "?"
}

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// tcpSeg is what the tracker reads of a segment. dir is 0 for a segment
// from inside, 1 from outside.
type tcpSeg struct {
	dir      int
	flags    uint8
	seq, ack uint32
	win      uint16
	wscale   int8 // the window scale option of a SYN, -1 if none
	len      uint32
}

// tcpDir is what the tracker knows of one direction's sender.
type tcpDir struct {
	end    uint32 // the highest sequence number sent, plus one
	maxend uint32 // the highest it may send: the other's ack plus window
	maxwin uint32 // the largest window it advertised
	scale  uint8
	wsopt  int8 // the window scale option of its SYN, -1 if none
	init   bool
	fin    bool   // it sent a FIN
	finEnd uint32 // the sequence number past its FIN
	finAck bool   // its FIN was acknowledged
	// acked is the highest ack it sent, if ackSet: the other side's
	// sequence it expects next, where that side's RST must fall.
	acked  uint32
	ackSet bool
}

// tcpTrack is a TCP flow's tracker. state is read without the lock, for
// the flow's timeout; everything else is under mu.
type tcpTrack struct {
	mu    sync.Mutex
	state atomicState
	orig  int // the direction of the first SYN
	d     [2]tcpDir
	// resyn is the originator's last SYN on a flow past the handshake, if
	// resynSet: the start of a connection the flow has lost, if the other
	// side answers it (see update).
	resyn    tcpSeg
	resynSet bool
}

// stateNow returns the state without the lock; tcpNone for a flow of
// another protocol (nil t).
func (t *tcpTrack) stateNow() tcpState {
	if t == nil {
		return tcpNone
	}
	return t.state.load()
}

// tracked reports whether the flow's segments are tracked (it was made by
// a packet, not by MapOutbound).
func (t *tcpTrack) tracked() bool { return t.stateNow() != tcpNone }

func before(a, b uint32) bool { return int32(a-b) < 0 }
func after(a, b uint32) bool  { return int32(b-a) < 0 }

// maxAckWindow is the least of how far behind the receiver's end an ack
// may be (conntrack's MAXACKWINDOW floor).
const maxAckWindow = 66000

// validTCPFlags reports whether a segment's SYN, ACK, RST and FIN flags
// are a combination TCP sends (conntrack's tcp_valid_flags).
func validTCPFlags(f uint8) bool {
	switch f & (tcpSYN | tcpACK | tcpRST | tcpFIN) {
	case tcpSYN, tcpSYN | tcpACK, tcpRST, tcpRST | tcpACK, tcpFIN | tcpACK, tcpACK:
		return true
	}
	return false
}

// update tracks segment s and returns the state after it, or
// DropOutOfWindow for a RST, FIN or SYN that does not count, or
// DropTCPState for one no state takes.
func (t *tcpTrack) update(s *tcpSeg) (tcpState, Drop) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.state.load()
	if !validTCPFlags(s.flags) {
		return st, DropTCPState
	}
	syn, ack := s.flags&tcpSYN != 0, s.flags&tcpACK != 0
	rst, fin := s.flags&tcpRST != 0, s.flags&tcpFIN != 0
	if st == tcpNone || (st == tcpTimeWait || st == tcpClose) && syn && !ack {
		// A new connection, or one taking the 4-tuple again after the
		// last closed (as conntrack lets a SYN reopen TIME_WAIT).
		if !syn || ack {
			return st, DropTCPState
		}
		return t.restart(s), DropNone
	}
	snd, rcv := &t.d[s.dir], &t.d[1-s.dir]
	if t.resynSet && s.dir != t.orig && ack && s.ack == t.resyn.seq+1 && (syn || rst) {
		// The other side answers the originator's new SYN: the flow's
		// connection is gone, and this is the new one's (or its refusal).
		syn0 := t.resyn
		t.restart(&syn0)
		if rst {
			t.state.store(tcpClose)
			return tcpClose, DropNone
		}
		t.open(s)
		t.state.store(tcpSynRecv)
		return tcpSynRecv, DropNone
	}
	if syn {
		switch {
		case st == tcpSynSent && s.dir == t.orig && !ack:
			if s.seq+1 != snd.end {
				t.restart(s) // a new ISN: the handshake again
			}
			return tcpSynSent, DropNone
		case st == tcpSynSent && s.dir != t.orig && ack:
			if s.ack != rcv.end {
				return st, DropOutOfWindow
			}
			t.open(s)
			t.state.store(tcpSynRecv)
			return tcpSynRecv, DropNone
		case st == tcpSynSent && s.dir != t.orig && !ack:
			t.open(s) // simultaneous open
			t.state.store(tcpSynSent2)
			return tcpSynSent2, DropNone
		case st == tcpSynSent2 && ack:
			if !snd.init {
				t.open(s)
			}
			t.scales()
			t.state.store(tcpSynRecv)
			return tcpSynRecv, DropNone
		case st == tcpSynRecv && ack && s.dir != t.orig:
			return st, DropNone // the SYN-ACK again
		case st == tcpSynRecv && !ack && s.dir == t.orig && s.seq+1 == snd.end:
			return st, DropNone // the SYN again, its SYN-ACK lost
		case !ack && s.dir == t.orig:
			// The originator's SYN on a flow it has lost: forwarded, the
			// state kept until the other side answers it.
			t.resyn, t.resynSet = *s, true
			return st, DropNone
		}
		return st, DropOutOfWindow // a SYN inside a connection: blind, or not ours
	}
	if !snd.init || !rcv.init {
		// Before both sides sent their SYN, a RST ends the attempt only
		// with the originator's SYN's sequence, or from the other side
		// acknowledging that SYN (a refusal).
		if rst && (snd.init && s.seq == snd.end || rcv.init && ack && s.ack == rcv.end) {
			t.state.store(tcpClose)
			return tcpClose, DropNone
		}
		if rst || fin {
			return st, DropOutOfWindow
		}
		return st, DropNone
	}
	end := s.seq + s.len
	if fin {
		end++
	}
	// tcp_in_window's two sequence bounds: not past what the receiver
	// allowed, not before what it may still accept again; and its ack
	// bounds: not past what the receiver sent, not older than the
	// sender's largest window (at least 66,000, conntrack's
	// MAXACKWINDOW) before it.
	in := !after(s.seq, snd.maxend) && !before(end, snd.end-rcv.maxwin) &&
		(!ack || !after(s.ack, rcv.end) && !before(s.ack, rcv.end-max(snd.maxwin, maxAckWindow)))
	if !in {
		if rst || fin {
			return st, DropOutOfWindow
		}
		return st, DropNone
	}
	if rst {
		// RFC 5961 3.2: the receiver takes a RST at the sequence it
		// expects next (its last ack; or the sender's end, as a RST
		// right after data is) and answers another in the window with
		// a challenge ACK, the connection kept; one before its ack is
		// stale. conntrack keeps the state for such RSTs too.
		switch {
		case rcv.ackSet && before(s.seq, rcv.acked):
			return st, DropOutOfWindow
		case st >= tcpEstablished && s.seq != snd.end && !(rcv.ackSet && s.seq == rcv.acked):
			return st, DropNone
		}
		t.state.store(tcpClose)
		return tcpClose, DropNone
	}
	win := uint32(s.win) << snd.scale
	if after(end, snd.end) {
		snd.end = end
	}
	snd.maxwin = max(snd.maxwin, win, 1)
	if ack && after(s.ack+win, rcv.maxend) {
		rcv.maxend = s.ack + win
	}
	if ack && (!snd.ackSet || after(s.ack, snd.acked)) {
		snd.acked, snd.ackSet = s.ack, true
	}
	if ack && rcv.fin && !before(s.ack, rcv.finEnd) {
		rcv.finAck = true
	}
	if fin && !snd.fin {
		snd.fin, snd.finEnd = true, end
	}
	next := st
	switch {
	case st == tcpSynRecv && s.dir == t.orig && ack && !before(s.ack, rcv.end):
		next = tcpEstablished
		if snd.fin {
			next = tcpFinWait
		}
	case st < tcpEstablished:
	case snd.fin && rcv.fin && snd.finAck && rcv.finAck:
		next = tcpTimeWait
	case snd.fin && rcv.fin:
		next = tcpLastAck
	case (snd.fin && snd.finAck) || (rcv.fin && rcv.finAck):
		next = tcpCloseWait
	case snd.fin || rcv.fin:
		next = tcpFinWait
	}
	if next != st {
		t.state.store(next)
	}
	return next, DropNone
}

// restart tracks the connection that SYN s starts, from its
// originator, forgetting the flow's last one; it returns the state.
func (t *tcpTrack) restart(s *tcpSeg) tcpState {
	t.d = [2]tcpDir{}
	t.resynSet = false
	t.orig = s.dir
	t.open(s)
	t.state.store(tcpSynSent)
	return tcpSynSent
}

// scales sets both sides' window scales once both SYNs are seen: each
// side's own option, if both offered one (RFC 7323), else none.
func (t *tcpTrack) scales() {
	a, b := &t.d[0], &t.d[1]
	if a.wsopt >= 0 && b.wsopt >= 0 {
		a.scale, b.scale = uint8(min(a.wsopt, 14)), uint8(min(b.wsopt, 14))
	}
}

// open starts tracking the sender of SYN s.
func (t *tcpTrack) open(s *tcpSeg) {
	snd, rcv := &t.d[s.dir], &t.d[1-s.dir]
	*snd = tcpDir{init: true, wsopt: s.wscale}
	snd.end = s.seq + 1 + s.len
	snd.maxwin = max(uint32(s.win), 1)
	snd.maxend = snd.end
	if s.flags&tcpACK != 0 {
		// A SYN-ACK: its ack and window bound the other side, and both
		// scale their windows only if both SYNs offered to (RFC 7323).
		rcv.maxend = s.ack + uint32(s.win)
		t.scales()
		snd.maxend = snd.end + rcv.maxwin
	}
}

// trackTCP runs segment s through f's tracker: an established flow becomes
// assured, out of early drop's reach, and a flow whose timeout shrank is
// filed again in the wheel.
func (n *NAT) trackTCP(f *flow, s *tcpSeg) Drop {
	was := f.tcp.stateNow()
	st, why := f.tcp.update(s)
	if why != DropNone {
		return why
	}
	if st != was {
		if st >= tcpEstablished && st != tcpClose {
			n.assure(f)
		}
		n.reschedule(f)
	}
	return DropNone
}
