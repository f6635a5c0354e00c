package hash4

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Table is a concurrent hash table from 4-tuples to *T, built as Linux's
// established-socket table (inet_ehash): lookups walk hlist_nulls chains
// without locks, writers take striped locks, entries are recycled without
// allocation. Make one with [New]; all methods are safe for concurrent use.
//
// Cost: [Table.Lookup] takes no lock and never allocates; writes lock one
// stripe and allocate only when the table needs more nodes: about 60 bytes
// per bucket, made or grown, and 56 per entry beyond one per bucket. It
// grows past about two entries per bucket, to at most two buckets per
// entry whatever the keys (see [WithMaxBuckets], [WithFixedBuckets]).
//
// Keys: an IPv4 address and its IPv4-mapped form are one; zones are not
// part of a key. Values: a Lookup that began before a Delete or Swap may
// return the old *T after it; reuse (pool) a deleted value only once no
// such Lookup can still hold it, or let the garbage collector free it.
type Table[T any] struct {
	// N.B. the pads keep the fields that every lookup reads off the cache
	// lines of the objects the heap puts before and after the table (see
	// slabDir).
	_       [cacheLineSize]byte
	arr     atomic.Pointer[tableArray[T]] // the bucket array (see tableArray)
	nodes   slab[entry[T]]
	moves   []moveCount     // per stripe (see move)
	metrics []stripeMetrics // per stripe (see Metrics)
	// alloc is the allocator whose bind table counts the table's flows
	// (WithPortAllocator), or nil: writers test it, the one cost to
	// tables without one.
	alloc    *PortAllocator
	secret   Secret
	hasher   Hasher
	fold     [4]uint64 // the fold hasher's keys, drawn from secret
	restarts atomic.Uint64
	growths  atomic.Uint64 // arrays published by Grow and growth

	// growMu serializes Grow; groups is the config's home groups rule
	// and huge pages choice, which Grow applies to each new array. growing is set while a growth
	// that an insert started (see insert) runs, and for good if one
	// failed; growers counts those growths' goroutines, for tests to wait
	// on; fixed is WithFixedBuckets; bucketLimit is the most buckets the
	// table may have, a power of two (see WithMaxBuckets).
	growMu      sync.Mutex
	groups      tableConfig
	growing     atomic.Bool
	growers     sync.WaitGroup
	fixed       bool
	bucketLimit int
	// listenerStripes are the lock stripes of a TCPTable's listener
	// chains, whose caches hold nodes of this table's store (set by
	// NewTCPTable before the table is shared), for compactNodes.
	listenerStripes []stripe

	// indexes are the occupancy indexes of busy destinations (index.go),
	// nil while there are none; indexMu serializes their building and
	// dropping.
	indexes atomic.Pointer[portIndexes]
	indexMu sync.Mutex
	// timeWaits are the TIME_WAIT marks (timewait.go), nil until the
	// first.
	timeWaits atomic.Pointer[timeWaits]

	hooks *testHooks // nil but in tests
	_     [cacheLineSize]byte
}

// testHooks are the points where tests step into a table's work. Tests set
// a table's hooks before they share it; every other table has none.
type testHooks struct {
	// visit is called by lookups on each entry of a chain before they
	// read its next link, with visitWalkEnd when lookup's walk ends on its
	// own chain's marker, and with visitGrowing when lookupGrowing has
	// loaded the array.
	visit func(index uint32)
	// growStep is called by Grow before it moves the entries of each
	// stripe.
	growStep func(stripe uint32)
	// relinked is called by migrate between linking a node into a chain
	// of the new array and unlinking it from the old.
	relinked func(index uint32)
	// checked is called by growBehind after each check of the table,
	// with whether it grew the table.
	checked func(grew bool)
	// matched is called by TCPTable's listener walks on each node whose
	// key matched, before they read its listen word and value.
	matched func(index uint32)
	// nodeLimit, when not 0, ends the node store's index space there
	// rather than at slabMaxNodes; nodesSpent makes reserve set nodeLimit
	// to the end of the nodes it carves, and carve them whatever the
	// limit. The store changes them under its mu.
	nodeLimit  uint32
	nodesSpent bool
}

// The values testHooks.visit takes besides node indexes, which are from 1
// to maxNullsValue.
const (
	visitWalkEnd = 0
	visitGrowing = ^uint32(0)
)

// onVisit calls h's visit hook, if h has one.
func (h *testHooks) onVisit(i uint32) {
	if h != nil && h.visit != nil {
		h.visit(i)
	}
}

// array returns the table's bucket array, and panics naming New for a zero
// Table. N.B. lookup makes the same test in line: array does not inline.
func (t *Table[T]) array() *tableArray[T] {
	a := t.arr.Load()
	if a == nil {
		panic(zeroTable)
	}
	return a
}

// tableArray is a table's bucket array and all that its bucket count lays
// out: the chain heads, the home slots and their bitmap. The stripes are
// the table's, shared by every array it has had. Grow replaces the array
// (see Grow); nothing in it changes once published but through the heads,
// the home slots' entries and the bitmap, which writers change under
// stripe locks, and old.
//
// N.B. the pads keep the fields that every lookup reads off the lines of
// the heap's neighbouring objects, as Table's do. old shares a line with
// the end of homes, which lookups read.
type tableArray[T any] struct {
	_     [cacheLineSize]byte
	b     buckets
	home  homeSlots
	homes []entry[T] // home slots: bucket b's is homes[b], node home.slot(b)
	// old is the array this one replaced while Grow moves the entries
	// out of it, stripe by stripe, and nil before and after.
	old atomic.Pointer[tableArray[T]]
	// relinkedHomes counts the home slots of old that migrate linked
	// into this array's chains, for want of nodes (see releaseOld).
	relinkedHomes atomic.Uint32
	// growAt is the entry count of a stripe past which an insert has the
	// table's growth check whether to grow (see overLimit and
	// growLimit), or never; checkAt[s], where not 0, raises stripe s's
	// after a check decided not to grow (see postpone).
	growAt  uint64
	checkAt []atomic.Uint64
	_       [cacheLineSize]byte
}

// flipped reports whether the array's nulls values have bit 30 set
// (arrayNullsFlip): arrays alternate, and a stripe whose flipped differs
// from the table's array has its entries in the old one (see Grow).
func (a *tableArray[T]) flipped() bool { return a.b.nullsBase&arrayNullsFlip != 0 }

// entry is one flow. Its fields are shared by lock-free readers and by
// writers under the stripe lock of the chain it is in: readers load them
// atomically, writers store them with release stores (release.go).
//
// N.B. seq is odd while the entry is live (in the table with its key and
// value) and even while it is free. A writer fills a free entry, links it
// and then makes seq odd; deleting makes seq even, then unlinks the entry
// and clears the value. A live entry is therefore always linked in the
// chain of its key, so a reader may trust an entry it reaches without the
// chain (a home slot). A reader that matches a key reads seq before the key
// and again after the value, and trusts the match only if seq was odd and
// did not change: otherwise the entry was deleted or recycled under it. A
// live entry's value may change without seq (CompareAndSwap): the reader
// returns the value it loaded, which the flow held at that moment.
// seq returns to a value only after 2^31 reuses of the entry: to be fooled,
// a reader would have to stall between its two loads through minutes of
// churn on that one entry. Chain walkers skip entries whose seq is even.
// Recycling never waits for readers.
//
// N.B. a reservation (ConnectFunc) is a live entry whose key has local port
// 0 in meta, the hash and the rest its tuple's, and whose value is nil. No
// lookup key equals it: a key's hash is its hash with local port 0 plus its
// port, so a key with meta's port 0 has another hash. Writers' findLocked
// matches it with the tuple's key, and moves copy it as any entry. It goes
// live to readers in place, under the lock: the value is stored, then meta,
// so a reader that matches the new meta loads the new value.
type entry[T any] struct {
	seq  relUint32
	next linkField
	key  entryKey
	val  relPointer[T]
}

// reserved reports whether e, live in a chain of a Table, is a reservation
// (see entry). The caller holds the chain's stripe lock.
func (e *entry[T]) reserved() bool { return e.key.meta.Load()&lportMask == 0 }

// lportMask is the local port's field in a key's meta (see key.setPort).
const lportMask = 0xffff << 16

// read is a reader's half of the seq protocol: it returns e's value and
// ok = true if e is live and holds k, unchanged across the read. A match
// that the second load of seq contradicts returns changed = true: e was
// deleted or recycled under the reader, whose walk must restart.
func (e *entry[T]) read(k *key) (v *T, ok, changed bool) {
	seq := e.seq.Load()
	if seq&1 == 0 || !e.key.matches(k) {
		return nil, false, false
	}
	v = e.val.Load()
	if e.seq.Load() != seq {
		return nil, false, true
	}
	return v, true, false
}

// key is a tuple in the form entries store: the full hash and ports in one
// word, addresses as the two words of their 16-byte form (IPv4 as
// IPv4-mapped, zone dropped).
type key struct {
	meta          uint64
	remote, local [2]uint64
}

// Option configures New.
type Option func(*tableConfig)

type tableConfig struct {
	capacity, stripes int
	stripesSet        bool // by WithLockStripes
	secret            *Secret
	hasher            Hasher
	hasherSet         bool // by WithHasher
	// homeGroups is whether to form home groups (home.go): set by New
	// from the bucket count, or by tests through withHomeGroups.
	homeGroups    bool
	homeGroupsSet bool
	fixed         bool           // by WithFixedBuckets
	hugePages     bool           // by WithHugePages
	capacitySet   bool           // by WithCapacity
	maxBuckets    int            // by WithMaxBuckets; 0 for none
	alloc         *PortAllocator // by WithPortAllocator
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

// withHomeGroups forces home groups on or off, whatever the bucket count,
// so that tests can reach grouped placement in small tables.
func withHomeGroups(on bool) Option {
	return func(c *tableConfig) { c.homeGroups, c.homeGroupsSet = on, true }
}

// stripeCount returns the stripe count asked for: the one given to
// WithLockStripes, else the default for the table's bucket count.
func (c *tableConfig) stripeCount() int {
	if c.stripesSet {
		return c.stripes
	}
	return defaultStripes(bucketCount(c.capacity))
}

// WithCapacity sizes the table for about n entries: the bucket count is n
// rounded up to a power of two (at least 16), so that a full table holds
// one entry per bucket on average, as Linux sizes its established table.
// 0 means the default, 1024. New reserves 60 bytes per bucket at once, as
// make(map[K]V, n) reserves room for n entries, and panics if n is
// negative or beyond 2^29 buckets or the bound set by [WithMaxBuckets].
// Past about twice as many entries as buckets the table grows, unless
// made [WithFixedBuckets].
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
// can have): the table does not grow itself past it, [Table.Grow] beyond it
// returns [ErrTooLarge], and New panics if [WithCapacity] asks for more, or
// if n is negative; without WithCapacity a table starts at the bound if it
// is below the default size. At 60 bytes per bucket, the bound caps the
// bucket array's memory; entries past two per bucket lengthen the chains.
func WithMaxBuckets(n int) Option { return func(c *tableConfig) { c.maxBuckets = n } }

// WithFixedBuckets keeps the bucket count that New sets: the table grows
// only when Grow is called, as Linux sizes its established table once, at
// boot, and starts no goroutine. Chains then lengthen as entries pass the
// bucket count.
func WithFixedBuckets() Option { return func(c *tableConfig) { c.fixed = true } }

// WithHugePages asks Linux to back the arrays that a table writes whole as
// it makes them (its chain heads, and the slots of each growth) with
// transparent huge pages (madvise MADV_HUGEPAGE), as the kernel maps its
// own large hash tables: a growth then takes about a third less time
// (docs/performance.md, "Huge pages"). The
// advice outlives the table: memory the Go heap reuses after it is freed
// stays advised, so it changes the heap of the whole process. It does
// nothing on other systems, or where GODEBUG=disablethp=1 is set.
func WithHugePages() Option { return func(c *tableConfig) { c.hugePages = true } }

// WithLockStripes sets the number of writer locks, rounded up to a power of
// two and limited to the bucket count. 0 means the default: 16 per
// GOMAXPROCS, at least 64, and at least one per 1024 buckets, but at most
// one per 16 buckets. New panics for a negative n. Fewer stripes make a
// small table smaller (an entry may take a free home slot of its own
// stripe only) and its writers meet more often; more stripes than a quarter
// of the buckets give up reading the home slots of four buckets at once.
func WithLockStripes(n int) Option {
	return func(c *tableConfig) {
		if n < 0 {
			panic(fmt.Sprintf("hash4: WithLockStripes(%d): negative stripe count", n))
		}
		c.stripes, c.stripesSet = n, n > 0
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

// New returns an empty table. It panics, naming the option, for an option
// value that is negative, out of range or names nothing (as make does for a
// negative size; see [WithCapacity], [WithMaxBuckets]); nil options are
// ignored.
func New[T any](opts ...Option) *Table[T] {
	cfg := tableConfig{capacity: 1024, hasher: defaultHasher}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	t := &Table[T]{hasher: cfg.hasher}
	if cfg.secret != nil {
		t.secret = *cfg.secret
	} else {
		t.secret = NewSecret()
	}
	t.fold = foldKeys(t.secret.Seed)
	t.bucketLimit = cfg.sizes()
	a := new(tableArray[T])
	n := bucketCount(cfg.capacity)
	a.b.initShared(n, newStripes(cfg.stripeCount(), n), 0, cfg.hugePages)
	// The home slots are reserved nodes, from index 1; nodes beyond them
	// come in chunks of a 64th of the buckets, 64 to 1024 (see
	// slab.setChunk). N.B. an empty store always has room for them.
	t.nodes.setChunk(n / 64)
	base, homes, _ := t.nodes.reserve(uint32(n))
	a.homes = homes
	t.nodes.setBatch(nodeBatch(n, len(a.b.stripes)))
	t.groups = tableConfig{homeGroups: cfg.homeGroups, homeGroupsSet: cfg.homeGroupsSet, hugePages: cfg.hugePages}
	a.home.init(n, len(a.b.stripes), base, t.groups.grouped(n))
	for s := range a.b.stripes {
		a.home.initStripe(&a.b.stripes[s], uint32(s))
	}
	t.moves = make([]moveCount, len(a.b.stripes))
	t.metrics = make([]stripeMetrics, len(a.b.stripes))
	t.fixed = cfg.fixed
	t.alloc = cfg.alloc
	t.initGrowth(a)
	t.arr.Store(a)
	return t
}

// nodeBatch returns the node batch (see slab.setBatch) of a table of the
// given bucket and stripe counts: 1/64 of a stripe's buckets, so 16 nodes
// from 1024 buckets per stripe, the default in large tables; setBatch
// holds it between 1 and 16.
func nodeBatch(buckets, stripes int) int { return buckets / stripes / 64 }

// grouped reports whether a table of n buckets has home groups: as forced
// by withHomeGroups, else from n buckets up to homeGroupMinBuckets.
func (c *tableConfig) grouped(n int) bool {
	if c.homeGroupsSet {
		return c.homeGroups
	}
	return n >= homeGroupMinBuckets
}

// moveCount counts the moves (see Table.move) in the chains of one stripe.
// It fills a cache line of its own: readers load it on every lookup, and
// only moves write it.
type moveCount struct {
	n relUint32
	_ [cacheLineSize - 4]byte
}

// tupleKey sets *k to the key of *tup, hashed with the table's hasher: the
// hash with local port 0, plus the port. Every operation on a tuple comes
// here. N.B. it is written for Lookup, whose tuple arrives in memory (with
// the receiver and the generic dictionary, its eight words overflow the
// argument registers): it reads the addresses where they lie and hashes in
// line, where a copy of the tuple and the calls to convert and hash it
// cost a tenth of a lookup of a cached key. Keys are filled in place and passed by pointer: returning a
// 40-byte key just written field by field costs a copy that stalls on
// store-to-load forwarding.
func (t *Table[T]) tupleKey(k *key, tup *Tuple) {
	if addrReprKnown { // setWords, in line
		setWordsReprAt(&k.remote, &tup.Remote)
		setWordsReprAt(&k.local, &tup.Local)
	} else {
		setWordsAs16(&k.remote, tup.Remote.Addr())
		setWordsAs16(&k.local, tup.Local.Addr())
	}
	rport := tup.Remote.Port()
	k.setPort(t.hashPort0(&k.local, &k.remote, rport), tup.Local.Port(), rport)
}

// hashPort0 is the package's hashPort0 with the table's hasher, secret and
// fold keys. N.B. written for tupleKey, which it must inline into: as a
// call, the hash of a cached key costs a tenth more. It is one call, to a
// function that is not generic, so that it fits the inliner's budget: as a
// switch over three calls, it did not.
func (t *Table[T]) hashPort0(local, remote *[2]uint64, rport uint16) uint32 {
	return tableHash(t.hasher, &t.secret, &t.fold, local, remote, rport)
}

// setKey sets *k to the key of the flow (local:localPort, remote), hashed,
// as tupleKey does for the tuple. N.B. it converts the addresses it is
// given: building a tuple of them to pass to tupleKey made each call
// slower, as the loads of the words just stored stall.
func (t *Table[T]) setKey(k *key, local netip.Addr, localPort uint16, remote netip.AddrPort) {
	if addrReprKnown { // setWords, in line
		setWordsRepr(&k.remote, remote.Addr())
		setWordsRepr(&k.local, local)
	} else {
		setWordsAs16(&k.remote, remote.Addr())
		setWordsAs16(&k.local, local)
	}
	k.setPort(t.hashPort0(&k.local, &k.remote, remote.Port()), localPort, remote.Port())
}

// setPort sets the local port of k, given the hash of k with local port 0.
func (k *key) setPort(hash0 uint32, localPort, remotePort uint16) {
	k.meta = uint64(hash0+uint32(localPort))<<32 | uint64(localPort)<<16 | uint64(remotePort)
}

// validate reports why tup cannot be a key, or nil.
func validate(tup Tuple) error {
	why := addrProblem(tup.Local.Addr(), tup.Remote.Addr())
	if why == "" && (tup.Local.Port() == 0 || tup.Remote.Port() == 0) {
		why = "port 0"
	}
	if why != "" {
		return fmt.Errorf("%w %v: %s", ErrInvalidTuple, tup, why)
	}
	return nil
}

// addrProblem says why local and remote cannot be the addresses of a key,
// or returns "". N.B. zones are dropped first, as keys drop them: netip's
// IsUnspecified says no for ::%eth0, whose key holds ::.
func addrProblem(local, remote netip.Addr) string {
	l, r := local.Unmap().WithZone(""), remote.Unmap().WithZone("")
	switch {
	case !l.IsValid() || !r.IsValid():
		return "invalid address"
	case l.IsUnspecified() || r.IsUnspecified():
		return "unspecified address"
	case l.Is4() != r.Is4():
		return "local and remote address families differ"
	}
	return ""
}

// validateInsert reports why tup with value v cannot be inserted, or nil.
func validateInsert[T any](tup Tuple, v *T) error {
	if err := validate(tup); err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w for %v", ErrNilValue, tup)
	}
	return nil
}
