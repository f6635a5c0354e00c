package hash4

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMetrics(t *testing.T) {
	tab := New[int](WithCapacity(16), WithSecret(connSecret))
	require.Equal(t, Metrics{Buckets: 16}, tab.Metrics())
	a := newTestAllocator(t)
	narrow := WithConnectRange(PortRange{40000, 40003})
	tried := func(f func()) uint64 {
		before := tab.Metrics().ConnectCandidates
		f()
		return tab.Metrics().ConnectCandidates - before
	}
	for range 4 {
		require.Positive(t, tried(func() {
			_, err := tab.Connect(a, connLocal, connDsts[0], valPtr(1), narrow)
			require.NoError(t, err)
		}))
	}
	require.Equal(t, uint64(4), tried(func() {
		_, err := tab.Connect(a, connLocal, connDsts[0], valPtr(1), narrow)
		require.ErrorIs(t, err, ErrNoPorts)
	}), "every port of the range, once")
	refusedOnce := false
	require.Equal(t, uint64(2), tried(func() {
		_, _, err := tab.ConnectFunc(a, connLocal, connDsts[1], func(Tuple) (*int, error) {
			if !refusedOnce {
				refusedOnce = true
				return nil, ErrPortRefused
			}
			return valPtr(2), nil
		})
		require.NoError(t, err)
	}))
	_, err := tab.Connect(a, connLocal, netip.AddrPortFrom(connDsts[0].Addr(), 0), valPtr(1))
	require.ErrorIs(t, err, ErrInvalidTuple, "not counted")

	m := tab.Metrics()
	require.Equal(t, 5, m.Entries)
	require.Equal(t, uint64(6), m.Connects)
	require.Equal(t, uint64(1), m.ConnectRefused)
	require.Equal(t, uint64(1), m.ConnectNoPorts)
	require.Zero(t, m.Growths)
	require.NoError(t, tab.Grow(100))
	require.NoError(t, tab.Grow(100)) // no growth: the table has the buckets
	require.Equal(t, 128, tab.Metrics().Buckets)
	require.Equal(t, uint64(1), tab.Metrics().Growths)
	require.Equal(t, tab.Stats().LookupRestarts, tab.Metrics().LookupRestarts)
}

func TestTCPLookupKind(t *testing.T) {
	tbl := NewTCPTable[string]()
	flow := tblTuple("10.0.0.1:80", "10.0.0.2:5000")
	release, err := tbl.Listen(netip.MustParseAddrPort("0.0.0.0:80"), valPtr("listener"))
	require.NoError(t, err)
	v, kind, ok := tbl.LookupKind(flow)
	require.True(t, ok)
	require.Equal(t, KindListener, kind)
	require.Equal(t, "listener", *v)
	require.NoError(t, tbl.Established().Insert(flow, valPtr("flow")))
	v, kind, ok = tbl.LookupKind(flow)
	require.True(t, ok)
	require.Equal(t, KindEstablished, kind)
	require.Equal(t, "flow", *v)
	w, ok := tbl.Lookup(flow)
	require.True(t, ok)
	require.Same(t, v, w, "as Lookup")
	tbl.Established().Delete(flow)
	release()
	v, kind, ok = tbl.LookupKind(flow)
	require.False(t, ok)
	require.Equal(t, KindNone, kind)
	require.Nil(t, v)
}

func TestUDPSocketValue(t *testing.T) {
	tbl := NewUDPTable[string]()
	v := valPtr("dns")
	s, err := tbl.Bind(netip.MustParseAddrPort("10.0.0.1:53"), v)
	require.NoError(t, err)
	require.Same(t, v, s.Value())
	require.NoError(t, s.Close())
	require.Same(t, v, s.Value(), "a closed socket keeps its value")
	var none *UDPSocket[string]
	require.Nil(t, none.Value())
}
