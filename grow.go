package hash4

import (
	"fmt"
	"math"
	"runtime/debug"
)

// This file holds growth: a table replaces its bucket array with one of
// more buckets, by itself past maxLoad entries per bucket or when Grow is
// called, while every method goes on, as rhashtable does.
//
// Invariants:
//
//  1. The new array is published with old pointing at the array it
//     replaces, and old is cleared only once every entry has moved; a
//     growth runs under growMu, so an array's old has no old of its own.
//  2. An old bucket's entries move under its lock, all at once, and the
//     bucket is then marked seqMoved, for good. A new bucket receives
//     entries from one old bucket only (its index's low bits), so it is
//     written by that bucket's move, under the old bucket's lock, until the
//     move is done, and by writers under its own lock after: a writer moves
//     its hash's old bucket before it locks the new one (lockBucket).
//  3. An entry is live in the new array before the old one stops leading to
//     it, so a lookup that misses in the old array after the entry left
//     finds it in the new (lookupGrowing). Each entry that moves into a new
//     line or its chain changes that line's seq, so a lookup in the new
//     array that missed it walks again, though the growth be over by then.
//     Nodes move between chains as rhashtable moves them: a reader standing
//     on one goes on into the new chain, ends on a marker not its own
//     (arrays differ in bit 30 of their nulls values) and restarts.

// initGrowth arms the shards' growth triggers for array a, a new array of
// the table (rearm).
func (t *Table[T]) initGrowth(a *bucketArray[T]) { t.rearm(t.count(), t.growLimit(a)) }

// rearm sets each shard's trigger to its count plus an equal share of the
// room left below limit, so the table passes its limit only after a shard
// passed its trigger. The shares add to at least a 64th of the limit, so a
// table at its limit does not sum its shards on every insert, and may pass
// it by that much before it grows.
func (t *Table[T]) rearm(total, limit int64) {
	if limit == math.MaxInt64 {
		for i := range t.shards {
			t.shards[i].checkAt.Store(math.MaxInt64)
		}
		return
	}
	share := max(limit-total, limit/64, 1) / int64(len(t.shards))
	for i := range t.shards {
		sh := &t.shards[i]
		sh.checkAt.Store(sh.count.Load() + max(share, 1))
	}
}

// growLimit returns the entry count past which a table of array a grows
// by itself: maxLoad per bucket, or never in a table made WithFixedBuckets
// or of the most buckets it may have.
func (t *Table[T]) growLimit(a *bucketArray[T]) int64 {
	if t.fixed || len(a.lines) >= t.bucketLimit {
		return math.MaxInt64
	}
	return int64(maxLoad * len(a.lines))
}

// overLimit is called by an insert that left a shard's count past its
// trigger. It sums the shards: past the table's limit, unless a growth
// runs, it starts one on a goroutine of its own, as rhashtable's inserts
// leave growth to a deferred worker (rht_deferred_worker), and returns at
// once; within it, it rearms the triggers.
func (t *Table[T]) overLimit() {
	if t.growing.Load() {
		return
	}
	total, limit := t.count(), t.growLimit(t.arr.Load())
	if h := t.hooks; h != nil && h.checked != nil {
		h.checked(total > limit)
	}
	if total <= limit {
		t.rearm(total, limit)
		return
	}
	if !t.growing.CompareAndSwap(false, true) {
		return
	}
	t.growers.Add(1)
	go func() {
		defer t.growers.Done()
		t.growBehind()
	}()
}

// growBehind grows the table while it is past its limit. If the node store
// cannot index a new array, growing stays set: the table grows no more by
// itself.
//
// N.B. growing is cleared before the last look at the count, and an insert
// loads it after its count's atomic add: of an insert that takes the table
// past its limit and the end of a growth, one sees the other.
func (t *Table[T]) growBehind() {
	t.growMu.Lock()
	defer t.growMu.Unlock()
	for {
		for t.count() > t.growLimit(t.array()) {
			if h := t.hooks; h != nil && h.checked != nil {
				h.checked(true)
			}
			t.grow(len(t.array().lines) * 2)
		}
		t.growing.Store(false)
		if t.count() <= t.growLimit(t.array()) || !t.growing.CompareAndSwap(false, true) {
			return
		}
	}
}

// Grow sizes the table for about n entries, as WithCapacity sizes a new
// one: if that is more buckets than the table has, it replaces the bucket
// array (64 bytes per bucket); else it does nothing. Every method may run
// meanwhile and finds every entry; a writer waits at most for one bucket's
// entries to move. It panics if n is negative, and changes nothing and
// returns an error matching [ErrTooLarge] if n is beyond the table's bucket
// limit (see [WithMaxBuckets]).
func (t *Table[T]) Grow(n int) error {
	if n < 0 {
		panic(fmt.Sprintf("hash4: Grow(%d): negative size", n))
	}
	t.array() // a nil or zero Table panics here, named
	nb := bucketCount(n / capLoad)
	if n/capLoad > t.bucketLimit {
		return fmt.Errorf("%w: Grow(%d) beyond %d buckets", ErrTooLarge, n, t.bucketLimit)
	}
	if limit := debug.SetMemoryLimit(-1); uint64(nb)*cacheLineSize > uint64(limit) {
		return fmt.Errorf("%w: Grow(%d): %d buckets take %d bytes, beyond the memory limit of %d", ErrTooLarge, n, nb, uint64(nb)*cacheLineSize, limit)
	}
	t.growMu.Lock()
	defer t.growMu.Unlock()
	t.grow(nb)
	return nil
}

// grow replaces the table's array with one of nb buckets, a power of two,
// if that is more than it has; growMu is held. It publishes the new array at
// once and moves the entries one old bucket at a time, under its lock; a
// writer moves its bucket first (lockBucket), so it waits for one bucket's
// move at most. Until grow returns, a lookup that misses in the new array
// looks in the old one too. The nodes serve the new chains as they are.
func (t *Table[T]) grow(nb int) {
	old := t.array()
	if nb <= len(old.lines) {
		return
	}
	a := newBucketArray[T](nb, old.nullsBase^arrayNullsFlip, t.huge)
	// N.B. old is set before the array is published (invariant 1).
	a.old.Store(old)
	t.arr.Store(a)
	t.growths.Add(1)
	for ob := range old.lines {
		if h := t.hooks; h != nil && h.growStep != nil {
			h.growStep(uint32(ob))
		}
		t.moveBucket(a, old, uint32(ob))
	}
	a.old.Store(nil)
	t.initGrowth(a)
}

// moveBucket moves the entries of the bucket of hash h in old, the array a
// replaced, into a, unless they have moved.
func (t *Table[T]) moveBucket(a, old *bucketArray[T], h uint32) {
	ob := old.line(h)
	if ob.moved() {
		return
	}
	ob.lock()
	if !ob.moved() {
		t.migrate(a, ob)
	}
	ob.unlock()
}

// migrate moves bucket ob's entries, of the array a replaced, into a; the
// caller holds ob's lock. The line's entry goes to its new line, free
// (invariant 2). A node's entry goes to its new line if free, and the node
// is freed; else the node moves to the new chain's head, linked there before
// it leaves the old chain (invariant 3), so growth takes no node. Last, ob is
// marked moved: its seq changes, so a lookup that missed in it walks again.
func (t *Table[T]) migrate(a *bucketArray[T], ob *bucket[T]) {
	if ob.live() {
		k := ob.key.load()
		a.line(k.hash()).fill(&k, ob.val.Load(), 0, nil)
	}
	for l := ob.next.load(); !l.isNulls(); l = ob.next.load() {
		n := &t.nodes.at(l.index()).entry
		next := n.next.load()
		k := n.key.load()
		nb := a.line(k.hash())
		if !nb.live() {
			nb.fill(&k, n.val.Load(), 0, nil)
			n.empty(&ob.next)
			t.freeNode(l.index())
			continue
		}
		linkAt(&nb.next, l, &n.next)
		// N.B. the new line's seq changes too: a lookup in the new array
		// that loaded its chain's head before the link missed n, and may
		// find the growth over when it ends (invariant 3).
		nb.seq.Store(nb.seq.Load() + seqGen)
		if h := t.hooks; h != nil && h.relinked != nil {
			h.relinked(l.index())
		}
		ob.next.store(next)
	}
	s := ob.seq.Load()
	ob.seq.Store((s&^seqLive | seqMoved) + seqGen)
	ob.val.Store(nil)
}
