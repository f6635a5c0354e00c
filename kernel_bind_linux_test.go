//go:build linux && amd64

package hash4

import (
	"errors"
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
	lo := netip.MustParseAddr("127.0.0.1")
	ln := tcpSock(t)
	if err := syscall.Bind(ln, sockaddrOf(netip.AddrPortFrom(lo, 0), false)); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(ln, 8); err != nil {
		t.Fatal(err)
	}
	server := sockName(t, ln)
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

	reused := connected(true)
	if _, err := kernelBind(reused, true, 0); err != nil {
		t.Errorf("bind(%v) with SO_REUSEADDR on both sockets: %v, want success", reused, err)
	}
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
