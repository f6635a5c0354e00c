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
	var s slab[int]
	s.setChunk(1)
	var c slabCache
	i, ok := s.get(&c)
	require.True(t, ok)
	require.EqualValues(t, slabBatch, i, "the last of the batch carved, 1 to 16")
	require.Len(t, c.free, slabBatch-1, "a batch carved, one handed out")
	carved, depot := s.stats()
	require.Equal(t, slabBatch, carved)
	require.Zero(t, depot)

	// Back up to a limit of 32: the cache keeps 16, the depot takes the rest.
	s.put(&c, i, 32)
	require.Len(t, c.free, slabBatch)
	for j := range uint32(slabBatch) {
		s.put(&c, 100+j, 32)
	}
	require.Len(t, c.free, 16, "32 reached the limit of 32: 16 kept")
	_, depot = s.stats()
	require.Equal(t, 16, depot)

	// A limit of 1 keeps nothing.
	s.put(&c, 200, 1)
	require.Empty(t, c.free)
	_, depot = s.stats()
	require.Equal(t, 33, depot)

	// refill takes a batch from the depot before carving.
	_, ok = s.get(&c)
	require.True(t, ok)
	require.Len(t, c.free, slabBatch-1)
	carved, depot = s.stats()
	require.Equal(t, slabBatch, carved, "nothing carved while the depot had nodes")
	require.Equal(t, 33-slabBatch, depot)
}

// TestSlabChunks checks the directory's geometry: nodes are carved in whole
// chunks of the size setChunk gave, from index 1; at and a view's at reach
// the same node for every index handed out, across growth.
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
	var cache slabCache
	i, ok := s.get(&cache)
	require.True(t, ok)
	*s.at(i) = i
	// A view that loaded the directory before it grew loads it again for
	// an index past its end.
	early := s.view()
	require.Equal(t, i, *early.at(i))
	got := []uint32{i}
	for range 200 {
		i, ok := s.get(&cache)
		require.True(t, ok)
		*s.at(i) = i
		got = append(got, i)
	}
	carved, _ := s.stats()
	require.Equal(t, len(got)+len(cache.free), carved)
	d := s.dir.Load()
	for _, ch := range d.chunks {
		require.Len(t, ch, 64, "carved chunks are whole")
	}
	v := s.view()
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
	require.Equal(t, unsafe.Offsetof(tab.arr)/cacheLineSize, unsafe.Offsetof(tab.hooks)/cacheLineSize, "arr and hooks on one line")
	require.GreaterOrEqual(t, unsafe.Sizeof(tab)-unsafe.Offsetof(tab.watch)-unsafe.Sizeof(tab.watch), uintptr(cacheLineSize))
	var a bucketArray[int]
	require.GreaterOrEqual(t, unsafe.Offsetof(a.lines), uintptr(cacheLineSize))
	require.GreaterOrEqual(t, unsafe.Sizeof(a)-unsafe.Offsetof(a.old)-unsafe.Sizeof(a.old), uintptr(cacheLineSize))
	if ptrSize != 8 {
		return
	}
	var s slab[entry[int]]
	s.setChunk(1) // the smallest chunks, so that the directory grows often
	s.grow()
	for i := range 100 {
		s.grow()
		if i == 50 { // a release copies the headers
			s.mu.Lock()
			d := s.releasing(func(*entry[int]) {})
			s.releaseChunk(d, 0)
			s.dir.Store(d)
			s.mu.Unlock()
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

// TestSlabCompaction checks beginCompaction and endCompaction on a store of
// five chunks of 64 carved nodes: the victims are the chunks at least half
// free, the freest first, as many as the free nodes beyond keep pay for;
// their nodes leave the caches and the depot, and put drops them while the
// compaction runs; a victim marked stuck gives its free nodes to the depot
// and stays, the others are released, and stats no longer counts them.
func TestSlabCompaction(t *testing.T) {
	var s slab[[2]uint32] // [0]: 1 while live, [1]: the marker
	s.setChunk(64)
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
