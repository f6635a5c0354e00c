package hash4

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestErrorVocabulary: every bad-address error, whichever type reports it,
// matches both ErrInvalidTuple and ErrInvalidAddr, and the two sentinels
// match each other and nothing else.
func TestErrorVocabulary(t *testing.T) {
	require.ErrorIs(t, ErrInvalidTuple, ErrInvalidAddr)
	require.ErrorIs(t, ErrInvalidAddr, ErrInvalidTuple)
	require.NotErrorIs(t, ErrInvalidAddr, ErrExists)
	require.NotErrorIs(t, errors.New("hash4: invalid address"), ErrInvalidAddr)

	bad := tblTuple("10.0.0.1:0", "10.0.0.2:80")
	tab := New[int]()
	alloc, err := NewPortAllocator()
	require.NoError(t, err)
	udp := NewUDPTable[int]()
	sock, err := udp.Bind(netip.MustParseAddrPort("10.0.0.1:53"), valPtr(1))
	require.NoError(t, err)
	errs := map[string]error{
		"Table.Insert": tab.Insert(bad, valPtr(1)),
		"Table.Connect": func() error {
			_, err := tab.Connect(alloc, netip.IPv4Unspecified(), netip.MustParseAddrPort("10.0.0.2:80"), valPtr(1))
			return err
		}(),
		"UDPTable.Bind": func() error {
			_, err := udp.Bind(netip.AddrPort{}, valPtr(1))
			return err
		}(),
		"UDPSocket.Connect": sock.Connect(netip.MustParseAddrPort("10.0.0.9:0")),
		"TCPTable.Listen": func() error {
			_, err := NewTCPTable[int]().Listen(netip.MustParseAddrPort("10.0.0.1:0"), valPtr(1))
			return err
		}(),
		"PortAllocator.Bind": func() error {
			_, err := alloc.Bind(netip.MustParseAddrPort("10.0.0.1:0"))
			return err
		}(),
		"PortAllocator.BindEphemeral": func() error {
			_, _, err := alloc.BindEphemeral(netip.Addr{})
			return err
		}(),
	}
	for name, err := range errs {
		require.ErrorIs(t, err, ErrInvalidTuple, name)
		require.ErrorIs(t, err, ErrInvalidAddr, name)
		require.NotErrorIs(t, err, ErrNilValue, name)
	}

	// A nil value, with valid addresses, matches ErrNilValue only.
	good := tblTuple("10.0.0.1:1", "10.0.0.2:80")
	nils := map[string]error{
		"Table.Insert": tab.Insert(good, nil),
		"Table.Connect": func() error {
			_, err := tab.Connect(alloc, good.Local.Addr(), good.Remote, nil)
			return err
		}(),
		"UDPTable.Bind": func() error {
			_, err := udp.Bind(netip.MustParseAddrPort("10.0.0.1:54"), nil)
			return err
		}(),
		"TCPTable.Listen": func() error {
			_, err := NewTCPTable[int]().Listen(netip.MustParseAddrPort("10.0.0.1:80"), nil)
			return err
		}(),
	}
	for name, err := range nils {
		require.ErrorIs(t, err, ErrNilValue, name)
		require.NotErrorIs(t, err, ErrInvalidTuple, name)
		require.NotErrorIs(t, err, ErrInvalidAddr, name)
	}
	require.Zero(t, tab.Len())
}

// TestZonedUnspecified: an unspecified address with a zone is unspecified,
// as the key drops the zone: every write refuses it, as Connect does, and a
// packet to it reaches no socket of a UDPTable or TCPTable.
func TestZonedUnspecified(t *testing.T) {
	tab := New[int]()
	other := netip.MustParseAddrPort("[2001:db8::1]:2")
	for _, s := range []string{"[::%eth0]:1", "[::ffff:0.0.0.0%eth0]:1"} {
		zoned := netip.MustParseAddrPort(s)
		for _, tup := range []Tuple{{zoned, other}, {other, zoned}} {
			require.ErrorIs(t, tab.Insert(tup, valPtr(1)), ErrInvalidTuple, "%v", tup)
			require.ErrorIs(t, tab.Store(tup, valPtr(1)), ErrInvalidTuple, "%v", tup)
		}
	}
	a := newTestAllocator(t)
	_, err := tab.Connect(a, netip.MustParseAddr("::%eth0"), other, valPtr(1))
	require.ErrorIs(t, err, ErrInvalidTuple)
	require.Zero(t, tab.Len())

	tt := NewTCPTable[int]()
	_, err = tt.Listen(netip.MustParseAddrPort("[::]:80"), valPtr(1))
	require.NoError(t, err)
	ut := NewUDPTable[int]()
	_, err = ut.Bind(netip.MustParseAddrPort("[::]:80"), valPtr(2))
	require.NoError(t, err)
	for _, s := range []string{"[::]:80", "[::%eth0]:80"} {
		pkt := Tuple{netip.MustParseAddrPort(s), other}
		_, ok := tt.Lookup(pkt)
		require.False(t, ok, "TCP %v", pkt)
		_, ok = ut.Lookup(pkt)
		require.False(t, ok, "UDP %v", pkt)
	}
	pkt := Tuple{netip.MustParseAddrPort("[2001:db8::2%eth0]:80"), other}
	_, ok := tt.Lookup(pkt)
	require.True(t, ok, "TCP %v: a zone on a specified address does not matter", pkt)
	_, ok = ut.Lookup(pkt)
	require.True(t, ok, "UDP %v", pkt)
}

// TestErrorMessages lists the errors the package returns, each from a call
// that a program can make, with the message it gets in full: every one
// starts with "hash4: " once, names the call or the input at fault, and
// says why. (ErrTableFull, returned as it is, takes 2^31-1 entries to
// reach.)
func TestErrorMessages(t *testing.T) {
	ap := netip.MustParseAddrPort
	addr := netip.MustParseAddr
	tup := tblTuple("10.0.0.1:1000", "10.0.0.2:80")
	local, remote := addr("10.0.0.1"), ap("10.0.0.2:80")
	one := PortRange{Low: 40000, High: 40000}
	newAlloc := func(opts ...PortOption) *PortAllocator {
		a, err := NewPortAllocator(append([]PortOption{WithPortRange(one)}, opts...)...)
		require.NoError(t, err)
		return a
	}
	first := func(_ any, err error) error { return err }
	second := func(_, _ any, err error) error { return err }

	tab := New[int](WithMaxBuckets(1024))
	require.NoError(t, tab.Insert(tup, valPtr(1)))
	var heldErr error // a Store of a tuple a ConnectFunc holds
	_, _, err := tab.ConnectFunc(newAlloc(), local, ap("10.0.0.3:80"), func(held Tuple) (*int, error) {
		heldErr = tab.Store(held, valPtr(2))
		return valPtr(2), nil
	})
	require.NoError(t, err)

	shared := newAlloc(WithPortRange(PortRange{Low: 40000, High: 40001}))
	sharedTab := New[int](WithPortAllocator(shared))
	flow, err := sharedTab.Connect(nil, local, remote, valPtr(1))
	require.NoError(t, err)
	flowPort := flow.Local.Port()
	otherPort := uint16(80001 - int(flowPort))
	release, err := shared.Bind(netip.AddrPortFrom(local, otherPort))
	require.NoError(t, err)
	defer release()

	udp := NewUDPTable[int]()
	sock, err := udp.Bind(ap("10.0.0.1:53"), valPtr(1))
	require.NoError(t, err)
	wild, err := udp.Bind(ap("0.0.0.0:54"), valPtr(1))
	require.NoError(t, err)
	sock6, err := udp.Bind(ap("[2001:db8::1]:53"), valPtr(1))
	require.NoError(t, err)
	closed, err := udp.Bind(ap("10.0.0.1:55"), valPtr(1))
	require.NoError(t, err)
	require.NoError(t, closed.Close())

	tcp := NewTCPTable[int]()
	_, err = tcp.Listen(ap("0.0.0.0:80"), valPtr(1))
	require.NoError(t, err)
	tcpShared := NewTCPTable[int](WithPortAllocator(shared))

	var wrongOld *string
	cases := []struct {
		name string
		err  error
		want string
	}{
		// Table
		{"Insert, port 0", tab.Insert(tblTuple("10.0.0.1:0", "10.0.0.2:80"), valPtr(1)),
			"hash4: invalid tuple 10.0.0.1:0->10.0.0.2:80: port 0"},
		{"Insert, invalid address", tab.Insert(Tuple{Remote: remote}, valPtr(1)),
			"hash4: invalid tuple invalid AddrPort->10.0.0.2:80: invalid address"},
		{"Insert, unspecified address", tab.Insert(tblTuple("0.0.0.0:1", "10.0.0.2:80"), valPtr(1)),
			"hash4: invalid tuple 0.0.0.0:1->10.0.0.2:80: unspecified address"},
		{"Insert, two families", tab.Insert(tblTuple("10.0.0.1:1", "[2001:db8::2]:80"), valPtr(1)),
			"hash4: invalid tuple 10.0.0.1:1->[2001:db8::2]:80: local and remote address families differ"},
		{"Insert, nil value", tab.Insert(tblTuple("10.0.0.1:2", "10.0.0.2:80"), nil),
			"hash4: nil value for 10.0.0.1:2->10.0.0.2:80"},
		{"Insert, present", tab.Insert(tup, valPtr(1)),
			"hash4: 4-tuple already in table: 10.0.0.1:1000->10.0.0.2:80"},
		{"Store, held by ConnectFunc", heldErr,
			"hash4: 4-tuple already in table: 10.0.0.1:40000->10.0.0.3:80, held by a ConnectFunc in progress"},
		{"Compute, unknown op", second(tab.Compute(tup, func(*int, bool) (*int, ComputeOp) { return nil, 7 })),
			"hash4: Compute of 10.0.0.1:1000->10.0.0.2:80: unknown ComputeOp 7"},
		{"Compute, nil value", second(tab.Compute(tup, func(*int, bool) (*int, ComputeOp) { return nil, UpdateOp })),
			"hash4: nil value from Compute of 10.0.0.1:1000->10.0.0.2:80"},
		{"LookupOrCompute, nil value", second(tab.LookupOrCompute(tblTuple("10.0.0.1:3", "10.0.0.2:80"), func() (*int, error) { return nil, nil })),
			"hash4: nil value from LookupOrCompute of 10.0.0.1:3->10.0.0.2:80"},
		{"Grow, beyond WithMaxBuckets", tab.Grow(4096),
			"hash4: size beyond the table's bucket limit: Grow(4096) beyond 1024 buckets"},

		// Connect and ConnectFunc
		{"Connect, nil value", first(tab.Connect(newAlloc(), local, remote, nil)),
			"hash4: nil value for a flow to 10.0.0.2:80"},
		{"ConnectFunc, nil function", second(tab.ConnectFunc(newAlloc(), local, remote, nil)),
			"hash4: nil value: ConnectFunc with a nil function, for a flow to 10.0.0.2:80"},
		{"Connect, unspecified local", first(tab.Connect(newAlloc(), netip.IPv4Unspecified(), remote, valPtr(1))),
			"hash4: invalid tuple: flow from 0.0.0.0 to 10.0.0.2:80: unspecified address"},
		{"Connect, remote port 0", first(tab.Connect(newAlloc(), local, ap("10.0.0.2:0"), valPtr(1))),
			"hash4: invalid tuple: flow from 10.0.0.1 to 10.0.0.2:0: port 0"},
		{"Connect, nil allocator", first(tab.Connect(nil, local, remote, valPtr(1))),
			"hash4: unusable PortAllocator: nil *PortAllocator"},
		{"Connect, zero allocator", first(tab.Connect(&PortAllocator{}, local, remote, valPtr(1))),
			"hash4: unusable PortAllocator: zero PortAllocator, not made by NewPortAllocator"},
		{"Connect, another table's allocator", first(sharedTab.Connect(newAlloc(), local, remote, valPtr(1))),
			"hash4: unusable PortAllocator: not the one the table was made with (WithPortAllocator)"},
		{"Connect, no port left", first(sharedTab.Connect(nil, local, remote, valPtr(1))),
			"hash4: no free local port (EADDRNOTAVAIL): 10.0.0.1 to 10.0.0.2:80"},
		{"ConnectFunc, every port refused", second(tab.ConnectFunc(newAlloc(), local, remote, func(Tuple) (*int, error) {
			return nil, ErrPortRefused
		})), "hash4: no free local port (EADDRNOTAVAIL): 10.0.0.1 to 10.0.0.2:80 (ports refused: 1)"},
		{"ConnectFunc, nil value", second(tab.ConnectFunc(newAlloc(), local, remote, func(Tuple) (*int, error) { return nil, nil })),
			"hash4: nil value from ConnectFunc's function for 10.0.0.1:40000->10.0.0.2:80"},
		{"Connect, WithTimeWaitReuse of another type", first(tab.Connect(newAlloc(), local, remote, valPtr(1), WithTimeWaitReuse(TCPTimeWaitReuse(false, 0), &wrongOld))),
			"hash4: connect to 10.0.0.2:80: WithTimeWaitReuse's old is a **string, not the table's **int"},

		// PortAllocator
		{"NewPortAllocator, low 0", first(NewPortAllocator(WithPortRange(PortRange{0, 10}))),
			"hash4: invalid port range 0-10: port 0 is not a local port"},
		{"NewPortAllocator, low above high", first(NewPortAllocator(WithPortRange(PortRange{10, 5}))),
			"hash4: invalid port range 10-5: low above high"},
		{"NewPortAllocator, policy", first(NewPortAllocator(WithPolicy(7))),
			"hash4: invalid port policy 7"},
		{"WithReservedPorts, port 0", first(NewPortAllocator(WithReservedPorts(80, 0))),
			"hash4: invalid reserved ports: port 0 at index 1"},
		{"WithReservedPortsText, not a port", first(NewPortAllocator(WithReservedPortsText("80,http"))),
			`hash4: invalid reserved ports: "http": not a port or port range`},
		{"ParseReservedPorts, backwards", first(ParseReservedPorts("9010-9000")),
			`hash4: invalid reserved ports: "9010-9000": range runs backwards`},
		{"ParseReservedPorts, beyond 65535", first(ParseReservedPorts("70000")),
			`hash4: invalid reserved ports: "70000": port outside 1-65535`},
		{"ParseReservedPorts, empty item", first(ParseReservedPorts("80,,81")),
			`hash4: invalid reserved ports: empty item in "80,,81"`},
		{"ParsePortRange, not a range", first(ParsePortRange("low-high")),
			`hash4: invalid port range "low-high": want low-high, such as 32768-60999, with ports in 1-65535`},
		{"Bind, nil allocator", first((*PortAllocator)(nil).Bind(ap("10.0.0.1:80"))),
			"hash4: unusable PortAllocator: nil *PortAllocator"},
		{"Bind, invalid address", first(shared.Bind(netip.AddrPort{})),
			"hash4: invalid address: Bind of an invalid local address"},
		{"Bind, port 0", first(shared.Bind(ap("10.0.0.1:0"))),
			"hash4: invalid address: Bind of 10.0.0.1:0: port 0 (use BindEphemeral)"},
		{"Bind, reuse option", first(shared.Bind(ap("10.0.0.1:80"), WithReusePort())),
			"hash4: invalid address: Bind of 10.0.0.1:80: WithReuseAddr and WithReusePort are for the sockets of tables, not an allocator's holds"},
		{"Bind, IPv6-only IPv4", first(shared.Bind(ap("10.0.0.1:80"), WithIPv6Only())),
			"hash4: invalid address: Bind of 10.0.0.1:80: IPv6-only option on an IPv4 address"},
		{"Bind, held", first(shared.Bind(netip.AddrPortFrom(local, otherPort))),
			"hash4: local port in use (EADDRINUSE): 10.0.0.1:" + strconv.Itoa(int(otherPort)) + ", held in the port allocator"},
		{"Bind, a flow's port", first(shared.Bind(netip.AddrPortFrom(local, flowPort))),
			"hash4: local port in use (EADDRINUSE): 10.0.0.1:" + strconv.Itoa(int(flowPort)) + ", by a connected flow"},
		{"BindEphemeral, invalid address", second(shared.BindEphemeral(netip.Addr{})),
			"hash4: invalid address: BindEphemeral of an invalid local address"},
		{"BindEphemeral, reuse option", second(shared.BindEphemeral(local, WithReuseAddr())),
			"hash4: invalid address: BindEphemeral of 10.0.0.1: WithReuseAddr and WithReusePort are for the sockets of tables, not an allocator's holds"},
		{"BindEphemeral, no port left", second(shared.BindEphemeral(local)),
			"hash4: no free local port (EADDRNOTAVAIL): BindEphemeral of 10.0.0.1, range 40000-40001"},

		// UDPTable and UDPSocket
		{"UDPTable.Bind, invalid address", first(udp.Bind(netip.AddrPort{}, valPtr(1))),
			"hash4: invalid address: Bind of an invalid address"},
		{"UDPTable.Bind, port 0", first(udp.Bind(ap("10.0.0.1:0"), valPtr(1))),
			"hash4: invalid address: Bind of 10.0.0.1:0: port 0"},
		{"UDPTable.Bind, IPv6-only IPv4", first(udp.Bind(ap("10.0.0.1:56"), valPtr(1), WithIPv6Only())),
			"hash4: invalid address: Bind of 10.0.0.1:56: IPv6-only option on an IPv4 address"},
		{"UDPTable.Bind, nil value", first(udp.Bind(ap("10.0.0.1:56"), nil)),
			"hash4: nil value for Bind of 10.0.0.1:56"},
		{"UDPTable.Bind, in use", first(udp.Bind(ap("10.0.0.1:53"), valPtr(1))),
			"hash4: local port in use (EADDRINUSE): 10.0.0.1:53, by another socket"},
		{"UDPSocket.Connect, closed", closed.Connect(remote),
			"hash4: Connect on UDP socket 10.0.0.1:55: use of closed network connection"},
		{"UDPSocket.Close, twice", closed.Close(),
			"hash4: Close on UDP socket 10.0.0.1:55: use of closed network connection"},
		{"UDPSocket.Connect, not made by Bind", new(UDPSocket[int]).Connect(remote),
			"hash4: Connect on a UDPSocket not made by Bind: use of closed network connection"},
		{"UDPSocket.Connect, invalid peer", sock.Connect(netip.AddrPort{}),
			"hash4: invalid address: Connect to an invalid address"},
		{"UDPSocket.Connect, unspecified peer", sock.Connect(ap("0.0.0.0:80")),
			"hash4: invalid address: Connect to 0.0.0.0:80: unspecified address"},
		{"UDPSocket.Connect, peer port 0", sock.Connect(ap("10.0.0.2:0")),
			"hash4: invalid address: Connect to 10.0.0.2:0: port 0"},
		{"UDPSocket.Connect, IPv6 socket, IPv4 peer", sock6.Connect(remote),
			"hash4: invalid address: Connect of IPv6 socket [2001:db8::1]:53 to IPv4 peer 10.0.0.2:80"},
		{"UDPSocket.Connect, IPv4 socket, IPv6 peer", sock.Connect(ap("[2001:db8::2]:80")),
			"hash4: invalid address: Connect of IPv4 socket 10.0.0.1:53 to IPv6 peer [2001:db8::2]:80"},
		{"UDPSocket.Connect, wildcard socket", wild.Connect(remote),
			"hash4: invalid address: Connect of 0.0.0.0:54, bound to a wildcard address, needs the source address (ConnectFrom)"},
		{"UDPSocket.ConnectFrom, invalid source", wild.ConnectFrom(netip.Addr{}, remote),
			"hash4: invalid address: ConnectFrom an invalid source address"},
		{"UDPSocket.ConnectFrom, another address", sock.ConnectFrom(addr("10.0.0.9"), remote),
			"hash4: invalid address: ConnectFrom 10.0.0.9 on a socket bound to 10.0.0.1:53"},
		{"UDPSocket.ConnectFrom, unspecified source", wild.ConnectFrom(netip.IPv4Unspecified(), remote),
			"hash4: invalid address: ConnectFrom 0.0.0.0 to 10.0.0.2:80: the source must be a concrete address of the peer's family"},

		// TCPTable
		{"Listen, invalid address", first(tcp.Listen(netip.AddrPort{}, valPtr(1))),
			"hash4: invalid address: Listen on an invalid address"},
		{"Listen, port 0", first(tcp.Listen(ap("10.0.0.1:0"), valPtr(1))),
			"hash4: invalid address: Listen on 10.0.0.1:0: port 0"},
		{"Listen, IPv6-only IPv4", first(tcp.Listen(ap("10.0.0.1:81"), valPtr(1), WithIPv6Only())),
			"hash4: invalid address: Listen on 10.0.0.1:81: IPv6-only option on an IPv4 address"},
		{"Listen, nil value", first(tcp.Listen(ap("10.0.0.1:81"), nil)),
			"hash4: nil value for Listen on 10.0.0.1:81"},
		{"Listen, in use", first(tcp.Listen(ap("10.0.0.1:80"), valPtr(1))),
			"hash4: local port in use (EADDRINUSE): 10.0.0.1:80, by another listener"},
		{"Listen, held in the allocator", first(tcpShared.Listen(netip.AddrPortFrom(local, otherPort), valPtr(1))),
			"hash4: local port in use (EADDRINUSE): 10.0.0.1:" + strconv.Itoa(int(otherPort)) + ", held in the port allocator"},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		require.False(t, seen[c.name], "two cases named %q", c.name)
		seen[c.name] = true
		if !assert.EqualError(t, c.err, c.want, c.name) {
			continue
		}
		assert.Equal(t, 1, strings.Count(c.err.Error(), "hash4: "), "%s: the prefix once", c.name)
	}
}

// TestNamedPanics pins the panics of the socket tables' zero values and of
// WithPortAllocator: each names what the program got wrong and how to make
// it right.
func TestNamedPanics(t *testing.T) {
	pkt := tblTuple("10.0.0.1:80", "10.0.0.2:1000")
	local := netip.MustParseAddrPort("10.0.0.1:80")
	tcpAlloc, err := NewPortAllocator()
	require.NoError(t, err)
	NewTCPTable[int](WithPortAllocator(tcpAlloc))
	udpAlloc, err := NewPortAllocator()
	require.NoError(t, err)
	NewUDPTable[int](WithPortAllocator(udpAlloc))
	const (
		zeroUDP  = "hash4: UDPTable used without NewUDPTable"
		zeroTCP  = "hash4: TCPTable used without NewTCPTable"
		twoProto = "hash4: %s: WithPortAllocator: the allocator serves %s tables; Linux keeps TCP and UDP ports apart (use an allocator per protocol)"
	)
	for _, c := range []struct {
		name, want string
		f          func()
	}{
		{"zero UDPTable, Bind", zeroUDP, func() { _, _ = new(UDPTable[int]).Bind(local, valPtr(1)) }},
		{"zero UDPTable, Lookup", zeroUDP, func() { new(UDPTable[int]).Lookup(pkt) }},
		{"zero TCPTable, Listen", zeroTCP, func() { _, _ = new(TCPTable[int]).Listen(local, valPtr(1)) }},
		{"zero TCPTable, Lookup", zeroTCP, func() { new(TCPTable[int]).Lookup(pkt) }},
		{"zero TCPTable, LookupKind", zeroTCP, func() { new(TCPTable[int]).LookupKind(pkt) }},
		{"zero TCPTable, Established", zeroTCP, func() { new(TCPTable[int]).Established() }},
		{"WithPortAllocator(nil)", "hash4: WithPortAllocator: nil *PortAllocator", func() { New[int](WithPortAllocator(nil)) }},
		{"WithPortAllocator of a zero allocator", "hash4: WithPortAllocator: zero PortAllocator, not made by NewPortAllocator",
			func() { NewTCPTable[int](WithPortAllocator(&PortAllocator{})) }},
		{"NewUDPTable with a TCP allocator", fmt.Sprintf(twoProto, "NewUDPTable", "TCP"), func() { NewUDPTable[int](WithPortAllocator(tcpAlloc)) }},
		{"NewTCPTable with a UDP allocator", fmt.Sprintf(twoProto, "NewTCPTable", "UDP"), func() { NewTCPTable[int](WithPortAllocator(udpAlloc)) }},
	} {
		require.PanicsWithValue(t, c.want, c.f, c.name)
	}
}
