package hash4

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTableCompactNodes lays out a TCPTable's node store in six chunks of 64
// nodes beyond the home slots: chunks 1 to 5 hold 40 free nodes each and 24
// entries, chunk 6 only a listener, which shares the established table's
// store, and a node freed by another listener, in a listener stripe's
// cache. Compaction empties the two freest chunks that the free nodes pay
// for, 6 and then 5: chunk 5's entries move out and it is released, while
// chunk 6, whose listener is no entry of the established chains, stays,
// its free nodes in the depot (and in no cache). Every entry and the
// listener are found after, every node is accounted for, and both tables
// go on.
func TestTableCompactNodes(t *testing.T) {
	tcp := NewTCPTable[int](WithCapacity(16), WithLockStripes(1), WithFixedBuckets(), WithSecret(tblSecret), WithHasher(LinuxHasher))
	est := tcp.Established()
	const chunk = 64
	index := map[uint32]Tuple{}
	want := map[Tuple]*int{}
	for i := range 16 + 6*chunk - 2 {
		k := tblKey(i, i%2 == 1)
		want[k] = valPtr(i)
		require.NoError(t, est.Insert(k, want[k]))
	}
	lv := valPtr(-1)
	listener := netip.MustParseAddrPort("10.9.9.9:80")
	unlisten, err := tcp.Listen(listener, lv)
	require.NoError(t, err)
	li := tcp.lb.heads[tcp.lb.bucket(uint32(tcp.listenerKey(listener.Addr(), 80, 0).meta>>32))].load().index()
	require.EqualValues(t, 7*chunk-1, li, "the listener's node")
	other, err := tcp.Listen(netip.MustParseAddrPort("10.9.9.9:81"), lv)
	require.NoError(t, err)
	other()
	require.Equal(t, []uint32{7 * chunk}, tcp.lb.stripes[0].cache.free, "the other listener's node, cached")

	a := est.cur()
	for k := range want {
		var kk key
		est.tupleKey(&kk, &k)
		_, l := est.findLocked(a, &kk)
		index[l.index()] = k
	}
	chunkOf := func(i uint32) uint32 { return (i - 1) / chunk }
	for i, k := range index {
		if c, at := chunkOf(i), (i-1)%chunk; c == 6 || c >= 1 && at < 40 {
			_, ok := est.Delete(k)
			require.True(t, ok)
			delete(want, k)
		}
	}

	est.growMu.Lock()
	est.compactNodes(a)
	est.growMu.Unlock()

	for i := uint32(5*chunk + 1); i <= 6*chunk; i++ {
		require.Equal(t, nullsLink(releasedNullsValue), est.nodes.at(i).next.load(), "node %d of chunk 5 not released", i)
	}
	for i := uint32(6*chunk + 1); i <= 7*chunk; i++ {
		if i != li {
			require.Contains(t, est.nodes.depot, i, "free node %d of chunk 6, which the listener keeps", i)
		}
	}
	require.EqualValues(t, 1, est.nodes.at(li).seq.Load()&1, "the listener's node")
	for c := uint32(1); c <= 4; c++ {
		for i := c*chunk + 1; i <= (c+1)*chunk; i++ {
			require.NotEqual(t, nullsLink(releasedNullsValue), est.nodes.at(i).next.load(), "node %d of chunk %d released", i, c)
		}
	}
	remote := netip.MustParseAddrPort("10.1.1.1:40000")
	got, ok := tcp.Lookup(Tuple{Local: listener, Remote: remote})
	require.True(t, ok)
	require.Same(t, lv, got)
	for k, v := range want {
		got, ok := est.Lookup(k)
		require.True(t, ok, "%v", k)
		require.Same(t, v, got)
	}
	compactCheckNodes(t, tcp, "after compaction")

	unlisten()
	_, ok = tcp.Lookup(Tuple{Local: listener, Remote: remote})
	require.False(t, ok)
	for i := range 200 {
		k := tblKey(1000+i, false)
		want[k] = valPtr(i)
		require.NoError(t, est.Insert(k, want[k]))
	}
	_, err = tcp.Listen(listener, lv)
	require.NoError(t, err)
	compactCheckNodes(t, tcp, "after more inserts")
}

// compactCheckNodes checks, as growCheckNodes does, that every node of a
// TCPTable's store is accounted for once, its listener nodes and the
// caches of its listener stripes too.
func compactCheckNodes[T any](t *testing.T, tcp *TCPTable[T], msg string) {
	t.Helper()
	est := tcp.Established()
	a := est.cur()
	seen := map[uint32]bool{}
	see := func(i uint32) {
		require.False(t, seen[i], "%s: node %d twice", msg, i)
		seen[i] = true
	}
	for _, heads := range [][]linkField{a.b.heads, tcp.lb.heads} {
		for b := range heads {
			for l := heads[b].load(); !l.isNulls(); l = est.nodes.at(l.index()).next.load() {
				see(l.index())
				require.EqualValues(t, 1, est.nodes.at(l.index()).seq.Load()&1, "%s: linked node %d free", msg, l.index())
			}
		}
	}
	for b := range uint32(len(a.b.heads)) {
		if w, m := a.home.bit(&a.b.stripes[b&a.b.stripeMask], b); *w&m != 0 {
			see(a.home.slot(b))
		}
	}
	for _, ss := range [][]stripe{a.b.stripes, tcp.lb.stripes} {
		for s := range ss {
			for _, i := range ss[s].cache.free {
				see(i)
			}
		}
	}
	for _, i := range est.nodes.depot {
		see(i)
	}
	nodes, _ := est.nodes.stats()
	require.Len(t, seen, nodes, "%s: nodes accounted for", msg)
}
