package nat

import (
	"net/netip"
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
