//go:build linux && amd64

package hash4

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
)

// ipLocalPortRange is the socket option IP_LOCAL_PORT_RANGE, missing from
// package syscall.
const ipLocalPortRange = 51

// TestKernelBindSeesConnected checks the rules of the shared bind table
// against the kernel, with real TCP sockets on loopback: after connect()
// autobinds 127.0.0.1:P, bind() of 127.0.0.1:P and 0.0.0.0:P fail with
// EADDRINUSE and bind() of 127.0.0.2:P succeeds (inet_csk_bind_conflict),
// while bind() to port 0 with P the only port left skips it for both
// addresses (inet_csk_find_open_port); a PortAllocator
// shared with a table that holds the flow answers the same. Both
// sockets with SO_REUSEADDR, the kernel allows the bind, which the
// allocator, without reuse options, does not model.
func TestKernelBindSeesConnected(t *testing.T) {
	inOwnNetns(t)
	server := loopbackListener(t)
	connected := func(reuse bool) netip.AddrPort {
		c := tcpSock(t)
		if reuse {
			setInt(t, c, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
		}
		if err := syscall.Connect(c, sockaddrOf(server, false)); err != nil {
			t.Fatal(err)
		}
		return sockName(t, c)
	}
	kernelBind := func(ap netip.AddrPort, reuse bool, rng uint16) (uint16, error) {
		s := tcpSock(t)
		if reuse {
			setInt(t, s, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
		}
		if rng != 0 {
			setInt(t, s, syscall.IPPROTO_IP, ipLocalPortRange, int(rng)|int(rng)<<16)
		}
		if err := syscall.Bind(s, sockaddrOf(ap, false)); err != nil {
			return 0, err
		}
		return sockName(t, s).Port(), nil
	}

	local := connected(false)
	p := local.Port()
	a, err := NewPortAllocator(WithPortRange(PortRange{p, p}))
	if err != nil {
		t.Fatal(err)
	}
	tab := New[int](WithPortAllocator(a))
	if err := tab.Insert(Tuple{Local: local, Remote: server}, valPtr(1)); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1", "0.0.0.0", "127.0.0.2"} {
		ap := netip.AddrPortFrom(netip.MustParseAddr(addr), p)
		_, kerr := kernelBind(ap, false, 0)
		rel, merr := a.Bind(ap)
		if rel != nil {
			rel()
		}
		if errors.Is(kerr, syscall.EADDRINUSE) != errors.Is(merr, syscall.EADDRINUSE) || (kerr == nil) != (merr == nil) {
			t.Errorf("bind(%v) after connect from %v: kernel %v, allocator %v", ap, local, kerr, merr)
		}
	}
	for _, addr := range []string{"127.0.0.1", "127.0.0.2", "0.0.0.0"} {
		ip := netip.MustParseAddr(addr)
		kport, kerr := kernelBind(netip.AddrPortFrom(ip, 0), false, p)
		mport, rel, merr := a.BindEphemeral(ip)
		if rel != nil {
			rel()
		}
		// N.B. bind() of port 0 reports EADDRINUSE where BindEphemeral
		// returns ErrNoPorts (see ErrNoPorts).
		if (kerr == nil) != (merr == nil) || (kerr == nil && kport != mport) ||
			(kerr != nil && (!errors.Is(kerr, syscall.EADDRINUSE) || !errors.Is(merr, ErrNoPorts))) {
			t.Errorf("bind(%v:0), only port %d: kernel %d %v, allocator %d %v", ip, p, kport, kerr, mport, merr)
		}
	}

	// N.B. connect() may give a port that another connection, or a
	// TIME_WAIT socket, to another destination uses too, such as one of
	// the tests of other packages that run meanwhile: a bind() then meets
	// it, and fails if it did not set SO_REUSEADDR. So a few tries, each
	// on a new port.
	for try := 0; try < 5; try++ {
		reused := connected(true)
		if _, err = kernelBind(reused, true, 0); err == nil {
			break
		}
		t.Logf("bind(%v) with SO_REUSEADDR on both sockets: %v", reused, err)
	}
	if err != nil {
		t.Errorf("bind() with SO_REUSEADDR on it and on a connected socket of its address and port: %v, want success", err)
	}
}

// loopbackListener returns the address of a TCP listener on 127.0.0.1 and
// a port the kernel chose, which the test closes at its end.
func loopbackListener(t *testing.T) netip.AddrPort {
	t.Helper()
	ln := tcpSock(t)
	if err := syscall.Bind(ln, sockaddrOf(netip.MustParseAddrPort("127.0.0.1:0"), false)); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(ln, 8); err != nil {
		t.Fatal(err)
	}
	return sockName(t, ln)
}

func tcpSock(t *testing.T) int {
	t.Helper()
	s, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(s) })
	return s
}

func setInt(t *testing.T, s, level, opt, v int) {
	t.Helper()
	if err := syscall.SetsockoptInt(s, level, opt, v); err != nil {
		t.Fatalf("setsockopt(%d, %d): %v", level, opt, err)
	}
}

func sockName(t *testing.T, s int) netip.AddrPort {
	t.Helper()
	sa, err := syscall.Getsockname(s)
	if err != nil {
		t.Fatal(err)
	}
	return addrPortOf(sa)
}

// TestKernelListenSeesBindTable checks the holds of a TCPTable's listeners
// and a UDPTable's sockets in a shared allocator against the kernel, with
// real sockets on loopback. A listener keeps connect() off its port
// (__inet_hash_connect: EADDRNOTAVAIL when it is the only port) and bind()
// off its address; listen() and a UDP bind() next to a connected socket on
// a conflicting address fail with EADDRINUSE unless both sockets set
// SO_REUSEADDR (inet_csk_bind_conflict, udp_lib_lport_inuse). The table
// counts a flow as a socket that set it: with the kernel's connected socket
// set so, the two agree on every case; with it unset, the kernel refuses
// wherever the table does.
func TestKernelListenSeesBindTable(t *testing.T) {
	inOwnNetns(t)
	lo := netip.MustParseAddr("127.0.0.1")
	serverAP := loopbackListener(t)

	// connect() skips the port of a listener.
	lp := loopbackListener(t).Port()
	c := tcpSock(t)
	setInt(t, c, syscall.IPPROTO_IP, ipLocalPortRange, int(lp)|int(lp)<<16)
	kerr := syscall.Connect(c, sockaddrOf(serverAP, false))
	a, err := NewPortAllocator(WithPortRange(PortRange{lp, lp}))
	if err != nil {
		t.Fatal(err)
	}
	tcp := NewTCPTable[int](WithPortAllocator(a))
	rel, err := tcp.Listen(netip.AddrPortFrom(lo, lp), valPtr(1))
	if err != nil {
		t.Fatal(err)
	}
	_, merr := tcp.Established().Connect(nil, lo, serverAP, valPtr(2))
	if !errors.Is(kerr, syscall.EADDRNOTAVAIL) || !errors.Is(merr, syscall.EADDRNOTAVAIL) {
		t.Errorf("connect with only the port of a listener on %v:%d: kernel %v, table %v, want EADDRNOTAVAIL", lo, lp, kerr, merr)
	}
	kerr = kernelSocket(t, syscall.SOCK_STREAM, netip.AddrPortFrom(lo, lp), false)
	_, merr = a.Bind(netip.AddrPortFrom(lo, lp))
	if !errors.Is(kerr, syscall.EADDRINUSE) || !errors.Is(merr, syscall.EADDRINUSE) {
		t.Errorf("bind(%v:%d) next to a listener: kernel %v, allocator %v, want EADDRINUSE", lo, lp, kerr, merr)
	}
	rel()

	// listen() and UDP bind() next to a connected socket.
	for _, typ := range []int{syscall.SOCK_STREAM, syscall.SOCK_DGRAM} {
		for _, connReuse := range []bool{true, false} {
			s, err := syscall.Socket(syscall.AF_INET, typ|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(s) })
			if connReuse {
				setInt(t, s, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			}
			if err := syscall.Connect(s, sockaddrOf(serverAP, false)); err != nil {
				t.Fatal(err)
			}
			local := sockName(t, s)
			a, err := NewPortAllocator()
			if err != nil {
				t.Fatal(err)
			}
			var tcp *TCPTable[int]
			var udp *UDPTable[int]
			var flows *Table[int]
			if typ == syscall.SOCK_STREAM {
				tcp = NewTCPTable[int](WithPortAllocator(a))
				flows = tcp.Established()
			} else {
				udp = NewUDPTable[int](WithPortAllocator(a))
				flows = New[int](WithPortAllocator(a))
			}
			if err := flows.Insert(Tuple{Local: local, Remote: serverAP}, valPtr(1)); err != nil {
				t.Fatal(err)
			}
			for _, addr := range []string{"127.0.0.1", "0.0.0.0", "127.0.0.2"} {
				for _, reuse := range []bool{false, true} {
					ap := netip.AddrPortFrom(netip.MustParseAddr(addr), local.Port())
					kerr := kernelSocket(t, typ, ap, reuse)
					var opts []BindOption
					if reuse {
						opts = append(opts, WithReuseAddr())
					}
					var merr error
					if tcp != nil {
						var rel func()
						if rel, merr = tcp.Listen(ap, valPtr(1), opts...); merr == nil {
							rel()
						}
					} else {
						var us *UDPSocket[int]
						if us, merr = udp.Bind(ap, valPtr(1), opts...); merr == nil {
							us.Close()
						}
					}
					if kerr != nil && !errors.Is(kerr, syscall.EADDRINUSE) {
						t.Fatalf("bind(%v): %v", ap, kerr)
					}
					agree := (kerr == nil) == (merr == nil) && (merr == nil || errors.Is(merr, syscall.EADDRINUSE))
					if !connReuse {
						agree = merr == nil || kerr != nil // the kernel refuses where the table does
					}
					if !agree {
						t.Errorf("type %d: bind(%v) with SO_REUSEADDR %v next to a socket connected from %v with SO_REUSEADDR %v: kernel %v, table %v",
							typ, ap, reuse, local, connReuse, kerr, merr)
					}
				}
			}
		}
	}
}

// kernelSocket opens a socket of type typ on ap, with SO_REUSEADDR if
// reuse, listens if it is a TCP socket, and closes it: it returns the error
// of bind() or listen().
func kernelSocket(t *testing.T, typ int, ap netip.AddrPort, reuse bool) error {
	t.Helper()
	s, err := syscall.Socket(syscall.AF_INET, typ|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(s)
	if reuse {
		setInt(t, s, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}
	if err := syscall.Bind(s, sockaddrOf(ap, false)); err != nil {
		return err
	}
	if typ == syscall.SOCK_STREAM {
		return syscall.Listen(s, 8)
	}
	return nil
}

// TestKernelConnectSkipsBoundPorts checks against the kernel, with real TCP
// sockets on loopback, that connect() from 127.0.0.1 with one port P in its
// range fails with EADDRNOTAVAIL once a socket is bound to P on any
// address, another IPv4 address and an IPv6-only :: alike, since
// __inet_hash_connect passes over every bind bucket that bind() made, and
// succeeds with P free; and that Connect, after a.Bind of the same address,
// answers the same.
func TestKernelConnectSkipsBoundPorts(t *testing.T) {
	inOwnNetns(t)
	server := loopbackListener(t)
	lo := netip.MustParseAddr("127.0.0.1")
	p := freeLoopbackPort(t)
	for _, bound := range []string{"127.0.0.2", "127.0.0.1", "0.0.0.0", "::", ""} {
		var kerr error
		func() {
			if bound != "" {
				b, err := boundTCPSock(t, netip.AddrPortFrom(netip.MustParseAddr(bound), p), true)
				defer syscall.Close(b)
				if err != nil {
					t.Fatalf("bind(%v:%d): %v", bound, p, err)
				}
			}
			c, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer closeRST(c) // no TIME_WAIT left on P
			setInt(t, c, syscall.IPPROTO_IP, ipLocalPortRange, int(p)|int(p)<<16)
			kerr = syscall.Connect(c, sockaddrOf(server, false))
		}()

		a, err := NewPortAllocator(WithPortRange(PortRange{p, p}))
		if err != nil {
			t.Fatal(err)
		}
		if bound != "" {
			if _, err := a.Bind(netip.AddrPortFrom(netip.MustParseAddr(bound), p)); err != nil {
				t.Fatal(err)
			}
		}
		tup, merr := New[int]().Connect(a, lo, server, valPtr(1))
		if (kerr == nil) != (merr == nil) || kerr != nil && (!errors.Is(kerr, syscall.EADDRNOTAVAIL) || !errors.Is(merr, syscall.EADDRNOTAVAIL)) {
			t.Errorf("connect from %v, only port %d, bound on %q: kernel %v, Connect %v %v", lo, p, bound, kerr, tup, merr)
		}
		if bound == "" && merr == nil && tup.Local.Port() != p {
			t.Errorf("Connect with only port %d free took %v", p, tup)
		}
	}
}

// TestKernelBindDualStack checks Bind's holds of :: against the kernel's
// bind(), with real TCP sockets on loopback and a fresh port per case: a
// dual-stack :: (IPV6_V6ONLY off, Linux's default) conflicts with IPv4
// binds and connected IPv4 sockets of its port, either bound first, and an
// IPv6-only :: ([WithIPv6Only]) with IPv6 ones only (inet_rcv_saddr_equal
// with its wildcard rules).
func TestKernelBindDualStack(t *testing.T) {
	inOwnNetns(t)
	type sock struct {
		addr   string
		v6only bool
	}
	server := loopbackListener(t)
	for _, c := range []struct {
		first     sock
		connected bool // first is a socket connected from its address
		second    sock
	}{
		{first: sock{"::", false}, second: sock{"127.0.0.1", false}},
		{first: sock{"::", false}, second: sock{"0.0.0.0", false}},
		{first: sock{"::", true}, second: sock{"127.0.0.1", false}},
		{first: sock{"::", true}, second: sock{"0.0.0.0", false}},
		{first: sock{"127.0.0.1", false}, second: sock{"::", false}},
		{first: sock{"127.0.0.1", false}, second: sock{"::", true}},
		{first: sock{"0.0.0.0", false}, second: sock{"::", false}},
		{first: sock{"::1", false}, second: sock{"::", true}},
		{first: sock{"::", true}, second: sock{"::", false}},
		{first: sock{"127.0.0.1", false}, connected: true, second: sock{"::", false}},
		{first: sock{"127.0.0.1", false}, connected: true, second: sock{"::", true}},
	} {
		p := freeLoopbackPort(t)
		name := fmt.Sprintf("%+v then %+v (connected %v), port %d", c.first, c.second, c.connected, p)

		kernel := func(s sock) (int, error) {
			return boundTCPSock(t, netip.AddrPortFrom(netip.MustParseAddr(s.addr), p), s.v6only)
		}
		fd1, err := kernel(c.first)
		if err != nil {
			t.Fatalf("%s: first bind: %v", name, err)
		}
		if c.connected {
			if err := syscall.Connect(fd1, sockaddrOf(server, false)); err != nil {
				t.Fatalf("%s: connect: %v", name, err)
			}
		}
		fd2, kerr := kernel(c.second)
		syscall.Close(fd2)
		closeRST(fd1) // no TIME_WAIT left on the port

		a, err := NewPortAllocator()
		if err != nil {
			t.Fatal(err)
		}
		opts := func(s sock) []BindOption {
			if s.v6only {
				return []BindOption{WithIPv6Only()}
			}
			return nil
		}
		ap := func(s sock) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(s.addr), p) }
		if c.connected {
			tab := New[int](WithPortAllocator(a))
			if err := tab.Insert(Tuple{Local: ap(c.first), Remote: server}, valPtr(1)); err != nil {
				t.Fatal(err)
			}
		} else if _, err := a.Bind(ap(c.first), opts(c.first)...); err != nil {
			t.Fatalf("%s: first Bind: %v", name, err)
		}
		_, merr := a.Bind(ap(c.second), opts(c.second)...)
		if (kerr == nil) != (merr == nil) || kerr != nil && (!errors.Is(kerr, syscall.EADDRINUSE) || !errors.Is(merr, syscall.EADDRINUSE)) {
			t.Errorf("%s: kernel %v, Bind %v", name, kerr, merr)
		}
	}
}

// freeLoopbackPort returns a TCP port the kernel chose for 127.0.0.1 and
// freed again.
func freeLoopbackPort(t *testing.T) uint16 {
	t.Helper()
	probe := tcpSock(t)
	if err := syscall.Bind(probe, sockaddrOf(netip.MustParseAddrPort("127.0.0.1:0"), false)); err != nil {
		t.Fatal(err)
	}
	p := sockName(t, probe).Port()
	syscall.Close(probe) // the Cleanup's second close fails unseen
	return p
}

// boundTCPSock opens a TCP socket of ap's family, IPv6-only if v6only (and
// dual-stack if not) when IPv6, and binds it to ap: it returns the socket,
// for the caller to close, and bind()'s error.
func boundTCPSock(t *testing.T, ap netip.AddrPort, v6only bool) (int, error) {
	t.Helper()
	family := syscall.AF_INET
	if ap.Addr().Is6() {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ap.Addr().Is6() {
		v := 0
		if v6only {
			v = 1
		}
		setInt(t, fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, v)
	}
	return fd, syscall.Bind(fd, sockaddrOf(ap, ap.Addr().Is6()))
}
