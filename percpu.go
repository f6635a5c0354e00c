package hash4

import (
	"runtime"
	"sync/atomic"
	_ "unsafe" // go:linkname
)

// This file holds a Table's per-P shards, a line each: entry counts and free
// node caches, as Linux keeps per-CPU counters and slab caches.
//
// Invariants:
//
//  1. A shard's cache is used only under its lock, which is held only for a
//     few stores and never across a call that may block but for the node
//     store's mutex (refill, put).
//  2. A node taken from a cache is filled and linked (or put back) before
//     the shard's lock is released, and a writer frees a node and puts it
//     in a cache under one hold of it: no index is held outside a cache,
//     the depot or a chain but under a shard lock (or growMu). Compaction
//     locks every shard to take a chunk's free nodes out of circulation
//     (compact.go).
//  3. Counts are changed with atomic adds, and may go below zero in one
//     shard (an entry inserted on one P and deleted on another): only
//     their sum means something.

// procPin pins the caller to its P and returns the P's id; the runtime keeps
// it linkable for packages outside the standard library (go.dev/issue/67401).
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// procID returns the id of the P the caller runs on: a hint of which shard
// is local, which may be stale as soon as it returns.
func procID() uint32 {
	p := procPin()
	procUnpin()
	return uint32(p)
}

// shard is one P's share of a Table's counters and free nodes.
type shard struct {
	count atomic.Int64 // entries inserted less entries removed through it
	// checkAt is the count past which an insert has the table check its
	// growth (grow.go): its share of the growth limit, raised by checks
	// that decided not to grow.
	checkAt atomic.Int64
	cache   slabCache
	lock    atomic.Uint32 // guards cache
	_       [cacheLineSize - 8 - 8 - 3*ptrSize - 4]byte
}

// shardCacheMax is the most free nodes a shard's cache keeps: a put past
// it gives half back to the depot.
const shardCacheMax = 2 * slabBatch

// newShards returns the shards of a table: one per P, a power of two.
func newShards() []shard {
	return make([]shard, ceilPow2(runtime.GOMAXPROCS(0)))
}

// shard returns the shard of the P the caller runs on, locked.
func (t *Table[T]) shard() *shard {
	sh := &t.shards[procID()&uint32(len(t.shards)-1)]
	sh.take()
	return sh
}

// take locks sh, spinning: holders run a few dozen instructions.
func (sh *shard) take() {
	for spins := 0; !sh.lock.CompareAndSwap(0, 1); spins++ {
		if spins >= lockSpins {
			runtime.Gosched()
		}
	}
}

// release unlocks sh.
func (sh *shard) release() { sh.lock.Store(0) }

// count returns the sum of the shards' counts, the table's entries.
func (t *Table[T]) count() int64 {
	var n int64
	for i := range t.shards {
		n += t.shards[i].count.Load()
	}
	return max(n, 0)
}
