package main

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hash4/hash4"
	"github.com/hash4/hash4/examples/internal/porttest"
)

// Many clients at once, each with a window of datagrams in flight: every
// echo comes back to the client that sent it, each flow has its own outside
// port in the range, and the upstream sees one source port per client.
func TestManyClientsEchoToSender(t *testing.T) {
	const clients, perClient, window = 32, 60, 4
	up := startUpstream(t)
	ports := porttest.Ports(64)
	gw, _ := startGateway(t, testConfig(up.addr(), ports))

	var wg sync.WaitGroup
	errs := make(chan error, clients)
	addrs := make([]netip.AddrPort, clients)
	for i := range clients {
		c := newClient(t, gw.addr())
		addrs[i] = c.addr()
		wg.Go(func() {
			// Send in bursts of window, then collect the burst's echoes in
			// any order; each must be one of this client's.
			for seq := 0; seq < perClient; seq += window {
				pending := map[string]bool{}
				for k := seq; k < seq+window; k++ {
					p := fmt.Appendf(nil, "client %d from %v seq %d", i, c.addr(), k)
					pending[string(p)] = true
					if err := c.send(p); err != nil {
						errs <- err
						return
					}
				}
				for range window {
					got, ok := c.recv(5 * time.Second)
					if !ok {
						errs <- fmt.Errorf("client %d: echo missing after seq %d", i, seq)
						return
					}
					if !pending[string(got)] {
						errs <- fmt.Errorf("client %d got %q, not one of its own", i, got)
						return
					}
					delete(pending, string(got))
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// The gateway counts a datagram after its send returns, and the echo
	// may reach the client first: the counts settle a moment after the
	// last echo.
	want := int64(clients * perClient)
	waitFor(2*time.Second, func() bool {
		s := gw.stats()
		return s.ToUpstream == want && s.ToClients == want
	})
	s := gw.stats()
	if s.ToUpstream != want || s.ToClients != want {
		t.Errorf("forwarded %d up, %d back; want %d each", s.ToUpstream, s.ToClients, want)
	}
	if s.FlowsCreated != clients || s.FlowsActive != clients || s.PortsInUse != clients {
		t.Errorf("flows created %d, active %d, ports in use %d; want %d each", s.FlowsCreated, s.FlowsActive, s.PortsInUse, clients)
	}
	if s.Misrouted != 0 || s.Unmatched != 0 || s.SendErrors != 0 {
		t.Errorf("misrouted %d, unmatched %d, send errors %d; want 0", s.Misrouted, s.Unmatched, s.SendErrors)
	}
	flows := gw.flows()
	seen := map[uint16]bool{}
	for _, a := range addrs {
		p, ok := flows[a]
		switch {
		case !ok:
			t.Errorf("client %v has no flow", a)
		case !inRange(ports, p):
			t.Errorf("client %v: outside port %d not in %d-%d", a, p, ports.Low, ports.High)
		case seen[p]:
			t.Errorf("client %v: outside port %d shared with another flow", a, p)
		}
		seen[p] = true
	}
	if got := up.sourcePorts(); len(got) != clients {
		t.Errorf("upstream saw %d source ports, want %d", len(got), clients)
	}
}

// Flows expire after the idle timeout, not before, and free their ports:
// with a range of 4 ports, 4 later flows get exactly those ports again.
func TestIdleFlowsExpireAndPortsAreReused(t *testing.T) {
	const idle = 500 * time.Millisecond
	up := startUpstream(t)
	ports := porttest.Ports(4)
	cfg := testConfig(up.addr(), ports)
	cfg.idle = idle
	gw, _ := startGateway(t, cfg)

	var old []*client
	for i := range 4 {
		c := newClient(t, gw.addr())
		if err := c.roundTrip(fmt.Appendf(nil, "first %d", i), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		old = append(old, c)
	}
	lastSend := time.Now()
	if got := portsOf(gw); len(got) != 4 {
		t.Fatalf("4 flows use ports %v, want all 4 of %d-%d", got, ports.Low, ports.High)
	}
	// A fifth flow finds no port while the 4 live.
	extra := newClient(t, gw.addr())
	extra.send([]byte("no port for me"))
	if !waitFor(2*time.Second, func() bool { return gw.stats().NoPortDrops == 1 }) {
		t.Fatalf("no-port drops %d, want 1", gw.stats().NoPortDrops)
	}

	if !waitFor(5*time.Second, func() bool { s := gw.stats(); return s.FlowsActive == 0 && s.PortsInUse == 0 }) {
		t.Fatalf("flows not expired: %+v", gw.stats())
	}
	if since := time.Since(lastSend); since < idle {
		t.Errorf("flows expired %v after the last datagram, before the idle timeout %v", since, idle)
	}
	if s := gw.stats(); s.FlowsExpired != 4 {
		t.Errorf("flows expired %d, want 4", s.FlowsExpired)
	}

	// Two old clients come back (new flows for the same addresses) and two
	// new ones arrive: all get through, on the same 4 ports.
	next := []*client{old[0], old[1], newClient(t, gw.addr()), newClient(t, gw.addr())}
	for i, c := range next {
		if err := c.roundTrip(fmt.Appendf(nil, "second %d", i), 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	got := portsOf(gw)
	for p := range got {
		if !inRange(ports, p) {
			t.Errorf("port %d outside %d-%d", p, ports.Low, ports.High)
		}
	}
	s := gw.stats()
	if len(got) != 4 || s.PortsReused != 4 || s.FlowsCreated != 8 {
		t.Errorf("second round: ports %v, reused %d, created %d; want 4 ports, 4 reused, 8 created", got, s.PortsReused, s.FlowsCreated)
	}
	if s.PortsRefused != 0 {
		t.Errorf("ports refused %d, want 0 (an expired flow's socket must be closed before its port is reused)", s.PortsRefused)
	}
}

// The flow limit holds: new flows past it are dropped and counted, the
// admitted flows keep working.
func TestFlowLimit(t *testing.T) {
	const limit, clients, flood = 5, 10, 40
	up := startUpstream(t)
	cfg := testConfig(up.addr(), porttest.Ports(64))
	cfg.maxFlows = limit
	gw, _ := startGateway(t, cfg)

	cs := make([]*client, clients)
	answered := make([]bool, clients)
	var wg sync.WaitGroup
	for i := range cs {
		cs[i] = newClient(t, gw.addr())
		c := cs[i]
		wg.Go(func() {
			p := fmt.Appendf(nil, "hello from %d", i)
			c.send(p)
			if got, ok := c.recv(time.Second); ok {
				if !bytes.Equal(got, p) {
					t.Errorf("client %d got %q", i, got)
				}
				answered[i] = true
			}
		})
	}
	wg.Wait()
	n := 0
	for _, a := range answered {
		if a {
			n++
		}
	}
	if n != limit {
		t.Errorf("%d clients answered, want %d (the flow limit)", n, limit)
	}
	// A flood of new flows, all dropped.
	for i := range flood {
		newClient(t, gw.addr()).send(fmt.Appendf(nil, "flood %d", i))
	}
	if !waitFor(2*time.Second, func() bool { return gw.stats().FlowLimitDrops == clients-limit+flood }) {
		t.Errorf("flow-limit drops %d, want %d", gw.stats().FlowLimitDrops, clients-limit+flood)
	}
	s := gw.stats()
	if s.FlowsActive != limit || s.PeakFlows != limit || s.FlowsCreated != limit {
		t.Errorf("flows active %d, peak %d, created %d; want %d each", s.FlowsActive, s.PeakFlows, s.FlowsCreated, limit)
	}
	// The admitted flows still work.
	for i, c := range cs {
		if answered[i] {
			if err := c.roundTrip([]byte("still here"), 2*time.Second); err != nil {
				t.Error(err)
			}
		}
	}
}

// Oversize datagrams are dropped either way and counted; an oversize
// datagram makes no flow.
func TestOversizeDropped(t *testing.T) {
	const limit = 100
	up := startUpstreamWith(t, func(p []byte) []byte {
		if bytes.HasPrefix(p, []byte("big")) {
			return bytes.Repeat([]byte("x"), 2*limit)
		}
		return p
	}, nil)
	cfg := testConfig(up.addr(), porttest.Ports(8))
	cfg.maxDatagram = limit
	gw, _ := startGateway(t, cfg)
	c := newClient(t, gw.addr())

	c.send(bytes.Repeat([]byte("a"), limit+1))
	if got, ok := c.recv(300 * time.Millisecond); ok {
		t.Errorf("oversize datagram answered: %d bytes", len(got))
	}
	if s := gw.stats(); s.OversizeIn != 1 || s.FlowsCreated != 0 || s.ToUpstream != 0 {
		t.Errorf("after an oversize datagram: oversize in %d, flows %d, forwarded %d; want 1, 0, 0", s.OversizeIn, s.FlowsCreated, s.ToUpstream)
	}
	if err := c.roundTrip(bytes.Repeat([]byte("b"), limit), 2*time.Second); err != nil {
		t.Errorf("datagram of exactly -max-datagram bytes: %v", err)
	}
	// The upstream answers this one with an oversize reply.
	c.send([]byte("big please"))
	if got, ok := c.recv(300 * time.Millisecond); ok {
		t.Errorf("oversize reply delivered: %d bytes", len(got))
	}
	if !waitFor(time.Second, func() bool { return gw.stats().OversizeOut == 1 }) {
		t.Errorf("oversize out %d, want 1", gw.stats().OversizeOut)
	}
	if err := c.roundTrip([]byte("small again"), 2*time.Second); err != nil {
		t.Error(err)
	}
	// ToClients is counted after the send returns: it settles a moment
	// after the echo arrives.
	waitFor(time.Second, func() bool { return gw.stats().ToClients == 2 })
	if s := gw.stats(); s.FlowsCreated != 1 || s.ToClients != 2 {
		t.Errorf("flows created %d, forwarded to client %d; want 1 and 2", s.FlowsCreated, s.ToClients)
	}
}

// A client that vanishes with a reply in flight: the reply goes nowhere,
// nothing crashes, nobody else gets it, and its flow expires.
func TestVanishedClient(t *testing.T) {
	up := startUpstreamWith(t, nil, func(p []byte) time.Duration {
		if bytes.HasPrefix(p, []byte("slow")) {
			return 200 * time.Millisecond
		}
		return 0
	})
	cfg := testConfig(up.addr(), porttest.Ports(8))
	cfg.idle = 500 * time.Millisecond
	gw, _ := startGateway(t, cfg)

	gone := newClient(t, gw.addr())
	gone.send([]byte("slow reply for a client about to vanish"))
	if !waitFor(2*time.Second, func() bool { return gw.stats().ToUpstream == 1 }) {
		t.Fatal("first datagram not forwarded")
	}
	gone.conn.Close()

	// Another client talks meanwhile, and must only ever get its own.
	other := newClient(t, gw.addr())
	for i := range 40 {
		if err := other.roundTrip(fmt.Appendf(nil, "other %d", i), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, ok := other.recv(300 * time.Millisecond); ok {
		t.Errorf("other client got a stray datagram %q", got)
	}
	// The vanished client's reply was forwarded (to a closed port) and its
	// flow expires; the other is still served.
	if !waitFor(3*time.Second, func() bool { s := gw.stats(); return s.ToClients == 41 && s.FlowsExpired >= 1 }) {
		t.Errorf("after the vanished client: %+v", gw.stats())
	}
	if err := other.roundTrip([]byte("still fine"), 2*time.Second); err != nil {
		t.Error(err)
	}
	if s := gw.stats(); s.Misrouted != 0 {
		t.Errorf("misrouted %d", s.Misrouted)
	}
}

// A port of the range held by another socket: the gateway's bind fails, it
// holds the port back, counts it, and never gives it to a flow; once the
// port is free again and the hold has expired, a flow gets it.
func TestPortRefusedByOS(t *testing.T) {
	up := startUpstream(t)
	// A 4-port range whose ports are all free but one, which we take.
	var occupier *net.UDPConn
	var taken uint16
	ports := porttest.Ports(4)
	for try := 0; occupier == nil; try++ {
		if try == 10 {
			t.Fatal("no free 4-port range found")
		}
		free := true
		for p := ports.Low; p <= ports.High; p++ {
			free = free && canBind(netip.AddrPortFrom(loopback, p))
		}
		if !free {
			ports = porttest.Ports(4)
			continue
		}
		taken = ports.Low + 1
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, taken)))
		if err != nil {
			ports = porttest.Ports(4)
			continue
		}
		occupier = c
	}
	defer occupier.Close()

	cfg := testConfig(up.addr(), ports)
	cfg.idle = time.Second
	gw, _ := startGateway(t, cfg)

	var cs []*client
	for i := range 3 {
		c := newClient(t, gw.addr())
		if err := c.roundTrip(fmt.Appendf(nil, "flow %d", i), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	// The fourth flow: the only port left is the occupied one.
	fourth := newClient(t, gw.addr())
	fourth.send([]byte("fourth"))
	if got, ok := fourth.recv(300 * time.Millisecond); ok {
		t.Errorf("fourth flow answered (%q) with every free port in use", got)
	}
	s := gw.stats()
	if s.PortsRefused != 1 || s.NoPortDrops != 1 || s.PortsHeld != 1 || s.FlowsCreated != 3 {
		t.Errorf("refused %d, no-port drops %d, held %d, flows %d; want 1, 1, 1, 3", s.PortsRefused, s.NoPortDrops, s.PortsHeld, s.FlowsCreated)
	}
	if got := portsOf(gw); got[taken] || len(got) != 3 {
		t.Errorf("flow ports %v: want the 3 free ones, not %d", got, taken)
	}

	// Free the port; keep the 3 flows alive until the hold runs out, then
	// the fourth client gets through on the freed port.
	occupier.Close()
	heartbeat := func() {
		for i, c := range cs {
			if err := c.roundTrip(fmt.Appendf(nil, "keepalive %d", i), 2*time.Second); err != nil {
				t.Error(err)
			}
		}
	}
	for deadline := time.Now().Add(5 * time.Second); gw.stats().PortsHeld != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("refused port still held after 5s")
		}
		heartbeat()
	}
	heartbeat()
	if err := fourth.roundTrip([]byte("fourth again"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := portsOf(gw); !got[taken] || len(got) != 4 {
		t.Errorf("flow ports %v: want all 4, including the freed %d", got, taken)
	}
	if s := gw.stats(); s.FlowsExpired != 0 {
		t.Errorf("flows expired %d during the heartbeat, want 0", s.FlowsExpired)
	}
}

// Shutdown closes every socket and ends every goroutine.
func TestShutdownLeavesNothing(t *testing.T) {
	up := startUpstream(t)
	ports := porttest.Ports(32)
	before := runtime.NumGoroutine()
	cfg := testConfig(up.addr(), ports)
	gw, stop := startGateway(t, cfg)
	inside := gw.addr()

	var cs []*client
	for i := range 20 {
		c := newClient(t, gw.addr())
		if err := c.roundTrip(fmt.Appendf(nil, "c%d", i), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	used := portsOf(gw)
	if len(used) != 20 {
		t.Fatalf("%d outside ports, want 20", len(used))
	}
	if n := runtime.NumGoroutine(); n < before+21 {
		t.Errorf("%d goroutines with 20 flows, started from %d: want a reader per flow", n, before)
	}

	stop()
	if !waitFor(3*time.Second, func() bool { return runtime.NumGoroutine() <= before }) {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines: %d before, %d after shutdown\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
	if !canBind(inside) {
		t.Errorf("inside address %v still bound after shutdown", inside)
	}
	for p := range used {
		if !canBind(netip.AddrPortFrom(loopback, p)) {
			t.Errorf("outside port %d still bound after shutdown", p)
		}
	}
	s := gw.stats()
	if s.FlowsActive != 0 || s.PortsInUse != 0 {
		t.Errorf("after shutdown: flows %d, ports in use %d", s.FlowsActive, s.PortsInUse)
	}
	// Nothing answers now.
	cs[0].send([]byte("anyone?"))
	if got, ok := cs[0].recv(200 * time.Millisecond); ok {
		t.Errorf("answer after shutdown: %q", got)
	}
}

// A flow's socket binds the configured outside address, zone included: the
// tuple Connect returns has none, and a link-local address cannot be bound
// without one.
func TestFlowBindAddrKeepsZone(t *testing.T) {
	for _, outside := range []string{"fe80::1%eth0", "127.0.0.1", "2001:db8::1"} {
		out := netip.MustParseAddr(outside)
		tab := hash4.New[int]()
		alloc, err := hash4.NewPortAllocator(hash4.WithPortRange(hash4.PortRange{Low: 40000, High: 40009}))
		if err != nil {
			t.Fatal(err)
		}
		upstream := netip.MustParseAddrPort("[2001:db8::53]:53")
		if out.Is4() {
			upstream = netip.MustParseAddrPort("192.0.2.53:53")
		}
		tup, err := tab.Connect(alloc, out, upstream, new(int))
		if err != nil {
			t.Fatalf("%v: Connect: %v", out, err)
		}
		if tup.Local.Addr().Zone() != "" {
			t.Fatalf("%v: Connect's tuple kept zone %q: nothing left to show", out, tup.Local.Addr().Zone())
		}
		if got := flowBindAddr(out, tup); got.Addr() != out || got.Port() != tup.Local.Port() {
			t.Errorf("%v: flow binds %v, want %v with port %d", out, got, outside, tup.Local.Port())
		}
	}
}

// The IPv4 wildcard in IPv4-mapped form is refused as a wildcard, for each
// address of the config: hash4 takes it for 0.0.0.0 and could key no flow.
func TestConfigRefusesMappedWildcard(t *testing.T) {
	mapped := netip.MustParseAddr("::ffff:0.0.0.0")
	for name, change := range map[string]func(*config){
		"inside":   func(c *config) { c.inside = netip.AddrPortFrom(mapped, 5000) },
		"outside":  func(c *config) { c.outside = mapped },
		"upstream": func(c *config) { c.upstream = netip.AddrPortFrom(mapped, 53) },
	} {
		cfg := testConfig(netip.MustParseAddrPort("127.0.0.1:53"), porttest.Ports(1))
		change(&cfg)
		if err := cfg.check(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s %v: check() = %v, want an error naming %s", name, mapped, err, name)
		}
	}
}

// needIPv6Loopback skips the test on a host without ::1.
func needIPv6Loopback(t *testing.T) {
	t.Helper()
	c, err := net.ListenUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.IPv6Loopback(), 0)))
	if err != nil {
		t.Skipf("no IPv6 loopback on this host: %v", err)
	}
	c.Close()
}

// The gateway forwards between IPv6 clients and an IPv6 upstream, and
// between the families, either way round: every echo comes back to its
// sender, each flow has its own outside port, and the upstream sees every
// flow come from the outside address.
func TestIPv6(t *testing.T) {
	needIPv6Loopback(t)
	v4, v6 := loopback, netip.IPv6Loopback()
	for _, tc := range []struct {
		name            string
		inside, outside netip.Addr
	}{
		{"6to6", v6, v6},
		{"4to6", v4, v6},
		{"6to4", v6, v4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const clients, perClient = 4, 3
			up := startUpstreamOn(t, tc.outside, nil, nil)
			cfg := testConfig(up.addr(), porttest.Ports(8))
			cfg.inside, cfg.outside = netip.AddrPortFrom(tc.inside, 0), tc.outside
			gw, _ := startGateway(t, cfg)
			if got := gw.addr().Addr(); got != tc.inside {
				t.Fatalf("gateway listens on %v, want %v", got, tc.inside)
			}
			var addrs []netip.AddrPort
			for i := range clients {
				c := newClient(t, gw.addr())
				addrs = append(addrs, c.addr())
				for k := range perClient {
					if err := c.roundTrip(fmt.Appendf(nil, "client %d seq %d", i, k), 5*time.Second); err != nil {
						t.Fatal(err)
					}
				}
			}
			flows := gw.flows()
			seen := map[uint16]bool{}
			for _, a := range addrs {
				p, ok := flows[a]
				if !ok || !inRange(cfg.ports, p) || seen[p] {
					t.Errorf("client %v: outside port %d (found %v), want a port of its own in %d-%d", a, p, ok, cfg.ports.Low, cfg.ports.High)
				}
				seen[p] = true
			}
			up.mu.Lock()
			defer up.mu.Unlock()
			if len(up.sources) != clients {
				t.Errorf("upstream saw %d sources, want %d", len(up.sources), clients)
			}
			for src, n := range up.sources {
				if src.Addr().Unmap() != tc.outside || !seen[src.Port()] || n != perClient {
					t.Errorf("upstream got %d datagrams from %v; want %d from %v at a flow's port", n, src, perClient, tc.outside)
				}
			}
		})
	}
}
