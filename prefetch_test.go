package hash4

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestPrefetchw3IsAHint checks that prefetchw3 changes no memory, on the
// fields touch passes it: a chain head and the first and last words of a
// home slot, here of a table in use; and that it allocates nothing.
func TestPrefetchw3IsAHint(t *testing.T) {
	tab := New[int](WithCapacity(16), WithLockStripes(2), WithSecret(tblSecret))
	for i := range 40 {
		require.NoError(t, tab.Insert(tblKey(i, i%2 == 1), new(i)))
	}
	before := tblCollect(t, tab)
	heads := make([]link, len(tab.b.heads))
	for b := range tab.b.heads {
		heads[b] = tab.b.heads[b].load()
	}
	homes := make([]key, len(tab.b.heads))
	for b := range uint32(len(tab.b.heads)) {
		homes[b] = tab.homeAt(b).key.load()
	}
	allocs := testing.AllocsPerRun(100, func() {
		for b := range uint32(len(tab.b.heads)) {
			e := tab.homeAt(b)
			prefetchw3(unsafe.Pointer(&tab.b.heads[b]), unsafe.Pointer(&e.seq), unsafe.Pointer(&e.val))
		}
	})
	require.Zero(t, allocs)
	for b := range uint32(len(tab.b.heads)) {
		require.Equal(t, heads[b], tab.b.heads[b].load())
		require.Equal(t, homes[b], tab.homeAt(b).key.load())
	}
	require.Equal(t, before, tblCollect(t, tab))
}
