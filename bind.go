package hash4

import "net/netip"

// The bind options of UDPTable and TCPTable, and the overlap of two sockets'
// local addresses as the kernel's bind conflict checks read it.

// BindOption configures one [UDPTable.Bind] or one [TCPTable.Listen].
type BindOption func(*bindConfig)

type bindConfig struct {
	reusePort, reuseAddr, v6only bool
}

// WithReusePort sets SO_REUSEPORT: sockets that all asked for it may bind the
// same address and port, and the packets that reach them are shared by flow
// hash, so that a flow keeps reaching one socket while the group does not
// change.
func WithReusePort() BindOption { return func(c *bindConfig) { c.reusePort = true } }

// WithReuseAddr sets SO_REUSEADDR: a UDP socket may bind an address and port
// that overlap those of sockets which all set it too. It does not let a TCP
// listener share a port with another listener. In a table made
// [WithPortAllocator], it lets a listener or socket share its port with the
// allocator's flows (see [TCPTable.Listen], [UDPTable.Bind]).
func WithReuseAddr() BindOption { return func(c *bindConfig) { c.reuseAddr = true } }

// WithIPv6Only sets IPV6_V6ONLY on an IPv6 socket or listener: bound to ::,
// it receives IPv6 packets only. Given to [PortAllocator.Bind] or
// [PortAllocator.BindEphemeral] of ::, it makes the hold cover IPv6
// addresses only. It is an error on an IPv4 or IPv4-mapped address.
func WithIPv6Only() BindOption { return func(c *bindConfig) { c.v6only = true } }

// normAddr returns addr in the form the tables use: IPv4-mapped addresses
// as IPv4, no zone.
func normAddr(addr netip.Addr) netip.Addr { return addr.Unmap().WithZone("") }

// sockAddr is a socket's local address as the kernel's bind conflict checks
// read it (inet_rcv_saddr_equal).
type sockAddr struct {
	v6     bool       // an AF_INET6 socket
	a6     netip.Addr // its IPv6 address (sk_v6_rcv_saddr), if v6
	v4     uint32     // its IPv4 address (inet_rcv_saddr)
	v6only bool
}

// newSockAddr returns the sockAddr of a socket of family v6 on addr: an
// IPv6 socket's IPv4 address is that of an IPv4-mapped address, 0 for ::,
// and the kernel's LOOPBACK4_IPV6 (127.0.0.6) for any other address.
func newSockAddr(addr netip.Addr, v6, v6only bool) sockAddr {
	a := sockAddr{v6: v6, v6only: v6only}
	switch {
	case !v6 || addr.Is4In6():
		b := addr.Unmap().As4()
		a.v4 = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	case !addr.IsUnspecified():
		a.v4 = 127<<24 | 6
	}
	if v6 {
		a.a6 = netip.AddrFrom16(addr.As16())
	}
	return a
}

// addrEqual reports whether a socket on a conflicts with one on b, b
// already bound, as the kernel's inet_rcv_saddr_equal (a is sk, b is sk2):
// if wild, a wildcard address overlaps every address it receives for.
func addrEqual(a, b sockAddr, wild bool) bool { return addrMatch(a, b, wild, wild) }

// addrMatch is addrEqual with a wildcard flag for each side, as
// ipv4_rcv_saddr_equal and ipv6_rcv_saddr_equal take them.
func addrMatch(a, b sockAddr, wildA, wildB bool) bool {
	v4eq := func() bool { return a.v4 == b.v4 || (wildA && a.v4 == 0) || (wildB && b.v4 == 0) }
	if !a.v6 {
		// N.B. an IPv6 socket on a specific address is IPv6-only unless
		// connect fixed its address (see newSockAddr).
		return !b.v6only && v4eq()
	}
	const any, mapped, other = 0, 1, 2
	kind := func(x netip.Addr) int {
		switch {
		case x.Is4In6():
			return mapped
		case x.IsUnspecified():
			return any
		}
		return other
	}
	k1, k2 := kind(a.a6), mapped
	if b.v6 {
		k2 = kind(b.a6)
	}
	switch {
	case k1 == mapped && k2 == mapped:
		return !b.v6only && v4eq()
	case k1 == any && k2 == any:
		return true
	case k2 == any && wildB && !(b.v6only && k1 == mapped):
		return true
	case k1 == any && wildA && !(a.v6only && k2 == mapped):
		return true
	}
	return b.v6 && a.a6 == b.a6
}
