package hash4

import (
	"math/bits"
	"runtime"
	"sync"
)

// This file holds the bucket array of a hash table and its writer locks, as
// the kernel's inet_ehash_bucket array and its ehash_locks: a power-of-two
// array of chain heads, and a smaller power-of-two array of lock stripes.
// Bucket b is covered by stripe b & stripeMask; since both sizes are powers
// of two and stripes <= buckets, that is also hash & stripeMask.

const (
	// cacheLineSize is the size of a cache line on the targets Go serves
	// (64 bytes on amd64 and arm64).
	cacheLineSize = 64

	minBuckets = 16
	// maxBuckets keeps bucket indexes, plus the offset that tells listener
	// chains from established ones (2^29, as in Linux), below
	// maxNullsValue.
	maxBuckets = 1 << 29
	// arrayNullsFlip is flipped in the nulls values of each new array
	// Table.Grow makes, so that a reader led from a chain of one array into
	// a chain of the next ends on a value that is not its own: bucket
	// indexes, with the listener offset, stay below it.
	arrayNullsFlip = 1 << 30
	// releasedNullsValue ends the next links of released nodes (see
	// slab.release): no chain ends in it, as bucket indexes, with the
	// listener offset or the flip (listener chains never flip), stay
	// below it.
	releasedNullsValue = maxNullsValue
)

// stripe is one writer lock with what it guards besides chains: the cache of
// free nodes for inserts under it, the count of entries in its buckets, and
// a Table's bookkeeping of its buckets' home slots (home.go). It fills a
// cache line of its own so that writers on neighbouring stripes do not share
// lines.
//
// N.B. the fields are ordered so that none leaves a hole before the next on
// 64- or 32-bit targets, and the padding counts the one field whose size
// differs, the slice in cache; a test checks the size for amd64 and, through
// vet, for 386.
type stripe struct {
	count      relUint64 // written under mu, read without it
	mu         sync.Mutex
	homeBits   [1]uint64 // its home bitmap run, in small tables (home.go)
	homeFree   uint32    // free home slots of its buckets
	homeCursor uint32    // word of its home bitmap run where steal resumes
	cache      slabCache
	homeLast   uint32 // 1 + the bucket whose home slot Table.free released last, or 0 (home.go)
	// flipped tells which of a Table's two latest bucket arrays holds the
	// entries of its buckets: the one whose nulls values have bit 30 set
	// (arrayNullsFlip), or the other. Table.Grow moves a stripe's entries
	// from the old array to the new one under its lock (Table.migrate).
	flipped bool
	_       [cacheLineSize - 8 - 8 - 8 - 4 - 4 - 3*ptrSize - 4 - 1]byte
}

// ptrSize is the size of a pointer: 8 on 64-bit targets, 4 on 32-bit ones.
const ptrSize = 4 << (^uintptr(0) >> 63)

// buckets is a bucket array with its lock stripes. Chain b ends in the nulls
// marker nullsBase + b.
type buckets struct {
	heads      []linkField
	mask       uint32
	stripes    []stripe
	stripeMask uint32
	nullsBase  uint32
}

// init sizes the array: n buckets and s stripes, each rounded up to a power
// of two and clamped to what the table supports (s to at most n). It panics
// if n is beyond maxBuckets, as New does (see tableConfig.sizes), before it
// allocates.
func (b *buckets) init(n, s int, nullsBase uint32, hugePages bool) {
	if n > maxBuckets {
		panic(capacityBeyond(n))
	}
	n = bucketCount(n)
	b.initShared(n, newStripes(s, n), nullsBase, hugePages)
}

// newStripes returns s lock stripes for n buckets, s rounded up to a power
// of two and clamped to [1, n].
func newStripes(s, n int) []stripe { return make([]stripe, ceilPow2(min(max(s, 1), n))) }

// initShared sizes the array to n buckets, a power of two, guarded by the
// stripes ss, a power of two no larger than n, which may guard another
// array too (Table.Grow). Chain i ends in the nulls value nullsBase+i.
// huge asks for the heads in huge pages (WithHugePages).
func (b *buckets) initShared(n int, ss []stripe, nullsBase uint32, huge bool) {
	b.heads = make([]linkField, n)
	if huge {
		adviseHugePages(b.heads) // written whole below
	}
	b.mask = uint32(n - 1)
	b.stripes = ss
	b.stripeMask = uint32(len(ss) - 1)
	b.nullsBase = nullsBase
	for i := range b.heads {
		b.heads[i].initNulls(nullsBase + uint32(i))
	}
}

// bucketCount returns the bucket count of a table sized for n entries: n
// rounded up to a power of two, clamped to what a table supports.
func bucketCount(n int) int { return ceilPow2(min(max(n, minBuckets), maxBuckets)) }

// defaultStripes returns the stripe count of a table of n buckets when none
// is given: enough that writers on every P rarely meet (16 per P, at least
// 64), and in large tables one per 1024 buckets. Writers on two cores that
// lock one stripe after the other pass its line between them, and in a
// large table more stripes make that less frequent, for 128 bytes per
// stripe (its line and its move count) and one more line per stripe for
// Len to read. A stripe covers at least 16 buckets: in a small table those
// 128 bytes would be a large part of each entry's share.
func defaultStripes(n int) int {
	return min(max(64, ceilPow2(16*runtime.GOMAXPROCS(0)), n/1024), max(n/16, 1))
}

// bucket returns the index of hash's bucket.
func (b *buckets) bucket(hash uint32) uint32 { return hash & b.mask }

// head returns the head of hash's chain.
func (b *buckets) head(hash uint32) *linkField { return &b.heads[hash&b.mask] }

// stripe returns the stripe that covers hash's bucket.
func (b *buckets) stripe(hash uint32) *stripe { return &b.stripes[hash&b.stripeMask] }

// ceilPow2 returns the least power of two >= n, for 1 <= n <= 2^30.
func ceilPow2(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}
