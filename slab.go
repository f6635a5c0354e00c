package hash4

import (
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
// Nodes live in fixed-size chunks that never move; a directory of chunks is
// replaced (copied) when it grows, and readers load it atomically, so growth
// never blocks them.
//
// Free indexes are kept in per-stripe caches used under the stripe's lock,
// like per-CPU slab caches, backed by a shared depot under the store's mutex
// (taken only when a cache runs empty or overfull), so steady-state churn
// costs no allocation and no shared lock.

const (
	slabChunkShift = 10
	slabChunkSize  = 1 << slabChunkShift
	// slabBatch is the most indexes a cache takes from, or gives back
	// to, the depot at once (see slab.setBatch).
	slabBatch = 16
	// slabCacheMax is the most free indexes a cache keeps.
	slabCacheMax = 4 * slabBatch
	// slabMaxNodes bounds the index space: indexes are link indexes.
	slabMaxNodes = maxNullsValue
)

// slab is a store of nodes of type N. The zero value is empty and ready.
type slab[N any] struct {
	dir atomic.Pointer[[]*[slabChunkSize]N]
	// reserved is the chunks that reserve made, one array: set before the
	// store is shared and never changed after, so it is read without
	// synchronization, and at reaches the nodes in it without loading dir.
	reserved [][slabChunkSize]N

	// batch is how many indexes a cache takes from, or gives back to,
	// the depot at once, slabBatch if zero; set before the store is
	// shared.
	batch int

	mu     sync.Mutex // guards what follows, and growth of dir
	carved uint32     // nodes handed out at least once; index 0 is never used
	depot  []uint32   // free indexes not held by any cache
}

// setBatch sets how many indexes a cache takes from, or gives back to, the
// depot at once: n, from 1 to slabBatch. A cache keeps at most 4 batches.
// It must be called before the store is shared.
//
// N.B. every cache may hold up to 5 batches of free nodes (4 kept, and one
// carved that it has not handed out yet), so the batch sets what a store
// with many caches holds beyond its live nodes: a table whose stripes
// cover few buckets takes small batches (Table.New).
func (s *slab[N]) setBatch(n int) { s.batch = min(max(n, 1), slabBatch) }

// batchSize returns the number of indexes a cache moves at once.
func (s *slab[N]) batchSize() int {
	if s.batch == 0 {
		return slabBatch
	}
	return s.batch
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
	if c := i >> slabChunkShift; int(c) < len(s.reserved) {
		return &s.reserved[c][i&(slabChunkSize-1)]
	}
	dir := *s.dir.Load()
	return &dir[i>>slabChunkShift][i&(slabChunkSize-1)]
}

// slabView is a reader's cached copy of the directory: a walk loads the
// directory once and again only for an index past its end (a node carved
// after the walk began), which saves a load per hop.
type slabView[N any] struct {
	s   *slab[N]
	dir []*[slabChunkSize]N
}

// view returns a view of s for one walk.
func (s *slab[N]) view() slabView[N] {
	return slabView[N]{s: s}
}

// at returns node i, as slab.at.
func (v *slabView[N]) at(i uint32) *N {
	if int(i>>slabChunkShift) >= len(v.dir) {
		v.dir = *v.s.dir.Load()
	}
	return &v.dir[i>>slabChunkShift][i&(slabChunkSize-1)]
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

// reserve carves nodes 1 to n, in one allocation, for the caller to manage
// outside the caches: they are never handed out by get. It must be called
// on an empty store, before the store is shared and before any other
// method.
func (s *slab[N]) reserve(n uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	chunks := make([][slabChunkSize]N, (n+1+slabChunkSize-1)/slabChunkSize)
	dir := make([]*[slabChunkSize]N, len(chunks))
	for i := range chunks {
		dir[i] = &chunks[i]
	}
	s.dir.Store(&dir)
	s.reserved = chunks
	s.carved = n + 1
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
		if s.carved >= slabMaxNodes {
			break
		}
		i := s.carved
		if i>>slabChunkShift >= uint32(s.chunks()) {
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
		return len(*d)
	}
	return 0
}

// grow adds a chunk. s.mu is held. N.B. readers never index past the length
// of the directory they loaded, so append may write the new slot in place
// (a slot no reader reads yet); the longer directory is then published whole
// with one atomic store, and every index handed out before stays valid in it.
func (s *slab[N]) grow() {
	var dir []*[slabChunkSize]N
	if d := s.dir.Load(); d != nil {
		dir = *d
	}
	dir = append(dir, new([slabChunkSize]N))
	s.dir.Store(&dir)
}

// stats returns the nodes handed out at least once and the free ones held
// by the depot.
func (s *slab[N]) stats() (carved, depot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(max(s.carved, 1) - 1), len(s.depot)
}
