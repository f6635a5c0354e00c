package hash4

import (
	"testing"
	"unsafe"

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
	s.setChunk(1)
	s.reserve(8)
	s.setBatch(4)
	var c slabCache
	i, ok := s.get(&c)
	require.True(t, ok)
	require.EqualValues(t, 68, i, "the last of the batch carved at the chunk after the reserved nodes, 65 to 68")
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

// TestSlabChunks checks the directory's geometry: reserve allocates exactly
// n nodes, indexes 1 to n, cut into chunks whose last may be short; nodes
// carved later begin at the next chunk, whole chunks of the size setChunk
// gave; at and a view's at reach the same node for every index handed out,
// across growth; and stats counts nodes, not the indexes of the gap.
func TestSlabChunks(t *testing.T) {
	for _, c := range []struct{ set, shift int }{
		{0, 6}, {1, 6}, {64, 6}, {65, 7}, {1000, 10}, {1 << 20, 10},
	} {
		var s slab[int]
		s.setChunk(c.set)
		require.EqualValues(t, c.shift, s.shift(), "setChunk(%d)", c.set)
	}
	var unset slab[int]
	require.EqualValues(t, slabChunkShift, unset.shift(), "the zero store")

	var s slab[uint32]
	s.setChunk(64)
	s.setBatch(16)
	const n = 100 // a chunk of 64 and one of 36
	s.reserve(n)
	require.Len(t, s.reserved, n)
	d := s.dir.Load()
	require.Len(t, d.chunks, 2)
	require.Len(t, d.chunks[0], 64)
	require.Len(t, d.chunks[1], 36)
	for i := uint32(1); i <= n; i++ {
		require.Same(t, &s.reserved[i-1], s.at(i), "reserved node %d", i)
		*s.at(i) = i
	}
	carved, _ := s.stats()
	require.Equal(t, n, carved)

	// A view that loaded the directory before it grew loads it again for
	// an index past its end.
	early := s.view()
	require.Equal(t, uint32(1), *early.at(1))

	var cache slabCache
	var got []uint32
	for range 200 {
		i, ok := s.get(&cache)
		require.True(t, ok)
		require.Greater(t, i, uint32(128), "carved nodes begin at the chunk after the reserved ones")
		*s.at(i) = i
		got = append(got, i)
	}
	carved, _ = s.stats()
	require.Equal(t, n+len(got)+len(cache.free), carved, "the gap, 101 to 128, is not counted")
	d = s.dir.Load()
	for _, ch := range d.chunks[2:] {
		require.Len(t, ch, 64, "carved chunks are whole")
	}
	v := s.view()
	for i := uint32(1); i <= n; i++ {
		require.Same(t, s.at(i), v.at(i))
		require.Equal(t, i, *v.at(i))
	}
	for _, i := range got {
		require.Same(t, s.at(i), v.at(i))
		require.Same(t, s.at(i), early.at(i))
		require.Equal(t, i, *v.at(i), "node %d", i)
	}
}

// TestSlabDirLines checks that what every walk past the reserved nodes
// reads fills whole cache lines of its own: the directory, the slice of
// chunk headers it points to, at every size it grows through, and the
// read-mostly fields of a Table and of its bucket array, padded on both sides. The heap's
// placement is checked on 64-bit targets only, the ones whose speed
// counts: on 32-bit ones the runtime puts a header before objects with
// pointers from 128 bytes, and their slots do not always start on a line.
func TestSlabDirLines(t *testing.T) {
	require.Equal(t, uintptr(cacheLineSize), unsafe.Sizeof(slabDir[entry[int]]{}))
	var tab Table[int]
	require.GreaterOrEqual(t, unsafe.Offsetof(tab.arr), uintptr(cacheLineSize))
	require.GreaterOrEqual(t, unsafe.Sizeof(tab)-unsafe.Offsetof(tab.visit)-unsafe.Sizeof(tab.visit), uintptr(cacheLineSize))
	var a tableArray[int]
	require.GreaterOrEqual(t, unsafe.Offsetof(a.b), uintptr(cacheLineSize))
	require.GreaterOrEqual(t, unsafe.Sizeof(a)-unsafe.Offsetof(a.homes)-unsafe.Sizeof(a.homes), uintptr(cacheLineSize))
	if ptrSize != 8 {
		return
	}
	var s slab[entry[int]]
	s.setChunk(1) // the smallest chunks, so that the directory grows often
	s.reserve(8)
	for range 100 {
		s.grow()
		d := s.dir.Load()
		require.Zero(t, uintptr(unsafe.Pointer(d))%cacheLineSize, "directory at %p", d)
		hdrs := d.chunks[:cap(d.chunks)]
		size := uintptr(cap(hdrs)) * unsafe.Sizeof(hdrs[0])
		require.Zero(t, size%cacheLineSize, "room for %d chunk headers", cap(hdrs))
		// Past 512 bytes, the runtime puts an 8-byte type header before an
		// object that holds pointers, in the object's own slot, which
		// starts on a line.
		at := uintptr(unsafe.Pointer(&hdrs[0])) % cacheLineSize
		if size > 512 && at == 8 {
			at = 0
		}
		require.Zero(t, at, "%d chunk headers at %p", cap(hdrs), &hdrs[0])
	}
}
