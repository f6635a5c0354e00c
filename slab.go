package hash4

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
)

// This file holds the node store: nodes addressed by 32-bit index, recycled
// without allocation and without waiting for readers, like a kernel cache
// created with SLAB_TYPESAFE_BY_RCU. A node keeps its type and its place for
// the life of the store, so a reader holding a stale index reads a node of
// the right type; whether it is still the one it wanted is the reader's
// question (nulls.go, and entry's sequence protocol).
//
// Nodes live in chunks that never move, listed in a directory that is
// copied when it grows and loaded atomically by readers. Chunks a
// compaction emptied leave the directory (beginCompaction). Free indexes
// are kept in caches, each used by one owner at a time (a Table's
// per-processor shards, a socket table's stripes), backed by a depot under
// the store's mutex, taken only when a cache runs empty or overfull.

const (
	// slabChunkShift sets the largest chunk, and a store's chunk when
	// none is set: 1024 nodes.
	slabChunkShift = 10
	// slabMinChunkShift sets the smallest chunk: 64 nodes.
	slabMinChunkShift = 6
	// slabBatch is how many indexes a cache takes from the depot at once.
	slabBatch = 16
	// slabCacheMax is the most free indexes a socket table's stripe
	// keeps; a put past it gives half back to the depot.
	slabCacheMax = 4 * slabBatch
	// slabDirMinChunks is the fewest chunk headers a directory has room
	// for (see grow).
	slabDirMinChunks = 16
	// slabMaxNodes bounds the index space: indexes are link indexes.
	slabMaxNodes = maxNullsValue
)

// slab is a store of nodes of type N. The zero value is empty and ready.
type slab[N any] struct {
	dir atomic.Pointer[slabDir[N]]

	// chunkShift is log2 of the nodes in a chunk, slabChunkShift if zero;
	// set before the store is shared (see setChunk).
	chunkShift uint32
	mu         sync.Mutex // guards what follows, and changes of dir
	carved     uint32     // next index to hand out for the first time; index 0 is never used
	depot      []uint32   // free indexes not held by any cache
	// retired counts the nodes of released chunks (see endCompaction).
	retired uint32
	// released is the chunk that stands in the directory for every
	// released one, made at the first release (see releasing).
	released []N
	// kinds records what each chunk of the directory holds (slabKind).
	kinds []slabKind
	// victims, while a compaction runs, marks the chunks it empties:
	// put drops their nodes (see beginCompaction). Read by put without
	// mu.
	victims atomic.Pointer[slabVictims]

	hooks *testHooks // nil but in tests: see nodeLimit
}

// maxNodes returns the end of the index space.
func (s *slab[N]) maxNodes() uint32 {
	if s.hooks != nil && s.hooks.nodeLimit != 0 {
		return s.hooks.nodeLimit
	}
	return slabMaxNodes
}

// slabKind is what a chunk of the directory holds.
type slabKind uint8

const (
	slabCarved   slabKind = iota // nodes handed out by get
	slabReleased                 // the released chunk, in place of a carved one
)

// slabDir is a directory of chunks: node i is chunk (i-1)>>shift, at
// (i-1)&(1<<shift-1); index 0 is never a node (the zero link is invalid),
// and takes no room.
//
// N.B. every chain walk reads the directory, and the slice of chunk headers
// it points to, so both fill whole cache lines of their own
// (TestSlabDirLines): a small object another core writes, placed beside
// them by the heap, would cost each such read a miss.
type slabDir[N any] struct {
	chunks [][]N
	shift  uint32
	_      [cacheLineSize - 3*ptrSize - 4]byte
}

// setChunk sets the nodes in a chunk: n rounded up to a power of two,
// from 64 to 1024 (a table's: a 64th of its buckets, so that the part of a
// chunk not in use yet is a small part of the table). It must be called
// before the store is shared and before any other method.
func (s *slab[N]) setChunk(n int) {
	s.chunkShift = uint32(min(max(bits.Len(uint(max(n, 1)-1)), slabMinChunkShift), slabChunkShift))
}

// shift returns log2 of the nodes in a chunk.
func (s *slab[N]) shift() uint32 {
	if s.chunkShift == 0 {
		return slabChunkShift
	}
	return s.chunkShift
}

// slabCache is a cache of free indexes. Its owner serializes its use.
type slabCache struct {
	free []uint32
}

// at returns node i. Any index ever handed out by get is valid for the
// life of the store: once released, it is a node of the released chunk
// (see releasing).
func (s *slab[N]) at(i uint32) *N {
	d := s.dir.Load()
	return &d.chunks[(i-1)>>(d.shift&31)][(i-1)&(1<<(d.shift&31)-1)]
}

// slabView is a reader's cached copy of the directory: a walk loads the
// directory once and again only for an index past its end (a node carved
// after the walk began), which saves a load per hop.
type slabView[N any] struct {
	s      *slab[N]
	chunks [][]N
	shift  uint32
}

// view returns a view of s for one walk.
func (s *slab[N]) view() slabView[N] {
	return slabView[N]{s: s}
}

// at returns node i, as slab.at. N.B. a view that has loaded no directory
// yet has no chunks, so its first call loads one, and the shift with it.
func (v *slabView[N]) at(i uint32) *N {
	// The shifts are masked to 31 so that the compiler, which cannot
	// know that shift is below 32, adds no test for it.
	j := i - 1
	if int(j>>(v.shift&31)) >= len(v.chunks) {
		d := v.s.dir.Load()
		v.chunks, v.shift = d.chunks, d.shift
	}
	return &v.chunks[j>>(v.shift&31)][j&(1<<(v.shift&31)-1)]
}

// get returns the index of a free node, taking it from c when it can. A node
// that was used before keeps what its last user left in it. It reports false
// when the index space is exhausted.
func (s *slab[N]) get(c *slabCache) (uint32, bool) {
	if len(c.free) == 0 && !s.refill(c) {
		return 0, false
	}
	return c.pop(), true
}

func (c *slabCache) pop() uint32 {
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	return i
}

// put returns node i to c; when c holds limit indexes or more, it keeps
// limit/2 and gives the rest back to the depot, so that nodes freed by one
// cache's owner serve the others.
func (s *slab[N]) put(c *slabCache, i uint32, limit int) {
	if v := s.victims.Load(); v != nil && v.has(i) {
		return // see beginCompaction
	}
	c.free = append(c.free, i)
	if len(c.free) >= limit {
		keep := limit / 2
		s.mu.Lock()
		s.depot = append(s.depot, c.free[keep:]...)
		s.mu.Unlock()
		c.free = c.free[:keep]
	}
}

// refill moves up to a batch of indexes into c, from the depot or else from
// fresh nodes, growing the store by a chunk when needed.
func (s *slab[N]) refill(c *slabCache) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := min(len(s.depot), slabBatch); n > 0 {
		c.free = append(c.free, s.depot[len(s.depot)-n:]...)
		s.depot = s.depot[:len(s.depot)-n]
		return true
	}
	if s.carved == 0 {
		s.carved = 1 // index 0 is never a node
	}
	for range slabBatch {
		if s.carved >= s.maxNodes() {
			break
		}
		i := s.carved
		if (i-1)>>s.shift() >= uint32(s.chunks()) {
			s.grow()
		}
		s.carved++
		c.free = append(c.free, i)
	}
	return len(c.free) > 0
}

// chunks returns the number of chunks in the directory.
func (s *slab[N]) chunks() int {
	if d := s.dir.Load(); d != nil {
		return len(d.chunks)
	}
	return 0
}

// grow adds a chunk. s.mu is held. N.B. readers never index past the length
// of the directory they loaded, so append may write the new slot in place
// (a slot no reader reads yet); the longer directory is then published whole
// with one atomic store, and every index handed out before stays valid in it.
func (s *slab[N]) grow() {
	d := s.nextDir()
	d.chunks = appendChunk(d.chunks, make([]N, 1<<d.shift))
	s.kinds = append(s.kinds, slabCarved)
	s.dir.Store(d)
}

// nextDir returns a new directory with the chunks of the current one, for
// the caller to append to and publish. s.mu is held.
func (s *slab[N]) nextDir() *slabDir[N] {
	d := &slabDir[N]{shift: s.shift()}
	if old := s.dir.Load(); old != nil {
		d.chunks = old.chunks
	}
	return d
}

// appendChunk appends chunk to a directory's chunk headers. N.B. it may
// write past the end of a slice that readers hold (see grow); it grows the
// headers to room for 16, then by doublings: a multiple of 192 bytes, in a
// size class whose slots start on a cache line and fill whole lines (see
// slabDir).
func appendChunk[N any](chunks [][]N, chunk []N) [][]N {
	if len(chunks) == cap(chunks) {
		grown := make([][]N, len(chunks), max(slabDirMinChunks, 2*cap(chunks)))
		copy(grown, chunks)
		chunks = grown
	}
	return append(chunks, chunk)
}

// releasing returns a copy of the directory for the caller to release
// chunks in (releaseChunk) and publish, and makes the released chunk, with
// marker, if there is none yet. s.mu is held.
func (s *slab[N]) releasing(marker func(*N)) *slabDir[N] {
	if s.released == nil {
		s.released = make([]N, 1<<s.shift())
		for i := range s.released {
			marker(&s.released[i])
		}
	}
	old := s.dir.Load()
	// A new array of chunk headers, since readers hold the old one; of
	// the old one's capacity, for the size class appendChunk keeps.
	d := &slabDir[N]{shift: old.shift, chunks: make([][]N, len(old.chunks), cap(old.chunks))}
	copy(d.chunks, old.chunks)
	return d
}

// releaseChunk puts the released chunk in place of chunk c in d. s.mu is
// held.
func (s *slab[N]) releaseChunk(d *slabDir[N], c uint32) {
	d.chunks[c] = s.released[:len(d.chunks[c])]
	s.kinds[c] = slabReleased
}

// slabVictims marks the chunks a compaction empties (see beginCompaction).
type slabVictims struct {
	shift  uint32
	chunks []uint32 // the victims' chunk numbers, in order
	marked []bool   // by chunk number
	stuck  []bool   // by chunk number: a node could not be moved out
}

// has reports whether node i is in a victim chunk.
func (v *slabVictims) has(i uint32) bool {
	c := (i - 1) >> (v.shift & 31)
	return c < uint32(len(v.marked)) && v.marked[c]
}

// nodes returns the indexes of victim chunk c's nodes.
func (v *slabVictims) nodes(c uint32) (first, end uint32) {
	return c<<v.shift + 1, (c+1)<<v.shift + 1
}

// beginCompaction marks the chunks to give back to the heap, keeping at
// least keep free nodes in the others: from then on put drops their nodes,
// and none is in caches (all the store's) or the depot; nil if none is
// worth it. The caller holds every cache owner's lock. Each victim costs a
// chunk's worth of free nodes, so the victims are the freest chunks, at
// least half free (emptying fuller ones is not worth the writes), as many
// as the free nodes beyond keep pay for.
func (s *slab[N]) beginCompaction(caches []*slabCache, keep int) *slabVictims {
	s.mu.Lock()
	defer s.mu.Unlock()
	shift := s.shift()
	size := 1 << shift
	full := (max(s.carved, 1) - 1) >> shift // chunks below are carved to their end
	freeIn := make([]int, full)
	total := 0
	count := func(free []uint32) {
		for _, i := range free {
			if c := (i - 1) >> shift; c < full {
				freeIn[c]++
			}
			total++
		}
	}
	for _, c := range caches {
		count(c.free)
	}
	count(s.depot)
	var cands []uint32
	for c := range full {
		if s.kinds[c] == slabCarved && freeIn[c] >= size/2 {
			cands = append(cands, c)
		}
	}
	// The freest first; among equals, the chunks carved last.
	slices.SortFunc(cands, func(x, y uint32) int {
		if d := freeIn[y] - freeIn[x]; d != 0 {
			return d
		}
		return int(y) - int(x)
	})
	cands = cands[:min(len(cands), max(total-keep, 0)/size)]
	if len(cands) == 0 {
		return nil
	}
	slices.Sort(cands)
	v := &slabVictims{shift: shift, chunks: cands, marked: make([]bool, full), stuck: make([]bool, full)}
	for _, c := range cands {
		v.marked[c] = true
	}
	s.victims.Store(v)
	drop := func(free []uint32) []uint32 {
		return slices.DeleteFunc(free, v.has)
	}
	for _, c := range caches {
		c.free = drop(c.free)
	}
	s.depot = drop(s.depot)
	return v
}

// endCompaction releases each victim chunk of v but those marked stuck,
// whose free nodes (free reports which) go to the depot, and ends put's
// drops. The caller holds every cache owner's lock and has moved what it
// could out of the victims: none but stuck chunks' nodes is live or held.
func (s *slab[N]) endCompaction(v *slabVictims, free func(*N) bool, marker func(*N)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.releasing(marker)
	for _, c := range v.chunks {
		if v.stuck[c] {
			first, end := v.nodes(c)
			for i := first; i < end; i++ {
				if free(&d.chunks[c][i-first]) {
					s.depot = append(s.depot, i)
				}
			}
			continue
		}
		s.releaseChunk(d, c)
		s.retired += uint32(len(d.chunks[c]))
	}
	s.dir.Store(d)
	s.victims.Store(nil)
}

// stats returns the nodes carved (handed out at least once, and not
// released) and the free ones held by the depot.
func (s *slab[N]) stats() (carved, depot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(max(s.carved, 1) - 1 - s.retired), len(s.depot)
}
