package nat

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

// Flows expire a tick after their protocol's timeout (their clock, the
// NAT's, may lag their last packet by a tick), not before; a flow in use
// does not; an answered UDP flow takes the longer timeout.
func TestExpiryTimeouts(t *testing.T) {
	n, clk := newTest(t, Config{Timeouts: Timeouts{UDPUnreplied: 3 * time.Second, UDP: 10 * time.Second, ICMP: 5 * time.Second}})
	a, busy, answered := ap("10.0.0.2", 1000), ap("10.0.0.2", 1001), ap("10.0.0.2", 1002)
	r := ap("198.51.100.1", 53)
	mustOut(t, n, UDP, a, r)
	mustOut(t, n, UDP, busy, r)
	e := mustOut(t, n, UDP, answered, r)
	if _, why := n.MapInbound(UDP, r, e); why != DropNone {
		t.Fatal(why)
	}
	mustOut(t, n, ICMP, ap("10.0.0.2", 7), ap("198.51.100.1", 0))
	for s := 1; s <= 13; s++ {
		clk.advance(time.Second)
		if s < 8 {
			mustOut(t, n, UDP, busy, r)
		}
		flows, _ := n.Len()
		want := 4
		if s >= 3+1 {
			want-- // a
		}
		if s >= 5+1 {
			want-- // the echo
		}
		if s >= 10+1 {
			want-- // answered
		}
		if s >= 7+3+1 {
			want-- // busy, last used at 7
		}
		if flows != want {
			t.Fatalf("at %ds: %d flows, want %d", s, flows, want)
		}
	}
	if m := n.Metrics(); m.Expired[ExpiredTimeout] != 4 || m.Mappings != 0 {
		t.Errorf("metrics: %v", m)
	}
}

// Expire looks at no more flows than its budget, and the rest on the next
// call.
func TestExpireBudget(t *testing.T) {
	n, clk := newTest(t, Config{ExpireBudget: 30, Timeouts: Timeouts{UDPUnreplied: 2 * time.Second}})
	for i := range 100 {
		mustOut(t, n, UDP, ap("10.0.0.2", uint16(1000+i)), ap("198.51.100.1", 53))
	}
	clk.advance(2 * time.Second) // the timeout, and the tick its clock may lag
	got := []int{clk.advance(time.Second), clk.advance(0), clk.advance(0), clk.advance(0), clk.advance(0)}
	if got[0] != 30 || got[1] != 30 || got[2] != 30 || got[3] != 10 || got[4] != 0 {
		t.Errorf("expired per call %v, want 30 30 30 10 0", got)
	}
}

// At MaxFlows a new flow evicts an unanswered flow, the oldest of the host
// with the most;
// answered flows are never evicted, and a new flow is then refused. A
// host past MaxFlowsPerHost is refused while others go on.
func TestLimits(t *testing.T) {
	n, _ := newTest(t, Config{MaxFlows: 10, MaxFlowsPerHost: 8})
	r := ap("198.51.100.1", 53)
	var flood []netip.AddrPort
	for i := range 10 {
		h := ap("10.0.0.2", uint16(1000+i))
		if i >= 8 {
			h = ap("10.0.0.3", uint16(1000+i))
		}
		mustOut(t, n, UDP, h, r)
		flood = append(flood, h)
	}
	if _, why := n.MapOutbound(UDP, ap("10.0.0.2", 999), r); why != DropHostLimit {
		t.Errorf("a ninth flow of one host: %v", why)
	}
	// Another host's flow evicts the oldest unanswered one.
	other := ap("10.0.0.4", 2000)
	e := mustOut(t, n, UDP, other, r)
	if _, why := n.MapInbound(UDP, r, e); why != DropNone {
		t.Fatal(why)
	}
	if f := n.proto[UDP].lookupOut(&hash4.Tuple{Local: flood[0], Remote: r}); f != nil {
		t.Errorf("the oldest unanswered flow survived")
	}
	if f := n.proto[UDP].lookupOut(&hash4.Tuple{Local: flood[1], Remote: r}); f == nil {
		t.Errorf("the second oldest was evicted too")
	}
	// Answer all: nothing left to evict.
	for _, h := range flood[1:] {
		f := n.proto[UDP].lookupOut(&hash4.Tuple{Local: h, Remote: r})
		if _, why := n.MapInbound(UDP, r, f.ext); why != DropNone {
			t.Fatal(why)
		}
	}
	if _, why := n.MapOutbound(UDP, ap("10.0.0.5", 3000), r); why != DropTableFull {
		t.Errorf("full of answered flows: %v", why)
	}
	m := n.Metrics()
	if m.Expired[ExpiredEarlyDrop] != 1 || m.Drops[DropTableFull] != 1 || m.Drops[DropHostLimit] != 1 || m.Flows != 10 {
		t.Errorf("metrics: %v", m)
	}
}

// A flood of new flows from one host at MaxFlows: every new flow of
// another host gets in, and no answered flow is lost.
func TestFloodOneHost(t *testing.T) {
	n, _ := newTest(t, Config{MaxFlows: 100, Ports: hash4.PortRange{Low: 1024, High: 65535}})
	r := ap("198.51.100.1", 80)
	var keep []netip.AddrPort
	for i := range 20 {
		h := ap("10.0.0.9", uint16(3000+i))
		e := mustOut(t, n, UDP, h, r)
		if _, why := n.MapInbound(UDP, r, e); why != DropNone {
			t.Fatal(why)
		}
		keep = append(keep, h)
	}
	for i := range 5000 {
		n.MapOutbound(UDP, ap("10.0.0.2", uint16(1024+i)), ap("198.51.100.2", uint16(1+i%1000)))
		if i%100 == 0 {
			if _, why := n.MapOutbound(UDP, ap("10.0.0.3", uint16(1024+i)), r); why != DropNone {
				t.Fatalf("another host's new flow during the flood: %v", why)
			}
		}
	}
	for _, h := range keep {
		if n.proto[UDP].lookupOut(&hash4.Tuple{Local: h, Remote: r}) == nil {
			t.Fatalf("answered flow %v lost to the flood", h)
		}
	}
	if m := n.Metrics(); m.Expired[ExpiredEarlyDrop] < 4000 {
		t.Errorf("metrics: %v", m)
	}
}

// A host's count of flows, raised without a lock while it has flows and
// from 0 only under its bucket lock, stays exact when goroutines make and
// end flows of one host at once, its last flow ending again and again:
// never past MaxFlowsPerHost, the host gone with its last flow, its block
// freed once (the next host gets the first block again).
func TestHostCountConcurrent(t *testing.T) {
	const max, workers, rounds = 3, 4, 2000
	n, _ := newTest(t, Config{MaxFlowsPerHost: max, Ports: hash4.PortRange{Low: 1024, High: 2047},
		Blocks: Blocks{Size: 256}})
	inside := netip.MustParseAddr("10.0.0.9")
	var wg sync.WaitGroup
	var over, held atomic.Int32
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				h, why := n.hosts.acquire(inside)
				if why == DropHostLimit {
					continue
				}
				if why != DropNone {
					t.Errorf("acquire: %v", why)
					return
				}
				if held.Add(1) > max {
					over.Add(1)
				}
				if c := h.n.Load(); c < 1 || c > max {
					t.Errorf("a held host counts %d flows", c)
				}
				held.Add(-1)
				n.hosts.release(h)
			}
		}()
	}
	wg.Wait()
	if over.Load() > 0 {
		t.Errorf("%d times more than %d flows of one host", over.Load(), max)
	}
	if got := n.hosts.t.Len(); got != 0 {
		t.Errorf("%d hosts left with no flows", got)
	}
	h, why := n.hosts.acquire(netip.MustParseAddr("10.0.0.10"))
	if why != DropNone || h.block != 0 {
		t.Errorf("a new host after them: block %d, %v; want block 0 (every block freed)", h.block, why)
	}
}

// wheelLen counts the timers filed in n's wheel.
func wheelLen(n *NAT) int {
	c := 0
	for i := range n.wheel.slots {
		for f := n.wheel.slots[i].head; f != nil; f = f.t.next {
			c++
		}
	}
	return c
}

// Flows that end before their deadline leave the wheel with them: after a
// flood that early drop answers and a Flush, the wheel holds the live
// flows and nothing else, so its memory is bounded by MaxFlows, whatever
// the churn.
func TestWheelHoldsLiveFlows(t *testing.T) {
	n, clk := newTest(t, Config{MaxFlows: 100})
	for i := range 5000 {
		n.MapOutbound(UDP, ap("10.0.0.2", uint16(1024+i)), ap("198.51.100.2", 53))
	}
	flows, _ := n.Len()
	if got := wheelLen(n); got != flows {
		t.Errorf("after a flood early drop answered: %d in the wheel, %d flows", got, flows)
	}
	clk.advance(time.Second)
	n.Flush()
	if got := wheelLen(n); got != 0 {
		t.Errorf("after Flush: %d in the wheel", got)
	}
}

// checkWheel fails t unless n's wheel holds each live flow once, in the
// slot it records, its list's links consistent, and nothing else.
func checkWheel(t *testing.T, n *NAT) {
	t.Helper()
	filed := 0
	for i := range n.wheel.slots {
		var prev *flow
		for f := n.wheel.slots[i].head; f != nil; prev, f = f, f.t.next {
			if f.state.Load() != stateLive || f.t.slot.Load() != int32(i+1) || f.t.prev != prev || f.t.due%wheelSlots != int64(i) {
				t.Fatalf("slot %d holds a flow in state %d, filed in %d under tick %d, linked from %p not %p",
					i, f.state.Load(), f.t.slot.Load()-1, f.t.due, f.t.prev, prev)
			}
			if next := n.wheel.next.Load(); f.t.due < next {
				t.Fatalf("slot %d holds a flow under tick %d, which Expire has passed (it is at %d)", i, f.t.due, next)
			}
			filed++
		}
	}
	if flows, _ := n.Len(); filed != flows {
		t.Fatalf("%d flows filed in the wheel, %d live", filed, flows)
	}
}

// handshake takes the TCP flow of MapOutbound from src to dst through a
// tracked handshake (isn: the inside's first sequence number) to
// established, and returns it.
func handshake(n *NAT, src, dst netip.AddrPort, isn uint32) *flow {
	f := n.proto[TCP].lookupOut(&hash4.Tuple{Local: src, Remote: dst})
	if f == nil {
		return nil
	}
	const peer = 5000000
	for _, s := range []tcpSeg{
		{dir: 0, flags: tcpSYN, seq: isn},
		{dir: 1, flags: tcpSYN | tcpACK, seq: peer, ack: isn + 1},
		{dir: 0, flags: tcpACK, seq: isn + 1, ack: peer + 1},
	} {
		s.win, s.wscale = 65535, -1
		f.touch(n.now())
		if n.trackTCP(f, &s) != DropNone {
			return nil
		}
	}
	return f
}

// establishedFlow returns a NAT with one TCP flow, made by handshake with
// isn 1000, that Expire has filed again under the established timeout.
func establishedFlow(t *testing.T) (*NAT, *testClock, *flow) {
	t.Helper()
	n, clk := newTest(t, Config{})
	src, dst := ap("10.0.0.2", 4000), ap("198.51.100.1", 80)
	mustOut(t, n, TCP, src, dst)
	f := handshake(n, src, dst, 1000)
	if f == nil {
		t.Fatal("handshake refused")
	}
	clk.advance(n.Config().Timeouts.TCPSynRecv + time.Second)
	if flows, _ := n.Len(); flows != 1 {
		t.Fatalf("the established flow expired")
	}
	return n, clk, f
}

// rst resets f, made by handshake with isn, from inside, as a packet
// does: it refreshes the flow's clock first.
func rst(n *NAT, f *flow, isn uint32) Drop {
	f.touch(n.now())
	return n.trackTCP(f, &tcpSeg{dir: 0, flags: tcpRST, seq: isn + 1, win: 65535, wscale: -1})
}

// A TCP flow whose timeout shrinks moves to its earlier tick: filed at
// first under the unanswered timeout, it moves earlier with its handshake
// (SYN_RECV), is filed again by Expire under the established timeout, and
// after a RST ends with the close timeout, not the established one.
func TestRescheduleEarlier(t *testing.T) {
	n, clk, f := establishedFlow(t)
	to := n.Config().Timeouts
	if why := rst(n, f, 1000); why != DropNone {
		t.Fatal(why)
	}
	clk.advance(to.TCPClose - time.Second)
	if flows, _ := n.Len(); flows != 1 {
		t.Fatalf("the reset flow expired before its timeout")
	}
	clk.advance(2 * time.Second)
	if flows, _ := n.Len(); flows != 0 {
		t.Errorf("the reset flow outlived its timeout (%v): filed under %d, the wheel at %d", to.TCPClose, f.t.due, n.wheel.next.Load())
	}
}

// Goroutines make flows, take some through a handshake (which moves their
// deadlines earlier, then Expire files them later) and reset some of those
// (earlier again), while Expire runs a tick a millisecond and every 300
// ticks Flushes, and early drop ends others: the wheel is then exactly the
// live flows; reset flows are gone once their close timeout has passed,
// established ones not; and once all deadlines pass, the wheel is empty.
func TestWheelConcurrent(t *testing.T) {
	n, clk := newTest(t, Config{MaxFlows: 300, Timeouts: Timeouts{TCPSynSent: 2 * time.Second}})
	dst := ap("198.51.100.1", 80)
	var wg sync.WaitGroup
	var done atomic.Bool
	var resets, advances atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// At least 4000 flows each, and on until Expire has run a
			// while meanwhile (past two Flushes). Each a new inside
			// endpoint (for 65,536 of them), so that none is refreshed
			// by a later one.
			for i := 0; i < 4000 || advances.Load() < 700; i++ {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(w), byte(i >> 8), byte(i)}), 1024)
				if _, why := n.MapOutbound(TCP, src, dst); why != DropNone || i%3 == 0 {
					continue // left unanswered, for early drop and the SYN's timeout
				}
				isn := uint32(i) * 1000
				f := handshake(n, src, dst, isn)
				if f != nil && i%3 == 2 && rst(n, f, isn) == DropNone {
					resets.Add(1)
				}
			}
		}()
	}
	expiry := make(chan struct{})
	go func() {
		defer close(expiry)
		for !done.Load() {
			clk.advance(time.Second)
			if advances.Add(1)%300 == 0 {
				n.Flush()
			}
			time.Sleep(time.Millisecond)
		}
	}()
	wg.Wait()
	done.Store(true)
	<-expiry
	checkWheel(t, n)
	m := n.Metrics()
	if resets.Load() == 0 || m.Expired[ExpiredEarlyDrop] == 0 || m.Expired[ExpiredTimeout] == 0 || m.Expired[ExpiredFlush] == 0 {
		t.Errorf("the run did not reset flows (%d) or end flows every way: %v", resets.Load(), m.Expired)
	}
	// One established flow and one reset, made now (in the room of two
	// flows of the run), that the close timeout must tell apart as it
	// does the run's.
	room := 0
	for f := range n.proto[TCP].flows() {
		if room < 2 && n.deleteFlow(f, ExpiredFlush) {
			room++
		}
	}
	kept, reset := ap("10.9.0.2", 1000), ap("10.9.0.2", 1001)
	for i, src := range []netip.AddrPort{kept, reset} {
		if _, why := n.MapOutbound(TCP, src, dst); why != DropNone {
			t.Fatal(why)
		}
		if f := handshake(n, src, dst, 7000); f == nil || i == 1 && rst(n, f, 7000) != DropNone {
			t.Fatalf("handshake or reset of %v refused", src)
		}
	}
	clk.advance(n.Config().Timeouts.TCPClose + time.Second)
	checkWheel(t, n)
	for f := range n.proto[TCP].flows() {
		if f.state.Load() == stateLive && f.tcp.stateNow() == tcpClose {
			t.Errorf("a reset flow outlived its timeout: last packet %v ago", time.Duration(n.now()-f.last.Load()))
		}
	}
	if n.proto[TCP].lookupOut(&hash4.Tuple{Local: kept, Remote: dst}) == nil {
		t.Errorf("the established flow expired with the reset ones")
	}
	clk.advance(1000 * time.Hour)
	checkWheel(t, n)
	if flows, _ := n.Len(); flows != 0 {
		t.Errorf("%d flows left after their deadlines", flows)
	}
}

// Goroutines move flows' deadlines earlier, often into the past (their
// clocks set back, as a packet's stale read of the NAT's clock would), and
// make flows again as they expire, while Expire jumps up to 400 ticks a
// call: no flow is filed twice or under a tick Expire has passed, and
// every flow expires on time.
func TestWheelStress(t *testing.T) {
	const jump, flows = 400, 2000
	// Each goroutine's work is counted, not timed, so that the test takes
	// as long however the scheduler shares the processors between them
	// and Expire's calls, which go on until the goroutines are done.
	calls, ops := 3000, 100000
	if raceEnabled {
		calls, ops = 50, 3000 // under the race detector each lock is slow: the full run is without
	}
	n, clk := newTest(t, Config{MaxFlows: 5000})
	dst := ap("198.51.100.1", 53)
	src := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 1000)
	}
	var wg sync.WaitGroup
	var working atomic.Int32
	for w := range 3 {
		wg.Add(1)
		working.Add(1)
		go func() {
			defer wg.Done()
			defer working.Add(-1)
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range ops {
				i := r.IntN(flows)
				f := n.proto[UDP].lookupOut(&hash4.Tuple{Local: src(i), Remote: dst})
				switch {
				case f == nil:
					n.MapOutbound(UDP, src(i), dst)
				case r.IntN(4) == 0:
					f.touch(n.now())
				default:
					f.last.Store(n.now() - int64(r.IntN(310))*int64(time.Second))
					n.reschedule(f)
				}
			}
		}()
	}
	r := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < calls || working.Load() > 0; i++ {
		clk.advance(time.Duration(r.IntN(jump)) * time.Second)
	}
	wg.Wait()
	checkWheel(t, n) // and none filed under a tick Expire has passed
	clk.advance(n.Config().Timeouts.UDP + 2*time.Second)
	if live, _ := n.Len(); live != 0 {
		t.Errorf("%d flows outlived their timeout", live)
	}
}

// TestWheelRaces runs, where the test hooks stop a goroutine, the step of
// another that broke the wheel there before it was fixed: Expire taking off
// a flow that reschedule is about to move (both filed it: invariant 3);
// Expire passing the tick a new flow is about to be filed under (it waited
// a revolution: 4). Each time the wheel is then exactly the live flows, and
// none is under a tick Expire has passed.
func TestWheelRaces(t *testing.T) {
	t.Run("reschedule", func(t *testing.T) {
		n, _, f := establishedFlow(t)
		at := time.Unix(0, f.t.due*n.wheel.tick)
		done := make(chan struct{})
		called := false
		setHook(t, &hookReschedule, func(g *flow) {
			called = true
			// A packet at that time: the flow's deadline goes on past it,
			// so that Expire files it again.
			g.last.Store(at.UnixNano())
			go func() { n.Expire(at); close(done) }()
			for g.t.slot.Load() != 0 {
				runtime.Gosched() // until Expire has taken it off
			}
		})
		if why := rst(n, f, 1000); why != DropNone {
			t.Fatal(why)
		}
		<-done
		if !called {
			t.Fatal("reschedule did not move the reset flow")
		}
		checkWheel(t, n)
	})
	t.Run("file", func(t *testing.T) {
		n, _ := newTest(t, Config{})
		passed := int64(0)
		setHook(t, &hookFile, func(f *flow, due int64) {
			if passed == 0 {
				passed = due + 10
				n.Expire(time.Unix(0, passed*n.wheel.tick))
			}
		})
		src, dst := ap("10.0.0.2", 4000), ap("198.51.100.1", 53)
		mustOut(t, n, UDP, src, dst)
		if passed == 0 {
			t.Fatal("the new flow was not filed")
		}
		checkWheel(t, n)
		// It ends a tick past its deadline, not a revolution later.
		f := n.proto[UDP].lookupOut(&hash4.Tuple{Local: src, Remote: dst})
		deadline := f.last.Load() + int64(n.timeout(f))
		if ended := n.Expire(time.Unix(0, deadline+n.wheel.tick)); ended != 1 {
			t.Fatalf("Expire ended %d flows a tick past the deadline of the one filed while it passed its tick", ended)
		}
	})
	t.Run("passed", func(t *testing.T) {
		n, clk := newTest(t, Config{})
		ticks := 0
		setHook(t, &hookPassed, func(tick int64) {
			ticks++
			if next := n.wheel.next.Load(); next <= tick {
				t.Errorf("Expire let tick %d's slot go before it moved on (at %d): a flow could be filed there", tick, next)
			}
		})
		clk.advance(5 * time.Second)
		if ticks == 0 {
			t.Fatal("Expire passed no tick")
		}
	})
}

// setHook sets *hook to f for the rest of the test.
func setHook[F any](t *testing.T, hook *F, f F) {
	var zero F
	*hook = f
	t.Cleanup(func() { *hook = zero })
}

// Expire after a pause longer than the wheel's span looks at its slots
// once, not at every tick of the pause, and still ends every flow due.
func TestExpireAfterLongPause(t *testing.T) {
	n, clk := newTest(t, Config{Tick: time.Millisecond, Timeouts: Timeouts{UDPUnreplied: time.Second, UDP: 48 * time.Hour}})
	for i := range 100 {
		mustOut(t, n, UDP, ap("10.0.0.2", uint16(1000+i)), ap("198.51.100.1", 53))
	}
	e := mustOut(t, n, UDP, ap("10.0.0.3", 1000), ap("198.51.100.1", 53))
	if _, why := n.MapInbound(UDP, ap("198.51.100.1", 53), e); why != DropNone {
		t.Fatal(why)
	}
	passed := 0
	setHook(t, &hookPassed, func(int64) { passed++ })
	if ended := clk.advance(24 * time.Hour); ended != 100 || passed > wheelSlots {
		t.Errorf("a day's pause at a 1 ms tick: %d flows ended (want 100), %d ticks looked at (at most %d)", ended, passed, wheelSlots)
	}
	if flows, _ := n.Len(); flows != 1 {
		t.Errorf("%d flows left, want the answered one", flows)
	}
}
