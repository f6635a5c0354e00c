package hash4

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
)

// This file holds the bucket arrays: a Table's bucket is one cache line; the
// socket tables keep the kernel's chain heads under lock stripes (chains).

const (
	cacheLineSize = 64 // on amd64 and arm64

	minBuckets = 16
	// maxBuckets keeps bucket indexes, plus the offset that tells listener
	// chains from established ones (2^29, as in Linux), below
	// arrayNullsFlip.
	maxBuckets = 1 << 29
	// arrayNullsFlip differs between a Table's successive arrays, so a
	// reader led into a chain of the next array ends on a foreign marker.
	arrayNullsFlip = 1 << 30
	// releasedNullsValue ends the next links of released nodes (see
	// slab.release): no chain ends in it.
	releasedNullsValue = maxNullsValue
)

// ptrSize is the size of a pointer: 8 on 64-bit targets, 4 on 32-bit ones.
const ptrSize = 4 << (^uintptr(0) >> 63)

// The bits of an entry's seq (see entry).
const (
	seqLock  = 1 << 0 // a bucket line's writer lock
	seqLive  = 1 << 1 // the entry is live
	seqMoved = 1 << 2 // a bucket line whose entries moved to a newer array (grow.go)
	seqGen   = 1 << 3 // one change that readers must see
)

// entry is one flow: the inline entry of a bucket line, or a node of an
// overflow chain. Lock-free readers load its fields atomically; writers
// store them with release stores (release.go), under the lock of the bucket
// whose chain holds it.
//
// The sequence protocol, relied on by every reader:
//
//  1. seq has seqLive set while the entry is live (in the table with its key
//     and value) and clear while it is free. Each change of liveness adds
//     seqGen, and so does each move of an entry that a walk could miss (see
//     bucket). A bucket line's seq also holds its lock bit and seqMoved,
//     which readers ignore and heed respectively.
//  2. A writer fills a free entry, links it (a node), and then makes it live;
//     deleting makes it free, then unlinks it, then clears the value. So a
//     live node is always linked in its key's chain.
//  3. A reader that matches a key reads seq before the key and again after
//     the value, and trusts the match only if seq was live and, but for the
//     lock bit, unchanged; otherwise the entry was deleted or recycled under
//     it, and it restarts. Seq returns to a value only after 2^28 changes of
//     one entry. Recycling never waits for readers.
//  4. A live entry's value may change without seq (CompareAndSwap, Store):
//     the reader returns the value it loaded, which the flow held then.
//  5. A reservation (ConnectFunc) is a live entry whose key has local port 0
//     in meta, the hash and the rest its tuple's, and whose value is nil. No
//     lookup key equals it: a key's hash is its hash with local port 0 plus
//     its port. It goes live to readers in place, under the lock: the value
//     is stored, then meta, so a reader that matches the new meta loads the
//     new value.
type entry[T any] struct {
	seq  relUint32
	next linkField
	key  entryKey
	val  relPointer[T]
}

// read is a reader's half of the seq protocol: it returns e's value and
// ok = true if e is live and holds k, unchanged across the read. A match that
// the second load of seq contradicts returns changed = true: e was deleted or
// recycled under the reader, whose walk must restart.
func (e *entry[T]) read(k *key) (v *T, ok, changed bool) {
	seq := e.seq.Load() &^ seqLock
	if seq&seqLive == 0 || !e.key.matches(k) {
		return nil, false, false
	}
	v = e.val.Load()
	if e.seq.Load()&^seqLock != seq {
		return nil, false, true
	}
	return v, true, false
}

// live reports whether e is live. The caller holds its bucket's lock.
func (e *entry[T]) live() bool { return e.seq.Load()&seqLive != 0 }

// reserved reports whether e, live, is a reservation (see entry). The
// caller holds its bucket's lock.
func (e *entry[T]) reserved() bool { return e.key.meta.Load()&lportMask == 0 }

// flip turns e live or free (entry's rule 1). The caller holds the lock of
// e's bucket; a bucket line's lock bit is kept.
func (e *entry[T]) flip() { e.seq.Store((e.seq.Load() ^ seqLive) + seqGen) }

// fill writes k and v into e, free, links a node at at (a head or a node's
// next), and makes e live; the caller holds the bucket lock. Readers ignore
// a free entry's key, so it is written field by field.
func (e *entry[T]) fill(k *key, v *T, node link, at *linkField) {
	e.key.store(k)
	e.val.Store(v)
	if at != nil {
		linkAt(at, node, &e.next)
	}
	e.flip() // live: N.B. after linking (rule 2)
}

// empty makes e free, unlinks a node from prev (rule 2) and clears and
// returns its value; the caller holds the bucket lock.
func (e *entry[T]) empty(prev *linkField) *T {
	e.flip()
	if prev != nil {
		unlink(prev, &e.next)
	}
	v := e.val.Load()
	e.val.Store(nil)
	return v
}

// bucket is one line of a Table's bucket array: an entry of its own (the
// inline entry), whose next field heads the bucket's hlist_nulls overflow
// chain and whose seq holds the bucket's writer lock, as Linux's hlist_bl
// heads hold theirs. Its lock covers the line and the chain.
//
// Invariants, under the lock:
//
//  1. The inline entry is free only while the chain is empty: an insert fills
//     the inline entry if it is free, else a node at the chain's head; a
//     delete of the inline entry moves the chain's first entry into it
//     (promote).
//  2. Each change of the inline entry changes seq (entry's rule 1), and so
//     does each move of an entry within the chain (compaction): a lookup
//     trusts a miss only if the line's seq, but for the lock bit, is what it
//     was before its walk, since a key moved meanwhile may have gone behind
//     the walk.
type bucket[T any] struct {
	entry[T]
	_ [cacheLineSize - 56]byte // an entry is 56 bytes on every target (TestTableMemoryLayout)
}

// lockSpins is how many times lock tries a held lock before it yields the
// processor between tries, as a holder may have been preempted.
const lockSpins = 64

// lock takes the bucket's writer lock, a bit of its seq (bit_spin_lock).
func (b *bucket[T]) lock() {
	for spins := 0; ; spins++ {
		if s := b.seq.Load(); s&seqLock == 0 && b.seq.CompareAndSwap(s, s|seqLock) {
			return
		}
		if spins >= lockSpins {
			runtime.Gosched()
		}
	}
}

// unlock releases the bucket's lock, with a release store: the holder's
// writes are visible before the lock is seen free.
func (b *bucket[T]) unlock() { b.seq.Store(b.seq.Load() &^ seqLock) }

// moved reports whether the bucket's entries moved to a newer array.
func (b *bucket[T]) moved() bool { return b.seq.Load()&seqMoved != 0 }

// bucketArray is a Table's array of bucket lines. Growth replaces it; once
// published only the lines (under their locks) and old change. The pads keep
// what lookups read off neighbouring objects' lines.
type bucketArray[T any] struct {
	_     [cacheLineSize]byte
	lines []bucket[T]
	mask  uint32
	// nullsBase + b ends bucket b's chain.
	nullsBase uint32
	// old is the array this one replaced while growth moves the entries
	// out of it, and nil before and after (grow.go).
	old atomic.Pointer[bucketArray[T]]
	_   [cacheLineSize]byte
}

// newBucketArray returns an array of n buckets, a power of two, whose chains
// end in nullsBase + b. huge asks for huge pages (WithHugePages).
func newBucketArray[T any](n int, nullsBase uint32, huge bool) *bucketArray[T] {
	a := &bucketArray[T]{lines: make([]bucket[T], n), mask: uint32(n - 1), nullsBase: nullsBase}
	if huge {
		adviseHugePages(a.lines) // written whole below
	}
	for i := range a.lines {
		a.lines[i].next.initNulls(nullsBase + uint32(i))
	}
	return a
}

// line returns the bucket of hash h.
func (a *bucketArray[T]) line(h uint32) *bucket[T] { return &a.lines[h&a.mask] }

// ends reports whether l is the marker that ends the chain of hash h.
func (a *bucketArray[T]) ends(l link, h uint32) bool { return l == nullsLink(a.nullsBase+h&a.mask) }

// bucketCount returns n rounded up to a power of two, clamped to what a
// table supports.
func bucketCount(n int) int { return ceilPow2(min(max(n, minBuckets), maxBuckets)) }

// ceilPow2 returns the least power of two >= n, for 1 <= n <= 2^30.
func ceilPow2(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// chains is the kernel's plain layout, which the socket tables keep: a
// power-of-two array of chain heads and a smaller power-of-two array of lock
// stripes (inet_ehash_locks), stripe b & stripeMask covering bucket b. Chain
// b ends in nullsBase + b.
type chains struct {
	heads      []linkField
	mask       uint32
	stripes    []stripe
	stripeMask uint32
	nullsBase  uint32
}

// stripe is one writer lock of chains, with the count of entries in its
// chains and its cache of free nodes, on a cache line of its own.
type stripe struct {
	count relUint64 // written under mu, read without it
	mu    sync.Mutex
	cache slabCache
	_     [cacheLineSize - 8 - 8 - 3*ptrSize]byte
}

// init sizes the chains: n heads and s stripes, each rounded up to a power
// of two and clamped (s to at most n). huge asks for huge pages.
func (c *chains) init(n, s int, nullsBase uint32, huge bool) {
	if n > maxBuckets {
		panic(fmt.Sprintf("hash4: WithCapacity(%d) beyond %d buckets, the most a table can have", n, maxBuckets))
	}
	n = bucketCount(n)
	c.heads = make([]linkField, n)
	if huge {
		adviseHugePages(c.heads)
	}
	c.mask = uint32(n - 1)
	c.stripes = make([]stripe, ceilPow2(min(max(s, 1), n)))
	c.stripeMask = uint32(len(c.stripes) - 1)
	c.nullsBase = nullsBase
	for i := range c.heads {
		c.heads[i].initNulls(nullsBase + uint32(i))
	}
}

// defaultStripes returns the stripe count of chains of n heads when none is
// given: 16 per P, at least 64, one per 1024 heads in large arrays, but at
// most one per 16 heads.
func defaultStripes(n int) int {
	return min(max(64, ceilPow2(16*runtime.GOMAXPROCS(0)), n/1024), max(n/16, 1))
}

// bucket returns the index of hash's chain.
func (c *chains) bucket(hash uint32) uint32 { return hash & c.mask }

// head returns the head of hash's chain.
func (c *chains) head(hash uint32) *linkField { return &c.heads[hash&c.mask] }

// stripe returns the stripe that covers hash's chain.
func (c *chains) stripe(hash uint32) *stripe { return &c.stripes[hash&c.stripeMask] }
