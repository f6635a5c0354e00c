package nat

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/hash4/hash4"
)

var (
	ext1 = netip.MustParseAddr("192.0.2.1")
	ext2 = netip.MustParseAddr("192.0.2.2")
	ext6 = netip.MustParseAddr("2001:db8::1")
)

// ap builds an AddrPort from an address string and a port.
func ap(a string, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(a), port)
}

// remoteAt is the remote 198.51.100.i:port, a test's i-th remote.
func remoteAt(i int, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), port)
}

// newTest returns a NAT of c, on ext1 if c has no pool, and a clock that
// starts at a whole second an hour from now (the NAT's clock never goes
// back, and New sets it to now).
func newTest(t testing.TB, c Config) (*NAT, *testClock) {
	t.Helper()
	if c.External == nil {
		c.External = []netip.Addr{ext1}
	}
	n, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	clk := &testClock{n: n, t: time.Now().Add(time.Hour).Truncate(time.Second)}
	clk.advance(0)
	return n, clk
}

// testClock drives a NAT's clock and expiry.
type testClock struct {
	n *NAT
	t time.Time
}

// advance moves the clock by d and runs Expire; it returns the flows ended.
func (c *testClock) advance(d time.Duration) int {
	c.t = c.t.Add(d)
	return c.n.Expire(c.t)
}

func mustOut(t *testing.T, n *NAT, p Proto, src, dst netip.AddrPort) netip.AddrPort {
	t.Helper()
	e, why := n.MapOutbound(p, src, dst)
	if why != DropNone {
		t.Fatalf("MapOutbound %v %v -> %v: %v", p, src, dst, why)
	}
	return e
}

// Endpoint-independent mapping: one external endpoint per inside endpoint
// whatever the destination, none shared between inside endpoints (no
// overloading), and replies come back to the right inside endpoint.
func TestEndpointIndependentMapping(t *testing.T) {
	n, _ := newTest(t, Config{})
	a := ap("10.0.0.2", 5000)
	dsts := []netip.AddrPort{ap("198.51.100.1", 80), ap("198.51.100.2", 80), ap("198.51.100.1", 81)}
	var e netip.AddrPort
	for i, d := range dsts {
		got := mustOut(t, n, UDP, a, d)
		if i > 0 && got != e {
			t.Fatalf("toward %v: external %v, toward %v it was %v", d, got, dsts[0], e)
		}
		e = got
	}
	if e.Addr() != ext1 || e.Port() < 1024 {
		t.Errorf("external %v", e)
	}
	b := ap("10.0.0.3", 5000)
	if eb := mustOut(t, n, UDP, b, dsts[0]); eb == e {
		t.Errorf("two inside endpoints share external %v", e)
	}
	for _, d := range dsts {
		if in, why := n.MapInbound(UDP, d, e); why != DropNone || in != a {
			t.Errorf("reply from %v to %v: %v %v", d, e, in, why)
		}
	}
	if m := n.Metrics(); m.Flows != 4 || m.Mappings != 2 || m.MappingsCreated != 2 || m.FlowsCreated != 4 {
		t.Errorf("metrics: %v", m)
	}
}

// Address-dependent mapping: one external endpoint per remote address.
func TestAddressDependentMapping(t *testing.T) {
	n, _ := newTest(t, Config{UDP: Behaviors{Mapping: AddressDependent}})
	a := ap("10.0.0.2", 5000)
	e1 := mustOut(t, n, UDP, a, ap("198.51.100.1", 80))
	e2 := mustOut(t, n, UDP, a, ap("198.51.100.1", 81))
	e3 := mustOut(t, n, UDP, a, ap("198.51.100.2", 80))
	if e1 != e2 || e1 == e3 {
		t.Errorf("externals %v %v %v: want the first two equal, the third not", e1, e2, e3)
	}
}

// Address-and-port-dependent mapping: a flow per remote endpoint, whose
// external port may serve other inside endpoints toward other remotes, as
// Connect gives ports; and it refuses any filtering but its own.
func TestAddressAndPortDependentMapping(t *testing.T) {
	if _, err := New(Config{External: []netip.Addr{ext1}, UDP: Behaviors{Mapping: AddressAndPortDependent}}); !errors.Is(err, ErrConfig) {
		t.Errorf("APDM with the default filtering: %v", err)
	}
	n, _ := newTest(t, Config{Ports: hash4.PortRange{Low: 40000, High: 40000},
		UDP: Behaviors{Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}})
	a, b := ap("10.0.0.2", 5000), ap("10.0.0.3", 5000)
	ea := mustOut(t, n, UDP, a, ap("198.51.100.1", 80))
	eb := mustOut(t, n, UDP, b, ap("198.51.100.2", 80))
	if ea != eb {
		t.Errorf("one port, two remotes: %v and %v", ea, eb)
	}
	if _, why := n.MapOutbound(UDP, b, ap("198.51.100.1", 80)); why != DropNoPort {
		t.Errorf("the same remote from another inside endpoint on one port: %v", why)
	}
	if in, _ := n.MapInbound(UDP, ap("198.51.100.2", 80), eb); in != b {
		t.Errorf("reply to b went to %v", in)
	}
	if _, why := n.MapInbound(UDP, ap("198.51.100.2", 81), eb); why != DropNoFlow {
		t.Errorf("unsolicited: %v", why)
	}
}

// Filtering: endpoint-independent lets anyone in, address-dependent the
// addresses contacted, address-and-port-dependent the endpoints contacted.
func TestFiltering(t *testing.T) {
	a := ap("10.0.0.2", 5000)
	r := ap("198.51.100.1", 80)
	samePort, otherPort, otherAddr := r, ap("198.51.100.1", 81), ap("198.51.100.9", 80)
	for _, c := range []struct {
		f    Behavior
		want [3]bool
	}{
		{EndpointIndependent, [3]bool{true, true, true}},
		{Default, [3]bool{true, true, false}},
		{AddressDependent, [3]bool{true, true, false}},
		{AddressAndPortDependent, [3]bool{true, false, false}},
	} {
		n, _ := newTest(t, Config{UDP: Behaviors{Filtering: c.f}})
		e := mustOut(t, n, UDP, a, r)
		for i, from := range []netip.AddrPort{samePort, otherPort, otherAddr} {
			in, why := n.MapInbound(UDP, from, e)
			if got := why == DropNone && in == a; got != c.want[i] {
				t.Errorf("%v filtering, from %v: %v %v", c.f, from, in, why)
			}
			if !c.want[i] && why != DropFiltered {
				t.Errorf("%v filtering, from %v: %v, want filtered", c.f, from, why)
			}
		}
	}
}

// Address-dependent filtering's permits: a mapping's first remote
// addresses in the mapping, the rest in the permit table; each address
// let in while a flow goes to it, and not once its last flow has ended;
// a freed near place taken by the next address; nothing left in the table
// when the mapping ends.
func TestPermits(t *testing.T) {
	n, _ := newTest(t, Config{})
	ps := &n.proto[UDP]
	a := ap("10.0.0.2", 5000)
	remote := func(i int) netip.AddrPort { return remoteAt(i, 80) }
	flowTo := func(r netip.AddrPort) *flow { return ps.lookupOut(&hash4.Tuple{Local: a, Remote: r}) }
	for i := 1; i <= 5; i++ {
		mustOut(t, n, UDP, a, remote(i))
	}
	second := netip.AddrPortFrom(remote(1).Addr(), 81)
	mustOut(t, n, UDP, a, second)
	m := flowTo(remote(1)).m
	check := func(step string, in []int, spill int32) {
		t.Helper()
		for i := 1; i <= 7; i++ {
			if got, want := n.permitted(ps, m, remote(i).Addr()), slices.Contains(in, i); got != want {
				t.Errorf("%s: address %d let in %v, want %v", step, i, got, want)
			}
		}
		if m.spill != spill || ps.perm.Len() != int(spill) {
			t.Errorf("%s: %d addresses spilled, %d in the table; want %d", step, m.spill, ps.perm.Len(), spill)
		}
	}
	check("five addresses", []int{1, 2, 3, 4, 5}, 3)
	n.deleteFlow(flowTo(remote(1)), ExpiredFlush)
	check("one of two flows to the first gone", []int{1, 2, 3, 4, 5}, 3)
	n.deleteFlow(flowTo(second), ExpiredFlush)
	n.deleteFlow(flowTo(remote(3)), ExpiredFlush)
	check("the first and third gone", []int{2, 4, 5}, 2)
	mustOut(t, n, UDP, a, remote(6))
	check("a sixth in the freed place", []int{2, 4, 5, 6}, 2)
	n.Flush()
	if _, maps := n.Len(); maps != 0 || ps.perm.Len() != 0 {
		t.Errorf("after Flush: %d mappings, %d permits in the table", maps, ps.perm.Len())
	}
}

// Port preservation keeps a free inside port; parity preservation keeps
// the inside port's parity.
func TestPortAndParityPreservation(t *testing.T) {
	for _, m := range []Behaviors{{}, {Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}} {
		n, _ := newTest(t, Config{PortPreservation: true, UDP: m})
		a := ap("10.0.0.2", 5000)
		if e := mustOut(t, n, UDP, a, ap("198.51.100.1", 80)); e.Port() != 5000 {
			t.Errorf("%v: preserved port %v", m.Mapping, e)
		}
		b := ap("10.0.0.3", 5000)
		if e := mustOut(t, n, UDP, b, ap("198.51.100.1", 80)); e.Port() == 5000 {
			t.Errorf("%v: two inside endpoints on port 5000 to one remote", m.Mapping)
		}
		n, _ = newTest(t, Config{ParityPreservation: true, UDP: m})
		for i := range 40 {
			src := ap("10.0.0.4", uint16(6000+i))
			if e := mustOut(t, n, UDP, src, ap("198.51.100.1", 80)); e.Port()&1 != src.Port()&1 {
				t.Fatalf("%v: %v mapped to %v, another parity", m.Mapping, src, e)
			}
		}
	}
}

// Paired pooling keeps all of an inside address's mappings on one external
// address; arbitrary pooling moves on when an address's ports run out.
func TestPooling(t *testing.T) {
	n, _ := newTest(t, Config{External: []netip.Addr{ext1, ext2, ext6}})
	for h := range 20 {
		inside := netip.AddrFrom4([4]byte{10, 0, 1, byte(h)})
		var first netip.Addr
		for p := range 10 {
			e := mustOut(t, n, UDP, netip.AddrPortFrom(inside, uint16(1000+p)), ap("198.51.100.1", uint16(80+p)))
			if p == 0 {
				first = e.Addr()
			} else if e.Addr() != first {
				t.Fatalf("host %v on %v and %v", inside, first, e.Addr())
			}
		}
	}
	if e := mustOut(t, n, UDP, ap("fd00::2", 1000), ap("2001:db8:1::1", 80)); e.Addr() != ext6 {
		t.Errorf("IPv6 mapped to %v", e)
	}
	n4, _ := newTest(t, Config{External: []netip.Addr{ext1}})
	if _, why := n4.MapOutbound(UDP, ap("fd00::2", 1000), ap("2001:db8:1::1", 80)); why != DropUnsupported {
		t.Errorf("IPv6 with no IPv6 external address: %v", why)
	}

	one := hash4.PortRange{Low: 2000, High: 2001}
	paired, _ := newTest(t, Config{External: []netip.Addr{ext1, ext2}, Ports: one})
	arb, _ := newTest(t, Config{External: []netip.Addr{ext1, ext2}, Ports: one, Pooling: Arbitrary})
	for _, c := range []struct {
		n    *NAT
		want int
	}{{paired, 2}, {arb, 4}} {
		got := 0
		for p := range 5 {
			if _, why := c.n.MapOutbound(UDP, ap("10.0.0.2", uint16(3000+p)), ap("198.51.100.1", 80)); why == DropNone {
				got++
			} else if why != DropNoPort {
				t.Errorf("%v", why)
			}
		}
		if got != c.want {
			t.Errorf("pooling %d: %d mappings of one host on two addresses of two ports, want %d", c.n.cfg.Pooling, got, c.want)
		}
	}
}

// Port blocks: a host's mappings stay in its block; deterministic blocks
// follow the address; two NATs on disjoint blocks of one address never
// give out the same port.
func TestPortBlocks(t *testing.T) {
	ports := hash4.PortRange{Low: 10000, High: 10000 + 64*8 - 1}
	n, _ := newTest(t, Config{Ports: ports, Blocks: Blocks{Size: 64, First: 2, Count: 3}})
	blockOf := func(port uint16) int { return int(port-ports.Low) / 64 }
	for h := range 4 {
		inside := netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + h)})
		var blk int
		for p := range 10 {
			e, why := n.MapOutbound(UDP, netip.AddrPortFrom(inside, uint16(5000+p)), ap("198.51.100.1", 80))
			if h == 3 {
				if why != DropNoBlock {
					t.Fatalf("a fourth host with three blocks: %v %v", e, why)
				}
				continue
			}
			if why != DropNone {
				t.Fatal(why)
			}
			if p == 0 {
				blk = blockOf(e.Port())
			}
			if b := blockOf(e.Port()); b != blk || b < 2 || b > 4 {
				t.Fatalf("host %d: port %d in block %d (first in %d; blocks 2-4)", h, e.Port(), b, blk)
			}
		}
	}
	if m := n.Metrics(); m.Drops[DropNoBlock] != 10 {
		t.Errorf("no-block drops %d", m.Drops[DropNoBlock])
	}

	det, _ := newTest(t, Config{Ports: ports, Blocks: Blocks{Size: 64, First: 1,
		Deterministic: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/29")}}})
	for i := range 7 {
		inside := netip.AddrFrom4([4]byte{10, 1, 0, byte(i)})
		e := mustOut(t, det, UDP, netip.AddrPortFrom(inside, 5000), ap("198.51.100.1", 80))
		if blockOf(e.Port()) != 1+i {
			t.Errorf("%v: block %d, want %d", inside, blockOf(e.Port()), 1+i)
		}
	}
	if _, why := det.MapOutbound(UDP, ap("10.1.0.7", 5000), ap("198.51.100.1", 80)); why != DropNoBlock {
		t.Errorf("past the last block: %v", why)
	}
	if _, why := det.MapOutbound(UDP, ap("10.2.0.1", 5000), ap("198.51.100.1", 80)); why != DropNoBlock {
		t.Errorf("outside the prefix: %v", why)
	}
}

// Two NATs, as two gateways, share one external address on disjoint
// blocks: under load from many hosts, no external port is given twice.
func TestTwoAllocatorsDisjointBlocks(t *testing.T) {
	ports := hash4.PortRange{Low: 20000, High: 20000 + 32*40 - 1}
	for _, m := range []Behaviors{{}, {Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}} {
		a, _ := newTest(t, Config{Ports: ports, UDP: m, Blocks: Blocks{Size: 32, First: 0, Count: 20}})
		b, _ := newTest(t, Config{Ports: ports, UDP: m, Blocks: Blocks{Size: 32, First: 20, Count: 20}})
		used := map[netip.AddrPort]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for gi, g := range []*NAT{a, b} {
			for h := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					inside := netip.AddrFrom4([4]byte{10, 9, byte(gi), byte(h)})
					for p := range 32 {
						e, why := g.MapOutbound(UDP, netip.AddrPortFrom(inside, uint16(1024+p)), ap("198.51.100.1", 80))
						if why != DropNone {
							t.Errorf("gateway %d host %d: %v", gi, h, why)
							return
						}
						mu.Lock()
						if who, ok := used[e]; ok {
							t.Errorf("%v given by %s and by gateway %d", e, who, gi)
						}
						used[e] = fmt.Sprint("gateway ", gi)
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		if len(used) != 2*20*32 {
			t.Errorf("%v: %d ports, want every one of %d", m.Mapping, len(used), 2*20*32)
		}
	}
}

// Both directions of a flow appear together: a flow found from inside is
// found from outside, and the other way, while goroutines make flows.
func TestBothDirectionsTogether(t *testing.T) {
	for _, m := range []Behaviors{{Filtering: AddressAndPortDependent}, {Mapping: AddressAndPortDependent, Filtering: AddressAndPortDependent}} {
		n, _ := newTest(t, Config{UDP: m})
		ps := &n.proto[UDP]
		const hosts, flows = 4, 300
		var done atomic.Bool
		var wg sync.WaitGroup
		var seen atomic.Int64
		for r := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !done.Load() {
					for h := range hosts {
						for i := range flows {
							in := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(h)}), uint16(1000+i))
							remote := ap("198.51.100.1", uint16(80+i%7))
							if r == 0 {
								if f := ps.lookupOut(&hash4.Tuple{Local: in, Remote: remote}); f != nil {
									seen.Add(1)
									if g := ps.lookupIn(&hash4.Tuple{Local: f.ext, Remote: remote}); g != f {
										t.Errorf("flow %v found from inside, from outside %v", in, g)
									}
								}
							}
						}
					}
					if r == 1 {
						for f := range ps.flows() {
							if f.state.Load() != stateLive {
								continue
							}
							if ps.lookupOut(&hash4.Tuple{Local: f.inside(), Remote: f.remote}) != f {
								t.Errorf("flow %v -> %v not found from inside", f.inside(), f.remote)
							}
							if ps.lookupIn(&hash4.Tuple{Local: f.ext, Remote: f.remote}) != f {
								t.Errorf("flow %v -> %v not found from outside", f.ext, f.remote)
							}
						}
					}
				}
			}()
		}
		for h := range hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range flows {
					in := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(h)}), uint16(1000+i))
					n.MapOutbound(UDP, in, ap("198.51.100.1", uint16(80+i%7)))
				}
			}()
		}
		for seen.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		done.Store(true)
		wg.Wait()
		if got := n.Metrics().Flows; got != hosts*flows {
			t.Errorf("%d flows, want %d", got, hosts*flows)
		}
	}
}

// A packet reads one cache line of its flow: the fields it needs are in
// the first 64 bytes, and flows, a multiple of 64 bytes, start on a line;
// so do mappings, whose first flow starts them.
func TestFlowLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is laid out for 64-bit targets")
	}
	var f flow
	if s := unsafe.Sizeof(f); s%64 != 0 {
		t.Errorf("flow is %d bytes", s)
	}
	if end := unsafe.Offsetof(f.others) + unsafe.Sizeof(f.others); end > 64 {
		t.Errorf("the hot fields end at byte %d", end)
	}
	// A packet that the first flow does not take reads the sibs and
	// their prints, on the line of the first flow's remote.
	if end := unsafe.Offsetof(f.sibPrints) + unsafe.Sizeof(f.sibPrints); unsafe.Offsetof(f.remote) < 64 || end > 128 {
		t.Errorf("the remote, the sibs and their prints are at bytes %d to %d", unsafe.Offsetof(f.remote), end)
	}
	var m mapping
	if s, o := unsafe.Sizeof(m), unsafe.Offsetof(m.first); s%64 != 0 || o != 0 {
		t.Errorf("mapping is %d bytes, its first flow at byte %d", s, o)
	}
}

// Capacity sizes the tables: its default, its bounds (refused with
// ErrConfig, nothing made, never hash4.New's panic), and a NAT past it,
// whose tables grow.
func TestConfigCapacity(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want int
	}{
		{Config{}, 1024},
		{Config{MaxFlows: 100}, 100},
		{Config{Capacity: 5000}, 5000},
	} {
		c.cfg.External = []netip.Addr{ext1}
		n, err := New(c.cfg)
		if err != nil || n.Config().Capacity != c.want {
			t.Errorf("%+v: capacity %v, %v; want %d", c.cfg, n.Config().Capacity, err, c.want)
		}
	}
	old := debug.SetMemoryLimit(64 << 20)
	defer debug.SetMemoryLimit(old)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Capacity: -1}, "capacity -1: want 0 to MaxFlows, 1048576"},
		{Config{MaxFlows: 10, Capacity: 11}, "capacity 11: want 0 to MaxFlows, 10"},
		{Config{MaxFlows: math.MaxInt32, Capacity: 1<<29 + 1}, "beyond the 536870912 buckets a table can have"},
		// 15 tables (TCP, UDP, ICMP: five each by default) of 2^20
		// lines: 960 MiB.
		{Config{Capacity: 1 << 20}, "15 tables of 1048576 buckets take 1006632960 bytes, beyond the memory limit of 67108864"},
	} {
		c.cfg.External = []netip.Addr{ext1}
		if _, err := New(c.cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrConfig saying %q", c.cfg, err, c.want)
		}
	}
	debug.SetMemoryLimit(old)

	n, _ := newTest(t, Config{Capacity: 16})
	const flows = 2000
	ext := make([]netip.AddrPort, flows)
	for i := range flows {
		ext[i] = mustOut(t, n, UDP, ap("10.0.0.2", uint16(1000+i)), ap("198.51.100.1", 80))
	}
	for i := range flows {
		if in, why := n.MapInbound(UDP, ap("198.51.100.1", 80), ext[i]); in != ap("10.0.0.2", uint16(1000+i)) {
			t.Fatalf("flow %d of %d past a capacity of 16: reply went to %v (%v)", i, flows, in, why)
		}
	}
}

// TestMappingsConcurrent makes and ends flows of a few inside endpoints
// from several goroutines at once, on a range of ports too small for every
// mapping, so that mappings end and their ports and keys are taken again
// while others look them up. After each round: every live flow's mapping
// is live, counts exactly its flows, holds its port alone and is the one
// its key finds; each live flow is the one found both ways for its
// 5-tuple; an inside endpoint has one mapping (endpoint-independent)
// or one per remote address; after Flush no port, mapping or host is left.
func TestMappingsConcurrent(t *testing.T) {
	for _, mb := range []Behavior{EndpointIndependent, AddressDependent} {
		n, _ := newTest(t, Config{UDP: Behaviors{Mapping: mb}, Ports: hash4.PortRange{Low: 40000, High: 40063}})
		ps := &n.proto[UDP]
		endpoint := func(i int) (in, remote netip.AddrPort) {
			in = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i % 3)}), uint16(1000+i%16))
			return in, remoteAt(i/16%4, uint16(80+i%5))
		}
		rounds := 20
		if raceEnabled {
			rounds = 5
		}
		for range rounds {
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 2000 {
						in, remote := endpoint(int(randUint32() % 1024))
						if w%2 == 1 && i%2 == 1 {
							if f := ps.lookupOut(&hash4.Tuple{Local: in, Remote: remote}); f != nil {
								n.deleteFlow(f, ExpiredFlush)
							}
							continue
						}
						// Busy: another goroutine's making or ending of
						// the mapping outlasted the waits (descheduled).
						if _, why := n.MapOutbound(UDP, in, remote); why != DropNone && why != DropNoPort && why != DropBusy {
							t.Errorf("%v -> %v: %v", in, remote, why)
						}
					}
				}()
			}
			wg.Wait()
			checkMappings(t, n, ps, mb)
		}
		n.Flush()
		checkMappings(t, n, ps, mb)
		if m := n.Metrics(); m.Mappings != 0 || m.Flows != 0 {
			t.Errorf("%v: %d mappings, %d flows after Flush", mb, m.Mappings, m.Flows)
		}
		for p := uint16(40000); p <= 40063; p++ {
			if ps.ports[0][0].taken(p) {
				t.Errorf("%v: port %d still held after Flush", mb, p)
			}
		}
		for k := range n.hosts.t.All() {
			t.Errorf("%v: host %v left after Flush", mb, k.Local.Addr())
		}
	}
}

// checkMappings checks the mappings of n's live flows (TestMappingsConcurrent).
func checkMappings(t *testing.T, n *NAT, ps *protoState, mb Behavior) {
	t.Helper()
	flows := map[*mapping]int32{}
	byKey := map[hash4.Tuple]*mapping{}
	for f := range ps.flows() {
		m := f.m
		if f == &m.first && f.state.Load() != stateLive {
			continue // ended; its mapping has other flows
		}
		if f.state.Load() != stateLive || m.state.Load() != stateLive || f.ext != m.ext {
			t.Fatalf("%v: flow %v -> %v of a mapping not live, or not at its external endpoint", mb, f.inside(), f.remote)
		}
		if ps.lookupOut(&hash4.Tuple{Local: f.inside(), Remote: f.remote}) != f || ps.lookupIn(&hash4.Tuple{Local: f.ext, Remote: f.remote}) != f {
			t.Fatalf("%v: flow %v -> %v is not the one found both ways", mb, f.inside(), f.remote)
		}
		flows[m]++
		key := hash4.Tuple{Local: f.inside(), Remote: sentinel4}
		if mb == AddressDependent {
			key.Remote = netip.AddrPortFrom(f.remote.Addr(), 1)
		}
		if o, ok := byKey[key]; ok && o != m {
			t.Fatalf("%v: %v has two mappings, %v and %v", mb, key, o.ext, m.ext)
		}
		byKey[key] = m
	}
	for m, c := range flows {
		if m.refs.Load() != c {
			t.Fatalf("%v: mapping %v counts %d flows, has %d", mb, m.ext, m.refs.Load(), c)
		}
		if o, ok := ps.extm.Lookup(soloKey(m.ext)); !ok || o != m || !n.portsOf(ps, m.ext.Addr()).taken(m.ext.Port()) {
			t.Fatalf("%v: port %v is not its mapping's, or not taken", mb, m.ext)
		}
		if o, ok := ps.maps.Lookup(m.key); !ok || o != m {
			t.Fatalf("%v: mapping %v is not the one its key finds", mb, m.ext)
		}
	}
	held := 0
	for _, m := range ps.maps.All() {
		if flows[m] == 0 {
			t.Fatalf("%v: mapping %v (%v) has no live flow", mb, m.ext, m.key)
		}
		held++
	}
	if held != len(flows) {
		t.Fatalf("%v: %d mappings in the table, %d live", mb, held, len(flows))
	}
	taken, keys := portsTaken(ps), 0
	for range ps.extm.All() {
		keys++
	}
	if taken != len(flows) || keys != len(flows) {
		t.Fatalf("%v: %d ports taken, %d external keys, %d live mappings", mb, taken, keys, len(flows))
	}
}

// An inbound packet to the external endpoint of a mapping that is being
// made or has ended finds no flow, even under endpoint-independent
// filtering, where it makes one once the mapping is live.
func TestInboundMappingNotLive(t *testing.T) {
	for _, st := range []uint32{statePending, stateDead, stateLive} {
		n, _ := newTest(t, Config{UDP: Behaviors{Filtering: EndpointIndependent}})
		ps := &n.proto[UDP]
		inside := ap("10.0.0.9", 4000)
		m := &mapping{key: mapKeyOf(ps, inside, netip.AddrPort{}), p: UDP, ext: netip.AddrPortFrom(ext1, 40000)}
		m.refs.Store(1)
		m.state.Store(st)
		if err := ps.extm.Insert(soloKey(m.ext), m); err != nil {
			t.Fatal(err)
		}
		_, why := n.MapInbound(UDP, ap("198.51.100.7", 53), m.ext)
		flows, _ := n.Len()
		if st == stateLive {
			if why != DropNone || flows != 1 {
				t.Fatalf("inbound to a live mapping: %v, %d flows", why, flows)
			}
			continue
		}
		if why != DropNoFlow || flows != 0 {
			t.Fatalf("state %d: inbound to a mapping not live: %v, %d flows made", st, why, flows)
		}
	}
}

// A mapping that loses the race for its key to another goroutine's lets
// its port go and returns the winner.
func TestMappingLosesItsKey(t *testing.T) {
	n, _ := newTest(t, Config{})
	ps := &n.proto[UDP]
	inside, remote := ap("10.0.0.9", 4000), ap("198.51.100.7", 53)
	var won *mapping
	setHook(t, &hookHeld, func(m *mapping) {
		hookHeld = nil
		won = &mapping{key: m.key, p: UDP, h: m.h, ext: netip.AddrPortFrom(ext1, 50000)}
		won.refs.Store(1)
		won.state.Store(stateLive)
		n.portsOf(ps, ext1).take(50000)
		if err := ps.maps.Insert(won.key, won); err != nil {
			t.Fatal(err)
		}
	})
	ext, why := n.MapOutbound(UDP, inside, remote)
	if why != DropNone || won == nil || ext != won.ext {
		t.Fatalf("the flow is at %v (%v), want the winning mapping's %v", ext, why, won)
	}
	if taken := portsTaken(ps); taken != 1 {
		t.Fatalf("%d ports taken, want the winner's alone", taken)
	}
}

// Only a new mapping takes a port: its mapping's later flows take none,
// and still find it when no port is free; a flow refused for the NAT's
// limit holds no port.
func TestMappingPorts(t *testing.T) {
	r := func(i int) netip.AddrPort { return ap("198.51.100.1", uint16(1000+i)) }
	for _, mb := range []Behavior{EndpointIndependent, AddressDependent} {
		n, _ := newTest(t, Config{UDP: Behaviors{Mapping: mb}, Ports: hash4.PortRange{Low: 40000, High: 40002}})
		a := ap("10.0.0.1", 4000)
		ea := mustOut(t, n, UDP, a, r(0))
		for i := 1; i < 20; i++ {
			if e := mustOut(t, n, UDP, a, r(i)); e != ea {
				t.Fatalf("%v: flow %d of a's mapping at %v, want %v", mb, i, e, ea)
			}
		}
		// Had the flows of a's mapping kept their ports, none would be free.
		eb := mustOut(t, n, UDP, ap("10.0.0.2", 4000), r(0))
		ec := mustOut(t, n, UDP, ap("10.0.0.3", 4000), r(0))
		if eb == ea || ec == ea || eb == ec {
			t.Fatalf("%v: mappings share ports: %v %v %v", mb, ea, eb, ec)
		}
		if e := mustOut(t, n, UDP, a, r(20)); e != ea {
			t.Fatalf("%v: a's flow with no port free at %v, want %v", mb, e, ea)
		}
		if _, why := n.MapOutbound(UDP, ap("10.0.0.4", 4000), r(0)); why != DropNoPort {
			t.Fatalf("%v: a fourth inside endpoint: %v, want %v", mb, why, DropNoPort)
		}
		if got := portsTaken(&n.proto[UDP]); got != 3 {
			t.Fatalf("%v: %d ports taken, want 3", mb, got)
		}

		// Three flows, answered (out of early drop's reach), fill the NAT.
		n, _ = newTest(t, Config{UDP: Behaviors{Mapping: mb}, Ports: hash4.PortRange{Low: 40000, High: 40002}, MaxFlows: 3})
		for i, src := range []netip.AddrPort{a, a, ap("10.0.0.2", 4000)} {
			e := mustOut(t, n, UDP, src, r(i))
			if _, why := n.MapInbound(UDP, r(i), e); why != DropNone {
				t.Fatal(why)
			}
		}
		if _, why := n.MapOutbound(UDP, ap("10.0.0.3", 4000), r(0)); why != DropTableFull {
			t.Fatalf("%v: a flow past MaxFlows: %v, want %v", mb, why, DropTableFull)
		}
		if got := portsTaken(&n.proto[UDP]); got != 2 {
			t.Fatalf("%v: %d ports taken after a flow refused, want 2", mb, got)
		}
	}
}

// portsTaken counts the ports taken in ps's first IPv4 address.
func portsTaken(ps *protoState) int {
	taken := 0
	for p := range 65536 {
		if ps.ports[0][0].taken(uint16(p)) {
			taken++
		}
	}
	return taken
}

// Early drop never takes a flow still being made (listed unassured before
// it is live): deleteFlow would refuse it, and it would live on unassured
// but off the list, out of early drop's reach, every new flow refused at
// MaxFlows until it timed out. (A race: a short stress, repeated.)
func TestEarlyDropPendingFlow(t *testing.T) {
	workers, per, rounds := 3, 30000, 30
	if raceEnabled {
		per, rounds = 5000, 3
	}
	for round := range rounds {
		n, _ := newTest(t, Config{MaxFlows: 1})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range per {
					src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(w), byte(i >> 8), byte(i)}), 2000)
					n.MapOutbound(UDP, src, ap("198.51.100.1", 53))
				}
			}()
		}
		wg.Wait()
		lost := 0
		for f := range n.proto[UDP].flows() {
			fl := f.flags.Load()
			if f.state.Load() == stateLive && fl&flagAssured == 0 && fl&flagListed == 0 {
				lost++
			}
		}
		_, why := n.MapOutbound(UDP, ap("10.200.0.1", 2000), ap("198.51.100.1", 53))
		if lost > 0 || why != DropNone {
			t.Fatalf("round %d: %d live unanswered flow(s) out of the unassured list; a new flow: %v; %v", round, lost, why, n.Metrics())
		}
	}
}

// A new flow that keeps losing its key (planted here; in use, another
// goroutine's) is refused once, and counted once.
func TestBusyCountedOnce(t *testing.T) {
	n, _ := newTest(t, Config{PortPreservation: true})
	src, dst := ap("10.0.0.2", 5000), ap("198.51.100.1", 53)
	// The mapping, its first flow and its sibs, to other remotes: the
	// flow to dst has keys of its own.
	for i := range 1 + numSibs {
		if _, why := n.MapOutbound(UDP, src, remoteAt(2+i, 53)); why != DropNone {
			t.Fatal(why)
		}
	}
	stuck := &flow{}
	if err := n.proto[UDP].rev.Insert(hash4.Tuple{Local: netip.AddrPortFrom(ext1, 5000), Remote: dst}, stuck); err != nil {
		t.Fatal(err)
	}
	if _, why := n.MapOutbound(UDP, src, dst); why != DropBusy {
		t.Fatalf("MapOutbound: %v", why)
	}
	if m := n.Metrics(); m.Drops[DropBusy] != 1 {
		t.Errorf("one busy refusal counted %d times: %v", m.Drops[DropBusy], m)
	}
}

// MapInbound of an echo reply: the remote has no identifier (port 0 is
// fine), the external identifier must not be 0.
func TestMapInboundEcho(t *testing.T) {
	n, _ := newTest(t, Config{ICMP: Behaviors{Filtering: EndpointIndependent}})
	src, dst := ap("10.0.0.2", 77), ap("198.51.100.1", 0)
	e := mustOut(t, n, ICMP, src, dst)
	if got, why := n.MapInbound(ICMP, netip.AddrPortFrom(dst.Addr(), 0), e); why != DropNone || got != src {
		t.Errorf("MapInbound(ICMP, %v, %v) = %v, %v; want %v", netip.AddrPortFrom(dst.Addr(), 0), e, got, why, src)
	}
	if _, why := n.MapInbound(ICMP, ap("198.51.100.1", 9), netip.AddrPortFrom(e.Addr(), 0)); why != DropMalformed {
		t.Errorf("MapInbound to echo identifier 0: %v, want malformed", why)
	}
}

// A packet refreshes its flow to the clock of the last Expire, up to a
// Tick before the packet: a UDP flow whose last packet came just before
// the tick at T+1s is not ended at T+120s, 119 s and a bit after it, under
// the default UDPUnreplied of 2m (RFC 4787 REQ-5: a mapping MUST NOT
// expire in less than two minutes), but a tick later.
func TestTimeoutNeverShort(t *testing.T) {
	n, clk := newTest(t, Config{})
	src, dst := ap("10.0.0.2", 5000), ap("198.51.100.1", 53)
	// Expire ran at T (clk.t); the packet comes at T+999ms, before the next
	// Expire: the NAT stamps it T.
	mustOut(t, n, UDP, src, dst)
	for range 120 {
		clk.advance(time.Second)
	}
	// Now T+120s: 119.001s since the packet.
	if f := n.proto[UDP].lookupOut(&hash4.Tuple{Local: src, Remote: dst}); f == nil {
		t.Errorf("an unreplied UDP flow ended %v after its last packet (UDPUnreplied %v)", 120*time.Second-999*time.Millisecond, DefaultTimeouts.UDPUnreplied)
	}
	if clk.advance(time.Second); n.proto[UDP].lookupOut(&hash4.Tuple{Local: src, Remote: dst}) != nil {
		t.Errorf("the flow outlived its timeout by two ticks")
	}
}

// New leaves the caller's Router slice as it was, accepted or not, and
// keeps a copy of its own.
func TestConfigRouterCopied(t *testing.T) {
	mapped := netip.MustParseAddr("::ffff:10.0.0.1")
	router := []netip.Addr{mapped}
	_, err := New(Config{External: []netip.Addr{ext1}, Router: router, MTU: 5})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err %v", err)
	}
	if router[0] != mapped {
		t.Errorf("a rejected New changed the caller's Router[0] from %v to %v", mapped, router[0])
	}
	router = []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	n, err := New(Config{External: []netip.Addr{ext1}, Router: router})
	if err != nil {
		t.Fatal(err)
	}
	router[0] = netip.MustParseAddr("224.0.0.1")
	if got := n.Config().Router[0]; got != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("the NAT's router address became %v after the caller reused its slice", got)
	}
}

// Deterministic blocks of an IPv6 prefix of more than 2^64 addresses: a
// block names one host (RFC 7422), and 2001:db8:0:1::5, the (2^64+5)-th
// address of the prefix, past every block, gets none (not 2001:db8::5's).
func TestDeterministicIPv6WidePrefix(t *testing.T) {
	n, _ := newTest(t, Config{External: []netip.Addr{ext6}, Blocks: Blocks{Size: 1024,
		Deterministic: []netip.Prefix{netip.MustParsePrefix("2001:db8::/48")}}})
	a, b := ap("2001:db8::5", 5000), ap("2001:db8:0:1::5", 5000)
	mustOut(t, n, UDP, a, remote6)
	_, why := n.MapOutbound(UDP, b, remote6)
	ha, _ := n.hosts.t.Lookup(hostKey(a.Addr()))
	hb, _ := n.hosts.t.Lookup(hostKey(b.Addr()))
	if why != DropNoBlock {
		blk := -1
		if hb != nil {
			blk = hb.block
		}
		t.Errorf("%v got %v, block %d; %v has block %d", b, why, blk, a, ha.block)
	}
}

// Deterministic blocks for one family: its hosts outside the prefix get
// no block; the other family's get dynamic ones.
func TestDeterministicOneFamily(t *testing.T) {
	n, _ := newTest(t, Config{External: []netip.Addr{ext1, ext6}, Blocks: Blocks{Size: 1024,
		Deterministic: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}}})
	if _, why := n.MapOutbound(UDP, ap("10.0.1.2", 5000), remote4); why != DropNoBlock {
		t.Errorf("IPv4 host outside the prefix: %v", why)
	}
	if _, why := n.MapOutbound(UDP, in6, remote6); why != DropNone {
		t.Errorf("IPv6 host, no IPv6 prefix: %v", why)
	}
}

// A Blocks.Count past the pool's blocks, however large, is cut to them.
func TestBlocksCountLarge(t *testing.T) {
	if _, err := New(Config{External: []netip.Addr{ext1}, Blocks: Blocks{Size: 1024, First: 1, Count: 1 << 20}}); err != nil {
		t.Fatalf("large Count: %v", err)
	}
	_, err := New(Config{External: []netip.Addr{ext1}, Blocks: Blocks{Size: 1024, First: 1, Count: math.MaxInt}})
	if err != nil {
		t.Errorf("Count MaxInt: %v (ErrConfig %v)", err, errors.Is(err, ErrConfig))
	}
}

// Configurations a NAT cannot keep its word under are refused: a timeout
// whose deadline would overflow, a Tick under a millisecond (Expire looks
// at each tick), a per-host cap past an int32, an external address no
// packet comes to (a loopback one is for the endpoint methods).
func TestConfigRefused(t *testing.T) {
	refused := []Config{
		{Timeouts: Timeouts{UDP: math.MaxInt64}},
		{Timeouts: Timeouts{TCPEstablished: maxTimeout + 1}},
		{Tick: time.Nanosecond},
		{Tick: 2 * time.Hour},
		{External: []netip.Addr{netip.MustParseAddr("255.255.255.255")}},
		{External: []netip.Addr{netip.MustParseAddr("224.0.0.1")}},
		{External: []netip.Addr{netip.MustParseAddr("fe80::1")}},
	}
	if big := int64(1)<<32 + 1; int64(int(big)) == big { // 64-bit ints
		refused = append(refused, Config{MaxFlowsPerHost: int(big)})
	}
	for _, c := range refused {
		if c.External == nil {
			c.External = []netip.Addr{ext1}
		}
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for _, c := range []Config{
		{External: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		{External: []netip.Addr{ext1}, Timeouts: Timeouts{TCPEstablished: maxTimeout}, Tick: minTick, MaxFlowsPerHost: math.MaxInt32},
	} {
		if _, err := New(c); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// A mapping's first flow and its next numSibs flows have no keys of their
// own, the rest have; each is found both ways at the mapping's external
// endpoint. Once the first ends, while later flows keep the mapping, a new
// flow to its remote is a later flow; a sib's end frees it for the next
// flow; the mapping goes, and its port, with its last flow.
func TestMappingFlows(t *testing.T) {
	n, _ := newTest(t, Config{})
	ps := &n.proto[UDP]
	src := ap("10.0.0.2", 5000)
	r := func(i int) netip.AddrPort { return remoteAt(i, 53) }
	var ext netip.AddrPort
	// found returns the live flow to remote i, checking that it is found
	// both ways; nil if neither way finds one.
	found := func(i int) *flow {
		t.Helper()
		out := ps.lookupOut(&hash4.Tuple{Local: src, Remote: r(i)})
		if in := ps.lookupIn(&hash4.Tuple{Local: ext, Remote: r(i)}); in != out {
			t.Fatalf("flow to %v: %p from inside, %p from outside", r(i), out, in)
		}
		return out
	}
	mapOut := func(i, keys int, others int32) *flow {
		t.Helper()
		e, why := n.MapOutbound(UDP, src, r(i))
		if ext == (netip.AddrPort{}) {
			ext = e
		}
		f := found(i)
		if why != DropNone || e != ext || f == nil || ps.fwd.Len() != keys || ps.rev.Len() != keys || f.m.first.others.Load() != others {
			t.Fatalf("flow to %v at %v (%v), want %v; keys %d, %d, others %d; want %d keys, others %d",
				r(i), e, why, ext, ps.fwd.Len(), ps.rev.Len(), f.m.first.others.Load(), keys, others)
		}
		return f
	}
	first := mapOut(1, 0, 0)
	m := first.m
	if first != &m.first {
		t.Fatal("the first flow is not its mapping's")
	}
	sib := mapOut(2, 0, 0)
	for i := 3; i < 2+numSibs; i++ {
		mapOut(i, 0, 0)
	}
	if sib.flags.Load()&flagSib == 0 || m.first.sibs[0].Load() != sib {
		t.Fatal("the second flow is not its mapping's first sib")
	}
	mapOut(2+numSibs, 1, 1) // keyed
	if !n.deleteFlow(first, ExpiredFlush) || found(1) != nil {
		t.Fatal("the first flow not ended, or found")
	}
	again := mapOut(1, 2, 2) // no free sib: keyed
	if again == first || again.m != m {
		t.Fatal("the new flow to the first's remote is not a later flow of the mapping")
	}
	if !n.deleteFlow(sib, ExpiredFlush) || found(2) != nil || m.first.sibs[0].Load() != nil {
		t.Fatal("an ended sib is found, or still held")
	}
	if f := mapOut(3+numSibs, 2, 2); m.first.sibs[0].Load() != f {
		t.Fatal("a new flow does not take the free sib")
	}
	if got, want := n.Flush(), numSibs+2; got != want {
		t.Fatalf("Flush ended %d flows, want %d", got, want)
	}
	if m.first.others.Load() != 0 || m.state.Load() != stateDead || ps.maps.Len() != 0 || ps.extm.Len() != 0 || ps.fwd.Len() != 0 || portsTaken(ps) != 0 {
		t.Fatalf("after its flows: others %d, state %d, %d keys, %d ports", m.first.others.Load(), m.state.Load(), ps.maps.Len()+ps.extm.Len()+ps.fwd.Len(), portsTaken(ps))
	}
}

// Under address-dependent mapping with endpoint-independent filtering, a
// flow made from outside may go to another address than its mapping's
// key: a packet from inside finds it even when that address has a
// mapping of its own (whose first flow goes elsewhere), and leaves at its
// flow's external endpoint.
func TestAddressDependentInboundFlowFound(t *testing.T) {
	n, _ := newTest(t, Config{UDP: Behaviors{Mapping: AddressDependent, Filtering: EndpointIndependent}})
	src := ap("10.0.0.2", 5000)
	a1, b1, b2 := ap("198.51.100.1", 53), ap("198.51.100.2", 53), ap("198.51.100.2", 54)
	extA, why := n.MapOutbound(UDP, src, a1)
	if why != DropNone {
		t.Fatal(why)
	}
	extB, why := n.MapOutbound(UDP, src, b1)
	if why != DropNone || extB == extA {
		t.Fatalf("the mapping toward %v: %v (%v), toward %v: %v", b1.Addr(), extB, why, a1.Addr(), extA)
	}
	// b2 writes to the mapping toward a1's address.
	if in, why := n.MapInbound(UDP, b2, extA); why != DropNone || in != src {
		t.Fatalf("inbound from %v to %v: %v (%v)", b2, extA, in, why)
	}
	flows, _ := n.Len()
	if e, why := n.MapOutbound(UDP, src, b2); why != DropNone || e != extA {
		t.Fatalf("the answer to %v leaves at %v (%v), want its flow's %v", b2, e, why, extA)
	}
	if after, _ := n.Len(); after != flows {
		t.Fatalf("the answer made a flow: %d flows, were %d", after, flows)
	}
}

// liveByInside counts ps's live flows whose inside key is k.
func liveByInside(ps *protoState, k hash4.Tuple) (n int) {
	for f := range ps.flows() {
		if f.state.Load() == stateLive && f.insideKey() == k {
			n++
		}
	}
	return n
}

// Under address-dependent mapping with endpoint-independent filtering, a
// remote whose address has a mapping of its own, whose first flow goes to
// that very remote, writes to another mapping of the same inside endpoint:
// the NAT makes no second live flow for the 5-tuple (which it did when an
// address-dependent mapping's first flow had no keys of its own).
func TestAddressDependentOneFlowFromOutside(t *testing.T) {
	n, _ := newTest(t, Config{UDP: Behaviors{Mapping: AddressDependent, Filtering: EndpointIndependent}})
	ps := &n.proto[UDP]
	src, a1, b1 := ap("10.0.0.2", 5000), ap("198.51.100.1", 53), ap("198.51.100.2", 53)
	extA := mustOut(t, n, UDP, src, a1)
	extB := mustOut(t, n, UDP, src, b1)
	if extA == extB {
		t.Fatal("one mapping for two addresses")
	}
	if in, why := n.MapInbound(UDP, b1, extA); why != DropNone || in != src {
		t.Fatalf("inbound from %v to %v: %v (%v)", b1, extA, in, why)
	}
	if c := liveByInside(ps, hash4.Tuple{Local: src, Remote: b1}); c != 1 {
		flows, _ := n.Len()
		t.Fatalf("%d live flows for %v -> %v (%d flows in all)", c, src, b1, flows)
	}
}

// The same from inside: a new mapping's first flow finds the 5-tuple held
// by a flow of another mapping of the inside endpoint, made from outside
// meanwhile (here from the hookHeld hook; in use, another goroutine).
func TestAddressDependentOneFlowNewMapping(t *testing.T) {
	n, _ := newTest(t, Config{UDP: Behaviors{Mapping: AddressDependent, Filtering: EndpointIndependent}})
	ps := &n.proto[UDP]
	src, a1, b1 := ap("10.0.0.2", 5000), ap("198.51.100.1", 53), ap("198.51.100.2", 53)
	extA := mustOut(t, n, UDP, src, a1)
	setHook(t, &hookHeld, func(m *mapping) {
		hookHeld = nil
		// b1 writes to the mapping toward a1 while src's mapping toward
		// b1's address is being made.
		if in, why := n.MapInbound(UDP, b1, extA); why != DropNone || in != src {
			t.Errorf("inbound from %v to %v: %v (%v)", b1, extA, in, why)
		}
	})
	mustOut(t, n, UDP, src, b1)
	if c := liveByInside(ps, hash4.Tuple{Local: src, Remote: b1}); c != 1 {
		flows, _ := n.Len()
		t.Fatalf("%d live flows for %v -> %v (%d flows in all)", c, src, b1, flows)
	}
}
