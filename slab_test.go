package hash4

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSlabBatch checks how a cache moves free indexes to and from the
// depot: refill takes a batch (carved when the depot is empty), and put,
// once the cache holds limit indexes, keeps limit/2 and gives the rest back,
// even at a limit of 1.
func TestSlabBatch(t *testing.T) {
	for _, c := range []struct{ set, want int }{
		{0, 1}, {1, 1}, {4, 4}, {slabBatch, slabBatch}, {1000, slabBatch},
	} {
		var s slab[int]
		s.setBatch(c.set)
		require.Equal(t, c.want, s.batchSize(), "setBatch(%d)", c.set)
		require.Equal(t, 4*c.want, s.cacheMax())
	}
	var unset slab[int]
	require.Equal(t, slabBatch, unset.batchSize(), "the zero store")

	var s slab[int]
	s.reserve(8)
	s.setBatch(4)
	var c slabCache
	i, ok := s.get(&c)
	require.True(t, ok)
	require.EqualValues(t, 12, i, "the last of the batch carved after the reserved nodes, 9 to 12")
	require.Len(t, c.free, 3, "a batch of 4 carved, one handed out")
	carved, depot := s.stats()
	require.Equal(t, 8+4, carved)
	require.Zero(t, depot)

	// Back up to a limit of 8: the cache keeps 4, the depot takes the rest.
	s.put(&c, i, 8)
	require.Len(t, c.free, 4)
	for j := range uint32(4) {
		s.put(&c, 100+j, 8)
	}
	require.Len(t, c.free, 4, "8 reached the limit of 8: 4 kept")
	_, depot = s.stats()
	require.Equal(t, 4, depot)

	// A limit of 1 keeps nothing.
	s.put(&c, 200, 1)
	require.Empty(t, c.free)
	_, depot = s.stats()
	require.Equal(t, 9, depot)

	// refill takes a batch from the depot before carving.
	_, ok = s.get(&c)
	require.True(t, ok)
	require.Len(t, c.free, 3)
	carved, depot = s.stats()
	require.Equal(t, 12, carved, "nothing carved while the depot had nodes")
	require.Equal(t, 5, depot)
}
