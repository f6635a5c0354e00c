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
	// Other addresses, the wildcard included, do not conflict.
	_, err = tbl.Bind(dmxAP("10.0.0.2:53"), v)
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("0.0.0.0:53"), v)
	require.NoError(t, err)
	_, err = tbl.Bind(dmxAP("[::]:53"), v)
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
	s4, err := tbl.Bind(dmxAP("10.0.0.1:53"), v)
	require.NoError(t, err)
	s6, err := tbl.Bind(dmxAP("[2001:db8::1]:53"), v)
	require.NoError(t, err)
	dual, err := tbl.Bind(dmxAP("[::]:53"), v)
	require.NoError(t, err)
	only6, err := tbl.Bind(dmxAP("[::]:54"), v, WithIPv6Only())
	require.NoError(t, err)
	any4, err := tbl.Bind(dmxAP("0.0.0.0:53"), v)
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
	require.Zero(t, tbl.slots[s4.h2&tbl.mask].hash4Cnt.Load())

	require.NoError(t, dual.Connect(dmxAP("[::ffff:192.0.2.1]:7")))
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
	nilSock, err := tbl.Bind(dmxAP("192.0.2.1:0"), new(int))
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
		name, local, peer string
		opts              []BindOption
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
				{name: "W", local: "0.0.0.0:53", peer: "192.0.2.1:9"},
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
				{name: "D", local: "[::]:53", peer: "192.0.2.1:9"},
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
				us, err := tbl.Bind(dmxAP(s.local), &name, s.opts...)
				require.NoError(t, err, s.name)
				if s.peer != "" {
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
		_, err := tbl.Bind(dmxAP("10.0.0.1:53"), &vals[i], WithReusePort())
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

// TestUDPGroupRecordsPublishedOnce binds sockets to a reuseport group and
// closes some in random order, keeping every version of the slot's records
// a lookup could have loaded; none may change after it was published, though
// Bind appends to a group's array in place while it has room.
func TestUDPGroupRecordsPublishedOnce(t *testing.T) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret))
	v := new(int)
	local := dmxAP("10.0.0.1:443")
	slot := &tbl.slots[portaddrHash(local.Addr(), local.Port(), tbl.mix)&tbl.mask]
	type version struct {
		records *[]udpGroup[int]
		members [][]*UDPSocket[int] // a copy, as published
	}
	var versions []version
	keep := func() {
		p := slot.groups.Load()
		if p == nil {
			return
		}
		ver := version{records: p}
		for _, g := range *p {
			ver.members = append(ver.members, slices.Clone(g.members))
		}
		versions = append(versions, ver)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var open []*UDPSocket[int]
	for range 400 {
		if len(open) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(open))
			require.NoError(t, open[i].Close())
			open = slices.Delete(open, i, i+1)
		} else {
			s, err := tbl.Bind(local, v, WithReusePort())
			require.NoError(t, err)
			open = append(open, s)
		}
		keep()
	}
	require.Greater(t, len(open), 64)
	for i, ver := range versions {
		for j, g := range *ver.records {
			require.Equal(t, ver.members[j], g.members, "version %d, group %d", i, j)
		}
	}
	sockets := (*slot.groups.Load())[0].members
	require.ElementsMatch(t, open, sockets)
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
			socks[i], err = tbl.Bind(netip.AddrPortFrom(netip.MustParseAddr(addr), 53), &names[i], WithReusePort())
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
		s, err := tbl.Bind(dmxAP("[::]:53"), &names[i], opts...)
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

// TestUDPReusePortConnectMovesOnlyItsFlows: when one socket of a reuseport
// group connects to an unrelated peer, only the flows it took move, each to
// the next unconnected socket of the group in bind order, as the kernel's
// reuseport_select_sock_by_hash skips connected sockets; when it
// disconnects, they come back. For a group on the wildcard address and one
// on a concrete address (whose connected sockets are in hash4).
func TestUDPReusePortConnectMovesOnlyItsFlows(t *testing.T) {
	for _, addr := range []string{"0.0.0.0", "10.0.0.1"} {
		tbl := NewUDPTable[int](WithSecret(udpTestSecret))
		const n = 4
		vals := make([]int, n)
		socks := make([]*UDPSocket[int], n)
		for i := range vals {
			vals[i] = i
			var err error
			socks[i], err = tbl.Bind(netip.AddrPortFrom(netip.MustParseAddr(addr), 53), &vals[i], WithReusePort())
			require.NoError(t, err)
		}
		owners := func() []int {
			var got []int
			for i := range 400 {
				remote := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), uint16(1000+i))
				v, ok := tbl.Lookup(Tuple{Local: dmxAP("10.0.0.1:53"), Remote: remote})
				require.True(t, ok, addr)
				got = append(got, *v)
			}
			return got
		}
		before := owners()
		peer := dmxAP("203.0.113.1:9") // sends none of the flows
		require.NoError(t, socks[1].Connect(peer))
		require.NoError(t, socks[3].Connect(peer))
		moved := 0
		for i, o := range owners() {
			switch before[i] {
			case 1:
				require.Equal(t, 2, o, "%s: flow %d of socket 1", addr, i)
				moved++
			case 3: // wraps past the end to socket 0
				require.Equal(t, 0, o, "%s: flow %d of socket 3", addr, i)
				moved++
			default:
				require.Equal(t, before[i], o, "%s: flow %d stays", addr, i)
			}
		}
		require.Positive(t, moved, addr)
		require.NoError(t, socks[1].Disconnect())
		require.NoError(t, socks[3].Disconnect())
		require.Equal(t, before, owners(), addr)
	}
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
			_, err := tbl.Bind(dmxAP("[::]:53"), &vals[i], opts...)
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
			socks[i], err = tbl.Bind(dmxAP("[::]:53"), &names[i], opts...)
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

	// B0, A1 (IPv6-only), B2, A3 (IPv6-only, connected to a peer that
	// sends none of the packets); B0 closes. The group of B2 comes first
	// in the slot and has no connected socket, A1's has one: IPv6 packets
	// still go to A1's group, bound first, where only A1 takes them.
	tbl, socks = bind([]string{"B0", "A1", "B2", "A3"})
	require.NoError(t, socks[3].Connect(dmxAP("[2001:db8::99]:9")))
	require.NoError(t, socks[0].Close())
	require.Equal(t, []string{"A1"}, reached(tbl), "the group bound first, scored socket by socket")

	// A1, B2, A3 (A IPv6-only): a flow that A3 takes moves to B2's group
	// when A1 connects to a peer that sends none of the packets, though
	// neither A3 nor a socket it skipped changed: A1 no longer ties, and
	// B2 is now the tied socket bound first, as in Linux's hash2 chain.
	tbl, socks = bind([]string{"A1", "B2", "A3"})
	var pkt Tuple
	for i := 1; ; i++ {
		pkt = Tuple{Local: dmxAP("[2001:db8::1]:53"), Remote: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 15: byte(i)}), 1000)}
		if reciprocalScale(udpTestHash(pkt), 2) == 1 {
			break
		}
	}
	v, ok := tbl.Lookup(pkt)
	require.True(t, ok)
	require.Equal(t, "A3", *v)
	require.NoError(t, socks[0].Connect(dmxAP("[2001:db8::99]:9")))
	v, ok = tbl.Lookup(pkt)
	require.True(t, ok)
	require.Equal(t, "B2", *v)
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
		s, err := tbl.Bind(dmxAP("0.0.0.0:53"), &names[i], WithReusePort())
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
			a.Connect(dmxAP("192.0.2.1:9"))
			a.Disconnect()
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
	t.Logf("%d scorings started again", tbl.rescores.Load())
	require.Zero(t, wrong, "lookups that did not return B")
}

// TestUDPStaleSlotScored stops a lookup just after it loaded its slot's
// sockets, two of a reuseport group, one of them connected to another peer;
// that one closes, which leaves no socket of the group connected. The
// lookup must not pick from the group it loaded as if its sockets were all
// unconnected, which could return the closed socket, connected to another
// peer all along: it must score them, and return the other. The same with
// a connected socket of another group in the slot, which stays connected.
func TestUDPStaleSlotScored(t *testing.T) {
	for _, beside := range []bool{false, true} {
		t.Run(fmt.Sprintf("beside=%v", beside), func(t *testing.T) {
			tbl := NewUDPTable[string](WithSecret(udpTestSecret), WithCapacity(16))
			names := []string{"D", "E", "F"}
			socks := make([]*UDPSocket[string], 2)
			for i := range socks {
				var err error
				socks[i], err = tbl.Bind(dmxAP("10.0.0.1:53"), &names[i], WithReusePort())
				require.NoError(t, err)
			}
			require.NoError(t, socks[0].Connect(dmxAP("192.0.2.1:9")))
			if beside {
				f, err := tbl.Bind(udpSlotMate(tbl, dmxAP("10.0.0.1:53")), &names[2])
				require.NoError(t, err)
				require.NoError(t, f.Connect(dmxAP("192.0.2.2:9")))
			}
			// A packet from another peer whose flow hash names D's place.
			var pkt Tuple
			for i := 1; ; i++ {
				pkt = Tuple{Local: dmxAP("10.0.0.1:53"), Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 1000)}
				if reciprocalScale(udpTestHash(pkt), 2) == 0 {
					break
				}
			}
			paused, resume := make(chan struct{}), make(chan struct{})
			var once sync.Once
			tbl.loaded = func() { once.Do(func() { close(paused); <-resume }) }
			done := make(chan *string)
			go func() {
				v, _ := tbl.Lookup(pkt)
				done <- v
			}()
			<-paused
			require.NoError(t, socks[0].Close())
			require.Zero(t, socks[1].conns.Load())
			close(resume)
			require.Same(t, &names[1], <-done)
		})
	}
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
	slotOf := func(a netip.AddrPort) uint32 { return portaddrHash(a.Addr(), a.Port(), tbl.mix) & tbl.mask }
	other := udpSlotMate(tbl, group)
	names := []string{"G0", "G1", "G2", "O"}
	for i := range 3 {
		_, err := tbl.Bind(group, &names[i], WithReusePort())
		require.NoError(t, err)
	}
	_, err := tbl.Bind(other, &names[3], WithReusePort())
	require.NoError(t, err)
	connected := int32(0)
	if neighbour {
		name := "N"
		n, err := tbl.Bind(udpSlotMate(tbl, other), &name)
		require.NoError(t, err)
		require.NoError(t, n.Connect(dmxAP("203.0.113.2:9")))
		connected = 1
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	for m := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("G-mover%d", m)
			for i := 0; !stop.Load(); i++ {
				s, err := tbl.Bind(group, &name, WithReusePort())
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
	t.Logf("%d lookups, %d scorings started again", lookups, tbl.rescores.Load())
	require.Equal(t, connected, tbl.slots[slotOf(group)].conns.Load())
	for _, g := range *tbl.slots[slotOf(group)].groups.Load() {
		want := int32(0)
		if *g.first.val == "N" {
			want = 1
		}
		require.Equal(t, want, g.conns.Load(), "connected sockets of %v", g.first.local)
	}
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
	v := new(int)
	a, err := tbl.Bind(dmxAP("10.0.0.1:53"), v, WithReusePort())
	require.NoError(t, err)
	b, err := tbl.Bind(dmxAP("10.0.0.1:53"), v, WithReusePort())
	require.NoError(t, err)
	w, err := tbl.Bind(dmxAP("0.0.0.0:53"), v)
	require.NoError(t, err)
	slot := &tbl.slots[a.h2&tbl.mask]
	wslot := &tbl.slots[w.h2&tbl.mask]
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
		for _, sl := range []*udpSlot[int]{slot, wslot} {
			inSlot := 0
			if p := sl.groups.Load(); p != nil {
				for _, g := range *p {
					connected := 0
					for _, s := range g.members {
						if s.peer.Load() != nil {
							connected++
						}
						require.Same(t, g.conns, s.conns)
					}
					require.EqualValues(t, connected, g.conns.Load(), "connected sockets of %v", g.first.local)
					inSlot += connected
				}
			}
			require.EqualValues(t, inSlot, sl.conns.Load(), "connected sockets of a slot")
		}
	}
	check(0, 0)
	require.NoError(t, a.Connect(dmxAP("192.0.2.1:9")))
	check(1, 1)
	require.NoError(t, a.Connect(dmxAP("192.0.2.2:9")), "reconnect moves")
	check(1, 1)
	require.NoError(t, b.Connect(dmxAP("192.0.2.2:9")))
	check(2, 2)
	require.NoError(t, w.Connect(dmxAP("192.0.2.2:9")), "wildcard sockets stay out of hash4")
	check(2, 2)
	if wslot != slot {
		require.Zero(t, wslot.hash4Cnt.Load())
	}
	require.NoError(t, a.Disconnect())
	check(1, 1)
	require.NoError(t, a.Disconnect())
	check(1, 1)
	require.NoError(t, b.Close())
	check(0, 0)
	require.NoError(t, a.Connect(dmxAP("192.0.2.3:9")))
	check(1, 1)
	require.NoError(t, a.Close())
	check(0, 0)
	require.NoError(t, w.Disconnect())
	check(0, 0)
	require.NoError(t, w.Connect(dmxAP("192.0.2.4:9")))
	check(0, 0)
	require.NoError(t, w.Close())
	check(0, 0)
	require.Zero(t, w.conns.Load())
}

// TestUDPHash4NullsRestart makes a hash4 reader stand on a node while the
// node moves to another chain (a reconnect), or is recycled into another
// socket that connects elsewhere; the reader must end on the other chain's
// marker, restart, and find the socket it looks for. Without the marker
// check it would report no match.
func TestUDPHash4NullsRestart(t *testing.T) {
	for _, recycle := range []bool{false, true} {
		t.Run(fmt.Sprintf("recycle=%v", recycle), func(t *testing.T) {
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
			stable, err := tbl.Bind(local, &sv, WithReusePort())
			require.NoError(t, err)
			sPeer := dmxAP("192.0.2.1:9")
			require.NoError(t, stable.Connect(sPeer))
			c := chain(sPeer)
			mover, err := tbl.Bind(local, &mv, WithReusePort())
			require.NoError(t, err)
			require.NoError(t, mover.Connect(peerIn(func(b uint32) bool { return b == c })))
			// Chain c is now mover -> stable.
			require.Equal(t, nodeLink(mover.node), tbl.h4.heads[c].load())
			other := peerIn(func(b uint32) bool { return b != c })

			paused, resume := make(chan struct{}), make(chan struct{})
			var once sync.Once
			target := mover.node
			tbl.visit = func(i uint32) {
				if i == target {
					once.Do(func() { close(paused); <-resume })
				}
			}
			type res struct {
				v *int
				n int
			}
			done := make(chan res)
			k := key{
				meta:   uint64(udpTestHash(Tuple{Local: local, Remote: sPeer}))<<32 | 5000<<16 | 9,
				remote: addrWords(sPeer.Addr()),
				local:  addrWords(local.Addr()),
			}
			go func() {
				v, n := tbl.lookup4(&k)
				done <- res{v, n}
			}()
			<-paused
			if recycle {
				require.NoError(t, mover.Close())
				nv := 3
				n, err := tbl.Bind(local, &nv, WithReusePort())
				require.NoError(t, err)
				require.Equal(t, target, n.node, "the node is recycled at once")
				require.NoError(t, n.Connect(other))
			} else {
				require.NoError(t, mover.Connect(other))
			}
			require.Equal(t, nodeLink(target), tbl.h4.heads[chain(other)].load())
			close(resume)
			r := <-done
			require.Same(t, &sv, r.v)
			require.Equal(t, 1, r.n)
			require.EqualValues(t, 1, tbl.restarts.Load(), "one restart, on the foreign marker")
			tbl.visit = nil
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
		s, err := tbl.Bind(dmxAP("10.0.0.1:53"), v, WithReusePort())
		require.NoError(t, err)
		if i < 4 {
			require.NoError(t, s.Connect(netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 9)))
		}
	}
	_, err := tbl.Bind(dmxAP("[::]:53"), v)
	require.NoError(t, err)
	s6, err := tbl.Bind(dmxAP("[2001:db8::1]:53"), v)
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

// ---- Reference model ----

// udpRefSock is a socket of the reference model.
type udpRefSock struct {
	refBinding
	conn bool
	peer netip.AddrPort // normalized
	s    *UDPSocket[int]
	val  *int
}

// udpRef is the obviously-correct reference: every open socket in bind
// order and each reuseport group's array (refSockets), and a linear scan
// with the Linux score.
type udpRef struct {
	refSockets[*udpRefSock]
	secret Secret
}

// refBinding is what a socket of a reference model is bound to.
type refBinding struct {
	local         netip.AddrPort // normalized
	v6only, reuse bool
}

func (b *refBinding) binding() *refBinding { return b }

// refGroup names a reuseport group: its sockets' address and port, and
// whether they are IPv6-only.
type refGroup struct {
	local  netip.AddrPort
	v6only bool
}

func (b *refBinding) group() refGroup { return refGroup{b.local, b.v6only} }

// refSockets holds the sockets of a reference model (UDP sockets or TCP
// listeners) in bind order, and each reuseport group as the kernel keeps
// its array: reuseport_add_sock appends, reuseport_detach_sock moves the
// last socket into the gap.
type refSockets[S interface {
	comparable
	binding() *refBinding
}] struct {
	bound  []S
	groups map[refGroup][]S
}

// bindOK reports whether a socket may bind local: a valid address and
// port, IPv6-only only on an IPv6 address, and port reuse asked for by
// every socket on local if it is taken.
func (r *refSockets[S]) bindOK(local netip.AddrPort, v6only, reuse bool) bool {
	l := refNorm(local)
	if !l.Addr().IsValid() || l.Port() == 0 || (v6only && l.Addr().Is4()) {
		return false
	}
	for _, s := range r.bound {
		if b := s.binding(); b.local == l && !(b.reuse && reuse) {
			return false
		}
	}
	return true
}

// add adds s, bound.
func (r *refSockets[S]) add(s S) {
	r.bound = append(r.bound, s)
	if r.groups == nil {
		r.groups = map[refGroup][]S{}
	}
	g := s.binding().group()
	r.groups[g] = append(r.groups[g], s)
}

// remove removes the i-th socket in bind order.
func (r *refSockets[S]) remove(i int) {
	s := r.bound[i]
	r.bound = slices.Delete(r.bound, i, i+1)
	g := s.binding().group()
	a := r.groups[g]
	j := slices.Index(a, s)
	a[j] = a[len(a)-1]
	r.groups[g] = a[:len(a)-1]
}

// refBindOptions decodes a scenario's byte into the options of a Bind or
// Listen: IPv6-only one time in two, port reuse three times in four.
func refBindOptions(f byte) (v6only, reuse bool, opts []BindOption) {
	v6only, reuse = f&1 != 0, f&6 != 0
	if v6only {
		opts = append(opts, WithIPv6Only())
	}
	if reuse {
		opts = append(opts, WithReusePort())
	}
	return v6only, reuse, opts
}

func refNorm(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap().WithZone(""), a.Port())
}

// connectOK reports whether Connect must succeed.
func (s *udpRefSock) connectOK(remote netip.AddrPort) bool {
	p := refNorm(remote)
	a := p.Addr()
	if !a.IsValid() || a.IsUnspecified() || p.Port() == 0 {
		return false
	}
	la := s.local.Addr()
	if a.Is4() {
		return la.Is4() || (la == netip.IPv6Unspecified() && !s.v6only)
	}
	return la.Is6()
}

func (s *udpRefSock) score(la netip.Addr, lp uint16, remote netip.AddrPort, wild bool) int {
	sa := s.local.Addr()
	if s.local.Port() != lp {
		return -1
	}
	score := 2
	if !wild {
		if sa != la {
			return -1
		}
	} else {
		switch {
		case !sa.IsUnspecified():
			return -1
		case sa.Is4() && la.Is4(), sa.Is6() && la.Is6():
		case sa.Is6() && la.Is4() && !s.v6only:
			score = 1
		default:
			return -1
		}
	}
	if s.conn {
		if s.peer != remote {
			return -1
		}
		score += 8
	}
	return score
}

func (r *udpRef) lookup(pkt Tuple) *udpRefSock {
	l, rem := refNorm(pkt.Local), refNorm(pkt.Remote)
	la, ra := l.Addr(), rem.Addr()
	if !la.IsValid() || la.IsUnspecified() || !ra.IsValid() || la.Is4() != ra.Is4() || l.Port() == 0 {
		return nil
	}
	for _, wild := range []bool{false, true} {
		best := -1
		var winners []*udpRefSock
		for _, s := range r.bound {
			switch sc := s.score(la, l.Port(), rem, wild); {
			case sc > best:
				best, winners = sc, []*udpRefSock{s}
			case sc == best && sc >= 0:
				winners = append(winners, s)
			}
		}
		switch len(winners) {
		case 0:
			continue
		case 1:
			return winners[0]
		}
		var h uint32
		if la.Is4() {
			h = UDPEhashfn(la, l.Port(), ra, rem.Port(), r.secret.Ehash)
		} else {
			h = UDP6Ehashfn(la, l.Port(), ra, rem.Port(), r.secret.Ehash, r.secret.Ehash6Addr)
		}
		// The reuseport group of the winner bound first: every socket on
		// its address and port that is IPv6-only if it is, in the order
		// of the kernel's array. The first winner of the group from its
		// k-th socket on, cyclically.
		group := r.groups[winners[0].group()]
		k := int(uint64(h) * uint64(len(group)) >> 32)
		for j := range group {
			if s := group[(k+j)%len(group)]; slices.Contains(winners, s) {
				return s
			}
		}
		panic("no winner in the winners' group")
	}
	return nil
}

// Pools the scenarios draw from: few values, so that binds conflict,
// sockets tie and peers repeat.
var (
	udpPoolLocal = []string{
		"10.0.0.1", "10.0.0.2", "::ffff:10.0.0.1", "0.0.0.0", "::", "::ffff:0.0.0.0",
		"2001:db8::1", "2001:db8::2", "fe80::1%eth0",
	}
	udpPoolPort = []uint16{53, 54}
	udpPoolPeer = []string{
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
// the reference, checking that they agree on every result and on the
// lookup of many packets, with hash4 on and off.
func runUDPScenario(t testing.TB, src *opSource, steps, capacity int) {
	tbl := NewUDPTable[int](WithSecret(udpTestSecret), WithCapacity(capacity))
	ref := &udpRef{secret: udpTestSecret}
	name := 0
	check := func(pkt Tuple) {
		want := ref.lookup(pkt)
		for _, off := range []bool{false, true} {
			tbl.hash4Off = off
			got, ok := tbl.Lookup(pkt)
			if want == nil {
				if ok {
					t.Fatalf("Lookup(%v) (hash4 off: %v) = %d, want nothing", pkt, off, *got)
				}
				continue
			}
			if !ok || got != want.val {
				t.Fatalf("Lookup(%v) (hash4 off: %v) = %v, %v; want the socket on %v (%d)", pkt, off, got, ok, want.local, *want.val)
			}
		}
		tbl.hash4Off = false
	}
	for range steps {
		if src.done {
			break
		}
		switch op := src.pick(10); {
		case op < 4 || len(ref.bound) == 0: // bind
			a := netip.MustParseAddr(udpPoolLocal[src.pick(len(udpPoolLocal))])
			local := netip.AddrPortFrom(a, udpPoolPort[src.pick(len(udpPoolPort))])
			v6only, reuse, opts := refBindOptions(src.next())
			name++
			v := name
			s, err := tbl.Bind(local, &v, opts...)
			if ok := ref.bindOK(local, v6only, reuse); ok != (err == nil) {
				t.Fatalf("Bind(%v, v6only %v, reuse %v) = %v, want ok %v", local, v6only, reuse, err, ok)
			}
			if err == nil {
				ref.add(&udpRefSock{refBinding: refBinding{refNorm(local), v6only, reuse}, s: s, val: &v})
			}
		case op < 7: // connect
			rs := ref.bound[src.pick(len(ref.bound))]
			peer := dmxAP(udpPoolPeer[src.pick(len(udpPoolPeer))])
			err := rs.s.Connect(peer)
			if ok := rs.connectOK(peer); ok != (err == nil) {
				t.Fatalf("Connect(%v -> %v) = %v, want ok %v", rs.local, peer, err, ok)
			}
			if err == nil {
				rs.conn, rs.peer = true, refNorm(peer)
			}
		case op < 8: // disconnect
			rs := ref.bound[src.pick(len(ref.bound))]
			if err := rs.s.Disconnect(); err != nil {
				t.Fatalf("Disconnect: %v", err)
			}
			rs.conn = false
		default: // close
			i := src.pick(len(ref.bound))
			if err := ref.bound[i].s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			ref.remove(i)
		}
		// The flows of every connected socket, then random packets.
		for _, rs := range ref.bound {
			if rs.conn {
				check(Tuple{Local: rs.local, Remote: rs.peer})
			}
		}
		for range 6 {
			check(Tuple{
				Local:  netip.AddrPortFrom(netip.MustParseAddr(udpPoolDst[src.pick(len(udpPoolDst))]), udpPoolPort[src.pick(len(udpPoolPort))]),
				Remote: dmxAP(udpPoolSrc[src.pick(len(udpPoolSrc))]),
			})
		}
	}
	// hash4_cnt of every slot counts its connected sockets with a concrete
	// local address, and hash4 holds just those.
	cnt := make([]int32, len(tbl.slots))
	hashed := 0
	for _, rs := range ref.bound {
		if rs.conn && !rs.local.Addr().IsUnspecified() {
			cnt[rs.s.h2&tbl.mask]++
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
	if got := len(tbl.sockets()); got != len(ref.bound) {
		t.Fatalf("%d sockets bound, want %d", got, len(ref.bound))
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
		s, err := tbl.Bind(dmxAP(local), v, opts...)
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
			s, err := tbl.Bind(local, v, WithReusePort())
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
						s, err = tbl.Bind(local, v, WithReusePort())
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
			if v, n := tbl.lookup4(&k); v != f.val || n != 1 {
				return fmt.Sprintf("lookup4(%v) = %v, %d", f.pkt, v, n)
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
