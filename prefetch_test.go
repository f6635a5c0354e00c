package hash4

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTouchForWriteIsAHint checks that touchForWrite changes no memory, on
// the fields Table.touch passes it: the chain heads and home slots of a
// table in use; and that it allocates nothing. (It cannot tell a prefetch
// for writing from any other hint: what that buys is measured, in
// BenchmarkChurn.)
func TestTouchForWriteIsAHint(t *testing.T) {
	tab := New[int](WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret))
	for i := range 40 {
		require.NoError(t, tab.Insert(tblKey(i, i%2 == 1), new(i)))
	}
	before := tblCollect(t, tab)
	heads := make([]link, len(tab.b.heads))
	homes := make([]key, len(tab.b.heads))
	for b := range uint32(len(tab.b.heads)) {
		heads[b] = tab.b.heads[b].load()
		homes[b] = tab.homeAt(b).key.load()
	}
	allocs := testing.AllocsPerRun(100, func() {
		for b := range uint32(len(tab.b.heads)) {
			e := tab.homeAt(b)
			touchForWrite(&tab.b.heads[b], &e.seq, &e.val.v)
		}
	})
	require.Zero(t, allocs)
	for b := range uint32(len(tab.b.heads)) {
		require.Equal(t, heads[b], tab.b.heads[b].load())
		require.Equal(t, homes[b], tab.homeAt(b).key.load())
	}
	require.Equal(t, before, tblCollect(t, tab))
}
