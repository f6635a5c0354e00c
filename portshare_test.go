package hash4

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
)

// Tests of the holds that the listeners of a TCPTable and the sockets of a
// UDPTable made WithPortAllocator take in the allocator's bind table.

func newSharedTCP(t *testing.T, opts ...PortOption) (*PortAllocator, *TCPTable[int]) {
	t.Helper()
	a := newTestAlloc(t, opts...)
	return a, NewTCPTable[int](WithPortAllocator(a))
}

func newSharedUDP(t *testing.T, opts ...PortOption) (*PortAllocator, *UDPTable[int]) {
	t.Helper()
	a := newTestAlloc(t, opts...)
	return a, NewUDPTable[int](WithPortAllocator(a))
}

func mustListen(t *testing.T, tcp *TCPTable[int], ap string, opts ...BindOption) func() {
	t.Helper()
	rel, err := tcp.Listen(netip.MustParseAddrPort(ap), valPtr(1), opts...)
	if err != nil {
		t.Fatalf("Listen(%s) = %v, want success", ap, err)
	}
	return rel
}

// wantListenInUse checks that Listen on ap is refused with EADDRINUSE and
// changes nothing: the allocator's holds are as they were and no segment
// to ap reaches a new listener.
func wantListenInUse(t *testing.T, a *PortAllocator, tcp *TCPTable[int], ap string, opts ...BindOption) {
	t.Helper()
	syn := Tuple{Local: netip.MustParseAddrPort(ap), Remote: netip.MustParseAddrPort("192.0.2.1:5555")}
	if syn.Local.Addr().Unmap().IsUnspecified() {
		syn.Local = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), syn.Local.Port())
		if syn.Local.Addr().Is6() {
			syn.Local = netip.AddrPortFrom(netip.IPv6Loopback(), syn.Local.Port())
		}
	}
	before, _ := tcp.Lookup(syn)
	holds := a.nheld.Load()
	v := valPtr(-1)
	rel, err := tcp.Listen(netip.MustParseAddrPort(ap), v, opts...)
	if !errors.Is(err, ErrPortInUse) || !errors.Is(err, syscall.EADDRINUSE) {
		if rel != nil {
			rel()
		}
		t.Fatalf("Listen(%s) = %v, want ErrPortInUse", ap, err)
	}
	if got := a.nheld.Load(); got != holds {
		t.Fatalf("refused Listen(%s) left %d holds, want %d", ap, got, holds)
	}
	if after, _ := tcp.Lookup(syn); after != before || after == v {
		t.Fatalf("refused Listen(%s) changed what a segment to %v reaches", ap, syn.Local)
	}
}

func mustUDPBind(t *testing.T, u *UDPTable[int], ap string, opts ...BindOption) *UDPSocket[int] {
	t.Helper()
	s, err := u.Bind(netip.MustParseAddrPort(ap), valPtr(1), opts...)
	if err != nil {
		t.Fatalf("UDP Bind(%s) = %v, want success", ap, err)
	}
	return s
}

// wantUDPBindInUse checks that a UDP Bind of ap is refused with EADDRINUSE
// and changes nothing.
func wantUDPBindInUse(t *testing.T, a *PortAllocator, u *UDPTable[int], ap string, opts ...BindOption) {
	t.Helper()
	holds, socks := a.nheld.Load(), len(u.sockets())
	s, err := u.Bind(netip.MustParseAddrPort(ap), valPtr(-1), opts...)
	if !errors.Is(err, ErrPortInUse) || !errors.Is(err, syscall.EADDRINUSE) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("UDP Bind(%s) = %v, want ErrPortInUse", ap, err)
	}
	if a.nheld.Load() != holds || len(u.sockets()) != socks {
		t.Fatalf("refused UDP Bind(%s) changed the holds (%d, was %d) or the sockets (%d, was %d)",
			ap, a.nheld.Load(), holds, len(u.sockets()), socks)
	}
}

// requireNoHolds checks that the allocator holds nothing.
func requireNoHolds(t *testing.T, a *PortAllocator) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.nheld.Load() != 0 || len(a.held) != 0 || len(a.byPort) != 0 || len(a.byOwner) != 0 {
		t.Fatalf("holds left: %d counted, held %v, byPort %v, byOwner %v", a.nheld.Load(), a.held, a.byPort, a.byOwner)
	}
	for i := range a.heldPorts {
		if a.heldPorts[i].Load() != 0 {
			t.Fatalf("held-port bits left in word %d", i)
		}
	}
}

func TestListenHoldsPort(t *testing.T) {
	a, tcp := newSharedTCP(t)
	rel := mustListen(t, tcp, "127.0.0.1:8080")
	wantInUse(t, a, "127.0.0.1:8080")
	wantInUse(t, a, "[::ffff:127.0.0.1]:8080")
	wantInUse(t, a, "0.0.0.0:8080")
	wantFree(t, a, "127.0.0.2:8080")
	wantFree(t, a, "[::1]:8080")
	rel()
	rel() // idempotent
	wantFree(t, a, "127.0.0.1:8080")
	wantFree(t, a, "0.0.0.0:8080")

	// A listener on :: that is not IPv6-only takes IPv4 segments too, and
	// holds the port for IPv4 addresses as well; an IPv6-only one does not.
	rel = mustListen(t, tcp, "[::]:8081")
	wantInUse(t, a, "127.0.0.1:8081")
	wantInUse(t, a, "[::1]:8081")
	rel()
	rel = mustListen(t, tcp, "[::]:8082", WithIPv6Only())
	wantFree(t, a, "127.0.0.1:8082")
	wantInUse(t, a, "[::1]:8082")
	rel()
	rel = mustListen(t, tcp, "[::ffff:127.0.0.1]:8083")
	wantInUse(t, a, "127.0.0.1:8083")
	rel()

	// A reuseport group holds the port until its last listener leaves.
	r1 := mustListen(t, tcp, "0.0.0.0:8084", WithReusePort())
	r2 := mustListen(t, tcp, "0.0.0.0:8084", WithReusePort())
	r3 := mustListen(t, tcp, "127.0.0.1:8084", WithReusePort())
	r1()
	wantInUse(t, a, "127.0.0.2:8084")
	r2()
	wantInUse(t, a, "127.0.0.1:8084")
	wantFree(t, a, "127.0.0.2:8084")
	r3()
	requireNoHolds(t, a)
}

func TestBindEphemeralSkipsListenerPort(t *testing.T) {
	a, tcp := newSharedTCP(t, WithPortRange(PortRange{40000, 40001}))
	lo := netip.MustParseAddr("127.0.0.1")
	r1 := mustListen(t, tcp, "127.0.0.1:40000")
	r2 := mustListen(t, tcp, "127.0.0.1:40001")
	for _, addr := range []netip.Addr{lo, netip.IPv4Unspecified()} {
		if p, rel, err := a.BindEphemeral(addr); !errors.Is(err, ErrNoPorts) {
			if rel != nil {
				rel()
			}
			t.Fatalf("BindEphemeral(%v) with every port listened on = %d, %v, want ErrNoPorts", addr, p, err)
		}
	}
	r1()
	p, rel, err := a.BindEphemeral(lo)
	if err != nil || p != 40000 {
		t.Fatalf("BindEphemeral(%v) after a release = %d, %v, want 40000", lo, p, err)
	}
	rel()
	r2()
	requireNoHolds(t, a)
}

func TestConnectSkipsListenerPort(t *testing.T) {
	a, tcp := newSharedTCP(t, WithPortRange(PortRange{40000, 40000}))
	other := New[int](WithPortAllocator(a))
	lo, lo2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	remote := netip.MustParseAddrPort("10.0.0.9:443")
	rel := mustListen(t, tcp, "127.0.0.1:40000")
	for name, tab := range map[string]*Table[int]{"Established": tcp.Established(), "another table": other} {
		if tup, err := tab.Connect(nil, lo, remote, valPtr(1)); !errors.Is(err, ErrNoPorts) {
			t.Fatalf("%s: Connect from %v with the only port listened on = %v, %v, want ErrNoPorts", name, lo, tup, err)
		}
		if _, _, err := tab.ConnectFunc(nil, lo, remote, func(Tuple) (*int, error) { return valPtr(1), nil }); !errors.Is(err, ErrNoPorts) {
			t.Fatalf("%s: ConnectFunc from %v with the only port listened on = %v, want ErrNoPorts", name, lo, err)
		}
	}
	// Nor from another address, of either family, as the kernel's
	// connect() skips the port whatever its source address
	// (TestKernelConnectSkipsBoundPorts).
	for _, from := range []netip.Addr{lo2, netip.MustParseAddr("::1")} {
		to := remote
		if from.Is6() {
			to = netip.MustParseAddrPort("[2001:db8::9]:443")
		}
		if tup, err := tcp.Established().Connect(nil, from, to, valPtr(1)); !errors.Is(err, ErrNoPorts) {
			t.Fatalf("Connect from %v with the only port listened on by %v = %v, %v, want ErrNoPorts", from, lo, tup, err)
		}
	}
	// A listener on the wildcard conflicts with every address of its family.
	rel()
	rel2 := mustListen(t, tcp, "0.0.0.0:40000")
	if _, err := tcp.Established().Connect(nil, lo2, remote, valPtr(1)); !errors.Is(err, ErrNoPorts) {
		t.Fatalf("Connect from %v with a listener on 0.0.0.0 = %v, want ErrNoPorts", lo2, err)
	}
	rel2()
	if _, err := tcp.Established().Connect(nil, lo, remote, valPtr(1)); err != nil {
		t.Fatalf("Connect after the listeners' release = %v, want success", err)
	}
}

func TestListenRefusedByBind(t *testing.T) {
	a, tcp := newSharedTCP(t)
	unbind, err := a.Bind(netip.MustParseAddrPort("127.0.0.1:9000"))
	if err != nil {
		t.Fatal(err)
	}
	// A Bind stands for a socket with neither SO_REUSEADDR nor SO_REUSEPORT:
	// no option of the listener's lets it share.
	for _, ap := range []string{"127.0.0.1:9000", "[::ffff:127.0.0.1]:9000", "0.0.0.0:9000", "[::]:9000", "[::ffff:0.0.0.0]:9000"} {
		for _, opts := range [][]BindOption{nil, {WithReuseAddr()}, {WithReusePort()}, {WithReuseAddr(), WithReusePort()}} {
			wantListenInUse(t, a, tcp, ap, opts...)
		}
	}
	mustListen(t, tcp, "127.0.0.2:9000")()
	mustListen(t, tcp, "[::]:9000", WithIPv6Only())()
	unbind()
	rel := mustListen(t, tcp, "127.0.0.1:9000")
	wantInUse(t, a, "127.0.0.1:9000")
	rel()
	requireNoHolds(t, a)
}

// TestListenRefusedByFlows: Linux refuses bind() next to a connected socket
// on a conflicting address unless both set SO_REUSEADDR; a flow counts as
// a socket that did.
func TestListenRefusedByFlows(t *testing.T) {
	a, tcp := newSharedTCP(t)
	lo := netip.MustParseAddr("127.0.0.1")
	tup, err := tcp.Established().Connect(nil, lo, netip.MustParseAddrPort("10.0.0.9:443"), valPtr(7))
	if err != nil {
		t.Fatal(err)
	}
	p := tup.Local.Port()
	at := func(addr string) string { return netip.AddrPortFrom(netip.MustParseAddr(addr), p).String() }
	for _, ap := range []string{at("127.0.0.1"), at("::ffff:127.0.0.1"), at("0.0.0.0"), at("::"), at("::ffff:0.0.0.0")} {
		wantListenInUse(t, a, tcp, ap)
		wantListenInUse(t, a, tcp, ap, WithReusePort())
	}
	for _, ap := range []string{at("127.0.0.2"), at("::1")} {
		mustListen(t, tcp, ap)()
	}
	mustListen(t, tcp, at("::"), WithIPv6Only())()
	for _, ap := range []string{at("127.0.0.1"), at("0.0.0.0"), at("::")} {
		rel := mustListen(t, tcp, ap, WithReuseAddr())
		wantInUse(t, a, at("127.0.0.1"))
		if v, ok := tcp.Lookup(tup); !ok || *v != 7 {
			t.Fatalf("with a listener on %s, the flow's segment reaches %v, %v", ap, v, ok)
		}
		rel()
	}
	// The flow still keeps a.Bind off, and once gone, Listen.
	wantInUse(t, a, at("127.0.0.1"))
	tcp.Established().Delete(tup)
	mustListen(t, tcp, at("127.0.0.1"))()
	requireNoHolds(t, a)
}

// TestListenReusePortGroupWithFlows: a listener joining the reuseport group
// that holds its port is not checked against the group's accepted
// connections, as Linux's bind bucket fast path skips the check; once the
// group is gone, the connections count as sockets with SO_REUSEADDR only.
func TestListenReusePortGroupWithFlows(t *testing.T) {
	a, tcp := newSharedTCP(t)
	r1 := mustListen(t, tcp, "0.0.0.0:9100", WithReusePort())
	accepted := Tuple{Local: netip.MustParseAddrPort("127.0.0.1:9100"), Remote: netip.MustParseAddrPort("192.0.2.7:5555")}
	if err := tcp.Established().Insert(accepted, valPtr(1)); err != nil {
		t.Fatal(err)
	}
	r2 := mustListen(t, tcp, "0.0.0.0:9100", WithReusePort())
	r1()
	r2()
	wantListenInUse(t, a, tcp, "0.0.0.0:9100", WithReusePort())
	wantListenInUse(t, a, tcp, "0.0.0.0:9100")
	mustListen(t, tcp, "0.0.0.0:9100", WithReuseAddr())()
	tcp.Established().Delete(accepted)
	requireNoHolds(t, a)
}

// TestListenAnotherTableHolds: a listener of another table sharing the
// allocator counts as a bind without options.
func TestListenAnotherTableHolds(t *testing.T) {
	a, x := newSharedTCP(t)
	y := NewTCPTable[int](WithPortAllocator(a))
	rel := mustListen(t, x, "0.0.0.0:9200", WithReusePort())
	wantListenInUse(t, a, y, "0.0.0.0:9200", WithReusePort())
	wantListenInUse(t, a, y, "127.0.0.1:9200", WithReusePort(), WithReuseAddr())
	mustListen(t, y, "[::]:9200", WithIPv6Only())()
	mustListen(t, x, "0.0.0.0:9200", WithReusePort())() // its own group
	rel()
	mustListen(t, y, "0.0.0.0:9200")()
	requireNoHolds(t, a)
}

// TestPortAllocatorOneProtocol: an allocator serves the tables of one
// protocol.
func TestPortAllocatorOneProtocol(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			t.Helper()
			r := recover()
			if r == nil {
				t.Fatalf("%s did not panic", name)
			}
			if s, _ := r.(string); !strings.Contains(s, "WithPortAllocator") {
				t.Fatalf("%s panicked with %v, which does not name the option", name, r)
			}
		}()
		f()
	}
	a, _ := newSharedTCP(t)
	NewTCPTable[int](WithPortAllocator(a))
	New[int](WithPortAllocator(a))
	mustPanic("NewUDPTable with a TCP allocator", func() { NewUDPTable[int](WithPortAllocator(a)) })
	b, _ := newSharedUDP(t)
	NewUDPTable[int](WithPortAllocator(b))
	mustPanic("NewTCPTable with a UDP allocator", func() { NewTCPTable[int](WithPortAllocator(b)) })
}

// TestListenConnectRace listens on and connects from the ports of a small
// range at once: while a flow is in the table, no listener holds its port
// for its address, whichever came first.
func TestListenConnectRace(t *testing.T) {
	a, tcp := newSharedTCP(t, WithPortRange(PortRange{41000, 41003}))
	local := netip.MustParseAddr("127.0.0.1")
	raceHoldsAndConnects(t, a, tcp.Established(), local, 2000, func(i int, p uint16) {
		addr := local
		if i%3 == 0 {
			addr = netip.IPv4Unspecified()
		}
		if rel, err := tcp.Listen(netip.AddrPortFrom(addr, p), valPtr(i)); err == nil {
			rel()
		}
	})
	requireNoHolds(t, a)
}

func TestUDPBindHoldsPort(t *testing.T) {
	a, u := newSharedUDP(t)
	s := mustUDPBind(t, u, "127.0.0.1:5353")
	wantInUse(t, a, "127.0.0.1:5353")
	wantInUse(t, a, "0.0.0.0:5353")
	wantFree(t, a, "127.0.0.2:5353")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantFree(t, a, "127.0.0.1:5353")

	// Sockets of a reuseport group hold the port until the last closes.
	s1 := mustUDPBind(t, u, "0.0.0.0:5354", WithReusePort())
	s2 := mustUDPBind(t, u, "0.0.0.0:5354", WithReusePort())
	s1.Close()
	wantInUse(t, a, "127.0.0.1:5354")
	s2.Close()
	wantFree(t, a, "127.0.0.1:5354")

	s = mustUDPBind(t, u, "[::]:5355")
	wantInUse(t, a, "127.0.0.1:5355")
	wantInUse(t, a, "[::1]:5355")
	s.Close()
	s = mustUDPBind(t, u, "[::]:5355", WithIPv6Only())
	wantFree(t, a, "127.0.0.1:5355")
	s.Close()

	// The hold stays on the wildcard after a connect fixes the address.
	s = mustUDPBind(t, u, "0.0.0.0:5356")
	if err := s.ConnectFrom(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddrPort("10.0.0.1:53")); err != nil {
		t.Fatal(err)
	}
	wantInUse(t, a, "127.0.0.2:5356")
	if err := s.Disconnect(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}
	requireNoHolds(t, a)
}

func TestConnectSkipsUDPSocketPort(t *testing.T) {
	a, u := newSharedUDP(t, WithPortRange(PortRange{40000, 40000}))
	flows := New[int](WithPortAllocator(a))
	lo, remote := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddrPort("10.0.0.9:53")
	s := mustUDPBind(t, u, "127.0.0.1:40000")
	if tup, err := flows.Connect(nil, lo, remote, valPtr(1)); !errors.Is(err, ErrNoPorts) {
		t.Fatalf("Connect with the only port bound = %v, %v, want ErrNoPorts", tup, err)
	}
	s.Close()
	if _, err := flows.Connect(nil, lo, remote, valPtr(1)); err != nil {
		t.Fatalf("Connect after Close = %v, want success", err)
	}
}

func TestUDPBindRefusedByBindAndFlows(t *testing.T) {
	a, u := newSharedUDP(t)
	flows := New[int](WithPortAllocator(a))
	unbind, err := a.Bind(netip.MustParseAddrPort("127.0.0.1:6000"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ap := range []string{"127.0.0.1:6000", "0.0.0.0:6000", "[::]:6000", "[::ffff:127.0.0.1]:6000"} {
		for _, opts := range [][]BindOption{nil, {WithReuseAddr()}, {WithReusePort()}} {
			wantUDPBindInUse(t, a, u, ap, opts...)
		}
	}
	mustUDPBind(t, u, "127.0.0.2:6000").Close()
	unbind()
	mustUDPBind(t, u, "127.0.0.1:6000").Close()

	tup, err := flows.Connect(nil, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddrPort("10.0.0.9:53"), valPtr(1))
	if err != nil {
		t.Fatal(err)
	}
	p := tup.Local.Port()
	at := func(addr string) string { return netip.AddrPortFrom(netip.MustParseAddr(addr), p).String() }
	for _, ap := range []string{at("127.0.0.1"), at("0.0.0.0"), at("::")} {
		wantUDPBindInUse(t, a, u, ap)
		wantUDPBindInUse(t, a, u, ap, WithReusePort())
	}
	mustUDPBind(t, u, at("127.0.0.2")).Close()
	mustUDPBind(t, u, at("::"), WithIPv6Only()).Close()
	s := mustUDPBind(t, u, at("127.0.0.1"), WithReuseAddr())
	wantInUse(t, a, at("127.0.0.1"))
	s.Close()
	flows.Delete(tup)
	mustUDPBind(t, u, at("127.0.0.1")).Close()
	requireNoHolds(t, a)
}
