package hash4

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// This file holds the node store: nodes addressed by 32-bit index, recycled
// without allocation and without waiting for readers, like a kernel cache
// created with SLAB_TYPESAFE_BY_RCU. A node keeps its type and its place for
// the life of the store, so a lock-free reader holding a stale index always
// reads a node of the right type; whether it is still the node the reader
// wanted is the reader's question to answer (nulls.go, and the sequence
// counter of the node type).
//
// Nodes live in chunks that never move; a directory of chunks is replaced
// (copied) when it grows, and readers load it atomically, so growth never
// blocks them. The chunks hold a power-of-two count of nodes each, set per
// store: a small table grows by small chunks, so that its first node beyond
// the reserved ones does not bring 1024 with it.
//
// Free indexes are kept in per-stripe caches used under the stripe's lock,
// like per-CPU slab caches, backed by a shared depot under the store's mutex
// (taken only when a cache runs empty or overfull), so steady-state churn
// costs no allocation and no shared lock.

const (
	// slabChunkShift sets the largest chunk, and a store's chunk when
	// none is set: 1024 nodes.
	slabChunkShift = 10
	// slabMinChunkShift sets the smallest chunk: 64 nodes.
	slabMinChunkShift = 6
	// slabBatch is the most indexes a cache takes from, or gives back
	// to, the depot at once (see slab.setBatch).
	slabBatch = 16
	// slabCacheMax is the most free indexes a cache keeps.
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
	// reserved is the nodes that reserve made, indexes 1 to len, one
	// array: set before the store is shared and never changed after, so
	// it is read without synchronization, and at reaches the nodes in it
	// without loading dir.
	reserved []N

	// chunkShift is log2 of the nodes in a chunk, slabChunkShift if zero;
	// set before the store is shared (see setChunk).
	chunkShift uint32
	// batch is how many indexes a cache takes from, or gives back to,
	// the depot at once, slabBatch if zero (see setBatch).
	batch atomic.Int32

	mu     sync.Mutex // guards what follows, and growth of dir
	carved uint32     // next index to hand out for the first time; index 0 is never used
	depot  []uint32   // free indexes not held by any cache
	gaps   uint32     // indexes that are no node, past the ranges reserveMore made

	// limit, when set, ends the index space there rather than at
	// slabMaxNodes; spent, when set, makes reserveMore set limit to the
	// end of the nodes it carves, and carve them whatever the limit. Both
	// are set by tests only, under mu.
	limit uint32
	spent bool
}

// maxNodes returns the end of the index space.
func (s *slab[N]) maxNodes() uint32 {
	if s.limit != 0 {
		return s.limit
	}
	return slabMaxNodes
}

// slabDir is a directory of chunks: node i is chunk (i-1)>>shift, at
// (i-1)&(1<<shift-1); index 0 is never a node, and takes no room. Every
// chunk but the one that ends the reserved nodes holds 1<<shift nodes; that
// one may hold fewer, and the indexes past its end are never handed out.
//
// N.B. counting from index 1 keeps the reserved nodes of a table of 2^k
// buckets at 2^k nodes, a whole number of the allocator's pages (2^k+1
// nodes took one page more).
// slabDir is a store's directory of chunks. N.B. every walk past the
// reserved nodes reads it, and the slice of chunk headers it points to, so
// both fill whole cache lines of their own (TestSlabDirLines): the heap
// packs small objects of one size side by side, and a neighbor that
// another core writes would cost each such read a miss. Before, a
// benchmark's per-goroutine counters, 32-byte objects like the directory,
// landed in its line in some runs, and lookups at 1K took twice as long.
type slabDir[N any] struct {
	chunks [][]N
	shift  uint32
	_      [cacheLineSize - 3*ptrSize - 4]byte
}

// setChunk sets the nodes in a chunk: n rounded up to a power of two,
// from 64 to 1024. It must be called before reserve, before the store is
// shared and before any other method.
//
// N.B. a store holds its nodes beyond the reserved ones in whole chunks:
// a table sizes them to a 64th of its buckets (Table.New), so that
// what a chunk brings that is not in use yet is a small part of the table.
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

// setBatch sets how many indexes a cache takes from, or gives back to, the
// depot at once: n, from 1 to slabBatch. A cache keeps at most 4 batches.
// It may be called while the store is shared: a cache that holds more
// than 4 of the new batches gives the excess back at its next put.
//
// N.B. every cache may hold up to 5 batches of free nodes (4 kept, and one
// carved that it has not handed out yet), so the batch sets what a store
// with many caches holds beyond its live nodes: a table whose stripes
// cover few buckets takes small batches (Table.New), and larger ones as
// it grows (Table.grow).
func (s *slab[N]) setBatch(n int) { s.batch.Store(int32(min(max(n, 1), slabBatch))) }

// batchSize returns the number of indexes a cache moves at once.
func (s *slab[N]) batchSize() int {
	if b := s.batch.Load(); b != 0 {
		return int(b)
	}
	return slabBatch
}

// cacheMax returns the most free indexes a cache keeps.
func (s *slab[N]) cacheMax() int { return 4 * s.batchSize() }

// slabCache is a cache of free indexes. Its owner serializes its use.
type slabCache struct {
	free []uint32
}

// at returns node i. Any index ever handed out by get is valid for the life
// of the store.
func (s *slab[N]) at(i uint32) *N {
	// i-1 wraps to the largest uint32 for index 0, which is no node.
	if j := i - 1; j < uint32(len(s.reserved)) {
		return &s.reserved[j]
	}
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

// cached returns a free index held by c, if any, without touching the
// depot.
func (c *slabCache) cached() (uint32, bool) {
	if len(c.free) == 0 {
		return 0, false
	}
	return c.pop(), true
}

func (c *slabCache) pop() uint32 {
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	return i
}

// reserve carves nodes 1 to n, in one allocation of exactly n nodes, for
// the caller to manage outside the caches: they are never handed out by
// get. It must be called on an empty store, before the store is shared and
// before any method but setChunk.
//
// N.B. the directory's chunks cut the reserved array where it lies; its
// last chunk ends with it, short where n is not a multiple of the chunk,
// and the nodes carved later begin at the next chunk's first index, so the
// indexes between (the gap) are no node.
func (s *slab[N]) reserve(n uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserved = make([]N, n)
	size := uint32(1) << s.shift()
	d := &slabDir[N]{shift: s.shift()}
	for lo := uint32(0); lo < n; lo += size {
		hi := min(lo+size, n)
		d.chunks = append(d.chunks, s.reserved[lo:hi:hi])
	}
	s.dir.Store(d)
	s.carved = uint32(len(d.chunks))<<d.shift + 1
}

// reserveMore carves n nodes in one allocation, as reserve does, in a
// store that may be shared, and returns the index of the first and the
// nodes; the caller manages them outside the caches, as reserve's. They
// begin at a chunk's first index: the indexes left in the chunk carved
// last go to the depot first. It reports false, and changes nothing, if
// the nodes would not fit in the index space.
//
// N.B. as in reserve, the directory's chunks cut the new array where it
// lies, and where n is less than a chunk the indexes past its end are no
// node (counted in gaps). Readers never index past the directory they
// loaded, so the longer one is published whole, as grow does. The nodes
// are allocated before the store's mutex is taken: writers that refill
// their caches meanwhile do not wait for the allocation.
func (s *slab[N]) reserveMore(n uint32) (first uint32, nodes []N, ok bool) {
	nodes = make([]N, n)
	s.mu.Lock()
	defer s.mu.Unlock()
	size := uint32(1) << s.shift()
	carved := max(s.carved, 1)
	first = (carved-1+size-1)/size*size + 1
	chunks := (n + size - 1) / size
	end := s.maxNodes()
	if s.spent {
		end = slabMaxNodes
	}
	if uint64(first)+uint64(chunks)*uint64(size) > uint64(end) {
		return 0, nil, false
	}
	for i := carved; i < first; i++ {
		s.depot = append(s.depot, i)
	}
	d := s.nextDir()
	for lo := uint32(0); lo < n; lo += size {
		hi := min(lo+size, n)
		d.chunks = appendChunk(d.chunks, nodes[lo:hi:hi])
	}
	s.dir.Store(d)
	s.carved = first + chunks*size
	s.gaps += chunks*size - n
	if s.spent {
		s.limit = s.carved
	}
	return first, nodes, true
}

// gap returns the number of indexes between the reserved nodes and the
// first carved one, which are no node (see reserve): the reserved count
// rounded up to a whole chunk, less that count.
func (s *slab[N]) gap() uint32 {
	return uint32(-len(s.reserved)) & (1<<s.shift() - 1)
}

// put returns node i to c; when c holds limit indexes or more (limit is at
// most s.cacheMax()), it keeps limit/2 and gives the rest back to the
// depot, so that nodes freed under one stripe serve the others.
func (s *slab[N]) put(c *slabCache, i uint32, limit int) {
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
	if n := min(len(s.depot), s.batchSize()); n > 0 {
		c.free = append(c.free, s.depot[len(s.depot)-n:]...)
		s.depot = s.depot[:len(s.depot)-n]
		return true
	}
	if s.carved == 0 {
		s.carved = 1 // index 0 is never a node
	}
	for range s.batchSize() {
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

// stats returns the nodes carved (handed out at least once, or reserved)
// and the free ones held by the depot.
func (s *slab[N]) stats() (carved, depot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(max(s.carved, 1) - 1 - s.gap() - s.gaps), len(s.depot)
}
