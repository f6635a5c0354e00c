package hash4

import (
	"errors"
	"net/netip"
	"testing"

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
