package hash4

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTableCompactNodes lays out a table's node store in six chunks of 64
// nodes: chunk 0 full, chunks 1 to 5 with 40 free nodes each and 24
// entries. Compaction empties the freest chunks that the free nodes beyond
// the two chunks' worth it keeps pay for: one, chunk 5 (of equals, the
// chunk carved last), whose entries move out and whose memory is released.
// Every entry is found after, every node is accounted for, and the table
// goes on.
func TestTableCompactNodes(t *testing.T) {
	tab := New[int](WithCapacity(16), WithFixedBuckets(), WithSecret(tblSecret), WithHasher(LinuxHasher))
	tab.shards = tab.shards[:1] // one cache: nodes carved in order, a batch at a time
	const chunk = 64
	require.EqualValues(t, 6, tab.nodes.shift())
	index := map[uint32]Tuple{}
	want := map[Tuple]*int{}
	for i := 0; len(want) < 6*chunk+16; i++ {
		k := tblKey(i, i%2 == 1)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	st := tab.Stats()
	require.Equal(t, 16, st.Buckets)
	require.Equal(t, 16, st.InLine, "every bucket holds one in line")
	require.Equal(t, 6*chunk, st.Nodes)
	for k := range want {
		var kk key
		tab.tupleKey(&kk, &k)
		_, b := tab.lockBucket(kk.hash())
		_, _, i := tab.findLocked(b, &kk)
		b.unlock()
		if i != 0 {
			index[i] = k
		}
	}
	require.Len(t, index, 6*chunk)
	for i, k := range index {
		// N.B. entries in nodes only: deleting one in line would move its
		// chain's first into the line and free that node instead.
		if c, at := (i-1)/chunk, (i-1)%chunk; c >= 1 && at < 40 {
			_, ok := tab.Delete(k)
			require.True(t, ok)
			delete(want, k)
		}
	}
	moved, released := tab.compact()
	require.Equal(t, 24, moved)
	require.Equal(t, 1, released)
	for i := uint32(5*chunk + 1); i <= 6*chunk; i++ {
		require.Equal(t, nullsLink(releasedNullsValue), tab.nodes.at(i).next.load(), "node %d of chunk 5 not released", i)
	}
	for i := uint32(1); i <= 5*chunk; i++ {
		require.NotEqual(t, nullsLink(releasedNullsValue), tab.nodes.at(i).next.load(), "node %d released", i)
	}
	for k, v := range want {
		got, ok := tab.Lookup(k)
		require.True(t, ok, "%v", k)
		require.Same(t, v, got)
	}
	compactCheckNodes(t, tab, "after compaction")
	tblCheckBuckets(t, tab, "after compaction")
	for i := range 200 {
		k := tblKey(1000+i, false)
		want[k] = valPtr(i)
		require.NoError(t, tab.Insert(k, want[k]))
	}
	compactCheckNodes(t, tab, "after more inserts")
	require.Equal(t, map[Tuple]*int(nil), nilIfEqual(want, tblCollect(t, tab)))
}

// nilIfEqual returns nil if got holds what want does, else got.
func nilIfEqual(want, got map[Tuple]*int) map[Tuple]*int {
	if len(want) != len(got) {
		return got
	}
	for k, v := range want {
		if got[tblCanon(k)] != v {
			return got
		}
	}
	return nil
}

// compactCheckNodes checks that every node of tab's store is accounted for
// once, in a chain, a shard's cache or the depot, while no writer runs.
func compactCheckNodes[T any](t *testing.T, tab *Table[T], msg string) {
	t.Helper()
	a := tab.cur()
	seen := map[uint32]bool{}
	see := func(i uint32) {
		require.False(t, seen[i], "%s: node %d twice", msg, i)
		seen[i] = true
	}
	for b := range a.lines {
		for l := a.lines[b].next.load(); !l.isNulls(); l = tab.nodes.at(l.index()).next.load() {
			see(l.index())
			require.True(t, tab.nodes.at(l.index()).live(), "%s: linked node %d free", msg, l.index())
		}
	}
	for s := range tab.shards {
		for _, i := range tab.shards[s].cache.free {
			see(i)
		}
	}
	for _, i := range tab.nodes.depot {
		see(i)
	}
	nodes, _ := tab.nodes.stats()
	require.Len(t, seen, nodes, "%s: nodes accounted for", msg)
}
