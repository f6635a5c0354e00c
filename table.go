package hash4

import (
	"fmt"
	"math/bits"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// Table is a concurrent hash table from 4-tuples to *T, built as Linux's
// established-socket table (inet_ehash): lookups walk hlist_nulls chains
// without locks, writers lock one bucket, entries are recycled without
// allocation. Make one with [New]; all methods are safe for concurrent use.
//
// Cost: each bucket is one 64-byte cache line that holds one entry, so a
// [Table.Lookup] of a flow held there reads one line; the other flows of a
// bucket are in 64-byte nodes of its chain. Lookups take no lock and never
// allocate; writes lock one bucket and allocate only when the table needs
// more nodes. A table made for n flows ([WithCapacity]) holds one per bucket
// when full: 63% of them in their buckets' lines, about 88 bytes per entry
// beyond the caller's T. Past two entries per bucket it doubles its buckets
// (see [WithMaxBuckets], [WithFixedBuckets]); in between it holds 64 to 88
// bytes per entry, and fewer flows in line.
//
// Keys: an IPv4 address and its IPv4-mapped form are one; zones are not
// part of a key. Values: a Lookup that began before a Delete or Swap may
// return the old *T after it; reuse (pool) a deleted value only once no
// such Lookup can still hold it, or let the garbage collector free it.
type Table[T any] struct {
	// N.B. the pads keep what lookups read off neighbours' lines.
	_      [cacheLineSize]byte
	arr    atomic.Pointer[bucketArray[T]]
	hooks  *testHooks // nil but in tests; N.B. on arr's line, which lookups read
	nodes  slab[node[T]]
	shards []shard // per P (percpu.go)
	secret Secret
	hasher Hasher
	fold   [4]uint64 // the fold hasher's keys, drawn from secret

	restarts atomic.Uint64 // lookups that walked again (Stats)
	growths  atomic.Uint64 // arrays published by growth

	// growMu serializes growths and compactions; growing is set while a
	// growth an insert started runs; growers counts their goroutines.
	growMu  sync.Mutex
	growing atomic.Bool
	growers sync.WaitGroup
	// fixed is WithFixedBuckets, huge WithHugePages; bucketLimit is the
	// most buckets the table may have, a power of two (WithMaxBuckets).
	fixed, huge bool
	bucketLimit int

	watch atomic.Pointer[watchSlot] // the clients, or nil (clients.go)

	_ [cacheLineSize]byte
}

// node is an entry of an overflow chain, padded to a cache line, as a
// bucket is: a node read whole reads one line.
type node[T any] struct {
	entry[T]
	_ [cacheLineSize - 56]byte // an entry is 56 bytes on every target (TestTableMemoryLayout)
}

// capLoad is the entries per bucket that WithCapacity and Grow size for,
// maxLoad those past which a table doubles itself. At one per bucket 63% of
// flows are in line (88 B/entry), at two 43% (76 B) and random lookups are a
// quarter slower (docs/performance.md, "Load factor").
const (
	capLoad = 1
	maxLoad = 2
)

// testHooks are the points where tests step into a table's work, set
// before the table is shared; every other table has none.
type testHooks struct {
	visit    func(index uint32)  // by lookups: each node before its next link, and see below
	growStep func(bucket uint32) // by growth: before it moves each old bucket
	relinked func(index uint32)  // by migrate: a node linked in the new chain, not yet out of the old
	checked  func(grew bool)     // by overLimit and growBehind: a sum of the counts, past the limit or not
	matched  func(index uint32)  // by TCPTable's listener walks: a key matched, its word not yet read
	// nodeLimit, when not 0, ends the node store's index space there.
	nodeLimit uint32
}

// The values testHooks.visit takes besides node indexes: a walk's end on its
// own marker; a line's miss before the head load; a line's match before the
// value load; lookupGrowing after it loaded the array.
const (
	visitWalkEnd = 0
	visitLine    = ^uint32(0)
	visitLineHit = ^uint32(1)
	visitGrowing = ^uint32(2)
)

// onVisit calls h's visit hook, if h has one.
func (h *testHooks) onVisit(i uint32) {
	if h != nil && h.visit != nil {
		h.visit(i)
	}
}

// array returns the table's bucket array, and panics naming New for a nil
// or zero Table.
func (t *Table[T]) array() *bucketArray[T] {
	if t == nil {
		panic(nilTable)
	}
	a := t.arr.Load()
	if a == nil {
		panic(zeroTable)
	}
	return a
}

// Option configures New, NewTCPTable and NewUDPTable.
type Option func(*tableConfig)

// tableConfig is what the options set; the ...Set fields say an option was
// given.
type tableConfig struct {
	capacity, stripes, maxBuckets int
	capacitySet, hasherSet        bool
	stripesSet, stripesGiven      bool // a count other than 0; any
	fixed, hugePages              bool
	secret                        *Secret
	hasher                        Hasher
	alloc                         *PortAllocator
}

// only panics for the options of New that a constructor of another table,
// ctor, cannot use.
func (c *tableConfig) only(ctor string) {
	if c.hasherSet {
		panic("hash4: " + ctor + ": WithHasher does not apply")
	}
	if c.fixed {
		panic("hash4: " + ctor + ": WithFixedBuckets does not apply")
	}
	if c.maxBuckets != 0 {
		panic("hash4: " + ctor + ": WithMaxBuckets does not apply")
	}
}

// stripeCount returns the stripe count of a socket table's chains: the one
// given to WithLockStripes, else the default for its bucket count.
func (c *tableConfig) stripeCount() int {
	if c.stripesSet {
		return c.stripes
	}
	return defaultStripes(bucketCount(c.capacity))
}

// WithCapacity sizes the table for about n entries: n buckets, rounded up
// to a power of two (at least 16), one entry per bucket when full, as Linux
// sizes its established table; 0 means the default, 1024. New reserves the
// buckets at once, 64 bytes each: 64 to 128 bytes per entry asked for (a
// million entries, 64 MiB), as make(map[K]V, n) reserves room for n. The
// table grows itself past two entries per bucket, unless made
// [WithFixedBuckets]; sized for half its flows, it holds about a fifth less
// memory and looks up a third slower (see [Table]). New panics if n is
// negative, beyond 2^29, beyond the bound set by [WithMaxBuckets], or if the
// buckets alone would pass the process's memory limit
// ([debug.SetMemoryLimit]).
func WithCapacity(n int) Option {
	return func(c *tableConfig) {
		if n < 0 {
			panic(fmt.Sprintf("hash4: WithCapacity(%d): negative capacity", n))
		}
		if n > 0 {
			c.capacity, c.capacitySet = n, true
		}
	}
}

// WithMaxBuckets bounds the table's bucket count at n rounded down to a
// power of two, at least 16 (0, the default, means 2^29, the most a table
// can have): the table does not grow past it, [Table.Grow] beyond it returns
// [ErrTooLarge], and New panics if [WithCapacity] asks for more, or if n is
// negative; without WithCapacity a table starts at the bound if it is below
// the default size. At 64 bytes per bucket, the bound caps the bucket
// array's memory; entries past two per bucket lengthen the chains.
func WithMaxBuckets(n int) Option { return func(c *tableConfig) { c.maxBuckets = n } }

// WithFixedBuckets keeps the bucket count that New sets: the table grows
// only when Grow is called, as Linux sizes its established table once, at
// boot, and starts no goroutine. Chains then lengthen as entries pass two
// per bucket.
func WithFixedBuckets() Option { return func(c *tableConfig) { c.fixed = true } }

// WithHugePages asks Linux to back the bucket arrays a table writes whole
// as it makes them with transparent huge pages (madvise MADV_HUGEPAGE), as
// the kernel maps its own large hash tables: a growth then takes less time
// (docs/performance.md, "Huge pages"). The advice outlives the table: memory
// the Go heap reuses after it is freed stays advised, so it changes the heap
// of the whole process. It does nothing on other systems, or where
// GODEBUG=disablethp=1 is set.
func WithHugePages() Option { return func(c *tableConfig) { c.hugePages = true } }

// WithLockStripes sets the number of writer locks of a [UDPTable]'s
// connected-socket chains and of a [TCPTable]'s listener chains, rounded up
// to a power of two and limited to their bucket count; 0 means the default:
// 16 per GOMAXPROCS, at least 64, and at least one per 1024 buckets, but at
// most one per 16 buckets. A [Table] locks each bucket on its own: New
// panics for this option, and NewTCPTable applies it to the listeners
// only. It panics for n outside [0, 2^30].
func WithLockStripes(n int) Option {
	return func(c *tableConfig) {
		if n < 0 || n > 1<<30 {
			panic(fmt.Sprintf("hash4: WithLockStripes(%d): out of range [0, 2^30]", n))
		}
		c.stripes, c.stripesSet, c.stripesGiven = n, n > 0, true
	}
}

// WithSecret sets the keys of the table's hash function. The default is a
// fresh [NewSecret]; see [Secret]. Keep a secret given here from those who
// choose the flows: one who knows it can choose flows that share a chain,
// which lookups of those flows walk whole and which no growth shortens, as
// in Linux's tables once their secret is known. The table's memory stays
// within its bound per entry whatever the flows (see [Table]).
func WithSecret(s Secret) Option { return func(c *tableConfig) { c.secret = &s } }

// WithHasher chooses the tuple hasher. New's default is [FoldHasher], the
// fastest; [NewTCPTable]'s is [LinuxHasher], whose buckets are the
// kernel's for the same secret, as its reuseport pick must be. New panics
// for a value that names no hasher.
func WithHasher(h Hasher) Option {
	return func(c *tableConfig) {
		if !h.valid() {
			panic(fmt.Sprintf("hash4: WithHasher(%d): no such Hasher", h))
		}
		c.hasher, c.hasherSet = h, true
	}
}

// defaultHasher is the hasher of a table made by New without WithHasher
// (docs/performance.md, "The hasher", measures the choice).
const defaultHasher = FoldHasher

// defaultCapacity is the capacity of a table made without WithCapacity.
const defaultCapacity = 1024

// New returns an empty table. It panics, naming the option, for an option
// value that is negative, out of range or names nothing (as make does for a
// negative size; see [WithCapacity], [WithMaxBuckets]) and for
// [WithLockStripes], which applies to the socket tables only; nil options
// are ignored.
func New[T any](opts ...Option) *Table[T] {
	cfg := tableConfig{capacity: defaultCapacity, hasher: defaultHasher}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.stripesGiven {
		panic("hash4: New: WithLockStripes does not apply: a Table locks each bucket")
	}
	return newTable[T](&cfg)
}

// newTable is New for a checked config.
func newTable[T any](cfg *tableConfig) *Table[T] {
	t := &Table[T]{hasher: cfg.hasher, fixed: cfg.fixed, huge: cfg.hugePages}
	if cfg.secret != nil {
		t.secret = *cfg.secret
	} else {
		t.secret = NewSecret()
	}
	t.fold = foldKeys(t.secret.Seed)
	t.bucketLimit = cfg.sizes()
	n := bucketCount(cfg.capacity / capLoad)
	if limit := debug.SetMemoryLimit(-1); uint64(n)*cacheLineSize > uint64(limit) {
		panic(fmt.Sprintf("hash4: WithCapacity(%d): %d buckets take %d bytes, beyond the memory limit of %d", cfg.capacity, n, uint64(n)*cacheLineSize, limit))
	}
	// Nodes come in chunks of a 64th of the buckets, 64 to 1024.
	t.nodes.setChunk(n / 64)
	t.shards = newShards()
	a := newBucketArray[T](n, 0, t.huge)
	t.initGrowth(a)
	t.arr.Store(a)
	if cfg.alloc != nil {
		t.attach().alloc = cfg.alloc
	}
	return t
}

// sizes checks the sizes of c, and returns the most buckets its table may
// have, a power of two (see WithMaxBuckets); it lowers the default
// capacity to that. It panics, as make does, on a size no table can have:
// so a size beyond the bound fails before a byte is allocated.
func (c *tableConfig) sizes() int {
	if c.maxBuckets < 0 {
		panic(fmt.Sprintf("hash4: WithMaxBuckets(%d): negative", c.maxBuckets))
	}
	limit := maxBuckets
	if c.maxBuckets > 0 {
		limit = max(minBuckets, 1<<(bits.Len(uint(min(c.maxBuckets, maxBuckets)))-1))
	}
	switch {
	case !c.capacitySet:
		c.capacity = min(c.capacity, capLoad*limit)
	case c.capacity > capLoad*limit && c.maxBuckets > 0:
		panic(fmt.Sprintf("hash4: WithCapacity(%d) beyond WithMaxBuckets(%d), %d buckets", c.capacity, c.maxBuckets, limit))
	case c.capacity > capLoad*limit:
		panic(capacityBeyond(c.capacity))
	}
	return limit
}

// capacityBeyond returns the message of a panic for a WithCapacity(n)
// beyond the most buckets any table can have.
func capacityBeyond(n int) string {
	return fmt.Sprintf("hash4: WithCapacity(%d) beyond %d buckets, the most a table can have", n, maxBuckets)
}
