package hash4

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

var udpTestSecret = Secret{Ehash: 0x1234_5678, Ehash6Addr: 0x9abc_def0, Seed: 0x0f1e_2d3c_4b5a_6978}

func dmxAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// udpTestHash returns the hash4 hash of tup in a table with udpTestSecret,
// by the exported hash functions.
func udpTestHash(tup Tuple) uint32 {
	la, ra := tup.Local.Addr().Unmap(), tup.Remote.Addr().Unmap()
	if la.Is4() {
		return UDPEhashfn(la, tup.Local.Port(), ra, tup.Remote.Port(), udpTestSecret.Ehash)
	}
	return UDP6Ehashfn(la, tup.Local.Port(), ra, tup.Remote.Port(), udpTestSecret.Ehash, udpTestSecret.Ehash6Addr)
}

func dmxPkt(local, remote string) Tuple { return Tuple{Local: dmxAP(local), Remote: dmxAP(remote)} }

func TestUDPBindErrors(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	v := new(int)
	for _, tc := range []struct {
		name  string
		local netip.AddrPort
		v     *int
		opts  []BindOption
		want  error
	}{
		{"invalid address", netip.AddrPort{}, v, nil, ErrInvalidAddr},
		{"port 0", dmxAP("10.0.0.1:0"), v, nil, ErrInvalidAddr},
		{"v6only on IPv4", dmxAP("10.0.0.1:53"), v, []BindOption{WithIPv6Only()}, ErrInvalidAddr},
		{"v6only on mapped IPv4", dmxAP("[::ffff:0.0.0.0]:53"), v, []BindOption{WithIPv6Only()}, ErrInvalidAddr},
		{"nil value", dmxAP("10.0.0.1:53"), nil, nil, ErrNilValue},
	} {
		_, err := tbl.Bind(tc.local, tc.v, tc.opts...)
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	require.Empty(t, tbl.sockets())

	a, err := tbl.Bind(dmxAP("10.0.0.1:53"), v, nil) // a nil option is ignored
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("10.0.0.1:53"), v)
	require.ErrorIs(t, err, ErrPortInUse)
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	_, err = tbl.Bind(dmxAP("[::ffff:10.0.0.1]:53"), v, WithReusePort())
	require.ErrorIs(t, err, ErrPortInUse, "the mapped form is the same address; the first did not ask for reuse")
	// Other addresses do not conflict; the wildcard does, as in Linux,
	// unless both sockets set SO_REUSEADDR.
	_, err = tbl.Bind(dmxAP("10.0.0.2:53"), v)
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("0.0.0.0:53"), v)
	require.ErrorIs(t, err, ErrPortInUse)
	_, err = tbl.Bind(dmxAP("0.0.0.0:53"), v, WithReuseAddr())
	require.ErrorIs(t, err, ErrPortInUse, "10.0.0.1:53 did not set SO_REUSEADDR")
	_, err = tbl.Bind(dmxAP("0.0.0.0:55"), v, WithReuseAddr())
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("[::]:55"), v, WithReuseAddr())
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("10.0.0.1:54"), v)
	require.NoError(t, err)
	require.Len(t, tbl.sockets(), 5)

	// Reuse needs every socket on the address to ask for it.
	r1, err := tbl.Bind(dmxAP("10.0.0.3:53"), v, WithReusePort())
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("10.0.0.3:53"), v)
	require.ErrorIs(t, err, ErrPortInUse)
	r2, err := tbl.Bind(dmxAP("10.0.0.3:53"), v, WithReusePort())
	require.NoError(t, err)
	require.Len(t, tbl.sockets(), 7)

	// Closing frees the address.
	require.NoError(t, a.Close())
	require.NoError(t, r1.Close())
	require.NoError(t, r2.Close())
	_, err = tbl.Bind(dmxAP("10.0.0.1:53"), v)
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("10.0.0.3:53"), v)
	require.NoError(t, err)
}

func TestUDPSocketErrors(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	v := new(int)
	s4, err := tbl.Bind(dmxAP("10.0.0.1:53"), v, WithReuseAddr())
	require.NoError(t, err)
	s6, err := tbl.Bind(dmxAP("[2001:db8::1]:53"), v, WithReuseAddr())
	require.NoError(t, err)
	dual, err := tbl.Bind(dmxAP("[::]:53"), v, WithReuseAddr())
	require.NoError(t, err)
	only6, err := tbl.Bind(dmxAP("[::]:54"), v, WithIPv6Only(), WithReuseAddr())
	require.NoError(t, err)
	any4, err := tbl.Bind(dmxAP("0.0.0.0:53"), v, WithReuseAddr())
	require.NoError(t, err)

	for _, tc := range []struct {
		s      *UDPSocket[int]
		remote netip.AddrPort
	}{
		{s4, netip.AddrPort{}},
		{s4, dmxAP("0.0.0.0:7")},
		{s4, dmxAP("192.0.2.1:0")},
		{s4, dmxAP("[2001:db8::9]:7")},
		{any4, dmxAP("[2001:db8::9]:7")},
		{s6, dmxAP("192.0.2.1:7")},
		{s6, dmxAP("[::ffff:192.0.2.1]:7")},
		{s6, dmxAP("[::]:7")},
		{only6, dmxAP("192.0.2.1:7")},
	} {
		err := tc.s.Connect(tc.remote)
		require.ErrorIs(t, err, ErrInvalidAddr, "%v to %v", tc.s.LocalAddr(), tc.remote)
		_, ok := tc.s.RemoteAddr()
		require.False(t, ok, "a failed Connect changes nothing")
	}
	require.Zero(t, tbl.slots[s4.b.h2&tbl.mask].hash4Cnt.Load())

	require.ErrorIs(t, dual.Connect(dmxAP("[::ffff:192.0.2.1]:7")), ErrInvalidAddr, "a wildcard socket needs its source")
	require.ErrorIs(t, dual.ConnectFrom(netip.MustParseAddr("2001:db8::1"), dmxAP("192.0.2.1:7")), ErrInvalidAddr, "a source of the peer's family")
	require.NoError(t, dual.ConnectFrom(netip.MustParseAddr("10.0.0.9"), dmxAP("[::ffff:192.0.2.1]:7")))
	require.Equal(t, dmxAP("[::ffff:10.0.0.9]:53"), dual.LocalAddr(), "an IPv6 socket keeps the mapped form")
	r, ok := dual.RemoteAddr()
	require.True(t, ok)
	require.Equal(t, dmxAP("192.0.2.1:7"), r, "peers are kept in IPv4 form")
	require.NoError(t, s6.Connect(dmxAP("[2001:db8::9%eth0]:7")))
	r, _ = s6.RemoteAddr()
	require.Equal(t, dmxAP("[2001:db8::9]:7"), r, "zones are dropped")

	require.NoError(t, s4.Disconnect(), "disconnecting an unconnected socket does nothing")
	require.NoError(t, s4.Close())
	for _, err := range []error{s4.Close(), s4.Connect(dmxAP("192.0.2.1:7")), s4.Disconnect()} {
		require.ErrorIs(t, err, net.ErrClosed)
	}
	// A closed socket says so first, whatever the address.
	for _, remote := range []netip.AddrPort{{}, dmxAP("192.0.2.1:0"), dmxAP("[2001:db8::9]:7")} {
		err := s4.Connect(remote)
		require.ErrorIs(t, err, net.ErrClosed, "%v", remote)
		require.NotErrorIs(t, err, ErrInvalidAddr, "%v", remote)
	}
	var zero UDPSocket[int]
	require.ErrorIs(t, zero.Connect(dmxAP("192.0.2.1:7")), net.ErrClosed)
	require.ErrorIs(t, zero.Close(), net.ErrClosed)
	// A failed Bind returns a nil socket: its methods report it closed
	// or empty, without panicking.
	nilSock, err := tbl.Bind(dmxAP("192.0.2.1:0"), new(int), WithReuseAddr())
	require.ErrorIs(t, err, ErrInvalidAddr)
	require.Nil(t, nilSock)
	require.ErrorIs(t, nilSock.Disconnect(), net.ErrClosed)
	require.ErrorIs(t, nilSock.Connect(dmxAP("192.0.2.1:7")), net.ErrClosed)
	require.ErrorIs(t, nilSock.Close(), net.ErrClosed)
	require.Equal(t, netip.AddrPort{}, nilSock.LocalAddr())
	r, ok = nilSock.RemoteAddr()
	require.False(t, ok)
	require.Equal(t, netip.AddrPort{}, r)
}

// TestUDPLookupSemantics spells out the lookup order and score on small
// cases; every case runs with hash4 on and off.
func TestUDPLookupSemantics(t *testing.T) {
	type sock struct {
		name, local, peer, src string
		opts                   []BindOption
	}
	type probe struct{ local, remote, want string }
	reuse := []BindOption{WithReusePort()}
	for _, tc := range []struct {
		name   string
		socks  []sock
		probes []probe
	}{
		{
			name:  "exact beats wildcard",
			socks: []sock{{name: "W", local: "0.0.0.0:53"}, {name: "A", local: "10.0.0.1:53"}},
			probes: []probe{
				{"10.0.0.1:53", "192.0.2.1:9", "A"},
				{"[::ffff:10.0.0.1]:53", "[::ffff:192.0.2.1]:9", "A"},
				{"10.0.0.2:53", "192.0.2.1:9", "W"},
				{"10.0.0.1:54", "192.0.2.1:9", ""},
				{"[2001:db8::1]:53", "[2001:db8::9]:9", ""},
			},
		},
		{
			name: "an unconnected exact socket beats a connected wildcard one (Linux order)",
			socks: []sock{
				{name: "W", local: "0.0.0.0:53", peer: "192.0.2.1:9", src: "10.0.0.2"},
				{name: "A", local: "10.0.0.1:53"},
			},
			probes: []probe{
				{"10.0.0.1:53", "192.0.2.1:9", "A"},
				{"10.0.0.2:53", "192.0.2.1:9", "W"},
				{"10.0.0.2:53", "192.0.2.1:10", ""},
			},
		},
		{
			name: "connected sockets take only their peer and beat unconnected ones",
			socks: []sock{
				{name: "C1", local: "10.0.0.1:53", peer: "192.0.2.1:9", opts: reuse},
				{name: "U", local: "10.0.0.1:53", opts: reuse},
				{name: "C2", local: "10.0.0.1:53", peer: "192.0.2.2:9", opts: reuse},
			},
			probes: []probe{
				{"10.0.0.1:53", "192.0.2.1:9", "C1"},
				{"10.0.0.1:53", "192.0.2.2:9", "C2"},
				{"10.0.0.1:53", "192.0.2.1:10", "U"},
				{"10.0.0.1:53", "192.0.2.3:9", "U"},
			},
		},
		{
			name:  "a connected socket alone drops other peers",
			socks: []sock{{name: "C", local: "10.0.0.1:53", peer: "192.0.2.1:9"}},
			probes: []probe{
				{"10.0.0.1:53", "192.0.2.1:9", "C"},
				{"10.0.0.1:53", "192.0.2.2:9", ""},
			},
		},
		{
			name: "IPv4 packets prefer 0.0.0.0 to ::, and reach :: without it",
			socks: []sock{
				{name: "W6", local: "[::]:53"},
				{name: "W4", local: "0.0.0.0:53"},
				{name: "D", local: "[::]:54"},
				{name: "O", local: "[::]:55", opts: []BindOption{WithIPv6Only()}},
			},
			probes: []probe{
				{"10.0.0.1:53", "192.0.2.1:9", "W4"},
				{"[2001:db8::1]:53", "[2001:db8::9]:9", "W6"},
				{"10.0.0.1:54", "192.0.2.1:9", "D"},
				{"[::ffff:10.0.0.1]:54", "[::ffff:192.0.2.1]:9", "D"},
				{"[2001:db8::1]:54", "[2001:db8::9]:9", "D"},
				{"10.0.0.1:55", "192.0.2.1:9", ""},
				{"[2001:db8::1]:55", "[2001:db8::9]:9", "O"},
			},
		},
		{
			name: "a dual-stack :: socket connected to an IPv4 peer beats 0.0.0.0",
			socks: []sock{
				{name: "W4", local: "0.0.0.0:53"},
				{name: "D", local: "[::]:53", peer: "192.0.2.1:9", src: "10.0.0.1"},
			},
			probes: []probe{
				{"10.0.0.1:53", "192.0.2.1:9", "D"},
				{"10.0.0.1:53", "192.0.2.2:9", "W4"},
				{"[2001:db8::1]:53", "[2001:db8::9]:9", ""},
			},
		},
		{
			name: "IPv6 exact and wildcard",
			socks: []sock{
				{name: "A", local: "[2001:db8::1]:53", peer: "[2001:db8::9]:9", opts: reuse},
				{name: "B", local: "[2001:db8::1]:53", opts: reuse},
				{name: "W", local: "[::]:53", opts: []BindOption{WithIPv6Only()}},
			},
			probes: []probe{
				{"[2001:db8::1]:53", "[2001:db8::9]:9", "A"},
				{"[2001:db8::1%eth0]:53", "[2001:db8::9%eth0]:9", "A"},
				{"[2001:db8::1]:53", "[2001:db8::8]:9", "B"},
				{"[2001:db8::2]:53", "[2001:db8::9]:9", "W"},
				{"10.0.0.1:53", "192.0.2.1:9", ""},
			},
		},
		{
			name: "packets no socket can receive",
			socks: []sock{
				{name: "W4", local: "0.0.0.0:53"},
				{name: "W6", local: "[::]:53"},
			},
			probes: []probe{
				{"0.0.0.0:53", "192.0.2.1:9", ""},
				{"[::]:53", "[2001:db8::9]:9", ""},
				{"10.0.0.1:0", "192.0.2.1:9", ""},
				{"10.0.0.1:53", "[2001:db8::9]:9", ""},
				{"[2001:db8::1]:53", "192.0.2.1:9", ""},
				// A source may be unspecified, with port 0 (DHCP).
				{"10.0.0.1:53", "0.0.0.0:0", "W4"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := NewUDPTable[string](WithSecret(udpTestSecret), WithCapacity(16))
			for _, s := range tc.socks {
				name := s.name
				us, err := tbl.Bind(dmxAP(s.local), &name, append(s.opts, WithReuseAddr())...)
				require.NoError(t, err, s.name)
				switch {
				case s.src != "":
					require.NoError(t, us.ConnectFrom(netip.MustParseAddr(s.src), dmxAP(s.peer)), s.name)
				case s.peer != "":
					require.NoError(t, us.Connect(dmxAP(s.peer)), s.name)
				}
			}
			for _, off := range []bool{false, true} {
				tbl.hash4Off = off
				for _, p := range tc.probes {
					got := ""
					if v, ok := tbl.Lookup(dmxPkt(p.local, p.remote)); ok {
						got = *v
					}
					require.Equal(t, p.want, got, "%s <- %s (hash4 off: %v)", p.local, p.remote, off)
				}
			}
		})
	}
	// An invalid packet finds nothing and does not panic.
	tbl := NewUDPTable[string]()
	_, ok := tbl.Lookup(Tuple{})
	require.False(t, ok)
}

// TestUDPReusePortFlowHash checks that reuseport sockets share the packets
// of their address by flow hash: stable for a 4-tuple, every socket used,
// the k-th socket in bind order for k = reciprocal_scale(udp_ehashfn, n).
func TestUDPReusePortFlowHash(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	const n = 4
	vals := make([]int, n)
	for i := range vals {
		vals[i] = i
		_, err := tbl.Bind(dmxAP("10.0.0.1:53"), &vals[i], WithReusePort(), WithReuseAddr())
		require.NoError(t, err)
	}
	seen := make([]int, n)
	for i := range 400 {
		remote := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))
		pkt := Tuple{Local: dmxAP("10.0.0.1:53"), Remote: remote}
		v, ok := tbl.Lookup(pkt)
		require.True(t, ok)
		h := UDPEhashfn(pkt.Local.Addr(), 53, remote.Addr(), remote.Port(), udpTestSecret.Ehash)
		require.Equal(t, int(uint64(h)*n>>32), *v)
		v2, _ := tbl.Lookup(pkt)
		require.Same(t, v, v2)
		seen[*v]++
	}
	for i, c := range seen {
		require.Positive(t, c, "socket %d never chosen", i)
	}
}

// TestUDPReusePortCloseOrder: when a socket of a reuseport group closes,
// the group's last socket takes its place, as the kernel's
// reuseport_detach_sock leaves its array: after A, B, C, D bind and B
// closes, the flow hash picks among A, D, C. And that reorder does not
// change which group takes IPv6 packets on ::, where both groups tie: the
// group of the socket bound first.
func TestUDPReusePortCloseOrder(t *testing.T) {
	for _, addr := range []string{"10.0.0.1", "0.0.0.0"} {
		tbl := NewUDPTable[string](WithSecret(udpTestSecret))
		names := []string{"A", "B", "C", "D"}
		socks := make([]*UDPSocket[string], len(names))
		for i := range names {
			var err error
			socks[i], err = tbl.Bind(netip.AddrPortFrom(netip.MustParseAddr(addr), 53), &names[i], WithReusePort(), WithReuseAddr())
			require.NoError(t, err)
		}
		require.NoError(t, socks[1].Close())
		want := []string{"A", "D", "C"}
		seen := map[string]int{}
		for i := range 300 {
			pkt := Tuple{Local: dmxAP("10.0.0.1:53"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))}
			v, ok := tbl.Lookup(pkt)
			require.True(t, ok, addr)
			require.Equal(t, want[reciprocalScale(udpTestHash(pkt), len(want))], *v, "%s: %v", addr, pkt)
			seen[*v]++
		}
		require.Len(t, seen, len(want), addr)
	}

	// On ::, X (IPv6-only), Y, Z and W (IPv6-only) bind; X closes, and W
	// takes its place in the IPv6-only group, ahead of Y in the slot's
	// slice. Y, bound before Z and W, still decides the group.
	tbl := NewUDPTable[string](WithSecret(udpTestSecret))
	names := []string{"X", "Y", "Z", "W"}
	var x *UDPSocket[string]
	for i, v6only := range []bool{true, false, true, true} {
		opts := []BindOption{WithReusePort()}
		if v6only {
			opts = append(opts, WithIPv6Only())
		}
		s, err := tbl.Bind(dmxAP("[::]:53"), &names[i], append(opts, WithReuseAddr())...)
		require.NoError(t, err)
		if i == 0 {
			x = s
		}
	}
	require.NoError(t, x.Close())
	for i := range 50 {
		v, ok := tbl.Lookup(Tuple{Local: dmxAP("[2001:db8::1]:53"),
			Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)}), uint16(1000+i))})
		require.True(t, ok)
		require.Equal(t, "Y", *v, "IPv6 packets: the group of the socket bound first")
	}
}

// TestUDPReusePortConnectLeavesGroup: a socket's first connect takes it out
// of its reuseport group (udp_lib_hash4), the group's last socket taking its
// place; a socket that binds later may put a connected socket in a new group,
// where the pick passes over it (reuseport_select_sock_by_hash skips
// connected sockets) and, the group never having had a connect, answers at
// once.
func TestUDPReusePortConnectLeavesGroup(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	vals := []int{0, 1, 2, 3, 4}
	var socks []*UDPSocket[int]
	bind := func(i int) {
		s, err := tbl.Bind(dmxAP("10.0.0.1:53"), &vals[i], WithReusePort())
		require.NoError(t, err)
		socks = append(socks, s)
	}
	for i := range 4 {
		bind(i)
	}
	// check asserts that the flows go to group by flow hash.
	check := func(msg string, group ...int) {
		t.Helper()
		for i := range 200 {
			pkt := Tuple{Local: dmxAP("10.0.0.1:53"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))}
			v, ok := tbl.Lookup(pkt)
			require.True(t, ok, msg)
			require.Equal(t, group[reciprocalScale(udpTestHash(pkt), len(group))], *v, "%s: flow %d", msg, i)
		}
	}
	check("bound", 0, 1, 2, 3)
	peer := dmxAP("203.0.113.1:9") // sends none of the flows
	require.NoError(t, socks[1].Connect(peer))
	check("1 connected", 0, 3, 2)
	require.NoError(t, socks[3].Connect(peer))
	check("1 and 3 connected", 0, 2)
	bind(4)
	check("4 joins 3, which is connected", 4)
	require.NoError(t, socks[1].Disconnect())
	require.NoError(t, socks[3].Disconnect())
	check("disconnected", 3, 4)
}

// TestUDPReusePortIPv6OnlyGroups: on ::, IPv6-only sockets and the others
// are two reuseport groups, as in Linux. IPv6 packets, which both kinds
// take, go to the group of the socket bound first, spread over it by flow
// hash; IPv4 packets to the sockets that are not IPv6-only.
func TestUDPReusePortIPv6OnlyGroups(t *testing.T) {
	for _, v6onlyFirst := range []bool{true, false} {
		tbl := NewUDPTable[int](WithSecret(udpTestSecret))
		vals := []int{0, 1, 2, 3}
		v6only := func(i int) bool { return i%2 == 0 == v6onlyFirst }
		for i := range vals {
			opts := []BindOption{WithReusePort()}
			if v6only(i) {
				opts = append(opts, WithIPv6Only())
			}
			_, err := tbl.Bind(dmxAP("[::]:53"), &vals[i], append(opts, WithReuseAddr())...)
			require.NoError(t, err)
		}
		got6, got4 := map[int]int{}, map[int]int{}
		for i := range 200 {
			v, ok := tbl.Lookup(Tuple{Local: dmxAP("[2001:db8::1]:53"),
				Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)}), uint16(1000+i))})
			require.True(t, ok)
			got6[*v]++
			v, ok = tbl.Lookup(Tuple{Local: dmxAP("10.0.0.1:53"),
				Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))})
			require.True(t, ok)
			got4[*v]++
		}
		require.Equal(t, []int{0, 2}, slices.Sorted(maps.Keys(got6)), "IPv6 packets: the first-bound socket's group")
		want4 := []int{0, 2}
		if v6onlyFirst {
			want4 = []int{1, 3}
		}
		require.Equal(t, want4, slices.Sorted(maps.Keys(got4)), "IPv4 packets: the sockets that are not IPv6-only")
	}

	// bind binds sockets with these names on ::, those named A... IPv6-only.
	bind := func(names []string) (*UDPTable[string], []*UDPSocket[string]) {
		tbl := NewUDPTable[string](WithSecret(udpTestSecret))
		socks := make([]*UDPSocket[string], len(names))
		for i, name := range names {
			opts := []BindOption{WithReusePort()}
			if name[0] == 'A' {
				opts = append(opts, WithIPv6Only())
			}
			var err error
			socks[i], err = tbl.Bind(dmxAP("[::]:53"), &names[i], append(opts, WithReuseAddr())...)
			require.NoError(t, err)
		}
		return tbl, socks
	}
	// reached returns the names of the sockets that 200 IPv6 flows reach.
	reached := func(tbl *UDPTable[string]) []string {
		got := map[string]bool{}
		for i := range 200 {
			v, ok := tbl.Lookup(Tuple{Local: dmxAP("[2001:db8::1]:53"),
				Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)}), uint16(1000+i))})
			require.True(t, ok)
			got[*v] = true
		}
		return slices.Sorted(maps.Keys(got))
	}

	// A0, A1 (IPv6-only), B2, A3 (IPv6-only); A0 closes, and its group,
	// now A3, A1, keeps the IPv6 packets: A1 was bound before B2.
	tbl, socks := bind([]string{"A0", "A1", "B2", "A3"})
	require.NoError(t, socks[0].Close())
	require.Equal(t, []string{"A1", "A3"}, reached(tbl), "the group of the socket bound first among those left")
}

// TestUDPReusePortTieRace: while socket A of a reuseport pair connects to
// and disconnects from a peer that sends none of the flow's packets,
// lookups of a flow that B takes in both states (the hash picks B when A
// is unconnected, and A does not take the flow when connected) must
// always return B: never A, scored before its Connect and chosen after.
func TestUDPReusePortTieRace(t *testing.T) {
	tbl := NewUDPTable[string](WithSecret(udpTestSecret))
	names := []string{"A", "B"}
	var a *UDPSocket[string]
	for i := range names {
		s, err := tbl.Bind(dmxAP("10.0.0.1:53"), &names[i], WithReusePort(), WithReuseAddr())
		require.NoError(t, err)
		if i == 0 {
			a = s
		}
	}
	var pkt Tuple
	for i := range 1 << 16 {
		pkt = Tuple{Local: dmxAP("10.0.0.1:53"),
			Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), uint16(1000+i))}
		if reciprocalScale(udpTestHash(pkt), 2) == 1 {
			break
		}
	}
	v, ok := tbl.Lookup(pkt)
	require.True(t, ok)
	require.Equal(t, "B", *v)
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			if a.Connect(dmxAP("192.0.2.1:9")) != nil || a.Disconnect() != nil {
				panic("Connect or Disconnect failed")
			}
		}
	}()
	wrong := 0
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
		for range 1000 {
			if v, ok := tbl.Lookup(pkt); !ok || *v != "B" {
				wrong++
			}
		}
	}
	stop.Store(true)
	<-done
	require.Zero(t, wrong, "lookups that did not return B")
}

// udpSlotMate returns an address and port on another address than a's
// whose hash2 slot in tbl is a's.
func udpSlotMate[T any](tbl *UDPTable[T], a netip.AddrPort) netip.AddrPort {
	slotOf := func(a netip.AddrPort) uint32 { return portaddrHash(a.Addr(), a.Port(), tbl.mix) & tbl.mask }
	for n := 0; ; n++ {
		b := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(n)}), a.Port()+uint16(n>>8))
		if slotOf(b) == slotOf(a) && b.Addr() != a.Addr() {
			return b
		}
	}
}

// TestUDPReusePortRace: while sockets join a reuseport group of three,
// connect to and disconnect from a peer that sends nothing here, and leave
// it, lookups of packets to the group's address must always return a socket
// of the group, never nothing and never the socket bound to another address
// of the same hash2 slot; and lookups to that address, that socket (run it
// under -race). Once quiet, the group is its three sockets in bind order
// and no socket of the slot counts as connected. The same with a third
// socket in the slot, on a third address, connected to a peer that sends
// nothing here.
func TestUDPReusePortRace(t *testing.T) {
	for _, neighbour := range []bool{false, true} {
		t.Run(fmt.Sprintf("neighbour=%v", neighbour), func(t *testing.T) { testUDPReusePortRace(t, neighbour) })
	}
}

func testUDPReusePortRace(t *testing.T, neighbour bool) {
	tbl := NewUDPTable[string](WithSecret(udpTestSecret), WithCapacity(16))
	group := dmxAP("10.0.0.1:53")
	other := udpSlotMate(tbl, group)
	names := []string{"G0", "G1", "G2", "O"}
	for i := range 3 {
		_, err := tbl.Bind(group, &names[i], WithReusePort(), WithReuseAddr())
		require.NoError(t, err)
	}
	_, err := tbl.Bind(other, &names[3], WithReusePort(), WithReuseAddr())
	require.NoError(t, err)
	if neighbour {
		name := "N"
		n, err := tbl.Bind(udpSlotMate(tbl, other), &name, WithReuseAddr())
		require.NoError(t, err)
		require.NoError(t, n.Connect(dmxAP("203.0.113.2:9")))
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	for m := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("G-mover%d", m)
			for i := 0; !stop.Load(); i++ {
				s, err := tbl.Bind(group, &name, WithReusePort(), WithReuseAddr())
				if err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					if err := s.Connect(dmxAP("203.0.113.1:9")); err != nil {
						t.Error(err)
						return
					}
					if i%4 == 0 {
						if err := s.Disconnect(); err != nil {
							t.Error(err)
							return
						}
					}
				}
				if err := s.Close(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	lookups := raceLookups(t, &stop, &wg, 2, 4, groupProbe(tbl.Lookup, group, other, "O"))
	t.Logf("%d lookups", lookups)
	for i := range 100 {
		pkt := Tuple{Local: group, Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 1000)}
		v, ok := tbl.Lookup(pkt)
		require.True(t, ok)
		require.Equal(t, names[reciprocalScale(udpTestHash(pkt), 3)], *v)
	}
}

// TestUDPHash4Count checks hash4_cnt, hash4 membership and the counts of
// connected sockets of the slots and their groups through Connect,
// reconnect, Disconnect and Close.
func TestUDPHash4Count(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	v, va := new(int), new(int)
	a, err := tbl.Bind(dmxAP("10.0.0.1:53"), va, WithReusePort(), WithReuseAddr())
	require.NoError(t, err)
	b, err := tbl.Bind(dmxAP("10.0.0.1:53"), v, WithReusePort(), WithReuseAddr())
	require.NoError(t, err)
	w, err := tbl.Bind(dmxAP("0.0.0.0:53"), v, WithReuseAddr())
	require.NoError(t, err)
	slot := &tbl.slots[a.b.h2&tbl.mask]
	wslot := &tbl.slots[w.b.h2&tbl.mask]
	hashed := func() int {
		n := 0
		for i := range tbl.h4.stripes {
			n += int(tbl.h4.stripes[i].count.Load())
		}
		return n
	}
	check := func(cnt, h int) {
		t.Helper()
		require.EqualValues(t, cnt, slot.hash4Cnt.Load())
		require.Equal(t, h, hashed())
	}
	check(0, 0)
	require.NoError(t, a.Connect(dmxAP("192.0.2.1:9")))
	check(1, 1)
	require.NoError(t, a.Connect(dmxAP("192.0.2.2:9")), "a reconnect stays in the chain of its first peer")
	check(1, 1)
	pkt := dmxPkt("10.0.0.1:53", "192.0.2.2:9")
	k := key{meta: uint64(udpTestHash(pkt))<<32 | 53<<16 | 9, remote: addrWords(pkt.Remote.Addr()), local: addrWords(pkt.Local.Addr())}
	require.Nil(t, tbl.lookup4(&k), "hash4 does not find it under its new peer")
	got, ok := tbl.Lookup(pkt)
	require.True(t, ok)
	require.Same(t, va, got, "scoring does")
	require.NoError(t, b.Connect(dmxAP("192.0.2.2:9")))
	check(2, 2)
	require.ErrorIs(t, w.Connect(dmxAP("192.0.2.2:9")), ErrInvalidAddr, "a wildcard socket needs its source address")
	check(2, 2)
	require.NoError(t, w.ConnectFrom(netip.MustParseAddr("10.0.0.1"), dmxAP("192.0.2.5:9")), "it moves to 10.0.0.1, into hash4")
	check(3, 3)
	require.Equal(t, dmxAP("10.0.0.1:53"), w.LocalAddr())
	require.NoError(t, w.Disconnect())
	require.Equal(t, dmxAP("0.0.0.0:53"), w.LocalAddr())
	check(2, 2)
	if wslot != slot {
		require.Zero(t, wslot.hash4Cnt.Load())
	}
	require.NoError(t, a.Disconnect())
	check(2, 2)
	require.NoError(t, a.Disconnect())
	check(2, 2)
	require.NoError(t, b.Close())
	check(1, 1)
	require.NoError(t, a.Connect(dmxAP("192.0.2.3:9")))
	check(1, 1)
	require.NoError(t, a.Close())
	check(0, 0)
	require.NoError(t, w.Disconnect())
	check(0, 0)
	require.NoError(t, w.ConnectFrom(netip.MustParseAddr("10.0.0.1"), dmxAP("192.0.2.4:9")))
	check(1, 1)
	require.NoError(t, w.Close())
	check(0, 0)
}

// TestUDPHash4NullsRestart makes a hash4 reader stand on a node while the
// node is recycled into another socket that connects elsewhere, after a
// Close or after the Disconnect of a socket whose address connect fixed;
// the reader must end on the other chain's marker, restart, and find the
// socket it looks for. Without the marker check it would report no match.
func TestUDPHash4NullsRestart(t *testing.T) {
	for _, byClose := range []bool{false, true} {
		t.Run(fmt.Sprintf("close=%v", byClose), func(t *testing.T) {
			tbl := NewUDPTable[int](WithSecret(udpTestSecret), WithCapacity(16))
			local := dmxAP("10.0.0.1:5000")
			chain := func(peer netip.AddrPort) uint32 {
				return tbl.h4.bucket(udpTestHash(Tuple{Local: local, Remote: peer}))
			}
			// peerIn returns a peer whose 4-tuple hashes to a chain
			// for which ok returns true.
			peerIn := func(ok func(uint32) bool) netip.AddrPort {
				for i := 1; ; i++ {
					p := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), uint16(7000+i))
					if ok(chain(p)) {
						return p
					}
				}
			}
			sv, mv := 1, 2
			stable, err := tbl.Bind(local, &sv, WithReusePort(), WithReuseAddr())
			require.NoError(t, err)
			sPeer := dmxAP("192.0.2.1:9")
			require.NoError(t, stable.Connect(sPeer))
			c := chain(sPeer)
			mover, err := tbl.Bind(dmxAP("0.0.0.0:5000"), &mv, WithReuseAddr())
			require.NoError(t, err)
			require.NoError(t, mover.ConnectFrom(local.Addr(), peerIn(func(b uint32) bool { return b == c })))
			// Chain c is now mover -> stable.
			require.Equal(t, nodeLink(mover.b.node), tbl.h4.heads[c].load())
			other := peerIn(func(b uint32) bool { return b != c })

			paused, resume := make(chan struct{}), make(chan struct{})
			var once sync.Once
			target := mover.b.node
			tbl.hooks = &testHooks{visit: func(i uint32) {
				if i == target {
					once.Do(func() { close(paused); <-resume })
				}
			}}
			done := make(chan *int)
			k := key{
				meta:   uint64(udpTestHash(Tuple{Local: local, Remote: sPeer}))<<32 | 5000<<16 | 9,
				remote: addrWords(sPeer.Addr()),
				local:  addrWords(local.Addr()),
			}
			go func() {
				done <- tbl.lookup4(&k)
			}()
			<-paused
			if byClose {
				require.NoError(t, mover.Close())
			} else {
				require.NoError(t, mover.Disconnect())
			}
			nv := 3
			n, err := tbl.Bind(local, &nv, WithReusePort(), WithReuseAddr())
			require.NoError(t, err)
			require.Equal(t, target, n.b.node, "the node is recycled at once")
			require.NoError(t, n.Connect(other))
			require.Equal(t, nodeLink(target), tbl.h4.heads[chain(other)].load())
			close(resume)
			require.Same(t, &sv, <-done)
			require.EqualValues(t, 1, tbl.restarts.Load(), "one restart, on the foreign marker")
			tbl.hooks = nil
			v, ok := tbl.Lookup(Tuple{Local: local, Remote: sPeer})
			require.True(t, ok)
			require.Same(t, &sv, v)
		})
	}
}

func TestUDPLookupNoAllocs(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	v := new(int)
	for i := range 8 {
		s, err := tbl.Bind(dmxAP("10.0.0.1:53"), v, WithReusePort(), WithReuseAddr())
		require.NoError(t, err)
		if i < 4 {
			require.NoError(t, s.Connect(netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 9)))
		}
	}
	_, err := tbl.Bind(dmxAP("[::]:53"), v, WithReuseAddr())
	require.NoError(t, err)
	s6, err := tbl.Bind(dmxAP("[2001:db8::1]:53"), v, WithReuseAddr())
	require.NoError(t, err)
	require.NoError(t, s6.Connect(dmxAP("[2001:db8::9]:9")))
	for _, p := range []Tuple{
		dmxPkt("10.0.0.1:53", "192.0.2.1:9"),          // hash4
		dmxPkt("10.0.0.1:53", "192.0.2.100:9"),        // scoring, reuseport tie
		dmxPkt("10.0.0.2:53", "192.0.2.1:9"),          // wildcard
		dmxPkt("10.0.0.2:54", "192.0.2.1:9"),          // miss
		dmxPkt("[2001:db8::1]:53", "[2001:db8::9]:9"), // IPv6 hash4
		{},
	} {
		require.Zero(t, testing.AllocsPerRun(100, func() { tbl.Lookup(p) }), "%v", p)
	}
}

// Pools the scenarios draw from: few values, so that binds conflict,
// sockets tie and peers repeat.
var (
	udpPoolLocal = []string{
		"10.0.0.1", "10.0.0.2", "::ffff:10.0.0.1", "0.0.0.0", "::", "::ffff:0.0.0.0",
		"2001:db8::1", "2001:db8::2", "fe80::1%eth0",
	}
	udpPoolPort    = []uint16{53, 54}
	udpPoolSrcAddr = []string{"10.0.0.1", "10.0.0.2", "::ffff:10.0.0.1", "2001:db8::1", "::"}
	udpPoolPeer    = []string{
		"192.0.2.1:1000", "192.0.2.1:1001", "192.0.2.2:1000", "[::ffff:192.0.2.2]:1000",
		"[2001:db8::9]:1000", "[2001:db8::a]:1000", "[2001:db8::9]:1001", "0.0.0.0:5",
		"192.0.2.3:0",
	}
	udpPoolDst = []string{
		"10.0.0.1", "10.0.0.2", "10.0.0.3", "::ffff:10.0.0.1", "2001:db8::1", "2001:db8::2",
		"2001:db8::3", "fe80::1%eth1", "0.0.0.0",
	}
	udpPoolSrc = []string{
		"192.0.2.1:1000", "192.0.2.1:1001", "192.0.2.2:1000", "192.0.2.9:7", "0.0.0.0:68",
		"[2001:db8::9]:1000", "[2001:db8::a]:1000", "[2001:db8::9]:1001", "[2001:db8::b]:5",
		"[::ffff:192.0.2.1]:1000",
	}
)

// opSource yields the bytes that drive a scenario: random ones, or a fuzz
// input (then done reports its end).
type opSource struct {
	rng  *rand.Rand
	data []byte
	done bool
}

func (o *opSource) next() byte {
	if o.rng != nil {
		return byte(o.rng.Uint32())
	}
	if len(o.data) == 0 {
		o.done = true
		return 0
	}
	b := o.data[0]
	o.data = o.data[1:]
	return b
}

func (o *opSource) pick(n int) int { return int(o.next()) % n }

// runUDPScenario applies up to steps random operations to a table and to
// the model (udpModel), checking that they agree on every result and on
// the lookup of many packets, with hash4 on and off.
func runUDPScenario(t testing.TB, src *opSource, steps, capacity int) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret), WithCapacity(capacity))
	ref := &udpModel{}
	name := 0
	check := func(pkt Tuple) {
		want := ref.lookup(pkt, func() uint32 { return udpTestHash(pkt) })
		for _, off := range []bool{false, true} {
			tbl.hash4Off = off
			got, ok := tbl.Lookup(pkt)
			if len(want) == 0 {
				if ok {
					t.Fatalf("Lookup(%v) (hash4 off: %v) = %d, want nothing", pkt, off, *got)
				}
				continue
			}
			if off && want[0].conn && !want[0].wild() {
				// Without hash4, scoring may pick another socket
				// connected to the same peer.
				continue
			}
			if !ok || got != want[0].val {
				t.Fatalf("Lookup(%v) (hash4 off: %v) = %v, %v; want the socket on %v (%d)", pkt, off, got, ok, want[0].addr, *want[0].val)
			}
		}
		tbl.hash4Off = false
	}
	for range steps {
		if src.done {
			break
		}
		switch op := src.pick(10); {
		case op < 4 || len(ref.socks) == 0: // bind
			a := netip.MustParseAddr(udpPoolLocal[src.pick(len(udpPoolLocal))])
			local := netip.AddrPortFrom(a, udpPoolPort[src.pick(len(udpPoolPort))])
			f := src.next()
			v6only, reusePort, reuseAddr := f&1 != 0, f&6 != 0, f&8 != 0
			var opts []BindOption
			if v6only {
				opts = append(opts, WithIPv6Only())
			}
			if reusePort {
				opts = append(opts, WithReusePort())
			}
			if reuseAddr {
				opts = append(opts, WithReuseAddr())
			}
			name++
			v := name
			s, err := tbl.Bind(local, &v, opts...)
			ms := ref.bind(local, v6only, reusePort, reuseAddr)
			if (ms != nil) != (err == nil) {
				t.Fatalf("Bind(%v, v6only %v, reuseport %v, reuseaddr %v) = %v, want ok %v", local, v6only, reusePort, reuseAddr, err, ms != nil)
			}
			if err == nil {
				ms.s, ms.val = s, &v
			}
		case op < 7: // connect
			rs := ref.socks[src.pick(len(ref.socks))]
			peer := dmxAP(udpPoolPeer[src.pick(len(udpPoolPeer))])
			var from netip.Addr
			if n := src.pick(len(udpPoolSrcAddr) + 1); n > 0 {
				from = netip.MustParseAddr(udpPoolSrcAddr[n-1])
			}
			var err error
			if from.IsValid() {
				err = rs.s.ConnectFrom(from, peer)
			} else {
				err = rs.s.Connect(peer)
			}
			if ok := ref.connect(rs, from, peer); ok != (err == nil) {
				t.Fatalf("Connect(%v -> %v from %v) = %v, want ok %v", rs.addr, peer, from, err, ok)
			}
			if got := rs.s.LocalAddr(); got != netip.AddrPortFrom(rs.addr, rs.port) {
				t.Fatalf("LocalAddr() = %v, want %v", got, netip.AddrPortFrom(rs.addr, rs.port))
			}
		case op < 8: // disconnect
			rs := ref.socks[src.pick(len(ref.socks))]
			if err := rs.s.Disconnect(); err != nil {
				t.Fatalf("Disconnect: %v", err)
			}
			ref.disconnect(rs)
		default: // close
			rs := ref.socks[src.pick(len(ref.socks))]
			if err := rs.s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			ref.close(rs)
		}
		// The flows of every connected socket, then random packets.
		for _, rs := range ref.socks {
			if rs.conn {
				check(Tuple{Local: netip.AddrPortFrom(rs.addr, rs.port), Remote: rs.peer})
			}
		}
		for range 6 {
			check(Tuple{
				Local:  netip.AddrPortFrom(netip.MustParseAddr(udpPoolDst[src.pick(len(udpPoolDst))]), udpPoolPort[src.pick(len(udpPoolPort))]),
				Remote: dmxAP(udpPoolSrc[src.pick(len(udpPoolSrc))]),
			})
		}
	}
	// hash4_cnt of every slot counts its sockets in hash4, and hash4 holds
	// just those.
	cnt := make([]int32, len(tbl.slots))
	hashed := 0
	for _, rs := range ref.socks {
		if rs.hashed4 {
			cnt[rs.s.b.h2&tbl.mask]++
			hashed++
		}
	}
	for i := range tbl.slots {
		if got := tbl.slots[i].hash4Cnt.Load(); got != cnt[i] {
			t.Fatalf("slot %d: hash4_cnt %d, want %d", i, got, cnt[i])
		}
	}
	n := 0
	for b := range tbl.h4.heads {
		for l := tbl.h4.heads[b].load(); !l.isNulls(); l = tbl.nodes.at(l.index()).next.load() {
			n++
		}
	}
	if n != hashed {
		t.Fatalf("hash4 holds %d nodes, want %d", n, hashed)
	}
	if got := len(tbl.sockets()); got != len(ref.socks) {
		t.Fatalf("%d sockets bound, want %d", got, len(ref.socks))
	}
}

// TestUDPLookupMatchesReference runs random scenarios against the reference.
func TestUDPLookupMatchesReference(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 20
	}
	for seed := range seeds {
		capacity := 16
		if seed%3 == 2 {
			capacity = 1024
		}
		runUDPScenario(t, &opSource{rng: rand.New(rand.NewPCG(uint64(seed), 0x5eed))}, 120, capacity)
	}
}

// FuzzUDPLookup drives a scenario with the fuzzer's bytes.
func FuzzUDPLookup(f *testing.F) {
	f.Add([]byte{0, 0, 2, 2, 0, 0, 2, 4, 5, 0, 0, 1, 1})
	f.Add([]byte{1, 3, 0, 6, 1, 3, 0, 6, 5, 0, 0, 5, 1, 1, 9, 0, 3, 4, 4, 1, 0, 0})
	f.Add([]byte("bind connect close reuse v6only wildcard"))
	f.Fuzz(func(t *testing.T, data []byte) {
		runUDPScenario(t, &opSource{data: data}, 64, 16)
	})
}

// TestUDPLookupRace connects, disconnects, closes and rebinds sockets while
// lookups run for sockets that stay bound: every lookup must find the right
// socket, never nothing (run it under -race).
func TestUDPLookupRace(t *testing.T) {
	// Few slots, so that moving nodes share chains with stable ones.
	tbl := NewUDPTable[int](WithSecret(udpTestSecret), WithCapacity(16), WithLockStripes(4))
	type flow struct {
		pkt Tuple
		val *int
	}
	var stable []flow
	vals := make([]int, 200)
	nv := 0
	newVal := func() *int { nv++; vals[nv] = nv; return &vals[nv] }
	bind := func(local string, peer netip.AddrPort, opts ...BindOption) *int {
		v := newVal()
		s, err := tbl.Bind(dmxAP(local), v, append(opts, WithReuseAddr())...)
		require.NoError(t, err)
		if peer.IsValid() {
			require.NoError(t, s.Connect(peer))
			stable = append(stable, flow{Tuple{Local: dmxAP(local), Remote: peer}, v})
		}
		return v
	}
	for i := range 32 {
		bind("10.0.0.1:5000", netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}), uint16(1000+i)), WithReusePort())
	}
	for i := range 16 {
		bind("[2001:db8::1]:5000", netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 15: byte(i + 1)}), uint16(2000+i)), WithReusePort())
	}
	nConnected := len(stable)
	// Unconnected sockets that own other addresses of the port.
	u := bind("10.0.0.2:5000", netip.AddrPort{})
	w := bind("0.0.0.0:5000", netip.AddrPort{})
	w6 := bind("[::]:5000", netip.AddrPort{}, WithIPv6Only())
	for i := range 8 {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), 3000)
		src6 := netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 2, 15: byte(i + 1)}), 3000)
		stable = append(stable,
			flow{Tuple{Local: dmxAP("10.0.0.2:5000"), Remote: src}, u},
			flow{Tuple{Local: dmxAP("10.0.0.9:5000"), Remote: src}, w},
			flow{Tuple{Local: dmxAP("[2001:db8::9]:5000"), Remote: src6}, w6},
		)
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	// Movers share the address of the stable connected sockets and connect
	// to peers of their own.
	const movers = 6
	for m := range movers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(m), 1))
			v6 := m%3 == 2
			local := dmxAP("10.0.0.1:5000")
			if v6 {
				local = dmxAP("[2001:db8::1]:5000")
			}
			v := new(int)
			s, err := tbl.Bind(local, v, WithReusePort(), WithReuseAddr())
			if err != nil {
				t.Error(err)
				return
			}
			for !stop.Load() {
				peer := netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(rng.IntN(64) + 1)}), uint16(4000+rng.IntN(4)))
				if v6 {
					peer = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 3, 15: byte(rng.IntN(64) + 1)}), uint16(4000+rng.IntN(4)))
				}
				switch r := rng.IntN(8); {
				case r < 5:
					err = s.Connect(peer)
				case r < 7:
					err = s.Disconnect()
				default:
					if err = s.Close(); err == nil {
						s, err = tbl.Bind(local, v, WithReusePort(), WithReuseAddr())
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	lookups := raceLookups(t, &stop, &wg, 2, 2, func(rng *rand.Rand) string {
		i := rng.IntN(len(stable))
		f := stable[i]
		if v, ok := tbl.Lookup(f.pkt); !ok || v != f.val {
			return fmt.Sprintf("Lookup(%v) = %v, %v", f.pkt, v, ok)
		}
		if i < nConnected {
			// hash4 alone must find exactly the stable socket.
			la, ra := f.pkt.Local.Addr(), f.pkt.Remote.Addr()
			k := key{
				meta:   uint64(udpTestHash(f.pkt))<<32 | 5000<<16 | uint64(f.pkt.Remote.Port()),
				remote: addrWords(ra),
				local:  addrWords(la),
			}
			if v := tbl.lookup4(&k); v != f.val {
				return fmt.Sprintf("lookup4(%v) = %v", f.pkt, v)
			}
		}
		return ""
	})
	t.Logf("%d lookups, %d hash4 restarts", lookups, tbl.restarts.Load())
	require.Positive(t, lookups)
}

// TestDemuxHashWords checks that the hashes computed from address words
// equal the exported (kernel-exact) functions.
func TestDemuxHashWords(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	rng := rand.New(rand.NewPCG(1, 2))
	addr := func(v4 bool) netip.Addr {
		if v4 {
			return netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())})
		}
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return netip.AddrFrom16(b)
	}
	check := func(la, ra netip.Addr, lp, rp uint16) {
		t.Helper()
		is4 := la.Is4()
		lw, rw := addrWords(la), addrWords(ra)
		require.Equal(t, addrWords(la), lw)
		wantPA := IPv6PortaddrHash(la, lp, tbl.mix)
		if is4 {
			wantPA = IPv4PortaddrHash(la, lp, tbl.mix)
		}
		require.Equal(t, wantPA, portaddrHashWords(&lw, is4, lp, tbl.mix), "%v", la)
		require.Equal(t, wantPA, portaddrHash(la, lp, tbl.mix), "%v", la)
		require.Equal(t, udpTestHash(Tuple{netip.AddrPortFrom(la, lp), netip.AddrPortFrom(ra, rp)}),
			tbl.udpEhash(&lw, is4, lp, &rw, rp), "%v %v", la, ra)
	}
	for i := range 2000 {
		v4 := i%2 == 0
		check(addr(v4), addr(v4), uint16(rng.Uint32()), uint16(rng.Uint32()))
	}
	check(netip.IPv4Unspecified(), netip.IPv4Unspecified(), 53, 0)
	check(netip.IPv6Unspecified(), netip.IPv6Unspecified(), 53, 0)
	require.Equal(t, portaddrHash(netip.IPv4Unspecified(), 53, tbl.mix), portaddrHash(netip.IPv6Unspecified(), 53, tbl.mix))
	require.Equal(t, tbl.anyMix^53, portaddrHash(netip.IPv6Unspecified(), 53, tbl.mix))
}

func TestUDPSlotSize(t *testing.T) {
	require.EqualValues(t, 32, unsafe.Sizeof(udpSlot[int]{}), "a slot must not straddle a cache line")
}

// A slot is 32 bytes on every architecture: checked when the tests are
// compiled, so also by the vet of 32-bit targets. A slot of any other size
// makes the index negative or too large.
var _ = [1]struct{}{}[unsafe.Sizeof(udpSlot[int]{})-32]

// udpNames looks pkt up and returns the name of the socket that takes it,
// or "".
func udpName(tbl *UDPTable[string], local, remote string) string {
	if v, ok := tbl.Lookup(dmxPkt(local, remote)); ok {
		return *v
	}
	return ""
}

// TestUDPWildcardConnectMoves: a socket on 0.0.0.0:P connected to
// 127.0.0.8:Q from 127.0.0.1 takes 127.0.0.1 as its address, as Linux's
// connect(): a datagram from its peer to 127.0.0.3:P reaches no socket, and
// one to 127.0.0.1:P reaches it rather than B, bound to 127.0.0.1:P. After
// a disconnect it is on the wildcard again.
func TestUDPWildcardConnectMoves(t *testing.T) {
	tbl := NewUDPTable[string](WithSecret(udpTestSecret))
	names := []string{"A", "B"}
	a, err := tbl.Bind(dmxAP("0.0.0.0:5000"), &names[0], WithReuseAddr())
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("127.0.0.1:5000"), &names[1], WithReuseAddr())
	require.NoError(t, err)
	require.ErrorIs(t, a.Connect(dmxAP("127.0.0.8:6000")), ErrInvalidAddr)
	require.Equal(t, dmxAP("0.0.0.0:5000"), a.LocalAddr(), "a failed Connect changes nothing")
	require.NoError(t, a.ConnectFrom(netip.MustParseAddr("127.0.0.1"), dmxAP("127.0.0.8:6000")))
	require.Equal(t, dmxAP("127.0.0.1:5000"), a.LocalAddr())
	require.Equal(t, "", udpName(tbl, "127.0.0.3:5000", "127.0.0.8:6000"))
	require.Equal(t, "A", udpName(tbl, "127.0.0.1:5000", "127.0.0.8:6000"))
	require.Equal(t, "B", udpName(tbl, "127.0.0.1:5000", "127.0.0.9:6000"))
	require.ErrorIs(t, a.ConnectFrom(netip.MustParseAddr("127.0.0.2"), dmxAP("127.0.0.9:6000")), ErrInvalidAddr,
		"the address stays what the first connect fixed")
	require.NoError(t, a.Connect(dmxAP("127.0.0.9:6000")), "a reconnect keeps it")
	require.Equal(t, "A", udpName(tbl, "127.0.0.1:5000", "127.0.0.9:6000"))
	require.NoError(t, a.Disconnect())
	require.Equal(t, dmxAP("0.0.0.0:5000"), a.LocalAddr())
	require.Equal(t, "A", udpName(tbl, "127.0.0.3:5000", "127.0.0.8:6000"))
	require.Equal(t, "B", udpName(tbl, "127.0.0.1:5000", "127.0.0.8:6000"))
}

// TestUDPMappedIsIPv6: a socket on [::ffff:127.0.0.3]:P is an IPv6 socket:
// with an IPv4 socket on 127.0.0.3:P, both with SO_REUSEPORT, every IPv4
// datagram goes to the IPv4 socket, which scores higher; alone, the mapped
// one takes them.
func TestUDPMappedIsIPv6(t *testing.T) {
	tbl := NewUDPTable[string](WithSecret(udpTestSecret))
	names := []string{"v4", "mapped"}
	m, err := tbl.Bind(dmxAP("[::ffff:127.0.0.3]:5000"), &names[1], WithReusePort())
	require.NoError(t, err)
	require.Equal(t, dmxAP("[::ffff:127.0.0.3]:5000"), m.LocalAddr())
	v4, err := tbl.Bind(dmxAP("127.0.0.3:5000"), &names[0], WithReusePort())
	require.NoError(t, err)
	for i := range 64 {
		remote := fmt.Sprintf("127.0.0.9:%d", 1000+i)
		require.Equal(t, "v4", udpName(tbl, "127.0.0.3:5000", remote))
	}
	require.NoError(t, v4.Close())
	require.Equal(t, "mapped", udpName(tbl, "127.0.0.3:5000", "127.0.0.9:1000"))
	require.Equal(t, "", udpName(tbl, "[::1]:5000", "[::1]:1000"), "not an IPv6 address")
}

// TestUDPHash4LastConnectedWins: of reuseport sockets connected to the same
// peer, the one whose first connect came last takes the flow, as the head of
// Linux's hash4 chain.
func TestUDPHash4LastConnectedWins(t *testing.T) {
	tbl := NewUDPTable[string](WithSecret(udpTestSecret))
	names := []string{"A", "B", "C"}
	var socks []*UDPSocket[string]
	for i := range names {
		s, err := tbl.Bind(dmxAP("127.0.0.1:5000"), &names[i], WithReusePort())
		require.NoError(t, err)
		socks = append(socks, s)
	}
	// Reconnects leave the sockets where their first connect put them.
	for _, order := range [][]int{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}} {
		for _, i := range order {
			require.NoError(t, socks[i].Connect(dmxAP("127.0.0.8:6000")))
		}
		require.Equal(t, "C", udpName(tbl, "127.0.0.1:5000", "127.0.0.8:6000"))
	}
}

// TestUDPBindConflicts checks Bind against Linux's answers
// (udp_lib_lport_inuse) in the cases that differ from a plain
// same-address rule.
func TestUDPBindConflicts(t *testing.T) {
	type bind struct {
		addr           string
		v6only, rp, ra bool
		ok             bool
	}
	for i, tc := range [][]bind{
		{{"127.0.0.1", false, false, false, true}, {"0.0.0.0", false, false, false, false}},
		{{"0.0.0.0", false, false, false, true}, {"127.0.0.1", false, false, false, false}},
		{{"0.0.0.0", false, false, true, true}, {"127.0.0.1", false, false, true, true}, {"127.0.0.1", false, false, true, true}},
		{{"127.0.0.1", false, false, true, true}, {"127.0.0.1", false, false, false, false}},
		{{"::", false, false, false, true}, {"0.0.0.0", false, false, false, false}},
		{{"::", true, false, false, true}, {"0.0.0.0", false, false, false, true}, {"::ffff:127.0.0.1", false, false, false, false}},
		{{"127.0.0.3", false, true, false, true}, {"::ffff:127.0.0.3", false, true, false, true}},
		{{"127.0.0.3", false, false, false, true}, {"::ffff:127.0.0.3", false, false, false, false}},
		// An IPv6 address other than :: overlaps no IPv4 address.
		{{"::1", false, false, false, true}, {"0.0.0.0", false, false, false, true}},
		{{"0.0.0.0", false, false, false, true}, {"::1", false, false, false, true}},
		{{"::1", false, false, false, true}, {"127.0.0.6", false, false, false, true}},
		// Every overlapping socket must allow it.
		{{"127.0.0.1", false, false, false, true}, {"127.0.0.2", false, true, false, true}, {"0.0.0.0", false, true, false, false}},
		{{"127.0.0.2", false, true, false, true}, {"127.0.0.1", false, false, false, true}, {"0.0.0.0", false, true, false, false}},
		{{"127.0.0.1", false, false, false, true}, {"0.0.0.0", false, true, true, false}},
	} {
		tbl := NewUDPTable[int](WithSecret(udpTestSecret))
		ref := &udpModel{}
		for j, b := range tc {
			var opts []BindOption
			if b.v6only {
				opts = append(opts, WithIPv6Only())
			}
			if b.rp {
				opts = append(opts, WithReusePort())
			}
			if b.ra {
				opts = append(opts, WithReuseAddr())
			}
			local := netip.AddrPortFrom(netip.MustParseAddr(b.addr), 5000)
			_, err := tbl.Bind(local, new(int), opts...)
			if b.ok {
				require.NoError(t, err, "case %d, bind %d", i, j)
			} else {
				require.ErrorIs(t, err, syscall.EADDRINUSE, "case %d, bind %d", i, j)
			}
			require.Equal(t, b.ok, ref.bind(local, b.v6only, b.rp, b.ra) != nil, "model: case %d, bind %d", i, j)
		}
	}
}

// TestUDPSpecificIPv6AddressIsIPv6Only: bind() to a specific IPv6 address
// makes a socket IPv6-only (__inet6_bind), so on ::1 the sockets that asked
// for IPV6_V6ONLY and those that did not form one reuseport group, while on
// :: they form two.
func TestUDPSpecificIPv6AddressIsIPv6Only(t *testing.T) {
	for _, addr := range []string{"::1", "::"} {
		tbl := NewUDPTable[int](WithSecret(udpTestSecret))
		vals := []int{0, 1}
		for i := range vals {
			opts := []BindOption{WithReusePort()}
			if i == 1 {
				opts = append(opts, WithIPv6Only())
			}
			_, err := tbl.Bind(netip.AddrPortFrom(netip.MustParseAddr(addr), 53), &vals[i], opts...)
			require.NoError(t, err)
		}
		seen := map[int]int{}
		for i := range 100 {
			pkt := Tuple{Local: dmxAP("[::1]:53"), Remote: netip.AddrPortFrom(netip.IPv6Loopback(), uint16(1000+i))}
			v, ok := tbl.Lookup(pkt)
			require.True(t, ok)
			seen[*v]++
			if addr == "::1" {
				require.Equal(t, vals[reciprocalScale(udpTestHash(pkt), 2)], *v)
			}
		}
		if addr == "::" {
			require.Equal(t, map[int]int{0: 100}, seen, "::: two groups, the first bound takes all")
		}
	}
}

// TestUDPConnectFixedIPv6AddressBlocksIPv4Wildcard: a dual-stack socket on
// :: whose address connect fixes to ::1 is not IPv6-only and holds the IPv4
// address the kernel gives IPv6 addresses (LOOPBACK4_IPV6, 127.0.0.6), so
// 0.0.0.0 on its port is refused until it disconnects; a socket bound to
// ::1 does not block it.
func TestUDPConnectFixedIPv6AddressBlocksIPv4Wildcard(t *testing.T) {
	for _, bound := range []string{"[::]:53", "[::1]:53"} {
		tbl := NewUDPTable[int](WithSecret(udpTestSecret))
		s, err := tbl.Bind(dmxAP(bound), new(int), WithReuseAddr())
		require.NoError(t, err)
		if bound == "[::]:53" {
			require.NoError(t, s.ConnectFrom(netip.IPv6Loopback(), dmxAP("[::1]:9")))
			_, err = tbl.Bind(dmxAP("0.0.0.0:53"), new(int))
			require.ErrorIs(t, err, syscall.EADDRINUSE)
			_, err = tbl.Bind(dmxAP("127.0.0.1:53"), new(int))
			require.NoError(t, err, "127.0.0.1 is not 127.0.0.6")
			require.NoError(t, s.Disconnect())
			_, err = tbl.Bind(dmxAP("0.0.0.0:53"), new(int))
			require.ErrorIs(t, err, syscall.EADDRINUSE, "back on ::, dual-stack")
			continue
		}
		require.NoError(t, s.Connect(dmxAP("[::1]:9")))
		_, err = tbl.Bind(dmxAP("0.0.0.0:53"), new(int))
		require.NoError(t, err)
	}
}
