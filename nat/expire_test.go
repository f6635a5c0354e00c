package nat

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hash4/hash4"
)

// Flows expire after their protocol's timeout, not before; a flow in use
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
	for s := 1; s <= 12; s++ {
		clk.advance(time.Second)
		if s < 8 {
			mustOut(t, n, UDP, busy, r)
		}
		flows, _ := n.Len()
		want := 4
		if s >= 3 {
			want-- // a
		}
		if s >= 5 {
			want-- // the echo
		}
		if s >= 10 {
			want-- // answered
		}
		if s >= 7+3 {
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
	clk.advance(time.Second)
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
	if f := n.proto[UDP].lookupOut(hash4.Tuple{Local: flood[0], Remote: r}); f != nil {
		t.Errorf("the oldest unanswered flow survived")
	}
	if f := n.proto[UDP].lookupOut(hash4.Tuple{Local: flood[1], Remote: r}); f == nil {
		t.Errorf("the second oldest was evicted too")
	}
	// Answer all: nothing left to evict.
	for _, h := range flood[1:] {
		f := n.proto[UDP].lookupOut(hash4.Tuple{Local: h, Remote: r})
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
		if n.proto[UDP].lookupOut(hash4.Tuple{Local: h, Remote: r}) == nil {
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
