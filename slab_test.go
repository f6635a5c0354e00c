package hash4

import (
	"slices"
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
	first, reserved, ok := s.reserve(n)
	require.True(t, ok)
	require.EqualValues(t, 1, first, "an empty store's reserve begins at index 1")
	require.Len(t, reserved, n)
	d := s.dir.Load()
	require.Len(t, d.chunks, 2)
	require.Len(t, d.chunks[0], 64)
	require.Len(t, d.chunks[1], 36)
	for i := uint32(1); i <= n; i++ {
		require.Same(t, &reserved[i-1], s.at(i), "reserved node %d", i)
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

// TestSlabDirLines checks that what every chain walk reads fills whole
// cache lines of its own: the directory, the slice of chunk headers it
// points to, at every size it grows through and after a release, which
// copies the headers, and the read-mostly fields of a Table and of its
// bucket array, padded on both sides. The heap's placement is checked on
// 64-bit targets only, the ones whose speed counts: on 32-bit ones the
// runtime puts a header before objects with pointers from 128 bytes, and
// their slots do not always start on a line.
func TestSlabDirLines(t *testing.T) {
	require.Equal(t, uintptr(cacheLineSize), unsafe.Sizeof(slabDir[entry[int]]{}))
	var tab Table[int]
	require.GreaterOrEqual(t, unsafe.Offsetof(tab.arr), uintptr(cacheLineSize))
	require.GreaterOrEqual(t, unsafe.Sizeof(tab)-unsafe.Offsetof(tab.hooks)-unsafe.Sizeof(tab.hooks), uintptr(cacheLineSize))
	var a tableArray[int]
	require.GreaterOrEqual(t, unsafe.Offsetof(a.b), uintptr(cacheLineSize))
	require.GreaterOrEqual(t, unsafe.Sizeof(a)-unsafe.Offsetof(a.homes)-unsafe.Sizeof(a.homes), uintptr(cacheLineSize))
	if ptrSize != 8 {
		return
	}
	var s slab[entry[int]]
	s.setChunk(1) // the smallest chunks, so that the directory grows often
	first, _, _ := s.reserve(8)
	for i := range 100 {
		s.grow()
		if i == 50 { // a release copies the headers
			s.release(first, 8, func(*entry[int]) {})
		}
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

// TestSlabRelease checks release: the released range's chunks, a whole one
// and a short one, give way in the directory to the released chunk, whose
// nodes the marker function set, while other nodes stay where they were; a
// view loaded before the release still reads the range's old nodes; stats
// no longer counts the range; and the store goes on carving past it.
func TestSlabRelease(t *testing.T) {
	var s slab[[2]uint32] // [0]: what the test wrote, [1]: the marker
	s.setChunk(64)
	s.setBatch(16)
	first, nodes, ok := s.reserve(100) // indexes 1 to 100: a chunk of 64 and one of 36
	require.True(t, ok)
	var cache slabCache
	var got []uint32
	for range 40 {
		i, ok := s.get(&cache)
		require.True(t, ok)
		s.at(i)[0] = i
		got = append(got, i)
	}
	second, more, ok := s.reserve(70) // a chunk of 64 and one of 6
	require.True(t, ok)
	for i := range nodes {
		nodes[i][0] = first + uint32(i)
	}
	for i := range more {
		more[i][0] = second + uint32(i)
	}
	before, _ := s.stats()
	early := s.view()
	early.at(1)

	s.release(first, uint32(len(nodes)), func(n *[2]uint32) { n[1] = 7 })
	after, _ := s.stats()
	require.Equal(t, before-len(nodes), after, "released nodes are not counted")
	for i := first; i < first+uint32(len(nodes)); i++ {
		require.Equal(t, [2]uint32{0, 7}, *s.at(i), "released node %d", i)
		require.Equal(t, i, early.at(i)[0], "node %d through a view loaded before", i)
	}
	for _, i := range got {
		require.Equal(t, i, s.at(i)[0], "carved node %d", i)
	}
	for i := second; i < second+uint32(len(more)); i++ {
		require.Equal(t, i, s.at(i)[0], "reserved node %d, not released", i)
	}

	// The released chunk serves a second release; carving goes on past
	// both ranges.
	s.release(second, uint32(len(more)), func(n *[2]uint32) { n[1] = 9 })
	require.Equal(t, [2]uint32{0, 7}, *s.at(second + 69), "the one released chunk, made once")
	for range 100 {
		i, ok := s.get(&cache)
		require.True(t, ok)
		require.False(t, i >= first && i < first+128 || i >= second && i < second+128, "index %d of a released range handed out", i)
		s.at(i)[0] = i
		require.Equal(t, i, s.at(i)[0])
	}
}

// TestSlabCompaction checks beginCompaction and endCompaction on a store of
// five chunks of 64 carved nodes: the victims are the chunks at least half
// free, the freest first, as many as the free nodes beyond keep pay for;
// their nodes leave the caches and the depot, and put drops them while the
// compaction runs; a victim marked stuck gives its free nodes to the depot
// and stays, the others are released, and stats no longer counts them.
func TestSlabCompaction(t *testing.T) {
	var s slab[[2]uint32] // [0]: 1 while live, [1]: the marker
	s.setChunk(64)
	s.setBatch(16)
	var carver slabCache
	var all []uint32
	for range 5*64 + 1 { // the last in a sixth chunk, carved in part
		i, ok := s.get(&carver)
		require.True(t, ok)
		all = append(all, i)
	}
	// Free: chunk 0, 10 nodes; 1, 60; 2, 40; 3, 63; 4, 32; the rest live.
	freeIn := []int{10, 60, 40, 63, 32}
	var caches [2]slabCache
	for c, n := range freeIn {
		for j, i := range all[c*64 : c*64+64] {
			if j < n {
				s.put(&caches[j%2], i, 1<<20) // the caches, and the depot
				if j%5 == 0 {
					s.depot = append(s.depot, caches[j%2].pop())
				}
			} else {
				s.at(i)[0] = 1
			}
		}
	}
	for _, i := range carver.free {
		s.at(i)[0] = 1 // carved, not freed: held, as by a writer
	}
	before, _ := s.stats()

	// 205 free; keep 100: a chunk of 64 each, for 1 victim... keep 60
	// pays for 2: chunks 3 and 1, the freest; 2 and 4 are not chosen.
	v := s.beginCompaction([]*slabCache{&caches[0], &caches[1]}, 205-2*64)
	require.NotNil(t, v)
	require.Equal(t, []uint32{1, 3}, v.chunks)
	for _, c := range caches {
		for _, i := range c.free {
			require.False(t, v.has(i), "victim node %d cached", i)
		}
	}
	for _, i := range s.depot {
		require.False(t, v.has(i), "victim node %d in the depot", i)
	}
	// Chunk 1's live nodes move out (the caller's work), chunk 3's one
	// live node cannot: stuck.
	for _, i := range all[64+60 : 128] {
		s.at(i)[0] = 0
		s.put(&caches[0], i, 1<<20)
		require.False(t, slices.Contains(caches[0].free, i), "put kept victim node %d", i)
	}
	v.stuck[3] = true
	s.endCompaction(v, func(n *[2]uint32) bool { return n[0] == 0 }, func(n *[2]uint32) { n[1] = 7 })
	require.Nil(t, s.victims.Load())
	for _, i := range all[64:128] {
		require.Equal(t, [2]uint32{0, 7}, *s.at(i), "node %d of released chunk 1", i)
	}
	for _, i := range all[3*64 : 3*64+63] {
		require.Contains(t, s.depot, i, "free node %d of stuck chunk 3", i)
	}
	require.NotContains(t, s.depot, all[3*64+63], "live node of stuck chunk 3")
	require.Equal(t, uint32(1), s.at(all[3*64+63])[0])
	after, _ := s.stats()
	require.Equal(t, before-64, after, "chunk 1 released")
	s.put(&caches[0], all[64], 1<<20)
	require.Contains(t, caches[0].free, all[64], "put after the compaction keeps nodes")
	caches[0].pop()

	// Too few free nodes beyond keep for a chunk: no compaction.
	require.Nil(t, s.beginCompaction([]*slabCache{&caches[0], &caches[1]}, 1<<20))
	require.Nil(t, s.victims.Load())
}
